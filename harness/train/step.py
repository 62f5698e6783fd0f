"""The training step shared by the single-process and the DeepSpeed engines."""
from __future__ import annotations

import math

import torch

from harness.evals.common import autocast


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the peak LR at optimizer step ``s``: linear warm-up, then the named schedule."""

    def f(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        p = (s - warmup) / max(1, total - warmup)
        if schedule == "constant_with_warmup":
            return 1.0
        if schedule == "linear":
            return max(0.0, 1.0 - p)
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, p)))
        raise ValueError(f"unknown LR schedule {schedule!r}")

    return f


def micro_step(model, batch: dict, accumulation: int, dtype: str, backward=None) -> float:
    """Forward + backward of one micro-batch, loss scaled by 1/accumulation. Returns the unscaled loss.

    ``backward`` lets an engine own the backward call (DeepSpeed: ``engine.backward``)."""
    dev = next(model.parameters()).device
    with autocast(dev, dtype):
        loss = model(**batch).loss
    value = loss.item()
    if not math.isfinite(value):
        raise FloatingPointError(f"non-finite training loss ({value})")
    scaled = loss / accumulation
    (backward or torch.Tensor.backward)(scaled)
    return value
