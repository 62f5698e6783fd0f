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

from harness.config import ConfigError, to_args
from harness.models import release, restore
from harness.results import pid_alive
from harness.train import Preempted, Terminated, TrainArgs
from harness.train.zero.config import ROOT, prebuild_optimizer_op, torch_extensions_dir
from harness.train.zero.nodes import Node, node

ENTRY = ROOT / "scripts" / "train_distributed.py"
JOIN = "--join"  # the entry point's argument on a follower node: the spec comes from rank 0

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


def run_torchrun(spec_path: Path | None, world_size: int, log=None, entry: Path | None = None,
                 preemptible: bool | None = None, node: Node | None = None) -> int:
    """Start ``world_size`` ranks of ``entry`` (default: the training entry point) on this node and wait; returns
    torchrun's exit code. torchrun and its ranks end when this process ends, however it ends (see the module
    docstring). Data-parallel evaluation (``harness.eval_distributed``) starts its ranks with it too.
    ``preemptible`` (default: for the training entry point): torchrun ignores SIGTERM / SIGUSR2 and the ranks handle
    them by saving and stopping (module docstring, "Preemption"); otherwise torchrun stops its ranks on SIGTERM.
    ``node`` (``harness.train.zero.nodes``): this node's share of a several-node job (its ``per_node`` ranks, the
    rendezvous); ``spec_path=None`` on a follower node, whose ranks get the spec from rank 0 (``--join``)."""
    node = node or Node(per_node=world_size)
    env = os.environ.copy()
    env.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // node.per_node)))
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HARNESS_LAUNCHER_PID"] = str(os.getpid())
    if preemptible is None:
        preemptible = entry is None
    cmd = [sys.executable, "-m", "torch.distributed.run", *node.torchrun_args(),
           *(["--signals-to-handle=SIGINT,SIGHUP,SIGQUIT"] if preemptible else []),  # SIGTERM: the ranks save first
           str(entry or ENTRY), str(spec_path) if spec_path is not None else JOIN]
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


def train_job(job: Path, world_size: int, log=None, node: Node | None = None) -> int:
    """torchrun over the training ranks of ``<job>/spec.json`` with ``SignalRelay`` in place; raises ``Preempted``
    (or hands the signal to submitit) when the ranks stopped on a request after saving; else torchrun's exit code.
    A follower node (``node.follower``) joins node 0's ranks instead and returns torchrun's exit code: node 0's
    launcher owns the stop files and reports a preemption."""
    job = Path(job)
    if node is not None and node.follower:
        with SignalRelay(job):  # a stop request reaches every node's ranks through <job>/STOP_FILE
            return run_torchrun(None, world_size, log, node=node)
    for name in (STOP_FILE, PREEMPTED_FILE):
        (job / name).unlink(missing_ok=True)
    with SignalRelay(job) as relay:
        rc = run_torchrun(job / "spec.json", world_size, log, node=node)
    marker, message = job / PREEMPTED_FILE, None
    if marker.exists():
        m = json.loads(marker.read_text())
        message = (f"preempted by {m['signal']}: training saved a checkpoint at step {m['step']} of {m['total']} "
                   f"({m['checkpoint']}); the requeued job resumes from it")
    relay.replay(message)
    return rc


def node_launch(a: TrainArgs, ckpt_dir: Path, gpus: int | None = None, env=None) -> Node:
    """This node's share of the training ranks (``harness.train.zero.nodes.node``: refuses a Slurm step whose nodes
    are not ``train.nodes`` and a missing rendezvous) and, with CUDA, more ranks per node than this node's GPUs;
    warns in one line when a Slurm job's checkpoints would go inside the checkout (``harness.submit``)."""
    env = os.environ if env is None else env
    n = node(a.world_size, a.nodes, env)
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and n.per_node > gpus:
        raise ConfigError(f"train.world_size={a.world_size} over train.nodes={a.nodes} is {n.per_node} ranks per "
                          f"node but this node has {gpus} GPUs: set train.world_size={gpus * a.nodes}")
    ckpt = Path(ckpt_dir).resolve()
    if env.get("SLURM_JOB_ID") and ROOT in ckpt.parents:
        print(f"warning: paths.ckpt_dir {ckpt} is inside the checkout in a Slurm job; set HARNESS_CKPT_DIR or "
              f"SCRATCH (conf/hydra/launcher/slurm_a100.yaml)", file=sys.stderr)
    return n


def follow(cfg, n: Node, run_dir: Path) -> int:
    """A follower node's ``run.py``: join node 0's training (``torchrun ... --join``), then end without a row; the
    exit code is torchrun's (0 after a stop request on which the ranks saved: node 0's launcher reports it)."""
    a = to_args(TrainArgs, cfg.train, "train")
    a.validate()
    first = n.rank * n.per_node
    print(f"node {n.rank} of {n.count}: joining node 0's training at {n.addr}:{n.port} with ranks "
          f"{first}..{first + n.per_node - 1}; node 0 writes the row and evaluates", flush=True)
    prebuild_optimizer_op(a, torch.cuda.is_available())
    rc = train_job(Path(run_dir) / "train_job", a.world_size, node=n)
    if rc == PREEMPTED_EXIT:
        print(f"node {n.rank}: the ranks saved a checkpoint on a stop request; node 0 reports it", flush=True)
        return 0
    if rc:
        print(f"node {n.rank}: training failed (torchrun exit code {rc})", file=sys.stderr, flush=True)
    return rc


def launch(cfg, handle, method, a: TrainArgs, ckpt_dir: Path, fingerprint: str, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    n = node_launch(a, ckpt_dir)
    job = Path(run_dir) / "train_job"
    spec = write_spec(OmegaConf.to_container(cfg, resolve=True), ckpt_dir, fingerprint, job)
    prebuild_optimizer_op(a, torch.cuda.is_available())
    # the parent's copy leaves the GPUs while the ranks train (rank 0 shares GPU 0 with it), the CUDA cache emptied;
    # the gathered weights are loaded into it on the host, and it goes back where it was
    where = release(handle)
    try:
        rc = train_job(job, a.world_size, node=n)
        if rc != 0:
            raise RuntimeError(f"distributed training failed (torchrun exit code {rc}); job spec {spec}")
        return load_final(handle, method, job)
    finally:
        restore(handle, where)
