"""yarn: YaRN (Peng et al. 2023; jquesnelle/yarn ``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py``).

NTK-by-parts frequency ramp (pairs whose wavelength completes more than ``beta_fast`` = 32 turns in the original
window keep their frequency, pairs completing fewer than ``beta_slow`` = 1 turn are interpolated by ``s``, a linear
ramp in between) plus the attention temperature: cos and sin are both multiplied by ``0.1 ln s + 1`` (so logits
by its square, the errata's sqrt(1/t)). Uses transformers' ``"yarn"`` rope type (``_compute_yarn_parameters``) with
``original_max_position_embeddings`` set explicitly to the model's native window (transformers would otherwise
default it to ``max_position_embeddings``, computing the ramp at the wrong length: methods.md section 16.3).
Static: the same frequencies at every length (Table 8: 8.0 everywhere). Paper/LCEG: s = 8 for 4k -> 32k; tiny:
256 -> 2048, s = 8.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import check_scale
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import set_rope_parameters


@METHODS.register("yarn")
class YaRN(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "yarn"
        scale: float = 8.0  # s = L'/C
        beta_fast: float = 32.0  # Mistral variants of the original use 128
        beta_slow: float = 1.0  # Mistral: 2
        truncate: bool = True  # floor/ceil the correction range as the original does

    def check(self, native_ctx: int, train=None) -> None:
        check_scale(self.args.name, self.args.scale)

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="yarn", factor=float(a.scale),
                            original_max_position_embeddings=int(handle.native_ctx),
                            beta_fast=float(a.beta_fast), beta_slow=float(a.beta_slow), truncate=bool(a.truncate))
