"""Exponential moving average of the weights with a constant decay (the controlled study's recipe):
``ema <- decay * ema + (1 - decay) * w`` after every optimizer step; the evaluated model uses the EMA weights.

The update is one fused ``torch._foreach_lerp_`` over all shadow tensors (``ema + (1 - decay) * (w - ema)``), in
place, with no per-step copies of fp32 weights (a cast only when the weights are not fp32, e.g. bf16 training).
"""
from __future__ import annotations

import torch


@torch.no_grad()
def ema_update_(shadow: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """``shadow[i] <- decay * shadow[i] + (1 - decay) * params[i]`` in place (one foreach call)."""
    if not shadow:
        return
    src = [p.detach() if p.dtype == s.dtype else p.detach().to(s.dtype) for s, p in zip(shadow, params)]
    torch._foreach_lerp_(shadow, src, 1.0 - decay)


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.shadow = {n: p.detach().clone().float() for n, p in model.named_parameters() if p.requires_grad}

    def update(self, model: torch.nn.Module) -> None:
        pairs = [(self.shadow[n], p) for n, p in model.named_parameters() if n in self.shadow]
        ema_update_([s for s, _ in pairs], [p for _, p in pairs], self.decay)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        for n, p in model.named_parameters():
            if n in self.shadow:
                p.copy_(self.shadow[n].to(p.dtype))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, sd: dict) -> None:
        self.decay = sd["decay"]
        self.shadow = {k: v.clone() for k, v in sd["shadow"].items()}
