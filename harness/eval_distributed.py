"""Data-parallel evaluation: one node's GPUs (or CPU ranks with gloo) evaluate one run together.

``eval_world_size`` (``conf/config.yaml``): ``auto`` = the number of visible CUDA GPUs (1 on a CPU machine), or an
integer N >= 1. With 1 the evaluation stage is one process (``pipeline.evaluations``'s plain loop, unchanged). With
N > 1:

- Parent (``evaluate_parallel``, called by ``pipeline.evaluate_units`` for consecutive units of the evaluation plan
  on one placement). Writes ``<run_dir>/eval_job/spec.json``: the resolved config, with ``model.path`` set to the
  weights to load (the fine-tuned ``<run_dir>/checkpoint`` that ``pipeline.finetune`` saved, else what the parent
  loaded: the base, or a shard's checkpoint), the units (each its entry, the node its evaluator is built from, and
  where its per-sample records go) and the run directory. Moves its own model copy off the GPU, starts N ranks of
  ``scripts/eval_distributed.py`` with torchrun (``harness.train.deepspeed_engine.run_torchrun``: the ranks die with
  the parent, and watch it), and reads back rank 0's output of every unit as soon as it is written
  (``eval_job/out/<i>.json``), yielding ``(output, seconds)`` in order, so the row is built by the same code and
  partial progress still reaches it. The ranks never cut a suite: they run the units ``harness.evals.suite.plan``
  made.
- Rank (``eval_rank``). Device ``cuda:LOCAL_RANK`` with NCCL, or the CPU with gloo. Builds the model and the method
  from the same config (deterministic: the same weights as the parent's), and runs each unit's evaluator with an
  ``EvalContext`` of its rank: ``ctx.map`` splits each evaluator's prompts into contiguous blocks by rank and
  all-gathers the per-prompt results, so every rank computes the same metrics; only rank 0 writes samples JSONL and
  outputs (``harness.evals.set_writer``). Evaluators with ``data_parallel = True`` split their work; the others run
  whole on every rank (correct, not faster).
- Results equal a single-process run of the same prompts: prompts are drawn from generators seeded per length and
  task (never per rank), blocks keep the prefix-reuse order, and PPL batches are split at batch edges. Where a block
  starts, the prompt is encoded from scratch instead of reusing the previous prompt's KV cache: equal up to float
  rounding (``harness.evals.common.PrefixCache``).
- Each rank writes ``eval_job/rank<r>.json`` (its device and how many items of ``ctx.map`` it computed).
- A rank that fails writes its one-line error to ``eval_job/error_rank<r>.txt``; torchrun stops the others, and the
  parent raises that line (a ``ConfigError`` stays one).

Limitations: one node (torchrun ``--standalone``); every rank holds a full replica, on its own GPU or, when one
input does not fit one GPU, split over g GPUs (``gpus_per_replica``: rank r holds GPUs r*g .. r*g + g - 1, and
``auto`` runs GPUs // g ranks); an entry's per-sample records are written when the entry ends, not prompt by prompt
(LongBench / many-shot ``resume`` then resumes per entry); LongRoPE's recovered short factors are passed to the
ranks as ``method.factors``.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import torch

from harness.config import ConfigError, to_args
from harness.device import accelerator
from harness.evals import EvalContext, build_evaluators, set_writer
from harness.evals.eval_progress import EvalProgress
from harness.evals.watch import EvalOutOfMemory, oom_line, watch_lengths
from harness.methods import build_method
from harness.methods.flex import AttentionArgs, set_backend
from harness.models import build_model, gpus_of, release
from harness.train.zero.launch import run_torchrun, watch_launcher

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "scripts" / "eval_distributed.py"
KEY = "eval_world_size"


def resolve_world_size(value, key: str = KEY, gpus_per_replica: int = 1) -> int:
    """``auto`` -> the replicas the visible CUDA GPUs hold, each spanning ``gpus_per_replica`` GPUs (a model split
    by ``device_map`` for inputs that do not fit one GPU: ``harness.models.choose_device_map``); 1 without CUDA. An
    integer >= 1 as it is; anything else one line."""
    if value == "auto" or value is None:
        if not torch.cuda.is_available():
            return 1
        return max(1, torch.cuda.device_count() // max(1, int(gpus_per_replica)))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: {value!r} is not a number of ranks (valid: auto = the visible GPUs, or an "
                          f"integer >= 1)")
    return int(value)


# ------------------------------------------------------------------------------------------------ parent side
def model_path(cfg, handle, run_dir: Path) -> str:
    """The weights the ranks load: the run's fine-tuned checkpoint, else what the parent loaded."""
    ckpt = Path(run_dir) / "checkpoint"
    if (ckpt / "config.json").is_file():
        return str(ckpt.resolve())
    path = str(handle.info.get("path") or "")
    if path and os.path.isdir(path):
        return str(Path(path).resolve())
    return str((cfg.get("model") or {}).get("path") or "")


def write_spec(cfg, handle, method, run_dir: Path, units: list, job: Path, gpus: int | None = None,
               samples_dir=None) -> Path:
    """``<job>/spec.json``: the resolved config (``model.path``: the weights to load), the units to evaluate (each
    its entry, the node its evaluator is built from and where its per-sample records go: ``samples_dir(unit)``,
    default ``run_dir``), the GPUs per replica and where rank 0 writes its outputs."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    path = model_path(cfg, handle, run_dir)
    if path:
        plain["model"]["path"] = path
    factors = (getattr(method, "resolved", None) or {}).get("factors_file")
    if getattr(method.args, "recovery", "") and factors:  # LongRoPE after recovery: the recovered factors
        plain["method"]["factors"] = str(factors)
    where = samples_dir or (lambda unit: Path(run_dir))
    spec = {"config": plain, "units": [{"key": u.entry, "node": u.node, "run_dir": str(Path(where(u)).resolve())}
                                       for u in units],
            "gpus_per_replica": gpus_of(handle) if gpus is None else int(gpus),
            "out_dir": str((job / "out").resolve()), "job_dir": str(job.resolve())}
    p = job / "spec.json"
    p.write_text(json.dumps(spec, indent=1))
    return p


def release_gpu(handle) -> None:
    """The parent's model copy leaves the GPU (the ranks need its memory): ``harness.models.release``."""

    release(handle)


def _failure(job: Path, rc) -> Exception:
    lines = []
    # the first error written is the root cause (the other ranks then fail on the broken collective)
    for f in sorted(job.glob("error_rank*.txt"), key=lambda f: f.stat().st_mtime_ns):
        try:
            kind, line = f.read_text().split("\n", 1)
        except (OSError, ValueError):
            continue
        lines.append((f.stem.removeprefix("error_"), kind, line.strip()))
    if lines:
        where, kind, line = lines[0]
        if kind == "ConfigError":
            return ConfigError(line)
        return RuntimeError(f"data-parallel evaluation failed on {where}: {line}")
    return RuntimeError(f"data-parallel evaluation failed (torchrun exit code {rc}); job spec {job / 'spec.json'}")


def evaluate_parallel(cfg, handle, method, units: list, world: int, samples_dir, poll_s: float = 0.2,
                      gpus: int | None = None):
    """Evaluate ``units`` (``harness.evals.suite.plan``'s) in ``world`` ranks; yields ``(output, seconds)`` per unit,
    in order, as rank 0 finishes each (see the module docstring). The job's folder is ``samples_dir(units[0]) /
    eval_job``."""

    run_dir = Path(samples_dir(units[0]))
    job = run_dir / "eval_job"
    out = job / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in [*job.glob("error_rank*.txt"), *job.glob("rank*.json")]:  # a previous attempt's
        f.unlink()
    spec = write_spec(cfg, handle, method, run_dir, units, job, gpus, samples_dir)
    release_gpu(handle)
    box: dict = {}

    def launch():
        try:
            box["rc"] = run_torchrun(spec, world, entry=ENTRY)
        except BaseException as e:  # noqa: BLE001 - reported by the generator
            box["error"] = e

    th = threading.Thread(target=launch, name="eval-torchrun", daemon=True)
    th.start()
    for i in range(len(units)):
        f = out / f"{i}.json"
        while not f.exists():
            if not th.is_alive():
                if f.exists():
                    break
                if "error" in box:
                    raise box["error"]
                raise _failure(job, box.get("rc"))
            th.join(poll_s)
        rec = json.loads(f.read_text())
        yield rec["output"], rec["seconds"]
    th.join()
    if "error" in box:
        raise box["error"]
    if box.get("rc") != 0:
        raise _failure(job, box.get("rc"))


# ------------------------------------------------------------------------------------------------ rank side
def _build_model(model_cfg, device: torch.device, gpus: int = 1):
    """The rank's replica: on ``device``, or split over ``gpus`` GPUs from it on (``harness.models.place``)."""

    return build_model(model_cfg, device=device, device_map=gpus if gpus > 1 else None)


def _rank_progress(rank: int, world: int):
    """Rank 0's progress lines (its own block of each prompt set: 1/world of the prompts), plain lines in the job's
    log; the other ranks stay quiet."""
    if rank != 0:
        return None

    class RankProgress(EvalProgress):
        def __call__(self, entry, done, total):
            super().__call__(f"{entry} (rank 0 of {world})", done, total)

    return RankProgress(terminal=False)


def _write_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def eval_rank(spec_path: str | Path) -> None:
    """One rank of a data-parallel evaluation (``scripts/eval_distributed.py`` under torchrun)."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    watch_launcher()
    spec = json.loads(Path(spec_path).read_text())
    cfg = OmegaConf.create(spec["config"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = int(spec.get("gpus_per_replica", 1))
    on_gpu = torch.cuda.is_available()
    if on_gpu:  # rank r holds GPUs r*g .. r*g + g - 1 (g = 1: its own GPU)

        torch.cuda.set_device(local * gpus)
        device = accelerator(local * gpus)
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        device = torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir, job = Path(spec["out_dir"]), Path(spec["job_dir"])
    try:
        set_writer(rank == 0)
        method = build_method(cfg.method)
        handle = _build_model(cfg.model, device, gpus if on_gpu else 1)
        set_backend(handle.model, to_args(AttentionArgs, cfg.get("attention"), "attention").backend)
        method.apply(handle)
        ctx = EvalContext(run_dir=Path("."), seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")),
                          batch_tokens=int(cfg.get("eval_batch_tokens", 8192)), rank=rank, world_size=world,
                          progress=_rank_progress(rank, world))
        seen: dict = {}  # the decoder's latest input length: an out-of-memory line names it
        watch_lengths(handle, seen)
        if ctx.progress is not None:
            ctx.progress.tokens = seen
        for i, u in enumerate(spec["units"]):  # each unit's evaluator built from its node, as the parent's view
            key, (ev,) = u["key"], build_evaluators({u["key"]: u["node"]})
            ctx.entry, ctx.run_dir = key, Path(u["run_dir"])
            t0 = time.time()
            try:
                output = ev.run(handle, method, ctx)
            except torch.OutOfMemoryError as e:  # one line naming entry, length, device and rank (a ConfigError)
                raise EvalOutOfMemory(f"{oom_line(f'eval.suite.{key}', e, seen, handle)} [rank {rank}]") from e
            seconds = round(time.time() - t0, 2)
            if rank == 0:
                _write_atomic(out_dir / f"{i}.json", {"key": key, "output": output, "seconds": seconds})
        _write_atomic(job / f"rank{rank}.json", {"rank": rank, "world_size": world, "device": str(device),
                                                 "items_computed": ctx.computed})
        dist.barrier()
    except BaseException as e:
        msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()][:1]
        line = msg[0] if isinstance(e, ConfigError) and msg else f"{type(e).__name__}: {' '.join(msg)}".strip()
        try:
            (job / f"error_rank{rank}.txt").write_text(f"{type(e).__name__}\n{line}\n")
        except OSError:
            pass
        raise
    finally:
        set_writer(True)
        dist.destroy_process_group()
