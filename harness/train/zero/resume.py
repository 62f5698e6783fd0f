"""The DeepSpeed engine's checkpoints: every rank saves its part (DeepSpeed's files, its EMA partition and RNG
states) and rank 0 publishes the step; a resume loads the newest checkpoint every rank can read, and DeepSpeed's own
files are read without unpickling arbitrary objects (``harness.train.deepspeed_engine``, "Resumption")."""
from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from harness.train.checkpoint import (
    CheckpointError,
    OtherKey,
    Store,
    load_state,
    safe_torch_load,
    save_error,
    save_state,
)
from harness.train.loop import restore_rng_state, rng_state


def deepspeed_safe_globals() -> list:
    """The classes besides tensors and containers that DeepSpeed's checkpoint files hold (allow-listed for
    ``torch.load(weights_only=True)``)."""
    out = []
    for mod, names in (("deepspeed.runtime.fp16.loss_scaler", ("LossScaler", "DynamicLossScaler")),
                       ("deepspeed.runtime.zero.config", ("ZeroStageEnum",)),
                       ("deepspeed.utils.tensor_fragment", ("fragment_address",))):
        try:
            m = __import__(mod, fromlist=list(names))
        except ImportError:
            continue
        out += [getattr(m, n) for n in names if hasattr(m, n)]
    return out


def safe_checkpoint_engine(engine) -> None:
    """Make DeepSpeed read its checkpoint files with ``torch.load(weights_only=True)``."""
    allowed = deepspeed_safe_globals()
    engine.checkpoint_engine.load = lambda path, map_location=None: safe_torch_load(path, map_location, allowed)


def resume(engine, ema, store: Store, rank: int, world: int):
    """Load the newest checkpoint every rank can read (see the module docstring); its ``meta.json`` or None."""
    lock = store.lock() if rank == 0 else None
    if lock is not None:
        lock.acquire()
    try:
        dist.barrier()
        box = [[str(d) for d in store.steps()] if rank == 0 and store.root.is_dir() else []]
        dist.broadcast_object_list(box, src=0)
        for i, d in enumerate(Path(p) for p in box[0]):
            meta, state, err = None, None, None
            try:
                meta = store.verify(d, digests=rank == 0)  # rank 0 hashes; the gather below shares its verdict
                if meta.get("world_size") == world:
                    state = load_state(d, f"rank{rank}")
            except CheckpointError as e:
                err = (str(e.path), str(e).split(": ", 1)[-1], isinstance(e, OtherKey))
            errs = [None] * world
            dist.all_gather_object(errs, err)
            bad = [e for e in errs if e is not None]
            if bad:
                if rank == 0 and not all(e[2] for e in bad):
                    nxt = f"falling back to {box[0][i + 1]}" if i + 1 < len(box[0]) else "starting from step 0"
                    print(f"warning: checkpoint file {bad[0][0]} is unusable ({bad[0][1]}); {nxt}", file=sys.stderr,
                          flush=True)
                continue
            if meta.get("world_size") != world:
                continue  # written by another number of ranks: another partition layout
            engine.load_checkpoint(str(d), tag="ds", load_optimizer_states=True, load_lr_scheduler_states=True)
            if ema is not None and state["ema"] is not None:
                ema.load_state_dict(state["ema"])
            restore_rng_state(state["rng"])
            return meta
        return None
    finally:
        dist.barrier()
        if lock is not None:
            lock.release()


def save(engine, ema, store: Store, step: int, fingerprint: str, world: int, rank: int, losses: list,
          tokens_per_step: int) -> Path | None:
    """Write and publish the checkpoint of ``step`` (every rank); rank 0 gets its published directory."""
    box = [str(store.new_tmp(step)) if rank == 0 else None]  # this run's own temporary directory
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    published = None
    try:
        engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
        save_state(tmp, f"rank{rank}", {"ema": ema.state_dict() if ema is not None else None, "rng": rng_state()})
        dist.barrier()
        if rank == 0:
            published = store.publish(tmp, step, {"fingerprint": fingerprint, "world_size": world,
                                                  "tokens": tokens_per_step * step, "losses": losses})
        dist.barrier()
        return published
    except BaseException as e:
        if rank == 0:
            store.discard(tmp)  # a full disk: free what this save took
        err = save_error(e, store.root, step)
        if err is e:
            raise
        raise err from e
