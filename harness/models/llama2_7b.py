"""llama2_7b: the controlled study's base model (LLaMA2-7B, pretrained window 4096, RoPE base 1e4, d=128).

Loaded from a local directory or a hub id already in the cluster's cache (``scripts/prepare_cluster_data.py``
downloads it on a login node); never downloaded at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.models import MODELS, ModelArgs, ModelHandle, load_pretrained, rotary_dim


@MODELS.register("llama2_7b")
class Llama2_7B:
    @dataclass
    class Args(ModelArgs):
        name: str = "llama2_7b"
        path: str = "meta-llama/Llama-2-7b-hf"
        native_ctx: int = 4096
        dtype: str = "bfloat16"
        attn_implementation: str = "flash_attention_2"

    @staticmethod
    def build(a: Llama2_7B.Args) -> ModelHandle:
        model, tok = load_pretrained(a.path, a.dtype, a.attn_implementation)
        return ModelHandle(model, tok, "llama2_7b", a.native_ctx,
                           {"path": a.path, "rotary_dim": rotary_dim(model.config)})
