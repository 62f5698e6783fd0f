"""abf: Adjusted Base Frequency (Xiong et al. 2023, "Effective Long-Context Scaling"): plain RoPE with a larger base,
``theta_i = b'^(-2i/d)``; transformers' default rope type with ``rope_theta = b'``.

Paper: LLaMA2 b = 1e4 -> 500,000 (x50); a 50,000 variant (x5) also appears in the studies. The default is the
ratio, ``ratio: 50`` (b' = 50 x the model's own base: 500,000 on LLaMA2-7B, 50 x rope_theta on tiny_llama), so the
same YAML means the same on every model; ``rope_theta`` > 0 sets an absolute base instead (it wins over ratio).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import check_base
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import rope_base, set_rope_parameters


@METHODS.register("abf")
class ABF(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "abf"
        rope_theta: float = 0.0  # absolute new base; 0 = use ratio
        ratio: float = 50.0  # b' = ratio x the model's base (paper: 1e4 -> 5e5) when rope_theta is 0

    def check(self, native_ctx: int, train=None) -> None:
        check_base(self.args.name, self.args.rope_theta, self.args.ratio)

    def new_base(self, model) -> float:
        a = self.args
        self.check(0)
        return float(a.rope_theta if a.rope_theta > 0 else a.ratio * rope_base(model.config))

    def apply(self, handle) -> None:
        set_rope_parameters(handle.model, rope_type="default", rope_theta=self.new_base(handle.model))
