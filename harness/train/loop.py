"""Single-process fine-tuning engine: AdamW + linear warm-up + EMA, resumable from atomic checkpoints.

Resumption: checkpoints live in ``ckpt_dir`` (the directory of the run's resume key: model, method, data and train
configs plus the training code's version; ``harness.train.checkpoint``), each written to a temporary directory of
its own and renamed into place under a lock, holding model, optimizer, scheduler, EMA, step (= data position:
chunk ``i`` of the packed data is used at a fixed step) and every RNG state, as tensors + JSON (no pickle). Started
again with the same command, a killed run resumes from the newest checkpoint that loads (a corrupt one is named in
a warning and the previous one used) and, on CPU, ends with the same weights as an uninterrupted run. A checkpoint
with another key is never resumed from. A finished run removes the checkpoints unless ``train.keep_checkpoints``.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from harness.device import model_device
from harness.train import TrainArgs
from harness.train.checkpoint import Store, load_state, read_file, save_error, save_state
from harness.train.ema import EMA
from harness.train.ema import record as ema_record
from harness.train.step import add_document_positions, micro_step, optimizer, scheduler, step_loss


def batches_for_step(chunks: np.ndarray, step: int, accumulation: int, micro: int, rank: int = 0, world: int = 1):
    """The micro-batches of optimizer step ``step`` for ``rank``: a pure function of (step, rank), which is what
    makes resumption exact and ranks disjoint."""
    per_step = accumulation * micro * world
    n = len(chunks)
    for a in range(accumulation):
        start = step * per_step + (a * world + rank) * micro
        idx = [(start + j) % n for j in range(micro)]
        ids = torch.from_numpy(np.asarray(chunks[idx], dtype=np.int64))
        yield ids


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


def save_checkpoint(ckpt_dir: Path, step: int, model, opt, sched, ema, fingerprint: str, info: dict) -> Path:
    store = Store(ckpt_dir, fingerprint)
    tmp = store.new_tmp(step)
    try:
        save_model(model, str(tmp / "model.safetensors"))  # handles tied weights (shared tensors)
        save_state(tmp, "train_state", {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                                        "ema": ema.state_dict() if ema else None, "rng": rng_state()})
        return store.publish(tmp, step, {"fingerprint": fingerprint, **info})
    except BaseException as e:
        store.discard(tmp)  # a full disk: free what this save took, so the failed row can still be written
        err = save_error(e, store.root, step)
        if err is e:
            raise
        raise err from e


def load_checkpoint(ckpt_dir: Path, fingerprint: str, model, opt, sched, ema) -> dict | None:
    """Restore the newest loadable checkpoint into the given objects; its ``meta.json`` or None."""

    def load(d: Path, meta: dict) -> dict:
        state = load_state(d, "train_state")  # everything read and checked before anything is changed
        read_file(d / "model.safetensors", lambda p: load_model(model, p, strict=True))
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if ema and state["ema"]:
            ema.load_state_dict(state["ema"])
        restore_rng_state(state["rng"])
        return meta

    _, meta, _ = Store(ckpt_dir, fingerprint).load_newest(load)
    return meta


def finetune(handle, method, chunks: np.ndarray, a: TrainArgs, ckpt_dir: Path, fingerprint: str,
             progress=None, on_step=None) -> dict:
    """Fine-tune ``handle.model`` in place on ``chunks``; returns what was actually done (for the results row).

    ``on_step(step, model, ema)``, if given, is called after every optimizer step (learning curves evaluate the
    EMA weights at chosen steps through it, ``scripts/recipe_curves.py``); it must leave the weights as it found
    them."""
    model = handle.model
    torch.manual_seed(a.seed)
    method.train_mode(handle)
    if a.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt, total = optimizer(a, params), a.steps()
    sched, accumulation = scheduler(a, opt, total), a.accumulation()
    ema = EMA(model, a.ema_decay, a.ema_bias_correction) if a.ema else None
    start, resumed_from, losses = 0, None, []
    meta = load_checkpoint(ckpt_dir, fingerprint, model, opt, sched, ema)
    if meta is not None:
        start = resumed_from = meta["step"]
        losses = list(meta.get("losses", []))
    bos = handle.tokenizer.bos_token_id if handle.tokenizer is not None else None
    dev = model_device(model)
    t0 = saved_at = time.time()
    tokens_per_step = a.global_batch * a.seq_len
    for step in range(start, total):
        micro = []
        for ids in batches_for_step(chunks, step, accumulation, a.micro_batch):
            batch = method.train_batch(ids.to(dev))  # on the model's device (its input embeddings' under device_map)
            if a.doc_masking and bos is not None:
                batch = add_document_positions(batch, bos)
            micro.append(micro_step(model, batch, accumulation, a.autocast))
        # the step's one host sync; raises before a NaN reaches the weights
        loss = step_loss(micro, accumulation, step, total)
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if ema:
            ema.update()
        losses.append(loss)
        if progress:
            progress(step + 1, total, loss, tokens_per_step * (step + 1 - start) / max(1e-9, time.time() - t0),
                     sched.get_last_lr()[0])
        if on_step:
            on_step(step + 1, model, ema)
        if save_due(a, step + 1, total, saved_at):
            save_checkpoint(ckpt_dir, step + 1, model, opt, sched, ema, fingerprint,
                            {"tokens": tokens_per_step * (step + 1), "losses": losses})
            saved_at = time.time()
    wall = time.time() - t0
    if not a.keep_checkpoints:
        Store(ckpt_dir, fingerprint).cleanup()  # finished: the weights go to the run directory
    if ema:
        ema.copy_to()
    model.eval()
    method.eval_mode(handle)
    return train_info(a, ema, losses, start, resumed_from, wall)


def save_due(a: TrainArgs, done: int, total: int, saved_at: float) -> bool:
    """A resumable checkpoint after ``done`` of ``total`` steps: every ``save_every`` steps, and once
    ``save_every_s`` seconds passed since the last one (``saved_at``); never after the last step."""
    if done >= total:
        return False
    return bool((a.save_every and done % a.save_every == 0) or
                (a.save_every_s and time.time() - saved_at >= a.save_every_s))


def train_info(a: TrainArgs, ema, losses: list, start: int, resumed_from: int | None, wall: float) -> dict:
    """What the single engine did, for the row's ``train_info``: the recipe as run, the EMA, the losses, the speed."""
    total, accumulation, tokens_per_step = a.steps(), a.accumulation(), a.global_batch * a.seq_len
    return {
        "engine": "single", "steps": total, "resumed_from_step": resumed_from,
        "tokens_seen": tokens_per_step * total, "seq_len": a.seq_len,
        "effective_global_batch": a.micro_batch * accumulation * 1, "micro_batch": a.micro_batch,
        "grad_accumulation": accumulation, "world_size": 1, "lr": a.lr, "schedule": a.schedule,
        "warmup_steps": a.warmup_steps, "weight_decay": a.weight_decay,
        "ema": ema_record(ema), "doc_masking": a.doc_masking,
        "grad_checkpointing": a.grad_checkpointing, "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None, "losses": [round(x, 4) for x in losses],
        "train_seconds": round(wall, 2),
        "tokens_per_second": round(tokens_per_step * (total - start) / max(wall, 1e-9), 1),
    }
