"""Models: one file + one YAML each, registered by short name (``model=tiny_llama``); a model that is only data (a
hub checkpoint: LLaMA2-7B, Phi-2) is one YAML naming the generic builder (``builder: hub``, ``harness/models/hub.py``).

A model builder returns a ``ModelHandle``: the transformers model, its tokenizer and the facts the methods and
evaluators need (native context window, rotary dimension). Loading is offline by construction: local directories,
files shipped inside installed packages, or a hub id that must already be in the local cache on a cluster.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from harness.config import ConfigError
from harness.registry import Registry

MODELS: Registry = Registry("model", "harness.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelArgs:
    """Fields shared by every model YAML."""

    name: str = ""
    path: str = ""  # local dir or hub id (hub ids only resolve from the local cache: no downloads at run time)
    native_ctx: int = 0  # pretrained context window C
    dtype: str = "float32"  # weights dtype; compute uses autocast from the train/eval configs
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 (GPU only; falls back to sdpa)
    gguf_file: str = ""
    builder: str = ""  # the registered builder when it is not ``name`` (``hub``: a model that is only data)


@dataclass
class ModelHandle:
    model: Any
    tokenizer: Any
    name: str
    native_ctx: int
    info: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config


@runtime_checkable
class ModelBuilder(Protocol):
    """The contract of a registered model: an ``Args`` dataclass (``ModelArgs`` or a subclass, validated against the
    YAML) and a static ``build(args) -> ModelHandle``."""

    Args: ClassVar[type]

    @staticmethod
    def build(a: Any) -> ModelHandle: ...


def resolve_attn_implementation(requested: str) -> str:
    if requested == "flash_attention_2":
        has_fa = importlib.util.find_spec("flash_attn") is not None
        if not (has_fa and torch.cuda.is_available()):
            warnings.warn("flash_attention_2 needs the flash-attn package and a CUDA GPU; falling back to sdpa",
                          stacklevel=2)
            return "sdpa"
    return requested


def load_pretrained(path: str, dtype: str, attn_implementation: str, gguf_file: str = ""):
    """Load a causal LM and its tokenizer from a local directory, a cached hub id, or a GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict = {"gguf_file": gguf_file} if gguf_file else {}
    is_local = os.path.isdir(path)
    if not is_local and not gguf_file:
        kw["local_files_only"] = os.environ.get("HF_HUB_OFFLINE", "1") == "1"
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], attn_implementation=resolve_attn_implementation(attn_implementation), **kw
        )
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load model from {path!r}: {first}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok


def rotary_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rp = getattr(config, "rope_parameters", None) or {}
    prf = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    return int(head_dim * prf)


def available_memory(device: torch.device) -> int | None:
    """Free bytes where the model's tensors live: the GPU's free memory, or the host's MemAvailable (None if
    unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def min_bytes(config, length: int, itemsize: int, generates: bool) -> int:
    """A lower bound on the memory one input of ``length`` tokens needs beyond the weights: the keys and values of
    every layer when the evaluator decodes with the KV cache (``generates``), else one layer's keys and values plus
    two hidden-state tensors."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    per_layer = 2 * kv * hd * length * itemsize
    if generates:
        return cfg.num_hidden_layers * per_layer
    return per_layer + 2 * cfg.hidden_size * length * itemsize


def check_fits(handle: ModelHandle, length: int, generates: bool, key: str) -> None:
    """Refuse, before fine-tuning or evaluating, an evaluation input that cannot fit in the free memory of the
    device the model is on (the lower bound of :func:`min_bytes`; what is actually needed is more)."""
    if length <= 0:
        return
    p = next(handle.model.parameters())
    need = min_bytes(handle.model.config, int(length), p.element_size(), generates)
    free = available_memory(p.device)
    if free is not None and need > free:
        what = "the KV cache of every layer" if generates else "one layer's keys and values"
        raise ConfigError(f"{key}: an input of {length} tokens needs at least {_size(need)} ({what}, {handle.name} "
                          f"in {p.dtype}) but {_size(free)} is free on {p.device}; use shorter eval lengths")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def build_model(cfg) -> ModelHandle:
    """The one builder: validate the ``model`` config group and load it."""
    name = (cfg or {}).get("name") if not hasattr(cfg, "name") else cfg.name
    if not name:
        raise ConfigError("model config has no name")
    builder = (cfg or {}).get("builder") if not hasattr(cfg, "builder") else cfg.builder
    cls, args = MODELS.args(cfg, f"model={name}", name=builder or name)
    args.name = name
    return cls.build(args)


def load_model(name: str, **overrides) -> ModelHandle:
    """Convenience for scripts and tests: load a registered model with its YAML defaults plus overrides."""
    from harness.conf_utils import group_defaults

    node = group_defaults("model", name)
    node.update(overrides)
    return build_model(node)
