"""Issue 32, item 3: a cluster launch that is right or refused. One node per point (``nodes > 1`` and a
``train.world_size`` other than the node's GPUs are refused at submission, in ``render_sbatch.py``, and inside a job
by ``run.py`` and the training launcher); submit-and-exit (``scripts/submit.py``, which ``run.py -m ...
hydra/launcher=slurm_a100`` hands its sweep to) with the job ids in ``<results_dir>/jobs/`` for ``make status``;
checkpoints on scratch, refused inside the checkout."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import ROOT, load_file_module

from harness import submit, sweeps
from harness.config import ConfigError
from harness.train import TrainArgs
from tests import forkrun

PI = ["experiment=paper_llama2", "point=paper_llama2/pi", "hydra/launcher=slurm_a100"]
FAKE_SBATCH = """#!/bin/bash
cp "${@: -1}" "$CAPTURE/submission_$(date +%s%N).sh"
echo "Submitted batch job 4242"
"""


def _launcher(overrides: list[str]) -> tuple[dict, object]:
    from omegaconf import OmegaConf

    cfg = sweeps.compose(overrides, with_hydra=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True), cfg


def test_a_job_s_nodes_are_its_point_s():
    """The launcher's own config passes; two nodes for a one-node point, or 16 ranks on one 8-GPU node, are one line
    naming the fix (tests/test_multinode.py: a point that asks for two nodes)."""
    launcher, cfg = _launcher(PI)
    submit.nodes_rule(launcher, [cfg])
    two, cfg2 = _launcher([*PI, "hydra.launcher.nodes=2", "train.world_size=16"])
    with pytest.raises(ConfigError, match=r"hydra.launcher.nodes=2 but train.nodes=1") as e:
        submit.nodes_rule(two, [cfg2])
    assert "\n" not in str(e.value)
    wide, cfg3 = _launcher([*PI, "train.world_size=16"])
    with pytest.raises(ConfigError, match=r"train.world_size=16 but a job has 1 node\(s\) of 8 GPUs"):
        submit.nodes_rule(wide, [cfg3])
    frozen, cfg4 = _launcher(["experiment=paper_llama2", "point=paper_llama2/base", "hydra/launcher=slurm_a100",
                              "hydra.launcher.gpus_per_node=4"])
    submit.nodes_rule(frozen, [cfg4])  # a frozen point trains nothing: any GPU count
    text = (ROOT / "conf" / "hydra" / "launcher" / "slurm_a100.yaml").read_text()
    assert "nodes=2" not in text and "world_size=16" not in text  # the old suggestion is gone


def test_inside_a_job_the_step_s_nodes_and_the_node_s_gpus(tmp_path, capsys):
    """In a Slurm step of two nodes a one-node run is refused (each node would train its own copy); more ranks per
    node than the node's GPUs are refused; checkpoints in the checkout inside a job are warned about."""
    from harness.train.deepspeed_engine import node_launch

    def args(world, nodes=1):
        return TrainArgs(name="t", enabled=True, engine="deepspeed", world_size=world, nodes=nodes, seq_len=8,
                         tokens=64, global_batch=world)

    node_launch(args(8), tmp_path, gpus=8, env={"SLURM_STEP_NUM_NODES": "1", "SLURM_JOB_NUM_NODES": "2"})
    node_launch(args(8), tmp_path, gpus=8, env={})
    with pytest.raises(ConfigError, match="spans 2 nodes but train.nodes=1"):
        node_launch(args(8), tmp_path, gpus=8, env={"SLURM_NNODES": "2"})
    with pytest.raises(ConfigError, match=r"8 ranks per node but this node has 4 GPUs: set train.world_size=8"):
        node_launch(args(16, 2), tmp_path, gpus=4, env={"MASTER_ADDR": "a", "MASTER_PORT": "1", "NODE_RANK": "0"})
    node_launch(args(8), ROOT / "outputs" / "ckpt", gpus=8, env={"SLURM_JOB_ID": "7"})
    assert "inside the checkout in a Slurm job" in capsys.readouterr().err
    node_launch(args(2), tmp_path, gpus=0, env={"SLURM_JOB_ID": "7"})  # CPU (gloo): any rank count, scratch: quiet
    assert capsys.readouterr().err == ""


@pytest.mark.integration
def test_checkpoints_of_a_cluster_job_go_to_scratch(tmp_path, monkeypatch):
    """The launcher's setup line, evaluated by bash as the job evaluates it: $HARNESS_CKPT_DIR, else $SCRATCH/...;
    neither set, or a directory in the checkout, is refused in one line."""
    launcher, cfg = _launcher(PI)
    setup = launcher["setup"]
    base = {k: v for k, v in os.environ.items() if k not in ("SCRATCH", "HARNESS_CKPT_DIR")}
    got = submit.job_ckpt_dir(cfg, setup, env={**base, "SCRATCH": str(tmp_path)})
    assert got == tmp_path / "long-context-harness" / "ckpt"
    assert submit.job_ckpt_dir(cfg, setup, env={**base, "HARNESS_CKPT_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    with pytest.raises(ConfigError, match="set HARNESS_CKPT_DIR or SCRATCH") as e:
        submit.job_ckpt_dir(cfg, setup, env=base)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="inside the checkout"):
        submit.job_ckpt_dir(cfg, setup, cwd=ROOT, env={**base, "HARNESS_CKPT_DIR": "outputs/ckpt"})
    explicit = sweeps.compose([*PI, f"paths.ckpt_dir={tmp_path / 'mine'}"])  # the command line wins over the env
    assert submit.job_ckpt_dir(explicit, setup, env={**base, "SCRATCH": "/s"}) == tmp_path / "mine"
    from harness.tools import plan as plan_script  # `make plan` says where, or why not
    monkeypatch.delenv("HARNESS_CKPT_DIR", raising=False)
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    assert plan_script.cluster_ckpt_dir(cfg) == str(tmp_path / "long-context-harness" / "ckpt")
    monkeypatch.delenv("SCRATCH")
    assert plan_script.cluster_ckpt_dir(cfg).startswith("REFUSED at submission: checkpoints of a cluster job")


def test_executor_parameters_come_from_the_launcher_yaml():
    """Mapped as hydra-submitit-launcher maps them: base keys as they are, the rest prefixed with the executor."""
    launcher, _ = _launcher(PI)
    init, update = submit.executor_params(launcher, "slurm")
    assert init == {"folder": launcher["submitit_folder"], "slurm_max_num_timeout": 5}
    assert update["gpus_per_node"] == 8 and update["timeout_min"] == 1440 and update["nodes"] == 1
    assert update["slurm_setup"] == launcher["setup"] and update["slurm_signal_delay_s"] == 180
    assert update["slurm_additional_parameters"] == {"requeue": True} and update["slurm_array_parallelism"] == 16
    _, local = submit.executor_params(launcher, "local")
    assert not any(k.startswith("slurm_") or k == "setup" for k in local) and local["timeout_min"] == 1440


def _fake_slurm(tmp_path: Path, sacct: str | None) -> dict:
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture"
    bin_dir.mkdir()
    capture.mkdir()
    tools = {"sbatch": FAKE_SBATCH, **({"sacct": sacct} if sacct else {})}
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CAPTURE=str(capture),
                HARNESS_OUTPUT_DIR=str(tmp_path / "out"), HARNESS_RESULTS_DIR=str(tmp_path / "results"),
                HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), PYTHONPATH=str(ROOT))


@pytest.mark.integration
def test_run_py_refuses_two_nodes_for_a_one_node_point_before_submitting(tmp_path):
    """`run.py -m ... hydra/launcher=slurm_a100 hydra.launcher.nodes=2` for a point of ``train.nodes=1`` used to
    submit a job whose second node ran the whole point again; now it is one line and nothing reaches sbatch; inside
    a two-node step a run that trains nothing is refused too (each node would write its own row)."""
    env = _fake_slurm(tmp_path, None)
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *PI, "hydra.launcher.nodes=2", "train.world_size=16"]
    out = forkrun.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "hydra.launcher.nodes=2 but train.nodes=1" in lines[0], out.stderr
    assert not list((tmp_path / "capture").iterdir())
    inside = forkrun.run([sys.executable, str(ROOT / "run.py"), "method=base", "train=none"], cwd=ROOT,
                            env={**env, "SLURM_STEP_NUM_NODES": "2"}, capture_output=True, text=True, timeout=300)
    assert inside.returncode == 2, inside.stderr[-2000:]
    assert "this Slurm step spans 2 nodes but the run trains nothing" in inside.stderr, inside.stderr[-2000:]


@pytest.mark.integration
def test_local_submission_returns_before_its_jobs_end(tmp_path):
    """submitit's local executor: the script prints the job ids, writes them, and exits while the jobs run; the jobs
    then write their rows in the recorded run directories, and `make status` lists them beside the rows."""
    env = _fake_slurm(tmp_path, None)
    cmd = [sys.executable, str(ROOT / "scripts" / "submit.py"), "--cluster", "local", "method=base,pi", "train=none",
           "eval=quick", "eval.lengths=[256]", "eval.suite.ppl_books.samples=1", "eval.suite.passkey.samples=1"]
    log = tmp_path / "submit.log"
    with open(log, "w") as f:  # a file, not a pipe: the jobs inherit it, and a pipe would wait for them too
        rc = forkrun.run(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode
    returned = time.time()
    assert rc == 0, log.read_text()[-2000:]
    recs = list((tmp_path / "results" / "jobs").glob("*.json"))
    assert len(recs) == 1
    rec = json.loads(recs[0].read_text())
    ids = [p["job_id"] for p in rec["points"]]
    assert len(ids) == 2 and all(ids) and f"submitted 2 job(s) to local: {', '.join(ids)}" in log.read_text()
    rows: list = []
    deadline = time.time() + 120
    while time.time() < deadline:
        rows = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
        if len(rows) == 2 and all(r["status"] != "running" for r in rows):
            break
        time.sleep(1)
    assert sorted(r["method"] for r in rows) == ["base", "pi"] and all(r["status"] == "ok" for r in rows), rows
    assert {r["run_dir"] for r in rows} == {p["run_dir"] for p in rec["points"]}
    for r in rows:  # every job ended after the submission had returned
        assert datetime.fromisoformat(r["time_end"]).timestamp() > returned, (r["time_end"], returned)
    status = forkrun.run([sys.executable, "-m", "harness.status", str(tmp_path / "results"), "--all"], env=env,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    jobs = [ln.split() for ln in status.stdout.splitlines() if ln.strip().split(" ")[0] in ids]
    assert len(jobs) == 2 and all(j[1:3] == ["FINISHED", "ok"] for j in jobs), status.stdout


@pytest.mark.integration
def test_status_follows_slurm_jobs_or_says_slurm_is_not_there(tmp_path, capsys, monkeypatch):
    from harness import status

    res = tmp_path / "results"
    (res / "jobs").mkdir(parents=True)
    rec = {"sweep": "paper_llama2_x", "cluster": "slurm", "submitted": "2026-01-01T00:00:00+00:00",
           "submitit_folder": str(tmp_path / "%j"),
           "points": [{"job_id": f"4242_{i}", "row": r, "run_dir": str(tmp_path / str(i)), "overrides": []}
                      for i, r in enumerate(("PI", "YaRN"))]}
    (res / "jobs" / "paper_llama2_x.json").write_text(json.dumps(rec))
    sacct = tmp_path / "sacct"
    sacct.write_text('#!/bin/bash\necho "4242_0|RUNNING"\necho "4242_1|CANCELLED by 7"\n')
    sacct.chmod(0o755)
    assert status.slurm_states(["4242_0", "4242_1"], str(sacct)) == {"4242_0": "RUNNING", "4242_1": "CANCELLED"}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no sacct: the jobs are listed, their state unknown
    assert status.main([str(res)]) == 0
    out = capsys.readouterr().out
    assert "slurm not available" in out and "4242_1" in out and "no row" in out


@pytest.mark.parametrize("drop", ["sweep", "submitit_folder"])
def test_status_skips_a_job_record_missing_a_field_with_one_line(tmp_path, capsys, drop):
    """A submission record without its sweep name (or a local one without its submitit folder) is skipped with one
    warning naming the file and the field (before: ``KeyError`` out of ``make status``); the rows are still listed."""
    from harness import status

    res = tmp_path / "results"
    (res / "jobs").mkdir(parents=True)
    rec = {"sweep": "s", "cluster": "local", "submitted": "2026-01-01T00:00:00+00:00",
           "submitit_folder": str(tmp_path / "%j"), "points": [{"job_id": "1", "run_dir": "x", "overrides": []}]}
    rec.pop(drop)
    (res / "jobs" / "s.json").write_text(json.dumps(rec))
    assert status.main([str(res)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s.json" in err[0] and f"no {drop}" in err[0], err


def test_render_sbatch_refuses_an_override_hydra_cannot_parse_in_one_line(tmp_path, capsys):
    """``render_sbatch.py 'method=[yarn'`` (an override Hydra's grammar refuses) is one line naming it and exit 2,
    not Hydra's traceback."""
    render_sbatch = load_file_module(ROOT / "scripts" / "render_sbatch.py")
    with pytest.raises(SystemExit) as e:
        render_sbatch.main(["experiment=paper_llama2", "method=[yarn", "--out", str(tmp_path / "x.sbatch")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "method=[yarn" in err[0] and "Traceback" not in err[0], err


def test_render_sbatch_keeps_the_same_rules(tmp_path):
    render_sbatch = load_file_module(ROOT / "scripts" / "render_sbatch.py")
    with pytest.raises(SystemExit, match="hydra.launcher.nodes=2 but a point that trains nothing runs on one node"):
        render_sbatch.render(["experiment=paper_llama2", "hydra.launcher.nodes=2"])
    text = render_sbatch.render(["experiment=paper_llama2"])
    assert 'export HARNESS_CKPT_DIR="${HARNESS_CKPT_DIR:-${SCRATCH:?' in text  # resolved: bash's ${, no backslash
