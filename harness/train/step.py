"""The training step shared by the single-process and the DeepSpeed engines."""
from __future__ import annotations

import math

import torch

from harness.device import autocast
from harness.safe import NonFinite


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


def adamw_settings(a) -> dict:
    """The recipe's AdamW settings (``TrainArgs``: lr, betas, weight decay; eps torch's default): the one source of
    both engines' optimizer, the torch AdamW and DeepSpeed's JSON alike."""
    return {"lr": a.lr, "betas": tuple(a.betas), "eps": 1e-8, "weight_decay": a.weight_decay}


def optimizer(a, params: list, fused: bool = False) -> torch.optim.AdamW:
    """The recipe's optimizer over ``params`` (``fused``: torch's fused kernel, on the GPU partitions)."""
    return torch.optim.AdamW(params, **adamw_settings(a), **({"fused": True} if fused else {}))


def scheduler(a, opt, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The recipe's LR schedule over ``total`` optimizer steps (:func:`lr_lambda`), both engines."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(a.schedule, a.warmup_steps, total))


def micro_step(model, batch: dict, accumulation: int, dtype: str, backward=None, loss_fn=None) -> torch.Tensor:
    """Forward + backward of one micro-batch, loss scaled by 1/accumulation. Returns the unscaled loss as a
    detached 0-d tensor: no host sync here (on GPU a per-micro-batch ``.item()`` stalls the launch queue between
    forward and backward); the caller reads the step's losses once with ``step_loss``.

    ``backward`` lets an engine own the backward call (DeepSpeed: ``engine.backward``); ``loss_fn(model, batch,
    accumulation) -> (to back-propagate, loss)`` replaces the model's own loss (sequence parallelism's slice loss,
    ``harness.train.zero.sequence``)."""
    dev = next(model.parameters()).device
    with autocast(dev, dtype):
        if loss_fn is None:
            loss = model(**batch).loss
            scaled = loss / accumulation
        else:
            scaled, loss = loss_fn(model, batch, accumulation)
    (backward or torch.Tensor.backward)(scaled)
    return loss.detach()


def step_loss(micro_losses: list[torch.Tensor], accumulation: int, step: int | None = None,
              total: int | None = None) -> float:
    """The optimizer step's loss (mean of its micro-batch losses) with one host sync per step. Raises on a
    non-finite loss, naming the step (0-based) when given; callers read it before the optimizer step, so such a
    step never reaches the weights."""
    values = torch.stack(micro_losses).tolist()
    loss = 0.0
    for v in values:
        if not math.isfinite(v):
            at = "" if step is None else f" at step {step}" + ("" if total is None else f" of {total}")
            raise FloatingPointError(f"non-finite training loss ({v}){at}")
        loss += v / accumulation
    return loss


def check_finite_weights(model, where: str) -> None:
    """Raise ``NonFinite`` naming the first parameter that holds a NaN or an infinity: the loss of a step is read
    before its update, so the last update of a diverging run (2 steps at lr=1e9) is only seen in the weights."""

    for name, p in model.named_parameters():
        if p.numel() and not bool(torch.isfinite(p.detach()).all()):
            raise NonFinite(f"{where}: non-finite weights in {name} (the training diverged; lower train.lr)")


def document_position_ids(input_ids: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Position ids that restart at 0 at every BOS token (each packed document starts at position 0).

    Given such ``position_ids`` and no ``attention_mask``, transformers (>= 4.54, ``masking_utils.
    find_packed_sequence_indices``) also makes the causal mask block-diagonal, so attention never crosses a
    document boundary (sdpa/eager/flex; flash-attention uses the same position ids as varlen boundaries)."""
    L = input_ids.shape[-1]
    ar = torch.arange(L, device=input_ids.device).expand_as(input_ids)
    is_start = input_ids == bos_id
    is_start[..., 0] = True  # a chunk that starts inside a document: its first token is position 0
    start_at = torch.where(is_start, ar, torch.zeros_like(ar)).cummax(dim=-1).values
    return ar - start_at


def add_document_positions(batch: dict, bos_id: int) -> dict:
    """Add document-restarting ``position_ids`` to a training batch (LongRoPE2-style mixed windows need them).

    ``use_cache=False`` matters: transformers only derives the packed (block-diagonal) mask when no KV cache
    object exists, and a model with ``config.use_cache`` creates one even in training."""
    if "position_ids" in batch:
        return batch
    return {**batch, "position_ids": document_position_ids(batch["input_ids"], bos_id), "use_cache": False}
