"""tiny_llama: the embedded default, a 5M-parameter Llama with native window C=512, shipped in the repo.

Trained by ``scripts/pretrain_tiny.py``; its model card (training data, steps, tokens, loss, passkey gate) is
``harness/assets/tiny_llama/README.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError
from harness.models import MODELS, ModelArgs, ModelHandle, load_pretrained, rotary_dim

ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny_llama"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<landmark>"]


def tiny_config(vocab_size: int, rope_theta: float, bos: int, eos: int, pad: int, native_ctx: int = 512,
                layers: int = 4, hidden: int = 256, heads: int = 4, intermediate: int = 688):
    """The shipped model's configuration (the defaults); a larger base for a GPU session changes the sizes."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=native_ctx,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, tie_word_embeddings=False,
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, rms_norm_eps=1e-5,
    )


@MODELS.register("tiny_llama")
class TinyLlama:
    @dataclass
    class Args(ModelArgs):
        name: str = "tiny_llama"
        native_ctx: int = 512

    @staticmethod
    def source(a: TinyLlama.Args) -> tuple[str, str]:
        return a.path or str(ASSET_DIR), ""

    @staticmethod
    def build(a: TinyLlama.Args, device=None, device_map=None) -> ModelHandle:
        path = a.path or str(ASSET_DIR)
        if not (Path(path) / "model.safetensors").exists():
            raise ConfigError(f"tiny_llama weights not found in {path} (run scripts/pretrain_tiny.py)")
        model, tok = load_pretrained(path, a.dtype, a.attn_implementation, device=device, device_map=device_map)
        trained = int(model.config.max_position_embeddings)
        if not a.path and trained != a.native_ctx:
            raise ConfigError(f"model.native_ctx = {a.native_ctx} but the shipped tiny_llama was pretrained at "
                              f"{trained} tokens (its config.json); set model.native_ctx={trained}")
        return ModelHandle(model, tok, "tiny_llama", a.native_ctx,
                           {"path": path, "rotary_dim": rotary_dim(model.config)})
