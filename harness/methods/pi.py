"""pi: Position Interpolation (Chen et al. 2023): positions m -> m/s, i.e. every RoPE frequency divided by s.

Uses transformers' ``"linear"`` rope type (``_compute_linear_scaling_rope_parameters``: inv_freq /= factor,
attention factor 1). The controlled study (LCEG ``continuous_finetuning/fine-tune.py``) and LongLoRA set
``factor = ceil(L_train / L_pretrained)``: 8 for 4k -> 32k; here ``scale`` is that factor (tiny: 256 -> 2048 = 8).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import check_scale
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import set_rope_parameters


@METHODS.register("pi")
class PI(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "pi"
        scale: float = 8.0  # s = L' / L

    def check(self, native_ctx: int, train=None) -> None:
        check_scale(self.args.name, self.args.scale)

    def apply(self, handle) -> None:
        self.check(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="linear", factor=float(self.args.scale))
