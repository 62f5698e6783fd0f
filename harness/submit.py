"""Submit a sweep to Slurm and return: one submitit job per sweep point (a job array), the job ids written to
``<results_dir>/jobs/<sweep>.json`` for ``make status``; nothing waits on the login node.

    python scripts/submit.py experiment=paper_llama2
    python run.py -m experiment=paper_llama2 hydra/launcher=slurm_a100   # the same (harness.precheck hands it here)

Why not hydra-submitit-launcher itself: its ``launch`` ends in ``[j.results()[0] for j in jobs]`` and has no option
to return earlier, so a paper sweep would hold the login node for days. This module composes the same sweep
(``harness.sweeps.expand``), reads the executor's parameters from the same launcher YAML
(``conf/hydra/launcher/slurm_a100.yaml`` + ``conf/local/slurm.yaml``, mapped to submitit exactly as that plugin maps
them), submits, writes the job ids and exits. Each job runs ``python run.py <point overrides>
hydra.run.dir=<sweep dir>/<n>_<model>_<method>`` inside the job's own process (``Point``), so Slurm's signals reach
the training's handlers and submitit's requeue (``Point.checkpoint``) as under the plugin: a requeued job runs in the
same directory, its row keeps its run_id and training resumes from its newest checkpoint.

Refused at submission, each in one line (``ConfigError``):
- ``hydra.launcher.nodes`` other than a training point's ``train.nodes`` (1 for a point that trains nothing), or
  ``train.world_size`` other than the job's GPUs (``nodes_rule``): every node runs the point's ``run.py``, node 0
  the whole run and the others their share of the training ranks (``harness.train.zero.nodes``); the same rule
  holds in ``scripts/render_sbatch.py`` and, inside a job, in ``run.py`` (``harness.train.zero.nodes.role``);
- checkpoints inside the checkout: the launcher's setup exports ``HARNESS_CKPT_DIR`` (default
  ``$SCRATCH/long-context-harness/ckpt``); ``job_ckpt_dir`` evaluates that line as the job will and refuses a
  ``paths.ckpt_dir`` that resolves inside this repository (``make plan`` prints the space a point needs).
"""
from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from harness import pipeline, sweeps
from harness.conf_utils import TOOLS_GROUP
from harness.config import ConfigError
from harness.results import atomic_write_json, now_iso
from harness.status import jobs_path

ROOT = Path(__file__).resolve().parents[1]
CKPT_EXPORT = "export HARNESS_CKPT_DIR="  # the launcher setup line that places a cluster job's checkpoints


# ----------------------------------------------------------------------------------------------- the rules
def nodes_rule(launcher: dict, cfgs: list) -> None:
    """Refuse a job whose nodes are not its training point's ``train.nodes`` (a point that trains nothing runs on
    one node), and a training point whose ranks are not all the job's GPUs: every node's ``run.py`` starts
    ``torchrun --nproc_per_node=train.world_size / train.nodes`` there (``harness.train.zero.nodes``)."""
    nodes, gpus = int(launcher.get("nodes") or 1), int(launcher.get("gpus_per_node") or 0)
    for cfg in cfgs:
        t = cfg.train
        trains = bool(t.get("enabled")) and t.get("engine") == "deepspeed"
        want = int(t.get("nodes") or 1) if trains else 1
        if nodes != want:
            what = f"train.nodes={want}" if trains else "a point that trains nothing runs on one node"
            raise ConfigError(f"hydra.launcher.nodes={nodes} but {what} (every node runs the point's run.py; "
                              f"node 0 writes the row): use hydra.launcher.nodes={want}"
                              + ("" if trains else ", or sweep the frozen points apart from the fine-tuned ones"))
        if trains and int(t.get("world_size", 1)) != gpus * nodes:
            raise ConfigError(f"train.world_size={t.world_size} but a job has {nodes} node(s) of {gpus} GPUs "
                              f"(hydra.launcher.gpus_per_node): set train.world_size={gpus * nodes} or "
                              f"hydra.launcher.gpus_per_node={int(t.world_size) // nodes}")


def job_ckpt_dir(cfg, setup: list[str], cwd: Path | None = None, env=None) -> Path:
    """The ``paths.ckpt_dir`` a cluster job of ``cfg`` will use: the launcher's ``export HARNESS_CKPT_DIR=`` line
    evaluated by bash as the job evaluates it (with this environment, which sbatch passes on), then the config's
    ``paths.ckpt_dir`` resolved with it, relative to ``cwd`` (the job's working directory: the submission's).
    Raises ``ConfigError`` when the line fails (neither ``HARNESS_CKPT_DIR`` nor ``SCRATCH`` set) or the directory
    is inside this checkout."""
    env = dict(os.environ if env is None else env)
    lines = [s for s in setup if str(s).strip().startswith(CKPT_EXPORT)]
    if lines:
        out = subprocess.run(["bash", "-c", "\n".join(lines) + '\nprintf %s "$HARNESS_CKPT_DIR"'], env=env,
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            why = re.sub(r"^bash: line \d+: ", "", (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1])
            raise ConfigError(f"checkpoints of a cluster job: {why} (hydra.launcher.setup exports HARNESS_CKPT_DIR, "
                              f"default $SCRATCH/long-context-harness/ckpt)")
        env["HARNESS_CKPT_DIR"] = out.stdout
    with _environ(env):
        ckpt = Path(str(cfg.paths.ckpt_dir)).expanduser()
    ckpt = ((cwd or Path.cwd()) / ckpt).resolve()
    if ckpt == ROOT or ROOT in ckpt.parents:
        raise ConfigError(f"paths.ckpt_dir resolves to {ckpt}, inside the checkout: a cluster point's ZeRO-3 "
                          f"checkpoints (make plan prints their size) belong on scratch; set HARNESS_CKPT_DIR or "
                          f"SCRATCH (or paths.ckpt_dir=/scratch/...)")
    return ckpt


@contextmanager
def _environ(env: dict):
    """``os.environ`` replaced by ``env`` for the block (``oc.env`` resolves against it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ----------------------------------------------------------------------------------------------- submitit
def executor_params(launcher: dict, cluster: str) -> tuple[dict, dict]:
    """(constructor, ``update_parameters``) arguments of ``submitit.AutoExecutor`` from the launcher node, mapped as
    hydra-submitit-launcher maps them: its base keys as they are, the rest prefixed with the executor's name. The
    local executor (tests, rehearsals) gets the base keys only: the setup lines and sbatch options are Slurm's."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    base = set(OmegaConf.structured(BaseQueueConf).keys())
    lc = {k: v for k, v in launcher.items() if k != "_target_"}
    init = {"folder": lc.pop("submitit_folder")}
    timeouts = lc.pop("max_num_timeout", None)
    if cluster == "slurm" and timeouts is not None:
        init["slurm_max_num_timeout"] = timeouts
    update = {k if k in base else f"{cluster}_{k}": v for k, v in lc.items() if k in base or cluster == "slurm"}
    return init, update


def run_app():
    """The installed Hydra app of one run, ``run.py``'s function: the tool ``run`` of the entry-point group
    ``harness.tools`` (the controlled study's app; the library names no study). Called with the command line's
    arguments, it returns the exit code."""
    apps = [ep for ep in entry_points(group=TOOLS_GROUP) if ep.name == "run"]
    if len(apps) != 1:
        raise ConfigError(f"{len(apps)} installed `run` tools under the entry-point group {TOOLS_GROUP} (valid: "
                          f"exactly one; reinstall the package: make setup)")
    return apps[0].load()


class Point:
    """One sweep point as a submitit job: ``run.py <overrides> hydra.run.dir=<run_dir>``, the installed app
    (:func:`run_app`) called inside the job's process (precheck, then the run), in the directory it was submitted
    from."""

    def __init__(self, overrides: list[str], run_dir: str, cwd: str):
        self.overrides, self.run_dir, self.cwd = list(overrides), str(run_dir), str(cwd)

    def __call__(self) -> None:
        os.chdir(self.cwd)
        code = run_app()([*self.overrides, f"hydra.run.dir={self.run_dir}"])
        if code:
            raise SystemExit(code)

    def checkpoint(self):
        """submitit's requeue on timeout or preemption: the same point again, in the same run directory."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def plan_sweep(overrides: list[str], cluster: str = "slurm") -> dict:
    """Compose and check every point of ``python run.py -m <overrides>``; the submission's record (no job yet)."""

    jobs = sweeps.expand(overrides)
    cfgs = [sweeps.compose([*job, "hydra.job.name=run"], with_hydra=True) for job in jobs]
    for job, cfg in zip(jobs, cfgs):
        try:
            pipeline.validate(cfg, data=False)  # data: checked where the job runs
        except Exception as e:  # noqa: BLE001
            raise sweeps.SweepJobError(job, e) from None
    first = cfgs[0]
    sweep_dir = str(Path(str(first.hydra.sweep.dir)).resolve())  # once (its ${now:...}); absolute, as rows record
    for cfg in cfgs:
        with open_dict(cfg):
            cfg.hydra.sweep.dir = sweep_dir
    launcher = OmegaConf.to_container(first.hydra.launcher, resolve=True)
    nodes_rule(launcher, cfgs)
    cwd = Path.cwd()
    ckpt = str(job_ckpt_dir(first, list(launcher.get("setup") or []), cwd)) if cluster == "slurm" else None
    points = []
    for n, (job, cfg) in enumerate(zip(jobs, cfgs)):
        with open_dict(cfg):
            cfg.hydra.job.num = n
        run = [o for o in job if not o.startswith("hydra")]
        points.append({"overrides": run, "row": OmegaConf.select(cfg, "study.row"),
                       "run_dir": str(Path(sweep_dir) / str(cfg.hydra.sweep.subdir)), "job_id": None})
    exp = OmegaConf.select(first, "study.experiment") or "sweep"
    return {"sweep": f"{exp}_{Path(sweep_dir).parent.name}_{Path(sweep_dir).name}", "cluster": cluster,
            "submitted": now_iso(), "command": "python run.py -m " + " ".join(overrides), "cwd": str(cwd),
            "ckpt_dir": ckpt, "sweep_dir": sweep_dir, "submitit_folder": launcher["submitit_folder"],
            "results_dir": str(first.paths.results_dir), "launcher": launcher, "points": points}


def submit(overrides: list[str], cluster: str = "slurm", log=print) -> tuple[dict, list]:
    """Submit every point as one job array and return (the record written to ``<results_dir>/jobs/<sweep>.json``,
    submitit's job handles) without waiting for any job."""
    import submitit

    rec = plan_sweep(overrides, cluster)
    init, update = executor_params(rec["launcher"], cluster)
    executor = submitit.AutoExecutor(cluster=cluster, **init)
    executor.update_parameters(**update)
    jobs = executor.submit_array([Point(p["overrides"], p["run_dir"], rec["cwd"]) for p in rec["points"]])
    for p, j in zip(rec["points"], jobs):
        p["job_id"] = str(j.job_id)
    path = jobs_path(rec["results_dir"], rec["sweep"])
    atomic_write_json(path, {k: v for k, v in rec.items() if k != "launcher"})
    log(f"submitted {len(jobs)} job(s) to {cluster}: {', '.join(p['job_id'] for p in rec['points'])}")
    if rec["ckpt_dir"]:
        log(f"checkpoints: {rec['ckpt_dir']}")
    log(f"job ids: {path}; `make status` follows them")
    return rec, jobs
