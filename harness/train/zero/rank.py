"""One rank of the DeepSpeed engine (``scripts/train_distributed.py`` under torchrun): the job read from its spec,
the model, method and data rebuilt as the parent built them, DeepSpeed started with the recipe's optimizer and
schedule, the steps (each rank its slice of every step, the step function the single engine uses), and the gathered
EMA weights written by rank 0 (``harness.train.deepspeed_engine`` has the whole story)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from safetensors.torch import save_file

from harness.config import to_args
from harness.data import build_data
from harness.device import accelerator
from harness.methods import build_method
from harness.methods.flex import AttentionArgs, set_backend
from harness.models import build_model
from harness.train import TrainArgs
from harness.train.checkpoint import Store, share
from harness.train.ema import EMA
from harness.train.ema import record as ema_record
from harness.train.loop import batches_for_step
from harness.train.step import add_document_positions, micro_step, scheduler, step_loss
from harness.train.zero import sequence
from harness.train.zero.config import OPTIMIZERS, client_optimizer, ds_config, optimizer_kind
from harness.train.zero.launch import PREEMPTED_FILE, STOP_FILE, STOP_SIGNALS, watch_launcher
from harness.train.zero.partition import gather_full, partition
from harness.train.zero.resume import resume, safe_checkpoint_engine, save
from harness.train.zero.sequence import SequenceParallel


def reduce_step(loss: float, stop: bool, dev) -> torch.Tensor:
    """The step's all-reduce, on ``dev``: ``[sum of the ranks' losses, number of ranks asked to stop]`` (float64).
    The caller reads it with one ``.tolist()``; the tensor lives on the collective's device (NCCL: the GPU)."""
    t = torch.tensor([float(loss), 1.0 if stop else 0.0], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return t


class StopFlag:
    """A rank's stop request: SIGUSR2 / SIGTERM received, or ``<job>/STOP_FILE`` written by ``launch``."""

    def __init__(self, job_dir: Path | None = None, install: bool = True):
        self.stop_file = Path(job_dir) / STOP_FILE if job_dir is not None else None
        self.signum: int | None = None
        if install:
            for s in STOP_SIGNALS:
                signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signum = signum

    def requested(self) -> bool:
        if self.signum is None and self.stop_file is not None and self.stop_file.exists():
            name = self.stop_file.read_text().strip() or "SIGTERM"
            self.signum = int(getattr(signal, name, signal.SIGTERM))
        return self.signum is not None

    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a stop request"


@dataclass
class Job:
    """A rank's job: its typed settings, its place in the group, where it reads and writes, and the seconds of each
    phase so far."""

    cfg: Any
    a: TrainArgs
    stop: StopFlag
    on_gpu: bool
    rank: int
    world: int
    ckpt_dir: Path
    fingerprint: str
    out_dir: Path
    t_start: float
    phases: dict = field(default_factory=dict)
    sp: SequenceParallel | None = None  # this rank's sequence-parallel group (train.sequence_parallel > 1)

    @property
    def tag(self) -> str:
        return f"[zero{self.a.zero_stage} x{self.world}]"

    def phase(self, name: str) -> None:
        self.phases[name] = round(time.time() - self.t_start - sum(self.phases.values()), 2)


@dataclass
class Progress:
    """Where a rank's steps stand: the first step of this process, the step a checkpoint resumed from, the losses."""

    start: int = 0
    resumed_from: int | None = None
    losses: list = field(default_factory=list)


def train_rank(spec_path: str | Path, started: float | None = None) -> dict | None:
    """One rank of a distributed fine-tune (called by ``scripts/train_distributed.py`` under torchrun)."""
    job = start(spec_path, started or time.time())
    handle, method, chunks = build(job)
    engine, ema, conf = initialize(job, handle, method)
    safe_checkpoint_engine(engine)
    store = Store(job.ckpt_dir, job.fingerprint)
    meta, done = resume(engine, ema, store, job.rank, job.world), Progress()
    if meta is not None:
        done = Progress(meta["step"], meta["step"], list(meta.get("losses", [])))
    dev = accelerator() if job.on_gpu else torch.device("cpu")  # the rank's GPU: where every collective's tensor lives
    t0 = time.time()
    stopped = run_steps(job, engine, ema, store, method, chunks, handle.tokenizer.bos_token_id, done, dev)
    if stopped is not None:
        return {"preempted_at_step": stopped}
    wall = time.time() - t0
    job.phase("train")
    return finish(job, engine, ema, conf, store, done, wall, dev)


def start(spec_path: str | Path | None, t_start: float) -> Job:
    """The rank's job from its spec: the stop flag first (SIGUSR2 / SIGTERM from then on save and stop), the device,
    the process group. ``spec_path=None`` (a follower node's ranks, ``--join``): the process group first, then the
    spec from rank 0 (``broadcast_spec``; every rank of a several-node job takes part), then the stop flag."""
    import deepspeed

    watch_launcher()
    spec = json.loads(Path(spec_path).read_text()) if spec_path is not None else None
    stop = StopFlag(Path(spec["out_dir"])) if spec else None  # before anything slow: SIGUSR2 / SIGTERM save and stop
    on_gpu = torch.cuda.is_available()
    if on_gpu:  # before the process group: NCCL and the object collectives use the current device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    if spec is None or int(spec["config"]["train"].get("nodes") or 1) > 1:
        spec = broadcast_spec(spec)
    stop = stop or StopFlag(Path(spec["out_dir"]))
    cfg = OmegaConf.create(spec["config"])
    a = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    a.validate()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != a.world_size:
        raise RuntimeError(f"train.world_size={a.world_size} but torchrun started {world} ranks")
    return Job(cfg, a, stop, on_gpu, rank, world, Path(spec["ckpt_dir"]), spec["fingerprint"], Path(spec["out_dir"]),
               t_start, {"imports_and_init_distributed": round(time.time() - t_start, 2)})


def broadcast_spec(spec: dict | None) -> dict:
    """Rank 0's job spec on every rank (a several-node job: a follower node's ranks start without one). A rank
    whose own spec differs from rank 0's (another config on that node) fails naming it."""
    box = [spec]
    dist.broadcast_object_list(box, src=0)
    if spec is not None and box[0] != spec:
        raise RuntimeError(f"rank {dist.get_rank()}: its job spec differs from rank 0's (every node must run the "
                           f"same command)")
    return box[0]


def build(job: Job):
    """(handle, method, data chunks): the same model + method as the parent process (deterministic), the data from
    the memory-mapped cache the parent built."""
    cfg, a = job.cfg, job.a
    torch.manual_seed(a.seed)
    method = build_method(cfg.method)
    handle = build_model(cfg.model)
    set_backend(handle.model, to_args(AttentionArgs, cfg.get("attention"), "attention").backend)
    method.apply(handle)
    chunks = build_data(cfg.data, handle.tokenizer, a.seq_len, a.tokens)
    job.phase("model_and_data")
    return handle, method, chunks


def initialize(job: Job, handle, method):
    """(engine, EMA or None, DeepSpeed JSON): the model in training mode handed to DeepSpeed with the recipe's
    optimizer (a client AdamW unless the JSON names DeepSpeed's) and schedule; the EMA over this rank's partitions."""
    import deepspeed

    a, model = job.a, handle.model
    method.train_mode(handle)
    job.sp = sequence.setup(model, a, method)  # the attention it trains with, wrapped by DeepSpeed's Ulysses
    sequence.tile_mlps(model, a.mlp_tiles)  # train.mlp_tiles > 1: the MLPs in pieces along the sequence
    if a.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    total = a.steps()
    conf = ds_config(a, job.on_gpu)
    params = [p for p in model.parameters() if p.requires_grad]
    client = client_optimizer(a, params, job.on_gpu)  # ZeRO hands it its fp32 partitions (on the GPU)
    sched_fn = lambda opt: scheduler(a, opt, total)  # noqa: E731
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client,
                                           lr_scheduler=sched_fn, config=conf,
                                           **({"mpu": job.sp.mpu} if job.sp is not None else {}))
    job.phase("deepspeed_initialize")
    ema = EMA(engine.module, a.ema_decay, a.ema_bias_correction, local=partition) if a.ema else None
    return engine, ema, conf


def run_steps(job: Job, engine, ema, store: Store, method, chunks, bos, done: Progress, dev) -> int | None:
    """The optimizer steps from ``done.start`` on; the step a stop request ended them at (after saving it), else
    None."""
    a, total, acc = job.a, job.a.steps(), job.a.accumulation()
    tokens_per_step = a.global_batch * a.seq_len
    backward = lambda loss: engine.backward(loss, scale_wrt_gas=False)  # noqa: E731  (micro_step scales)
    sp = job.sp
    # the sequences in flight: one per group of ranks sharing a sequence (consecutive ranks, DeepSpeed's groups)
    dp_rank, dp = job.rank // a.sequence_parallel, a.data_parallel()
    t0 = time.time()
    for step in range(done.start, total):
        micro = []
        for ids in batches_for_step(chunks, step, acc, a.micro_batch, dp_rank, dp):
            batch = method.train_batch(ids)
            if a.doc_masking and bos is not None:
                batch = add_document_positions(batch, bos)
            if sp is not None:
                batch = sp.shard(batch)
            batch = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}
            micro.append(micro_step(engine, batch, acc, a.autocast, backward=backward,
                                    loss_fn=sp.loss if sp is not None else None))
            if len(micro) == acc:  # one host sync per step, before the boundary step() can apply a NaN update
                loss = step_loss(micro, acc, step, total)
            engine.step()  # DeepSpeed updates only at the accumulation boundary
        if ema is not None:
            ema.update()
        loss_sum, stopping = reduce_step(loss, job.stop.requested(), dev).tolist()  # all ranks agree on stopping
        done.losses.append(loss_sum / dp)  # a group's ranks hold shares of one sequence's loss
        if job.rank == 0 and (a.log_every and ((step + 1) % a.log_every == 0 or step + 1 == total)):
            el = time.time() - t0
            tps = tokens_per_step * (step + 1 - done.start) / max(el, 1e-9)
            eta = (total - step - 1) * el / max(1, step + 1 - done.start)
            print(f"{job.tag} step {step + 1}/{total} loss {done.losses[-1]:.4f} {tps:.0f} tok/s ETA {eta:.0f}s",
                  file=sys.stderr, flush=True)
        saved = a.save_every and (step + 1) % a.save_every == 0 and step + 1 < total
        if saved or (stopping and step + 1 < total):
            path = save(engine, ema, store, step + 1, job.fingerprint, job.world, job.rank, done.losses,
                        tokens_per_step)
        if stopping and step + 1 < total:  # preempted: the checkpoint of this step is written; leave
            stopped_at(job, step + 1, total, path)
            return step + 1
    return None


def stopped_at(job: Job, step: int, total: int, path) -> None:
    """After the checkpoint of ``step`` on a stop request: rank 0 says so and leaves the marker ``launch`` reads; the
    group ends."""
    if job.rank == 0:
        print(f"{job.tag} stop requested ({job.stop.name()}): saved step {step}", file=sys.stderr, flush=True)
        marker = {"signal": job.stop.name(), "step": step, "total": total, "checkpoint": str(path)}
        (job.out_dir / PREEMPTED_FILE).write_text(json.dumps(marker))
    dist.barrier()
    dist.destroy_process_group()


def gathered(engine, ema, rank: int, dev) -> dict:
    """The (EMA) weights on rank 0, by name: every parameter's partitions all-gathered (the EMA shadow, or the
    current values). Not GatheredParameters: ZeRO-3 keeps small parameters "persistent" (full p.data, below
    stage3_param_persistence_threshold), and those would come back as the last iterate instead of the EMA."""
    shadow = ema.shadow if ema is not None else {}
    state = {}
    for name, p in engine.module.named_parameters():
        local = shadow.get(name)
        full = gather_full(p, partition(p).detach() if local is None else local, dev)
        if rank == 0:
            state[name] = full.to(dtype=p.dtype, device="cpu").contiguous()
    return state


def finish(job: Job, engine, ema, conf: dict, store: Store, done: Progress, wall: float, dev) -> dict:
    """Gather the weights, write them and the run's facts (rank 0), remove the checkpoints unless kept; the facts."""
    a, world, total = job.a, job.world, job.a.steps()
    state = gathered(engine, ema, job.rank, dev)
    tokens_per_step = a.global_batch * a.seq_len
    info = {
        "engine": "deepspeed", "zero_stage": a.zero_stage, "offload": a.offload, "bf16": conf["bf16"]["enabled"],
        "optimizer": OPTIMIZERS[optimizer_kind(a, job.on_gpu)],
        "steps": total, "resumed_from_step": done.resumed_from, "tokens_seen": tokens_per_step * total,
        "seq_len": a.seq_len, "effective_global_batch": a.micro_batch * a.accumulation() * a.data_parallel(),
        "sequence_parallel": a.sequence_parallel,
        "micro_batch": a.micro_batch, "grad_accumulation": a.accumulation(), "world_size": world, "lr": a.lr,
        "schedule": a.schedule, "warmup_steps": a.warmup_steps, "weight_decay": a.weight_decay,
        "ema": ema_record(ema), "ema_scope": "per-rank ZeRO partitions" if a.ema else None,
        "doc_masking": a.doc_masking, "grad_checkpointing": a.grad_checkpointing,
        "loss_first": done.losses[0] if done.losses else None, "loss_last": done.losses[-1] if done.losses else None,
        "losses": [round(x, 4) for x in done.losses], "train_seconds": round(wall, 2),
        "tokens_per_second": round(tokens_per_step * (total - done.start) / max(wall, 1e-9), 1),
        "ds_config": conf,
    }
    job.phase("gather")
    info["phase_seconds"] = job.phases
    if job.rank == 0:
        write_final(job.out_dir, state, info)
        print(f"{job.tag} done; seconds per phase {job.phases}", file=sys.stderr, flush=True)
    dist.barrier()
    if job.rank == 0 and not a.keep_checkpoints:
        store.cleanup()  # finished: the gathered weights are in the run directory
    dist.destroy_process_group()
    return info


def write_final(out_dir: Path, state: dict, info: dict) -> None:
    """``<out_dir>/final/`` (model.safetensors, info.json), written beside it and renamed into place."""
    final = out_dir / "final"
    tmp = out_dir / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, tmp / "model.safetensors")
    (tmp / "info.json").write_text(json.dumps(info, indent=1))
    share(tmp)  # the umask's permissions, as rows (safetensors writes 0600)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
