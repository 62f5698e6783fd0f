"""llama3: Llama-3.1 wavelength-banded scaling (meta-llama/llama-models ``models/llama3/model.py::apply_scaling``;
transformers' ``"llama3"`` rope type, ``_compute_llama3_parameters``): pairs whose wavelength is shorter than
C / high_freq_factor keep their frequency, longer than C / low_freq_factor are divided by ``factor``, smooth blend in
between. No attention factor, static. Llama-3.1: factor 8, low 1, high 4, C = 8192; tiny: factor 8 (256 -> 2048),
C = 256.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import ConfigError, check_scale
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import set_rope_parameters


@METHODS.register("llama3")
class Llama3(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "llama3"
        scale: float = 8.0
        low_freq_factor: float = 1.0
        high_freq_factor: float = 4.0

    def check(self, native_ctx: int, train=None) -> None:
        a = self.args
        check_scale(a.name, a.scale)
        if not 0 < a.low_freq_factor < a.high_freq_factor:
            raise ConfigError(f"method=llama3: need 0 < low_freq_factor < high_freq_factor (wavelength bands C/high "
                              f".. C/low), got {a.low_freq_factor}, {a.high_freq_factor}")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="llama3", factor=float(a.scale),
                            original_max_position_embeddings=int(handle.native_ctx),
                            low_freq_factor=float(a.low_freq_factor), high_freq_factor=float(a.high_freq_factor))
