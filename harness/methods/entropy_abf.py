"""entropy_abf: Entropy-Aware ABF (Zhang et al. 2024, GAIR-NLP/Entropy-ABF ``patch/EABF.py``).

Two parts: (1) ABF: plain RoPE with base 500,000 (the original hard-codes it and ignores its ``factor``);
(2) after RoPE the *query* of a token at 0-based position ``p`` is multiplied by
``lambda = max(1, ln(p + 1) / ln(C))`` (C = 4096 hard-coded there = LLaMA2's window), i.e. attention logits are
scaled by ``max(1, log_C n)``, so attention entropy stays bounded as the context grows. The paper says the first two
layers are exempt (``apply_eabf(model, count=2)``); the original code sets an instance attribute the HF 4.31
attention never reads, so its behaviour is to scale *every* layer (methods.md section 7). Default here: the paper
(``exempt_layers: 2``); ``scale_all_layers: true`` reproduces the code.

Where it is patched: a registered ``AttentionInterface`` function ``"entropy_abf"`` (plus its mask builder, copied
from the wrapped implementation's) that scales the query by lambda(position_ids) row by row and then calls the
model's previous attention implementation (sdpa, eager, flash...) unchanged; the model is switched to it with
``set_attn_implementation``. RoPE itself goes through transformers' default rope type with the new base.
Defaults in units that mean the same on every model: base = ``ratio`` 50 x the model's own base (LLaMA2: 1e4 ->
500,000, the original's value) and ``log_base`` = 1 C (LLaMA2: 4096, the original's value).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from harness.config import ConfigError, check_base, window_tokens
from harness.methods import METHODS, Method, MethodArgs, Needs
from harness.methods.rope import rope_base, set_rope_parameters

ATTN_NAME = "entropy_abf"


def entropy_scale(position_ids: torch.Tensor, native_ctx: int) -> torch.Tensor:
    """lambda(p) = max(1, ln(p + 1) / ln(C)) for 0-based positions."""
    return torch.clamp(torch.log(position_ids.float() + 1.0) / math.log(native_ctx), min=1.0)


def _base_function(module, name: str):
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[name]


def entropy_abf_attention(module, query, key, value, attention_mask, **kwargs):
    """AttentionInterface function: q (B, H, q_len, hd) *= lambda(position) unless the layer is exempt."""
    cfg = module.__dict__.get("_eabf")
    if cfg is None:
        raise RuntimeError("entropy_abf attention called on a module that method=entropy_abf did not prepare")
    pos = kwargs.get("position_ids")
    if pos is not None and module.layer_idx >= cfg["exempt_layers"]:
        lam = entropy_scale(pos, cfg["native_ctx"]).to(query.dtype)  # (B or 1, q_len)
        query = query * lam[:, None, :, None]
    return _base_function(module, cfg["base"])(module, query, key, value, attention_mask, **kwargs)


def attn_name(base: str) -> str:
    """One registered name per wrapped implementation: mask builders are global per name, so two models wrapping
    different implementations (e.g. sdpa and attention.backend=flex's harness_causal) must not share one."""
    return ATTN_NAME if base == "sdpa" else f"{ATTN_NAME}_{base}"


def register_attention(base: str) -> str:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    name = attn_name(base)
    AttentionInterface.register(name, entropy_abf_attention)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(base)
    if mask_fn is not None:
        AttentionMaskInterface.register(name, mask_fn)
    return name


@METHODS.register("entropy_abf")
class EntropyABF(Method):
    needs = Needs(rope=True, attention_interface=True)

    @dataclass
    class Args(MethodArgs):
        name: str = "entropy_abf"
        rope_theta: float = 0.0  # absolute base; 0 = use ratio
        ratio: float = 50.0  # base = ratio x the model's base (the original hard-codes 500,000 = 50 x LLaMA2's 1e4)
        exempt_layers: int = 2  # paper: layers 0 and 1 keep lambda = 1
        scale_all_layers: bool = False  # true = the original code's behaviour (exemption is a no-op there)
        log_base: float = 1.0  # x C: the C in log_C (original: 4096 = LLaMA2's native window)

    def check(self, native_ctx: int, train=None) -> int:
        """Checks the settings; returns log_base in tokens."""
        a = self.args
        check_base(a.name, a.rope_theta, a.ratio)
        if a.exempt_layers < 0:
            raise ConfigError(f"method=entropy_abf: exempt_layers must be >= 0, got {a.exempt_layers}")
        n = window_tokens(a.log_base, native_ctx, "method=entropy_abf: log_base", zero_ok=False)
        if n < 2:
            raise ConfigError(f"method=entropy_abf: log_base = {a.log_base:g} C = {n} tokens; log_C needs C >= 2 "
                              f"(valid: >= {2 / native_ctx:g})")
        return n

    def apply(self, handle) -> None:
        a = self.args
        log_base = self.check(handle.native_ctx)
        model = handle.model
        theta = float(a.rope_theta if a.rope_theta > 0 else a.ratio * rope_base(model.config))
        set_rope_parameters(model, rope_type="default", rope_theta=theta)
        base = model.config._attn_implementation
        if base.startswith(ATTN_NAME):  # applied twice: keep the first wrapped implementation
            base = next(m._eabf["base"] for m in model.modules() if "_eabf" in m.__dict__)
        name = register_attention(base)
        cfg = {"base": base, "native_ctx": log_base,
               "exempt_layers": 0 if a.scale_all_layers else int(a.exempt_layers)}
        n = 0
        for m in model.modules():
            if hasattr(m, "layer_idx") and hasattr(m, "q_proj"):
                m._eabf = dict(cfg)
                n += 1
        if n == 0:
            raise ConfigError("method=entropy_abf: found no attention modules (need Llama-style q_proj/layer_idx)")
        model.set_attn_implementation(name)
