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

Optimizer (``optimizer_kind``; recorded in the row's ``train_info["optimizer"]``): ``train.optimizer=auto`` uses
torch's AdamW as a DeepSpeed client optimizer (``zero_allow_untested_optimizer``), ``fused=True`` on GPU: no
JIT-compiled op, no nvcc on the compute node, the same update rule as the single engine. With CPU offload, ``auto``
uses DeepSpeed's CPU Adam (DeepSpeed refuses a client optimizer with ZeRO-Offload); ``train.optimizer=deepspeed``
asks for DeepSpeed's AdamW anyway (FusedAdam on GPU). Those ops are JIT-compiled (ninja; gcc for CPU Adam, nvcc for
FusedAdam) into ``TORCH_EXTENSIONS_DIR``: ``launch`` builds the op once in the parent process, before torchrun
starts the ranks (``prebuild_optimizer_op``), so the ranks only load the cached build instead of 8 ranks compiling
at once (and a rank killed mid-build leaving the build's ``lock`` file behind, on which every later job waits).

Collectives: every tensor a collective carries lives on the rank's device ``dev`` (``cuda:LOCAL_RANK`` on GPU, where
NCCL refuses CPU tensors; the CPU with gloo): the per-step loss and stop flag (``reduce_step``), the final gather
(``_gather_full``), and the EMA partitions read back from a checkpoint (``EMA.load_state_dict``); object collectives
(``broadcast_object_list``, ``all_gather_object``, barriers) use the current CUDA device, set before the process
group starts.

EMA under ZeRO-3: each rank keeps an fp32 EMA of *its own partition* of every parameter (``param.ds_tensor``), updated
after every optimizer step; memory is 4 bytes x params / world_size per rank, and no communication is needed. At the
end every parameter's EMA partitions are all-gathered on rank 0 (not ``GatheredParameters``: ZeRO-3 keeps small
parameters "persistent" and would hand back their last iterate), which writes ``final/model.safetensors``
(loadable in a single process). With bf16 training the EMA follows the bf16 partitions (not the fp32 master copy)
-- a rounding-level difference from an EMA of the master weights. With ZeRO stage 0-2 parameters are not
partitioned and the EMA covers the full tensors.

Resumption: every ``save_every`` steps all ranks write a DeepSpeed checkpoint (model, optimizer partitions, client
scheduler) plus one state per rank (EMA partition and update count, RNG states; tensors + JSON) into a temporary
directory of this run's own; rank 0 publishes it as ``step_N`` under the key's lock
(``harness.train.checkpoint.Store``: ``meta.json`` with step, key, losses and every file's size). The data position
is the step (``batches_for_step``), so a killed run started again with the same command continues with the same
batches. On resume rank 0 holds the lock while every rank checks the newest checkpoint's files (sizes, its own
state file); if any rank finds a bad file, rank 0 warns naming it and all ranks move on to the previous checkpoint
together. DeepSpeed's own files are read with ``torch.load(weights_only=True)`` (a few DeepSpeed classes
allow-listed), never by unpickling arbitrary objects. A corrupt file that keeps its size and fails inside
``engine.load_checkpoint`` fails the run (ranks cannot agree on a fallback from inside DeepSpeed's collective load).

Preemption (Slurm's SIGTERM; submitit's SIGUSR2 before the time limit): torchrun is started with SIGTERM and SIGUSR2
ignored and told not to handle SIGTERM (``--signals-to-handle``), so neither it nor, until they install their
handlers, its ranks die of them. Each rank records SIGUSR2 / SIGTERM (``StopFlag``) and so does ``launch`` in the
parent (``SignalRelay``, in place of ``lifecycle.raise_on_sigterm``'s and submitit's handlers while torchrun runs),
which passes the request on in a file (``<job>/stop_requested``) that every rank checks at each step boundary. At
the boundary the ranks agree (the flag rides on the loss all-reduce, one collective per step, on ``dev``); on a
request they save a checkpoint of the finished step, rank 0 writes ``<job>/preempted.json``, and they exit with
``PREEMPTED_EXIT``. ``launch`` then raises ``Preempted`` ("preempted by SIGTERM: training saved a checkpoint at step
N ..."), or, when the signal was submitit's SIGUSR2, prints that line and hands the signal to submitit's handler,
which requeues the job; the requeued job resumes from that checkpoint. The save must fit in the time Slurm leaves
(``signal_delay_s`` before the time limit; KillWait after a preemption's SIGTERM).

Process lifetime: torchrun gets SIGKILL when the launching process dies (Linux ``PR_SET_PDEATHSIG``; SIGTERM, on
which torchrun stops its ranks, for a torchrun that is not preemptible, e.g. the evaluation's), and every rank watches
its parent and the launching process (``HARNESS_LAUNCHER_PID``) and kills itself within a second of either
disappearing, so a killed ``run.py`` never leaves ranks training and writing checkpoints.

Limitations: every rank loads the full model in host memory before DeepSpeed partitions it (no ``zero.Init``);
for LLaMA2-7B in bf16 that is ~13.5 GB per rank. ``run.py`` launches one node (``one_node_launch`` refuses a
Slurm step of several nodes and more ranks than the node's GPUs); for several nodes run
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
    share,
)
from harness.train.ema import EMA
from harness.train.ema import record as ema_record
from harness.train.loop import batches_for_step, restore_rng_state, rng_state
from harness.train.step import adamw_settings, add_document_positions, micro_step, optimizer, scheduler, step_loss

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "scripts" / "train_distributed.py"


# ----------------------------------------------------------------------------------------------- config
OPTIMIZERS = {"deepspeed": "deepspeed AdamW", "torch_fused": "torch AdamW fused (client optimizer)",
              "torch": "torch AdamW (client optimizer)"}


def optimizer_kind(a: TrainArgs, on_gpu: bool) -> str:
    """``deepspeed`` (the JSON's AdamW: FusedAdam on GPU, DeepSpeedCPUAdam with offload; JIT-compiled ops),
    ``torch_fused`` (``torch.optim.AdamW(fused=True)`` on the GPU partitions) or ``torch`` (``torch.optim.AdamW``)."""
    if a.optimizer == "deepspeed" or (a.optimizer == "auto" and a.offload):
        return "deepspeed"
    return "torch_fused" if on_gpu and not a.offload else "torch"


def use_ds_optimizer(a: TrainArgs, on_gpu: bool) -> bool:
    return optimizer_kind(a, on_gpu) == "deepspeed"


def client_optimizer(a: TrainArgs, params: list, on_gpu: bool):
    """The torch AdamW handed to ``deepspeed.initialize`` (None when the JSON names DeepSpeed's own)."""
    kind = optimizer_kind(a, on_gpu)
    if kind == "deepspeed":
        return None
    return optimizer(a, params, fused=kind == "torch_fused")


def bf16_enabled(a: TrainArgs, on_gpu: bool = False) -> bool:
    """DeepSpeed's bf16 switch from ``train.autocast``: ``auto`` is bf16 on a GPU and on CPUs with native bf16
    (``harness.device.resolve_dtype``, which answers with a dtype *name*)."""
    if a.autocast == "bfloat16":
        return True
    if a.autocast == "auto":
        from harness.device import accelerator, resolve_dtype

        return resolve_dtype("auto", accelerator(0) if on_gpu else None) == "bfloat16"
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
    if a.offload and not use_ds_optimizer(a, on_gpu):
        cfg["zero_force_ds_cpu_optimizer"] = False  # train.optimizer=torch with offload: asked for explicitly
    if use_ds_optimizer(a, on_gpu):
        cfg["optimizer"] = {"type": "AdamW", "params": {**adamw_settings(a), "betas": list(a.betas)}}
    return cfg


# ----------------------------------------------------------------------------------------------- parent side
def _torch_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(ROOT / ".cache" / "torch_extensions")


def prebuild_optimizer_op(a: TrainArgs, on_gpu: bool) -> str | None:
    """Build (or load the cached build of) DeepSpeed's optimizer op in this process, before any rank starts; the
    op's builder name, or None when the ranks need no compiled op."""
    if optimizer_kind(a, on_gpu) != "deepspeed":
        return None
    from deepspeed.accelerator import get_accelerator

    name = "CPUAdamBuilder" if a.offload else "FusedAdamBuilder"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", _torch_extensions_dir())  # where the ranks will look
    builder = get_accelerator().create_op_builder(name)
    if builder is None:
        raise RuntimeError(f"train.optimizer: DeepSpeed has no {name} for this accelerator; use train.optimizer=torch")
    builder.load()
    return name


PREEMPTED_EXIT = 85  # a rank's exit code after it saved a checkpoint on a stop request
STOP_FILE, PREEMPTED_FILE = "stop_requested", "preempted.json"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class SignalRelay:
    """In the launching process while torchrun runs: SIGTERM / SIGUSR2 are recorded and passed on to the ranks
    (``<job>/STOP_FILE``) instead of ending this process (which would kill torchrun and the ranks unsaved); the
    previous handlers come back on exit. ``replay()`` then does what the first signal would have done."""

    def __init__(self, job_dir: Path):
        self.job_dir, self.caught, self.previous = Path(job_dir), [], {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self.previous[s] = signal.signal(s, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.caught.append(signum)
        try:
            (self.job_dir / STOP_FILE).write_text(signal.Signals(signum).name)
        except OSError as e:  # the ranks got the same signal from Slurm's cgroup anyway, most often
            print(f"warning: could not pass {signal.Signals(signum).name} on to the ranks ({e})", file=sys.stderr)

    def __exit__(self, *exc) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)

    def replay(self, message: str | None) -> None:
        """After torchrun ended: hand the first caught signal to its previous handler (submitit's SIGUSR2 handler
        requeues the job), or raise ``Preempted(message)`` / ``Terminated``."""
        from harness.train import Preempted, Terminated

        if not self.caught:  # the ranks alone got the signal (Slurm signals the whole step)
            if message:
                raise Preempted(message)
            return
        signum = self.caught[0]
        prev = self.previous.get(signum)
        if signum == signal.SIGUSR2 and callable(prev):  # submitit's handler: requeue the job, then exit
            if message:
                print(message, file=sys.stderr, flush=True)
            prev(signum, None)
            if message:
                raise Preempted(message)
            return
        if message:
            raise Preempted(message)
        if prev != signal.SIG_IGN:  # training had finished: what the signal would have done
            raise Terminated(f"terminated by {signal.Signals(signum).name}")


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


def _torchrun_preexec() -> None:
    """torchrun survives SIGTERM / SIGUSR2 (ignored, inherited by the ranks until they install ``StopFlag``) and
    dies with its parent."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        _die_with_parent(signal.SIGKILL)  # torchrun ignores SIGTERM now


def run_torchrun(spec_path: Path, world_size: int, log=None, entry: Path | None = None,
                 preemptible: bool | None = None) -> int:
    """Start ``world_size`` ranks of ``entry`` (default: the training entry point) on this node and wait; returns
    torchrun's exit code. torchrun and its ranks end when this process ends, however it ends (see the module
    docstring). Data-parallel evaluation (``harness.eval_distributed``) starts its ranks with it too.
    ``preemptible`` (default: for the training entry point): torchrun ignores SIGTERM / SIGUSR2 and the ranks handle
    them by saving and stopping (module docstring, "Preemption"); otherwise torchrun stops its ranks on SIGTERM."""
    env = os.environ.copy()
    env.setdefault("TORCH_EXTENSIONS_DIR", _torch_extensions_dir())
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HARNESS_LAUNCHER_PID"] = str(os.getpid())
    if preemptible is None:
        preemptible = entry is None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
           *(["--signals-to-handle=SIGINT,SIGHUP,SIGQUIT"] if preemptible else []),  # SIGTERM: the ranks save first
           str(entry or ENTRY), str(spec_path)]
    if preemptible:
        preexec = _torchrun_preexec
    else:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
    proc = subprocess.Popen(cmd, env=env, cwd=os.getcwd(), stdout=log, stderr=subprocess.STDOUT if log else None,
                            preexec_fn=preexec)
    try:
        return proc.wait()
    except BaseException:
        proc.kill()  # e.g. Ctrl-C or SIGTERM outside launch's relay: torchrun, and by their watchdog the ranks, end
        raise


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


def train_job(spec_path: Path, world_size: int, log=None) -> int:
    """torchrun over the training ranks with ``SignalRelay`` in place; raises ``Preempted`` (or hands the signal to
    submitit) when the ranks stopped on a request after saving; else torchrun's exit code."""
    job = Path(spec_path).parent
    for name in (STOP_FILE, PREEMPTED_FILE):
        (job / name).unlink(missing_ok=True)
    with SignalRelay(job) as relay:
        rc = run_torchrun(spec_path, world_size, log)
    marker, message = job / PREEMPTED_FILE, None
    if marker.exists():
        m = json.loads(marker.read_text())
        message = (f"preempted by {m['signal']}: training saved a checkpoint at step {m['step']} of {m['total']} "
                   f"({m['checkpoint']}); the requeued job resumes from it")
    relay.replay(message)
    return rc


def one_node_step(env=None) -> None:
    """Inside Slurm: refuse a job step that spans several nodes (every node would run this ``run.py``, train its
    own copy and write its own row). ``SLURM_STEP_NUM_NODES`` is srun's step; outside srun, the job's nodes.
    ``run.py`` checks it too (``harness.precheck``), and ``harness.submit`` refuses ``nodes > 1`` before submitting."""
    from harness.config import ConfigError

    env = os.environ if env is None else env
    n = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if n and int(n) > 1:
        raise ConfigError(f"this Slurm step spans {n} nodes: run.py runs one point on one node (torchrun "
                          f"--standalone); submit with hydra.launcher.nodes=1 (srun --nodes=1)")


def one_node_launch(world_size: int, ckpt_dir: Path, gpus: int | None = None, env=None) -> None:
    """``torchrun --standalone`` starts every rank on this node: refuse a Slurm step of several nodes
    (``one_node_step``) and, with CUDA, more ranks than this node's GPUs; warn in one line when a Slurm job's
    checkpoints would go inside the checkout (``harness.submit``)."""
    from harness.config import ConfigError

    env = os.environ if env is None else env
    one_node_step(env)
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and world_size > gpus:
        raise ConfigError(f"train.world_size={world_size} but this node has {gpus} GPUs (torchrun --standalone "
                          f"starts every rank here): set train.world_size={gpus}")
    ckpt = Path(ckpt_dir).resolve()
    if env.get("SLURM_JOB_ID") and ROOT in ckpt.parents:
        print(f"warning: paths.ckpt_dir {ckpt} is inside the checkout in a Slurm job; set HARNESS_CKPT_DIR or "
              f"SCRATCH (conf/hydra/launcher/slurm_a100.yaml)", file=sys.stderr)


def launch(cfg, handle, method, a: TrainArgs, ckpt_dir: Path, fingerprint: str, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    one_node_launch(a.world_size, ckpt_dir)
    job = Path(run_dir) / "train_job"
    spec = write_spec(OmegaConf.to_container(cfg, resolve=True), ckpt_dir, fingerprint, job)
    prebuild_optimizer_op(a, torch.cuda.is_available())
    from harness.models import release, restore

    # the parent's copy leaves the GPUs while the ranks train (rank 0 shares GPU 0 with it), the CUDA cache emptied;
    # the gathered weights are loaded into it on the host, and it goes back where it was
    where = release(handle)
    try:
        rc = train_job(spec, a.world_size)
        if rc != 0:
            raise RuntimeError(f"distributed training failed (torchrun exit code {rc}); job spec {spec}")
        return load_final(handle, method, job)
    finally:
        restore(handle, where)


# ----------------------------------------------------------------------------------------------- rank side
def partition(p: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a parameter: its ZeRO-3 partition, or the whole tensor when not partitioned (the EMA's
    ``local``)."""
    t = getattr(p, "ds_tensor", None)
    return t if t is not None else p.data


def reduce_step(loss: float, stop: bool, dev) -> torch.Tensor:
    """The step's all-reduce, on ``dev``: ``[sum of the ranks' losses, number of ranks asked to stop]`` (float64).
    The caller reads it with one ``.tolist()``; the tensor lives on the collective's device (NCCL: the GPU)."""
    import torch.distributed as dist

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


def _gather_full(p: torch.Tensor, local: torch.Tensor, dev) -> torch.Tensor:
    """The full tensor of parameter ``p`` from every rank's partition ``local`` (ZeRO-3 partitions are contiguous
    slices of the flattened parameter, in rank order, padded at the end)."""
    if getattr(p, "ds_tensor", None) is None:
        return local
    import torch.distributed as dist

    flat = local.reshape(-1).to(dev).contiguous()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return torch.cat(parts).narrow(0, 0, p.ds_numel).view(p.ds_shape)  # the padding at the end dropped


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


def train_rank(spec_path: str | Path, started: float | None = None) -> dict | None:
    """One rank of a distributed fine-tune (called by ``scripts/train_distributed.py`` under torchrun)."""
    import deepspeed
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from harness.config import to_args
    from harness.data import build_data
    from harness.methods import build_method
    from harness.methods.flex import AttentionArgs, set_backend
    from harness.models import build_model

    t_start = started or time.time()
    watch_launcher()
    spec = json.loads(Path(spec_path).read_text())
    stop = StopFlag(Path(spec["out_dir"]))  # before anything slow: SIGUSR2 / SIGTERM from now on save and stop
    cfg = OmegaConf.create(spec["config"])
    a = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    a.validate()
    on_gpu = torch.cuda.is_available()
    if on_gpu:  # before the process group: NCCL and the object collectives use the current device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != a.world_size:
        raise RuntimeError(f"train.world_size={a.world_size} but torchrun started {world} ranks")
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
    client = client_optimizer(a, params, on_gpu)  # ZeRO hands it its fp32 partitions (on the GPU)
    sched_fn = lambda opt: scheduler(a, opt, total)  # noqa: E731
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client,
                                           lr_scheduler=sched_fn, config=conf)
    phase("deepspeed_initialize")
    ema = EMA(engine.module, a.ema_decay, a.ema_bias_correction, local=partition) if a.ema else None

    start, resumed_from, losses = 0, None, []
    _safe_checkpoint_engine(engine)
    store = Store(ckpt_dir, fingerprint)
    meta = _resume(engine, ema, store, rank, world)
    if meta is not None:
        start = resumed_from = meta["step"]
        losses = list(meta.get("losses", []))

    tokens_per_step = a.global_batch * a.seq_len
    backward = lambda loss: engine.backward(loss, scale_wrt_gas=False)  # noqa: E731  (micro_step scales)
    from harness.device import accelerator

    dev = accelerator() if on_gpu else torch.device("cpu")  # the rank's GPU: where every collective's tensor lives
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
        loss_sum, stopping = reduce_step(loss, stop.requested(), dev).tolist()  # all ranks agree on stopping
        losses.append(loss_sum / world)
        if rank == 0 and (a.log_every and ((step + 1) % a.log_every == 0 or step + 1 == total)):
            el = time.time() - t0
            tps = tokens_per_step * (step + 1 - start) / max(el, 1e-9)
            eta = (total - step - 1) * el / max(1, step + 1 - start)
            print(f"[zero{a.zero_stage} x{world}] step {step + 1}/{total} loss {losses[-1]:.4f} "
                  f"{tps:.0f} tok/s ETA {eta:.0f}s", file=sys.stderr, flush=True)
        saved = a.save_every and (step + 1) % a.save_every == 0 and step + 1 < total
        if saved or (stopping and step + 1 < total):
            path = _save(engine, ema, store, step + 1, fingerprint, world, rank, losses, tokens_per_step)
        if stopping and step + 1 < total:  # preempted: the checkpoint of this step is written; leave
            if rank == 0:
                print(f"[zero{a.zero_stage} x{world}] stop requested ({stop.name()}): saved step {step + 1}",
                      file=sys.stderr, flush=True)
                marker = {"signal": stop.name(), "step": step + 1, "total": total, "checkpoint": str(path)}
                (out_dir / PREEMPTED_FILE).write_text(json.dumps(marker))
            dist.barrier()
            dist.destroy_process_group()
            return {"preempted_at_step": step + 1}
    wall = time.time() - t0
    phase("train")

    # gather the (EMA) weights on rank 0: all-gather each parameter's partitions (the EMA shadow or the current
    # values). Not GatheredParameters: ZeRO-3 keeps small parameters "persistent" (full p.data, below
    # stage3_param_persistence_threshold), and those would come back as the last iterate instead of the EMA.
    shadow = ema.shadow if ema is not None else {}
    state = {}
    for name, p in engine.module.named_parameters():
        local = shadow.get(name)
        full = _gather_full(p, partition(p).detach() if local is None else local, dev)
        if rank == 0:
            state[name] = full.to(dtype=p.dtype, device="cpu").contiguous()
    info = {
        "engine": "deepspeed", "zero_stage": a.zero_stage, "offload": a.offload, "bf16": conf["bf16"]["enabled"],
        "optimizer": OPTIMIZERS[optimizer_kind(a, on_gpu)],
        "steps": total, "resumed_from_step": resumed_from, "tokens_seen": tokens_per_step * total,
        "seq_len": a.seq_len, "effective_global_batch": a.micro_batch * acc * world, "micro_batch": a.micro_batch,
        "grad_accumulation": acc, "world_size": world, "lr": a.lr, "schedule": a.schedule,
        "warmup_steps": a.warmup_steps, "weight_decay": a.weight_decay, "ema": ema_record(ema),
        "ema_scope": "per-rank ZeRO partitions" if a.ema else None,
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
        share(tmp)  # the umask's permissions, as rows (safetensors writes 0600)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        print(f"[zero{a.zero_stage} x{world}] done; seconds per phase {phases}", file=sys.stderr, flush=True)
    dist.barrier()
    if rank == 0 and not a.keep_checkpoints:
        store.cleanup()  # finished: the gathered weights are in the run directory
    dist.destroy_process_group()
    return info


def _save(engine, ema, store: Store, step: int, fingerprint: str, world: int, rank: int, losses: list,
          tokens_per_step: int) -> Path | None:
    """Write and publish the checkpoint of ``step`` (every rank); rank 0 gets its published directory."""
    import torch.distributed as dist

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
