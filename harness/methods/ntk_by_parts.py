"""ntk_by_parts: YaRN's frequency ramp without its attention temperature (bloc97's "NTK-by-parts", the YaRN
paper's section 3.2 ablation): transformers' ``"yarn"`` rope type with ``attention_factor = 1.0`` (an explicit
attention_factor is used as is by ``_compute_yarn_parameters``). Same defaults as ``yarn`` (s = 8, beta 32/1).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import check_scale
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import set_rope_parameters


@METHODS.register("ntk_by_parts")
class NTKByParts(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "ntk_by_parts"
        scale: float = 8.0
        beta_fast: float = 32.0
        beta_slow: float = 1.0
        truncate: bool = True

    def check(self, native_ctx: int, train=None) -> None:
        check_scale(self.args.name, self.args.scale)

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="yarn", factor=float(a.scale),
                            original_max_position_embeddings=int(handle.native_ctx), attention_factor=1.0,
                            beta_fast=float(a.beta_fast), beta_slow=float(a.beta_slow), truncate=bool(a.truncate))
