"""Experiment files and launchers: every sweep point of every experiment composes and validates; tiny_study reduced
to two methods runs end to end with the joblib launcher; the Slurm submission of paper_llama2 (submitit, with a
stand-in ``sbatch``) and the plain sbatch template carry the configured resources and commands."""
from __future__ import annotations

import functools
import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, load_file_module

from harness import conf_utils, sweeps
from tests import forkrun

EXPERIMENTS = sorted(p.stem for d in conf_utils.conf_dirs() for p in (d / "experiment").glob("*.yaml"))
# the folders a caller's environment may point elsewhere (conf/paths/default.yaml reads them): the renderings and
# compositions these tests compare with committed text use the defaults, whatever the caller set
PATH_SETTINGS = ("HARNESS_OUTPUT_DIR", "HARNESS_RESULTS_DIR", "HARNESS_CKPT_DIR", "HARNESS_CACHE_DIR")


@pytest.fixture(autouse=True)
def _default_paths(monkeypatch):
    for k in PATH_SETTINGS:
        monkeypatch.delenv(k, raising=False)


TABLE1 = {"LLaMA2", "NTK-Frozen", "LM-Infinite", "Self-Extend", "PI", "NTK-32K", "YaRN", "CLEX", "LongLoRA",
          "Landmark", "NTK-64K", "NTK-64K-2B"}


def test_the_study_points_live_in_the_study_package():
    """The library's ``conf/`` holds no study point and no experiment: they are the controlled study's
    (``controlled_study/conf``), on the config search path through its ``harness.conf`` entry point."""
    assert not (conf_utils.CONF_DIR / "point").exists() and not (conf_utils.CONF_DIR / "experiment").exists()
    assert conf_utils.installed_conf_dirs() == [ROOT / "controlled_study" / "conf"]
    assert conf_utils.conf_dirs()[:2] == [conf_utils.CONF_DIR, ROOT / "controlled_study" / "conf"]


def test_every_experiment_is_there():
    assert set(EXPERIMENTS) >= {"paper_llama2", "paper_phi2", "entropy_abf", "tiny_study"}
    for e in EXPERIMENTS:
        lines = conf_utils.find_conf("experiment", e).read_text().splitlines()
        assert lines[0] == "# @package _global_" and lines[1].startswith(f"# python run.py -m experiment={e}")


@functools.cache
def _points(exp: str) -> list[tuple[list[str], object]]:
    from harness import pipeline

    out = []
    for job in sweeps.expand([f"experiment={exp}"]):
        cfg = sweeps.compose(job)
        pipeline.validate(cfg, data=False)  # method vs C, train recipe, every evaluator; cluster data is not here
        out.append((job, cfg))
    return out


# the experiments at the paper's scale: their fine-tuned points train on the cluster data, evaluated with this suite
PAPER_SCALE = {"paper_llama2": "paper", "paper_phi2": "paper", "entropy_abf": "longbench"}


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_sweep_point_composes(exp):
    points = _points(exp)
    assert points
    for _job, cfg in points:
        assert cfg.study.experiment == exp and cfg.study.row
        if cfg.train.enabled is False:
            assert cfg.train.name == "none"
        elif exp in PAPER_SCALE:  # not the CPU miniature's mixture (validate refuses it under these budgets too)
            assert cfg.data.name == "slimpajama_upsampled", (exp, cfg.study.row)
        if exp in PAPER_SCALE:
            assert cfg.eval.name == PAPER_SCALE[exp], (exp, cfg.study.row)


def test_one_paper_point_prints_the_cluster_data_and_the_paper_suite():
    out = forkrun.run([sys.executable, str(ROOT / "run.py"), "experiment=paper_llama2",
                          "point=paper_llama2/ntk_32k", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    import yaml

    cfg = yaml.safe_load(out.stdout)
    assert cfg["data"]["name"] == "slimpajama_upsampled" and cfg["data"]["path"].endswith("/slimpajama")
    assert cfg["eval"]["name"] == "paper" and cfg["train"]["name"] == "paper"


def test_paper_llama2_is_table1():
    from harness.config import to_args
    from harness.train import TrainArgs

    rows = {cfg.study.row: cfg for _, cfg in _points("paper_llama2")}
    assert set(rows) == TABLE1
    for name, cfg in rows.items():
        assert cfg.model.name == "llama2_7b" and cfg.eval.name == "paper" and cfg.data.name == "slimpajama_upsampled"
        frozen = name in {"LLaMA2", "NTK-Frozen", "LM-Infinite", "Self-Extend"}
        assert cfg.train.name == ("none" if frozen else "paper")
        if frozen:
            continue
        t = to_args(TrainArgs, cfg.train, "train")
        # Landmark: the recipe's 32k sequences (Table 7), split into its 512-token training context by the method
        want_len = {"NTK-64K": 65536, "NTK-64K-2B": 65536}.get(name, 32768)
        assert (t.seq_len, t.tokens) == (want_len, 2_000_000_000 if name == "NTK-64K-2B" else 1_000_000_000)
        assert (t.global_batch, t.lr, t.weight_decay, t.ema, t.world_size) == (32, 2e-5, 0.0, True, 8)
    assert rows["NTK-64K-2B"].method.name == rows["NTK-64K"].method.name == "ntk_64k"
    assert rows["Landmark"].method.train_len == 512


def test_tiny_study_covers_every_method_and_entropy_abf_steps():
    from harness.config import to_args
    from harness.train import TrainArgs

    tiny = _points("tiny_study")
    methods = {cfg.method.name for _, cfg in tiny}
    assert methods == {p.stem for p in (conf_utils.CONF_DIR / "method").glob("*.yaml")}
    for _, cfg in tiny:
        assert cfg.model.name == "tiny_llama" and cfg.eval.name == "tiny"
        assert list(cfg.eval.lengths) == [512, 1024, 2048, 4096, 8192]  # C..16C, C = 512
    steps = {}
    for _, cfg in _points("entropy_abf"):
        t = to_args(TrainArgs, cfg.train, "train")
        assert t.seq_len == 16384 and t.schedule == "cosine" and t.weight_decay == 0.1
        steps[(cfg.method.name, cfg.study.samples)] = t.steps()
    assert {s for (_, n), s in steps.items()} == {2, 6, 62, 54}  # 32, 100, 1000, 3500 samples x 2 epochs
    assert len(steps) == 20


@pytest.mark.slow  # ~28 s idle; the default tier runs the study's points through scripts/study.py (tests/test_study.py)
def test_tiny_study_two_methods_with_joblib(tmp_path):
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_CACHE_DIR=str(tmp_path / "cache"),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "experiment=tiny_study",
           "point=tiny_study/base,tiny_study/pi", "hydra/launcher=joblib_local",
           "eval=quick", "eval.lengths=[256,512]", "eval.suite.ppl_books.samples=1", "eval.suite.passkey.samples=2",
           "++train.seq_len=512", "++train.tokens=4096", "++train.global_batch=4", "++train.save_every=0",
           "++train.convergence_check=false"]
    out = forkrun.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(f.read_text()) for f in (tmp_path / "results" / "tiny_study" / "runs").glob("*.json")]
    assert sorted(r["method"] for r in rows) == ["base", "pi"]  # the study's rows, in the study's folder
    assert not list((tmp_path / "results" / "runs").glob("*.json"))  # none among the rows of no study
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert set(r["metrics"]) == {"ppl_books", "passkey"}
        assert set(r["metrics"]["passkey"]["accuracy"]) == {"256", "512"}
        assert r["config"]["study"]["experiment"] == "tiny_study"
        run_dir = Path(r["run_dir"])
        assert (run_dir / "run.json").exists() and (run_dir / ".hydra" / "config.yaml").exists()
        hydra_cfg = (run_dir / ".hydra" / "hydra.yaml").read_text()
        assert "JoblibLauncher" in hydra_cfg
    pi = next(r for r in rows if r["method"] == "pi")
    base = next(r for r in rows if r["method"] == "base")
    assert base["train_info"] is None and base["train"] == "none"
    assert pi["train"] == "tiny" and pi["train_info"]["steps"] == 2 and pi["train_info"]["seq_len"] == 512


FAKE_SBATCH = """#!/bin/bash
# stand-in for sbatch: keep the submission script, answer like Slurm
cp "${@: -1}" "$CAPTURE/submission_$(date +%s%N).sh"
echo "Submitted batch job 4242"
"""
FAKE_SACCT = """#!/bin/bash
# stand-in for sacct: every array task of job 4242 has failed (nothing runs here)
echo "JobID|State|NodeList"
for i in $(seq 0 40); do echo "4242_$i|FAILED|node1"; done
"""


def _site_conf(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "local").mkdir(parents=True)
    (site / "local" / "slurm.yaml").write_text("# @package hydra.launcher\npartition: a100-part\naccount: acct-42\n")
    return site


def test_slurm_submission_of_paper_llama2(tmp_path):
    """``run.py -m ... hydra/launcher=slurm_a100`` submits through ``harness.submit`` (submitit writes the real sbatch
    script; a stand-in sbatch records it), prints the job ids, writes them for ``make status`` and exits at once
    instead of waiting for the jobs (hydra-submitit-launcher waits: days on the login node)."""
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture"
    bin_dir.mkdir()
    capture.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("sacct", FAKE_SACCT), ("srun", "#!/bin/bash\nexit 1\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CAPTURE=str(capture),
               HARNESS_OUTPUT_DIR=str(tmp_path / "out"), HARNESS_RESULTS_DIR=str(tmp_path / "results"),
               SCRATCH=str(tmp_path / "scratch"))
    env.pop("HARNESS_CKPT_DIR", None)
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "experiment=paper_llama2", "hydra/launcher=slurm_a100",
           f"hydra.searchpath=[file://{_site_conf(tmp_path)}]", f"hydra.sweep.dir={sweep_dir}"]
    out = forkrun.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    ids = [f"4242_{i}" for i in range(12)]
    assert f"submitted 12 job(s) to slurm: {', '.join(ids)}" in out.stdout
    assert f"checkpoints: {tmp_path / 'scratch' / 'long-context-harness' / 'ckpt'}" in out.stdout
    rec = json.loads(next((tmp_path / "results" / "jobs").glob("paper_llama2_*.json")).read_text())
    assert [p["job_id"] for p in rec["points"]] == ids and rec["sweep_dir"] == str(sweep_dir)
    scripts = list(capture.glob("submission_*.sh"))
    assert len(scripts) == 1
    text = scripts[0].read_text()
    for flag in ("--nodes=1", "--gpus-per-node=8", "--ntasks-per-node=1", "--cpus-per-task=64", "--mem=480GB",
                 "--time=1440", "--partition=a100-part", "--account=acct-42", "--signal=USR2@180",
                 "--array=0-11%12", "--open-mode=append", "--requeue"):  # submitit caps % at the job count
        assert f"#SBATCH {flag}\n" in text, (flag, text)
    assert text.count("#SBATCH --requeue") == 1
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    # srun >= 22.05 does not inherit --cpus-per-task: without this its task (run.py + 8 ranks) gets one CPU
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in text
    assert 'export HARNESS_CKPT_DIR="${HARNESS_CKPT_DIR:-${SCRATCH:?' in text  # checkpoints on scratch
    assert "srun" in text and "-m submitit.core._submit" in text
    # the command each array task runs: run.py with that point's overrides, in its own run directory
    pickles = sorted(sweep_dir.glob(".submitit/**/*_submitted.pkl"))
    assert len(pickles) == 12
    points = set()
    for p in pickles:
        with open(p, "rb") as f:
            delayed = pickle.load(f)
        point = delayed.function
        assert type(point).__name__ == "Point" and "experiment=paper_llama2" in point.overrides
        assert not any(o.startswith("hydra") for o in point.overrides) and point.cwd == str(ROOT)
        assert Path(point.run_dir).parent == sweep_dir
        points |= {o.split("=", 1)[1] for o in point.overrides if o.startswith("point=")}
        assert delayed._timeout_countdown == 5  # requeued after timeouts (Point.checkpoint), resumes via run.json
    assert len(points) == 12 and "paper_llama2/ntk_64k_2b" in points


def test_plain_sbatch_template(tmp_path):
    render_sbatch = load_file_module(ROOT / "scripts" / "render_sbatch.py")

    out = tmp_path / "paper_llama2.sbatch"
    render_sbatch.main(["experiment=paper_llama2", f"hydra.searchpath=[file://{_site_conf(tmp_path)}]",
                        "--out", str(out)])
    text = out.read_text()
    for flag in ("--nodes=1", "--gpus-per-node=8", "--cpus-per-task=64", "--mem=480G", "--time=1-00:00:00",
                 "--partition=a100-part", "--account=acct-42", "--array=0-11%16", "--requeue", "--signal=B:USR1@180"):
        assert f"#SBATCH {flag}\n" in text, flag
    assert "  11) POINT=(point=paper_llama2/ntk_64k_2b experiment=paper_llama2) ;;" in text
    assert ('srun --ntasks=1 --ntasks-per-node=1 --cpus-per-task=64 --gpus-per-node=8 python run.py "${POINT[@]}" '
            "'hydra.run.dir='\"'\"'outputs/slurm/paper_llama2/'\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}'\" &"
            in text)  # 8 cores per GPU; srun >= 22.05 does not inherit --cpus-per-task from sbatch
    assert "scontrol requeue" in text and 'kill -USR2 "$SRUN_PID"' in text  # save, then requeue
    four = sweeps.compose(["hydra/launcher=slurm_a100", "hydra.launcher.gpus_per_node=4"], with_hydra=True)
    assert four.hydra.launcher.cpus_per_task == 32  # follows the GPUs: 8 cores per GPU
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    committed = ROOT / "slurm" / "paper_llama2.sbatch"
    if committed.exists():  # the committed template is the rendering of the committed config
        assert committed.read_text() == render_sbatch.render(["experiment=paper_llama2"])


def test_requeued_job_keeps_its_row(results_env):
    """A requeued job restarts in the same run directory: same run_id, one row."""
    from harness import lifecycle

    cfg = sweeps.compose(["model=tiny_llama", "train=none", "eval=quick"])
    d = results_env / "outputs" / "job0"
    first = lifecycle.start(cfg, run_dir=d)
    again = lifecycle.start(cfg, run_dir=d)
    assert first.row["run_id"] == again.row["run_id"]
    assert len(list((results_env / "results" / "runs").glob("*.json"))) == 1


def test_jobs_are_the_basic_sweepers():
    """``sweeps.jobs`` (the public override API, no ``hydra._internal`` in the harness) gives Hydra's basic sweeper's
    jobs in its order: keys in first-appearance order, a later override of a key replacing its values in place."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.sweeps import jobs

    parser = OverridesParser.create()
    for argv in (["method=pi,yarn", "seed=0,1", "train=none"], ["a=1", "b=x,y", "a=2,3"], ["+e@eval.suite.t=toy"],
                 ["lr=range(1,4)", "b=q"], ["model=tiny_llama", "method=choice(pi,yarn)", "eval.lengths=[1,2]"]):
        ov = parser.parse_overrides(argv)
        assert jobs(ov) == BasicSweeper.split_arguments(ov, None)[0], argv
    with pytest.raises(ValueError, match="discrete sweeps"):
        jobs(parser.parse_overrides(["lr=interval(0,1)"]))
