"""Shared RoPE plumbing for the exact-attention methods: rewrite ``config.rope_parameters`` and rebuild the rotary
module(s) through transformers' own ``XRotaryEmbedding(config)``, so inv_freq, attention scaling and the dynamic
update decorator are transformers' code, not ours. Not a method itself (no registration)."""
from __future__ import annotations

import torch


def rope_base(config) -> float:
    rp = getattr(config, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def set_rope_parameters(model, **params) -> dict:
    """Replace the model's RoPE parameters (keeping rope_theta / partial_rotary_factor unless given) and rebuild
    every rotary-embedding module from the new config. Returns the new parameters."""
    config = model.config
    old = dict(getattr(config, "rope_parameters", None) or {})
    new = {"rope_theta": old.get("rope_theta", rope_base(config))}
    if "partial_rotary_factor" in old:
        new["partial_rotary_factor"] = old["partial_rotary_factor"]
    new.update(params)
    config.rope_parameters = new
    if hasattr(config, "rope_scaling"):
        try:
            config.rope_scaling = None
        except Exception:
            pass
    rebuild_rotary(model)
    return new


def rebuild_rotary(model) -> None:
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "inv_freq"):
                device = child.inv_freq.device
                new = type(child)(config=model.config, device=device)
                setattr(parent, child_name, new)


def rotary_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "inv_freq")]


@torch.no_grad()
def inv_freq_of(model) -> torch.Tensor:
    return rotary_modules(model)[0].inv_freq.detach().clone()
