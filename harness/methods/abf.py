"""abf: Adjusted Base Frequency (Xiong et al. 2023, "Effective Long-Context Scaling"): plain RoPE with a larger base,
``theta_i = b'^(-2i/d)``; transformers' default rope type with ``rope_theta = b'``.

Paper: LLaMA2 b = 1e4 -> 500,000 (x50); a 50,000 variant (x5) also appears in the studies. Set ``rope_theta`` (an
absolute base) or ``ratio`` (b' = ratio * the model's base; used when rope_theta is 0). tiny_llama's base is 1000,
so the x50 analogue is 50,000 (the YAML) and the x5 variant 5,000.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import ConfigError
from harness.methods import METHODS, Method, MethodArgs
from harness.methods.rope import rope_base, set_rope_parameters


@METHODS.register("abf")
class ABF(Method):
    @dataclass
    class Args(MethodArgs):
        name: str = "abf"
        rope_theta: float = 500000.0  # absolute new base (0 = use ratio)
        ratio: float = 0.0  # b' = ratio * base when rope_theta == 0

    def new_base(self, model) -> float:
        a = self.args
        b = a.rope_theta if a.rope_theta > 0 else a.ratio * rope_base(model.config)
        if b <= 0:
            raise ConfigError("method=abf: set rope_theta > 0 or ratio > 0")
        return float(b)

    def apply(self, handle) -> None:
        set_rope_parameters(handle.model, rope_type="default", rope_theta=self.new_base(handle.model))
