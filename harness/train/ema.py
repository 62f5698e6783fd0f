"""Exponential moving average of the weights with a constant decay (the controlled study's recipe); the evaluated
model uses the EMA weights. Both engines keep one :class:`EMA` (the DeepSpeed engine over each rank's partitions).

Update ``t`` (1-based, one per optimizer step) moves the average towards the new weights ``w_t``:
``ema <- ema + u_t * (w_t - ema)``. The average starts at the base model's weights, so

- without bias correction (``u_t = 1 - d``), after ``T`` steps the base model keeps a weight of ``d^T`` in the
  evaluated weights (:func:`base_share`): at d = 0.999, 38.5% after the paper's 953 steps (1B tokens in steps of
  32 x 32k) and 62% for NTK-64K (476 steps of 32 x 64k). docs/ema.md has the arithmetic.
- with bias correction (``u_t = (1 - d) / (1 - d^t)``, so ``u_1 = 1``), the average is Adam's bias-corrected one,
  ``(1 - d) / (1 - d^T) * sum_t d^(T - t) w_t``: only fine-tuned iterates, the base model's share is 0.

Which to use: the paper says only "an exponential moving average (EMA) of model weights with a constant decay"
(Section 4 and Appendix); LCEG's released fine-tune.py has no EMA at all. Both mean the evaluated model to be the
fine-tuned one, not a blend with the base. So the paper recipes (``conf/train/paper*.yaml``) set
``ema_bias_correction: true`` and a decay of 0.99, a window of ~100 of their 953 steps; measured on the CPU
miniature in docs/ema.md. ``train.ema=false`` (or ``train.ema_decay=0``) evaluates the last iterate, as LCEG's
code does. ``TrainArgs.ema_bias_correction`` defaults to false: the behaviour the committed tiny-study rows were
trained with (0.9^512: a base share of 4e-24, so there it changes nothing) and the config hash they are found by.

The update is one fused ``torch._foreach_lerp_`` over all shadow tensors, in place, with no per-step copies of fp32
weights (a cast only when the weights are not fp32, e.g. bf16 training). The shadow always holds the evaluated
(corrected) average, so copying it out and checkpointing it need no correction; a resumed run restores the update
count ``steps`` with the shadow, which the next ``u_t`` depends on.
"""
from __future__ import annotations

import torch


def update_weight(decay: float, step: int, bias_correction: bool) -> float:
    """``u_t`` of update ``step`` (1-based): ``1 - decay``, or ``(1 - decay) / (1 - decay^step)`` corrected."""
    if not bias_correction:
        return 1.0 - decay
    return (1.0 - decay) / (1.0 - decay ** step)


def base_share(decay: float, steps: int, bias_correction: bool) -> float:
    """The base model's weight in the average after ``steps`` updates: ``decay^steps``, 0 with bias correction."""
    return 0.0 if bias_correction else decay ** steps


def record(ema) -> dict | None:
    """The results row's ``train_info["ema"]`` from an :class:`EMA` after training: what the evaluated weights
    average (None: no EMA, the last iterate is evaluated)."""
    if ema is None:
        return None
    return {"decay": ema.decay, "bias_correction": ema.bias_correction, "steps": ema.steps,
            "base_share": base_share(ema.decay, ema.steps, ema.bias_correction)}


@torch.no_grad()
def ema_update_(shadow: list[torch.Tensor], params: list[torch.Tensor], weight: float) -> None:
    """``shadow[i] <- shadow[i] + weight * (params[i] - shadow[i])`` in place (one foreach call)."""
    if not shadow:
        return
    src = [p.detach() if p.dtype == s.dtype else p.detach().to(s.dtype) for s, p in zip(shadow, params)]
    torch._foreach_lerp_(shadow, src, weight)


def whole(p: torch.Tensor) -> torch.Tensor:
    """What one process holds of a parameter in the single engine: all of it."""
    return p.data


class EMA:
    """The one EMA of both engines: an fp32 shadow, by parameter name, of the piece of every trainable parameter this
    process holds (``local``: :func:`whole` in the single engine; each rank's ZeRO-3 partition in the DeepSpeed
    engine, ``harness.train.deepspeed_engine.partition``), updated once per optimizer step (:meth:`update`), copied
    into those pieces after training (:meth:`copy_to`), and kept in a checkpoint with its update count
    (:meth:`state_dict`, which the next bias-corrected update depends on)."""

    def __init__(self, params, decay: float, bias_correction: bool = False, local=whole):
        """``params``: a module (its trainable parameters) or ``(name, parameter)`` pairs."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        named = params.named_parameters() if isinstance(params, torch.nn.Module) else params
        self.params = {n: p for n, p in named if p.requires_grad}
        self.decay, self.bias_correction, self.steps, self.local = decay, bias_correction, 0, local
        self.shadow = {n: local(p).detach().float().clone() for n, p in self.params.items()}

    def update(self) -> None:
        self.steps += 1
        ema_update_(list(self.shadow.values()), [self.local(p) for p in self.params.values()],
                    update_weight(self.decay, self.steps, self.bias_correction))

    @torch.no_grad()
    def copy_to(self) -> None:
        """The averages into the parameters (the evaluated weights)."""
        for n, p in self.params.items():
            self.local(p).copy_(self.shadow[n].to(self.local(p).dtype))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "bias_correction": self.bias_correction, "steps": self.steps,
                "shadow": self.shadow}

    def load_state_dict(self, sd: dict) -> None:
        """A checkpoint's state (read on the CPU), each shadow placed where its parameter's piece lives."""
        self.decay, self.bias_correction, self.steps = sd["decay"], sd["bias_correction"], sd["steps"]
        self.shadow = {n: sd["shadow"][n].to(device=self.local(p).device, dtype=torch.float32, copy=True)
                       for n, p in self.params.items()}
