"""`make study`: a point runs once; run again, the point whose row has the same config hash is skipped (the hash
the study computes is the one run.py writes into the row), and the tables and findings are written at the end."""
from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import ROOT

from tests import forkrun

# one cheap point of tiny_study: the frozen base on the quick suite at 2 short lengths
OVERRIDES = ["experiment=tiny_study", "point=tiny_study/base", "eval=quick", "eval.lengths=[128,256]",
             "eval.suite.passkey.samples=2", "eval.suite.ppl_books.samples=1"]


@pytest.mark.slow  # 32 s; skipping by config hash stays in the default tier: the gpu-study rehearsal
def test_study_runs_then_skips_by_config_hash(tmp_path):
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "scripts" / "study.py")] + OVERRIDES
    first = forkrun.run(cmd + ["--no-figures"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "1 points, 0 already done" in first.stdout and "1 points run, 0 skipped" in first.stdout
    assert "wall time" in first.stdout and "make findings" in first.stdout
    study = tmp_path / "results" / "tiny_study"   # the study's own folder: rows, tables, findings
    rows = [json.loads(p.read_text()) for p in (study / "runs").glob("*.json")]
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    assert (study / "findings.md").exists() and (study / "tables" / "index.md").exists()
    # the hash the study computes for the point is the one run.py wrote
    h = rows[0]["config_hash"]
    assert f"(config {h})" in first.stdout
    second = forkrun.run(cmd + ["--no-report"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1 already done" in second.stdout and f"done: {rows[0]['run_id']}" in second.stdout
    assert "0 points run, 1 skipped" in second.stdout
    assert len(list((study / "runs").glob("*.json"))) == 1
    # a changed config (another seed) is not the same point: it would run
    dry = forkrun.run(cmd + ["seed=1", "--dry-run"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert dry.returncode == 0 and "0 already done" in dry.stdout and "1 to run" in dry.stdout


@pytest.mark.slow  # ~14 s idle: the study tool's points in parallel; the default tier runs its points in turn (above)
def test_study_jobs_run_points_at_once(tmp_path):
    """``--jobs 2``: two points run at the same time (each started before the other ended), one thread each."""
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("OMP_NUM_THREADS", None)
    over = ["experiment=tiny_study", "point=tiny_study/base,tiny_study/ntk_frozen"] + OVERRIDES[2:]
    r = forkrun.run([sys.executable, str(ROOT / "scripts" / "study.py"), *over, "--jobs", "2", "--no-report"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "2 points run, 0 skipped (done), 0 failed" in r.stdout
    rows = [json.loads(p.read_text()) for p in (tmp_path / "results" / "tiny_study" / "runs").glob("*.json")]
    assert sorted(x["method"] for x in rows) == ["base", "ntk_frozen"] and all(x["status"] == "ok" for x in rows)
    # both points were started before either was waited for (row times have 1 s resolution: not a test of overlap)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("== [")]
    assert [ln.endswith(")") and ": " not in ln.split("]", 1)[1] for ln in lines[:2]] == [True, True], lines
    assert {x["hardware"]["torch_threads"] for x in rows} == {max(1, (os.cpu_count() or 1) // 2)}


def test_ntk_64k_2b_point_trains_on_twice_ntk_64k_tokens():
    """The NTK-64K-2B point is NTK-64K with twice the tokens, whatever train=tiny's budget is (a hard-coded token count
    once left it with 0.09x NTK-64K's tokens after the recipe grew)."""
    from harness.conf_utils import compose

    one, two = (compose(["experiment=tiny_study", f"point=tiny_study/{p}"]).train for p in ("ntk_64k", "ntk_64k_2b"))
    assert two.seq_len == one.seq_len and two.tokens == 2 * one.tokens
    assert {k: v for k, v in two.items() if k != "tokens"} == {k: v for k, v in one.items() if k != "tokens"}


def test_study_starts_longest_first_and_estimates_wall_from_recorded_rows(tmp_path):
    """Expected seconds per point come from the latest ok row naming that point (any seed); the longest start
    first; the expected wall time is the list schedule of those seconds on --jobs lanes."""
    from controlled_study import study as st
    runs = tmp_path / "runs"
    runs.mkdir()
    rows = [  # (point, start, end, status)
        ("tiny_study/pi", "2026-01-01T10:00:00+00:00", "2026-01-01T10:10:00+00:00", "ok"),
        ("tiny_study/pi", "2026-01-02T10:00:00+00:00", "2026-01-02T10:12:00+00:00", "ok"),  # latest: 720 s
        ("tiny_study/ntk_64k", "2026-01-01T10:00:00+00:00", "2026-01-01T10:50:00+00:00", "ok"),
        ("tiny_study/base", "2026-01-01T10:00:00+00:00", "2026-01-01T10:05:00+00:00", "ok"),
        ("tiny_study/landmark", "2026-01-01T10:00:00+00:00", "2026-01-01T11:00:00+00:00", "failed"),
    ]
    for i, (pt, t0, t1, status) in enumerate(rows):
        (runs / f"r{i}.json").write_text(json.dumps({
            "run_id": f"r{i}", "status": status, "time_start": t0, "time_end": t1,
            "command": f"run.py point={pt} experiment=tiny_study" + (" data.seed=1" if i == 1 else "")}))
    sec = st.recorded_seconds(str(tmp_path))
    assert sec == {"tiny_study/pi": 720.0, "tiny_study/ntk_64k": 3000.0, "tiny_study/base": 300.0}
    jobs = [{"label": p, "expected_s": sec.get(p)} for p in
            ("tiny_study/base", "tiny_study/pi", "tiny_study/landmark", "tiny_study/ntk_64k")]
    assert [j["label"] for j in st.order_jobs(jobs, "longest")] == [
        "tiny_study/landmark", "tiny_study/ntk_64k", "tiny_study/pi", "tiny_study/base"]
    assert st.order_jobs(jobs, "given") == jobs
    # list scheduling on 2 lanes: longest first 3000 | 720+300 -> 3000; in the given order 300+3000 | 720 -> 3300
    assert st.expected_wall([3000, 720, 300], 2) == 3000 and st.expected_wall([300, 720, 3000], 2) == 3300
    assert st.expected_wall([300, 720, 3000], 1) == 4020
    assert st.point_of(["experiment=tiny_study", "point=tiny_study/pi"]) == "tiny_study/pi"
    assert st.point_of("run.py method=base") is None


def test_study_refuses_a_job_that_does_not_compose_before_running_any(tmp_path):
    """A key one point's config lacks (``train.seed`` on the frozen base): one line naming the job and the valid keys,
    a failed row, exit 2, and no point run (as ``run.py -m``)."""
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"))
    over = ["experiment=tiny_study", "point=tiny_study/pi,tiny_study/base", "train.seed=1"]
    r = forkrun.run([sys.executable, str(ROOT / "scripts" / "study.py"), *over, "--no-report"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines[0].startswith("config error in sweep job [point=tiny_study/base") and "train.seed" in lines[0]
    assert "== [" not in r.stdout  # nothing launched
    rows = [json.loads(p.read_text()) for p in (tmp_path / "results" / "runs").glob("*.json")]
    assert [x["status"] for x in rows] == ["failed"]


def test_study_seed_runs_the_fine_tuned_points_with_that_training_seed(tmp_path, monkeypatch):
    """``--seed 1``: the frozen base is left out (it has no training seed), PI runs with ``data.seed=1 train.seed=1``,
    and its config hash is the one ``run.py`` gives that command line."""
    from omegaconf import OmegaConf

    from harness.conf_utils import compose
    from harness.results import config_hash

    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path))
    from controlled_study import study as st
    argv = ["experiment=tiny_study", "point=tiny_study/base,tiny_study/pi"]
    assert len(st.plan(argv)[0]) == 2
    (job,), _ = st.plan(argv, seed=1)
    want = ["experiment=tiny_study", "point=tiny_study/pi", "data.seed=1", "train.seed=1"]
    assert sorted(job["overrides"]) == sorted(want)
    assert job["hash"] == config_hash(OmegaConf.to_container(compose(want), resolve=True))
