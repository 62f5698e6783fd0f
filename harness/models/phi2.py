"""phi2: the controlled study's second base model (Phi-2, 2.7B, window 2048, partial rotary factor 0.4: 32 of 80
head dims rotated). The RoPE methods act on the rotary dims only (``harness.models.rotary_dim``)."""
from __future__ import annotations

from dataclasses import dataclass

from harness.models import MODELS, ModelArgs, ModelHandle, load_pretrained, rotary_dim


@MODELS.register("phi2")
class Phi2:
    @dataclass
    class Args(ModelArgs):
        name: str = "phi2"
        path: str = "microsoft/phi-2"
        native_ctx: int = 2048
        dtype: str = "bfloat16"
        attn_implementation: str = "flash_attention_2"

    @staticmethod
    def build(a: Phi2.Args) -> ModelHandle:
        model, tok = load_pretrained(a.path, a.dtype, a.attn_implementation)
        return ModelHandle(model, tok, "phi2", a.native_ctx, {"path": a.path, "rotary_dim": rotary_dim(model.config)})
