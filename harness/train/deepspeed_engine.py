"""Multi-process fine-tuning engine: DeepSpeed ZeRO (stage 3 by default) launched with torchrun.

Two halves:

- ``launch(...)`` runs in the ``run.py`` process. It writes a job spec (the resolved config, the fingerprint, the
  checkpoint directory), starts ``torchrun --standalone --nproc_per_node=<train.world_size>
  scripts/train_distributed.py <spec>``, waits, and loads the gathered final weights into ``handle.model`` (so the
  evaluation that follows sees the fine-tuned, EMA-averaged model, exactly as with the single-process engine).
- ``train_rank(spec)`` runs in every rank (``scripts/train_distributed.py``). Each rank rebuilds the model and the
  method from the same config (deterministic), reads the same memory-mapped data cache, and trains its disjoint
  slice of every optimizer step (``batches_for_step(step, rank)``) with the step function the single engine uses
  (``harness.train.step.micro_step``, backward through ``engine.backward``).

The DeepSpeed JSON is generated from ``TrainArgs`` by ``ds_config`` (one source of truth): ZeRO stage, CPU offload
(placed *inside* ``zero_optimization``: the controlled study's ``stage3_offload.json`` has ``offload_param`` at the top
level, where DeepSpeed ignores it), bf16, gradient clipping, micro batch x accumulation x world size = global batch.
The LR schedule is the harness's own ``lr_lambda`` passed as a client scheduler; the JSON never has a ``scheduler``
block (in the study's release a DeepSpeed ``WarmupDecayLR`` silently overrides the "constant_with_warmup" it asks for).

Optimizer: on GPU, or with offload, DeepSpeed's own AdamW (FusedAdam / DeepSpeedCPUAdam, JIT-compiled with ninja into
``TORCH_EXTENSIONS_DIR``); on CPU without offload, torch's AdamW as a client optimizer
(``zero_allow_untested_optimizer``), which needs no compiled op and is the same update rule as the single engine.
``train.optimizer`` = auto | torch | deepspeed overrides the choice.

EMA under ZeRO-3: each rank keeps an fp32 EMA of *its own partition* of every parameter (``param.ds_tensor``), updated
after every optimizer step; memory is 4 bytes x params / world_size per rank, and no communication is needed. At the
end every parameter's EMA partitions are all-gathered on rank 0 (not ``GatheredParameters``: ZeRO-3 keeps small
parameters "persistent" and would hand back their last iterate), which writes ``final/model.safetensors``
(loadable in a single process). With bf16 training the EMA follows the bf16 partitions (not the fp32 master copy)
-- a rounding-level difference from an EMA of the master weights. With ZeRO stage 0-2 parameters are not
partitioned and the EMA covers the full tensors.

Resumption: every ``save_every`` steps all ranks write a DeepSpeed checkpoint (model, optimizer partitions, client
scheduler) plus one state per rank (EMA partition, RNG states; tensors + JSON) into a temporary directory of this
run's own; rank 0 publishes it as ``step_N`` under the key's lock (``harness.train.checkpoint.Store``: ``meta.json``
with step, key, losses and every file's size). The data position is the step (``batches_for_step``), so a killed
run started again with the same command continues with the same batches. On resume rank 0 holds the lock while
every rank checks the newest checkpoint's files (sizes, its own state file); if any rank finds a bad file, rank 0
warns naming it and all ranks move on to the previous checkpoint together. DeepSpeed's own files are read with
``torch.load(weights_only=True)`` (a few DeepSpeed classes allow-listed), never by unpickling arbitrary objects.
A corrupt file that keeps its size and fails inside ``engine.load_checkpoint`` fails the run (ranks cannot agree
on a fallback from inside DeepSpeed's collective load).

Process lifetime: torchrun gets SIGTERM when the launching process dies (Linux ``PR_SET_PDEATHSIG``; torchrun then
stops its ranks), and every rank watches its parent and the launching process (``HARNESS_LAUNCHER_PID``) and kills
itself within a second of either disappearing, so a killed ``run.py`` never leaves ranks training and writing
checkpoints.

Limitations: every rank loads the full model in host memory before DeepSpeed partitions it (no ``zero.Init``);
for LLaMA2-7B in bf16 that is ~13.5 GB per rank. ``run.py`` launches one node; for several nodes run
``scripts/train_distributed.py <spec>`` under your own ``torchrun --nnodes ...`` with a spec written by a previous
launch (``<run_dir>/train_job/spec.json``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from harness.train import TrainArgs
from harness.train.checkpoint import (
    CheckpointError,
    OtherKey,
    Store,
    load_state,
    safe_torch_load,
    save_error,
    save_state,
)
from harness.train.ema import ema_update_
from harness.train.loop import _rng_state, _set_rng_state, batches_for_step
from harness.train.step import add_document_positions, lr_lambda, micro_step, step_loss

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "scripts" / "train_distributed.py"


# ----------------------------------------------------------------------------------------------- config
def use_ds_optimizer(a: TrainArgs, on_gpu: bool) -> bool:
    if a.optimizer == "torch":
        return False
    if a.optimizer == "deepspeed":
        return True
    return on_gpu or a.offload


def bf16_enabled(a: TrainArgs, on_gpu: bool = False) -> bool:
    """DeepSpeed's bf16 switch from ``train.autocast``: ``auto`` is bf16 on a GPU and on CPUs with native bf16
    (``harness.device.resolve_dtype``, which answers with a dtype *name*)."""
    if a.autocast == "bfloat16":
        return True
    if a.autocast == "auto":
        from harness.device import resolve_dtype

        return resolve_dtype("auto", torch.device("cuda") if on_gpu else None) == "bfloat16"
    return False


def ds_config(a: TrainArgs, on_gpu: bool = False) -> dict:
    """The DeepSpeed JSON for this train config (no other source of DeepSpeed settings exists)."""
    acc = a.accumulation()
    zero: dict = {"stage": a.zero_stage, "contiguous_gradients": True, "overlap_comm": bool(on_gpu),
                  "reduce_bucket_size": 5e7, "stage3_gather_16bit_weights_on_model_save": True}
    if a.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": bool(on_gpu)}
        if a.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": bool(on_gpu)}
    cfg = {
        "train_batch_size": a.global_batch,
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": acc,
        "gradient_clipping": a.grad_clip if a.grad_clip > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16_enabled(a, on_gpu)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if use_ds_optimizer(a, on_gpu):
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": a.lr, "betas": list(a.betas), "eps": 1e-8,
                                                        "weight_decay": a.weight_decay}}
    return cfg


# ----------------------------------------------------------------------------------------------- parent side
def _torch_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(ROOT / ".cache" / "torch_extensions")


def write_spec(cfg_plain: dict, ckpt_dir: Path, fingerprint: str, job_dir: Path) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = {"config": cfg_plain, "fingerprint": fingerprint, "ckpt_dir": str(Path(ckpt_dir).resolve()),
            "out_dir": str(job_dir.resolve())}
    path = job_dir / "spec.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child (``preexec_fn``): have the kernel send ``sig`` when the parent dies (Linux; elsewhere a no-op,
    the ranks' watchdog still ends them)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_torchrun(spec_path: Path, world_size: int, log=None) -> int:
    """Start ``world_size`` ranks on this node and wait; returns torchrun's exit code. torchrun and its ranks end
    when this process ends, however it ends (see the module docstring)."""
    env = os.environ.copy()
    env.setdefault("TORCH_EXTENSIONS_DIR", _torch_extensions_dir())
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HARNESS_LAUNCHER_PID"] = str(os.getpid())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
           str(ENTRY), str(spec_path)]
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.run(cmd, env=env, cwd=os.getcwd(), stdout=log, stderr=subprocess.STDOUT if log else None,
                          preexec_fn=preexec).returncode


def watch_launcher(poll_s: float = 1.0) -> None:
    """In a rank: kill this process as soon as its parent (torchrun) or the launching ``run.py`` is gone."""
    from harness.results import pid_alive

    parent = os.getppid()
    launcher = int(os.environ.get("HARNESS_LAUNCHER_PID") or 0)

    def watch():
        while True:
            if os.getppid() != parent or (launcher and not pid_alive(launcher)):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()


def load_final(handle, method, out_dir: Path) -> dict:
    """Load the gathered weights written by rank 0 into ``handle.model`` (train_mode first, so parameter names
    match what was trained, then eval_mode, as the single engine does)."""
    from safetensors.torch import load_file

    final = Path(out_dir) / "final"
    info = json.loads((final / "info.json").read_text())
    method.train_mode(handle)
    state = load_file(final / "model.safetensors")
    model = handle.model
    names = {n for n, _ in model.named_parameters()}
    missing = sorted(names - set(state))
    if missing:
        raise RuntimeError(f"distributed checkpoint lacks parameters: {missing[:5]}")
    model.load_state_dict(state, strict=False)
    model.eval()
    method.eval_mode(handle)
    return info


def launch(cfg, handle, method, a: TrainArgs, ckpt_dir: Path, fingerprint: str, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    job = Path(run_dir) / "train_job"
    spec = write_spec(OmegaConf.to_container(cfg, resolve=True), ckpt_dir, fingerprint, job)
    rc = run_torchrun(spec, a.world_size)
    if rc != 0:
        raise RuntimeError(f"distributed training failed (torchrun exit code {rc}); job spec {spec}")
    return load_final(handle, method, job)


# ----------------------------------------------------------------------------------------------- rank side
def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a parameter: its ZeRO-3 partition, or the whole tensor when not partitioned."""
    t = getattr(p, "ds_tensor", None)
    return t if t is not None else p.data


class PartitionEMA:
    """EMA of each rank's parameter partitions (fp32), constant decay."""

    def __init__(self, params: list, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.params, self.decay = params, decay
        self.shadow = [_local(p).detach().float().clone() for p in params]

    def update(self) -> None:
        ema_update_(self.shadow, [_local(p) for p in self.params], self.decay)

    @torch.no_grad()
    def copy_to_params(self) -> None:
        for p, s in zip(self.params, self.shadow):
            _local(p).copy_(s.to(_local(p).dtype))


def _gather_full(p: torch.Tensor, local: torch.Tensor, dev) -> torch.Tensor:
    """The full tensor of parameter ``p`` from every rank's partition ``local`` (ZeRO-3 partitions are contiguous
    slices of the flattened parameter, in rank order, padded at the end)."""
    if getattr(p, "ds_tensor", None) is None:
        return local
    import torch.distributed as dist

    flat = local.reshape(-1).to(dev).contiguous()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return torch.cat(parts)[: p.ds_numel].view(p.ds_shape)


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


def _safe_checkpoint_engine(engine) -> None:
    """Make DeepSpeed read its checkpoint files with ``torch.load(weights_only=True)``."""
    allowed = deepspeed_safe_globals()
    engine.checkpoint_engine.load = lambda path, map_location=None: safe_torch_load(path, map_location, allowed)


def _resume(engine, ema, store: Store, rank: int, world: int):
    """Load the newest checkpoint every rank can read (see the module docstring); its ``meta.json`` or None."""
    import torch.distributed as dist

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
                meta = store.verify(d)
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
                ema.shadow = [t.clone() for t in state["ema"]]
            _set_rng_state(state["rng"])
            return meta
        return None
    finally:
        dist.barrier()
        if lock is not None:
            lock.release()


def train_rank(spec_path: str | Path, started: float | None = None) -> dict | None:
    """One rank of a distributed fine-tune (called by ``scripts/train_distributed.py`` under torchrun)."""
    import deepspeed
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from harness.config import to_args
    from harness.data import build_data
    from harness.methods import build_method
    from harness.methods._flex import AttentionArgs, set_backend
    from harness.models import build_model

    t_start = started or time.time()
    watch_launcher()
    spec = json.loads(Path(spec_path).read_text())
    cfg = OmegaConf.create(spec["config"])
    a = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    a.validate()
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != a.world_size:
        raise RuntimeError(f"train.world_size={a.world_size} but torchrun started {world} ranks")
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    ckpt_dir, fingerprint, out_dir = Path(spec["ckpt_dir"]), spec["fingerprint"], Path(spec["out_dir"])
    phases: dict[str, float] = {"imports_and_init_distributed": round(time.time() - t_start, 2)}

    def phase(name: str) -> None:
        phases[name] = round(time.time() - t_start - sum(phases.values()), 2)

    torch.manual_seed(a.seed)
    method = build_method(cfg.method)  # the same model + method as the parent process (deterministic)
    handle = build_model(cfg.model)
    set_backend(handle.model, to_args(AttentionArgs, cfg.get("attention"), "attention").backend)
    method.apply(handle)
    chunks = build_data(cfg.data, handle.tokenizer, a.seq_len, a.tokens)  # memory-mapped cache (built by the parent)
    bos = handle.tokenizer.bos_token_id
    model = handle.model
    phase("model_and_data")
    method.train_mode(handle)
    if a.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    total, acc = a.steps(), a.accumulation()
    conf = ds_config(a, on_gpu)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if "optimizer" not in conf:
        optimizer = torch.optim.AdamW(params, lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay)
    sched_fn = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(a.schedule, a.warmup_steps, total))  # noqa: E731
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=optimizer,
                                           lr_scheduler=sched_fn, config=conf)
    phase("deepspeed_initialize")
    ema_params = [p for p in engine.module.parameters() if p.requires_grad]
    ema = PartitionEMA(ema_params, a.ema_decay) if a.ema else None

    start, resumed_from, losses = 0, None, []
    _safe_checkpoint_engine(engine)
    store = Store(ckpt_dir, fingerprint)
    meta = _resume(engine, ema, store, rank, world)
    if meta is not None:
        start = resumed_from = meta["step"]
        losses = list(meta.get("losses", []))

    tokens_per_step = a.global_batch * a.seq_len
    backward = lambda loss: engine.backward(loss, scale_wrt_gas=False)  # noqa: E731  (micro_step scales)
    dev = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    t0 = time.time()
    for step in range(start, total):
        micro = []
        for ids in batches_for_step(chunks, step, acc, a.micro_batch, rank, world):
            batch = method.train_batch(ids)
            if a.doc_masking and bos is not None:
                batch = add_document_positions(batch, bos)
            batch = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}
            micro.append(micro_step(engine, batch, acc, a.autocast, backward=backward))
            if len(micro) == acc:  # one host sync per step, before the boundary step() can apply a NaN update
                loss = step_loss(micro, acc, step, total)
            engine.step()  # DeepSpeed updates only at the accumulation boundary
        if ema is not None:
            ema.update()
        mean = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(mean)
        losses.append(float(mean.item()) / world)
        if rank == 0 and (a.log_every and ((step + 1) % a.log_every == 0 or step + 1 == total)):
            el = time.time() - t0
            tps = tokens_per_step * (step + 1 - start) / max(el, 1e-9)
            eta = (total - step - 1) * el / max(1, step + 1 - start)
            print(f"[zero{a.zero_stage} x{world}] step {step + 1}/{total} loss {losses[-1]:.4f} "
                  f"{tps:.0f} tok/s ETA {eta:.0f}s", file=sys.stderr, flush=True)
        if a.save_every and (step + 1) % a.save_every == 0 and step + 1 < total:
            _save(engine, ema, store, step + 1, fingerprint, world, rank, losses, tokens_per_step)
    wall = time.time() - t0
    phase("train")

    # gather the (EMA) weights on rank 0: all-gather each parameter's partitions (the EMA shadow or the current
    # values). Not GatheredParameters: ZeRO-3 keeps small parameters "persistent" (full p.data, below
    # stage3_param_persistence_threshold), and those would come back as the last iterate instead of the EMA.
    shadow_of = {id(p): s for p, s in zip(ema.params, ema.shadow)} if ema is not None else {}
    state = {}
    for name, p in engine.module.named_parameters():
        local = shadow_of.get(id(p))
        full = _gather_full(p, _local(p).detach() if local is None else local, dev)
        if rank == 0:
            state[name] = full.to(dtype=p.dtype, device="cpu").contiguous()
    info = {
        "engine": "deepspeed", "zero_stage": a.zero_stage, "offload": a.offload, "bf16": conf["bf16"]["enabled"],
        "optimizer": "deepspeed AdamW" if "optimizer" in conf else "torch AdamW (client optimizer)",
        "steps": total, "resumed_from_step": resumed_from, "tokens_seen": tokens_per_step * total,
        "seq_len": a.seq_len, "effective_global_batch": a.micro_batch * acc * world, "micro_batch": a.micro_batch,
        "grad_accumulation": acc, "world_size": world, "lr": a.lr, "schedule": a.schedule,
        "warmup_steps": a.warmup_steps, "weight_decay": a.weight_decay, "ema": a.ema,
        "ema_decay": a.ema_decay if a.ema else None, "ema_scope": "per-rank ZeRO partitions" if a.ema else None,
        "doc_masking": a.doc_masking, "grad_checkpointing": a.grad_checkpointing,
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "losses": [round(x, 4) for x in losses], "train_seconds": round(wall, 2),
        "tokens_per_second": round(tokens_per_step * (total - start) / max(wall, 1e-9), 1),
        "ds_config": conf,
    }
    phase("gather")
    info["phase_seconds"] = phases
    if rank == 0:
        from safetensors.torch import save_file

        final = out_dir / "final"
        tmp = out_dir / ".tmp-final"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(state, tmp / "model.safetensors")
        (tmp / "info.json").write_text(json.dumps(info, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        print(f"[zero{a.zero_stage} x{world}] done; seconds per phase {phases}", file=sys.stderr, flush=True)
    dist.barrier()
    if rank == 0 and not a.keep_checkpoints:
        store.cleanup()  # finished: the gathered weights are in the run directory
    dist.destroy_process_group()
    return info


def _save(engine, ema, store: Store, step: int, fingerprint: str, world: int, rank: int, losses: list,
          tokens_per_step: int) -> None:
    import torch.distributed as dist

    box = [str(store.new_tmp(step)) if rank == 0 else None]  # this run's own temporary directory
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    try:
        engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
        save_state(tmp, f"rank{rank}", {"ema": ema.shadow if ema is not None else None, "rng": _rng_state()})
        dist.barrier()
        if rank == 0:
            store.publish(tmp, step, {"fingerprint": fingerprint, "world_size": world,
                                      "tokens": tokens_per_step * step, "losses": losses})
        dist.barrier()
    except BaseException as e:
        if rank == 0:
            store.discard(tmp)  # a full disk: free what this save took
        err = save_error(e, store.root, step)
        if err is e:
            raise
        raise err from e
