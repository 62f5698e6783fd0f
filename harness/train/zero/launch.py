"""The DeepSpeed engine's parent side, in the ``run.py`` process: the job spec, torchrun over the ranks with their
lifetime tied to this process, the stop signals passed on to them (``SignalRelay``), and the gathered weights loaded
back (``harness.train.deepspeed_engine`` has the whole story)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from harness.config import ConfigError
from harness.models import release, restore
from harness.results import pid_alive
from harness.train import Preempted, Terminated, TrainArgs
from harness.train.zero.config import ROOT, prebuild_optimizer_op, torch_extensions_dir

ENTRY = ROOT / "scripts" / "train_distributed.py"

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
    env.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
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
    env = os.environ if env is None else env
    n = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if n and int(n) > 1:
        raise ConfigError(f"this Slurm step spans {n} nodes: run.py runs one point on one node (torchrun "
                          f"--standalone); submit with hydra.launcher.nodes=1 (srun --nodes=1)")


def one_node_launch(world_size: int, ckpt_dir: Path, gpus: int | None = None, env=None) -> None:
    """``torchrun --standalone`` starts every rank on this node: refuse a Slurm step of several nodes
    (``one_node_step``) and, with CUDA, more ranks than this node's GPUs; warn in one line when a Slurm job's
    checkpoints would go inside the checkout (``harness.submit``)."""
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
