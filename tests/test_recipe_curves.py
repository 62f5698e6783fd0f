"""scripts/recipe_curves.py: every curve point is measured on the weights of that point (regression: the PPL
windows cached at the base point were returned at every later point, so a curve showed the base's PPL throughout),
a killed curve resumes from its last checkpoint, keeping the points it had written, and a curve is a run of the
lifecycle: one results row (``ok`` with its points and train_info, or ``failed`` with one line) that the tables
never take for a row of the study's method."""
from __future__ import annotations

import json
import os
import sys

import pytest

from controlled_study.rows import RowSet, load_spec
from tests import forkrun
from tests.conftest import ROOT


def _run(tmp_path, *overrides):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    flags = [o for o in overrides if o.startswith("-")]  # -m before the overrides (Hydra's argument parser)
    overrides = [o for o in overrides if not o.startswith("-")]
    return forkrun.run([sys.executable, str(ROOT / "scripts" / "recipe_curves.py"), *flags, "method=pi",
                           "train=tiny", "train.tokens=8192", "train.lr=1e-3", "train.warmup_steps=1", "curve.at=[1,2]",
                           "eval=quick", "curve.tag=t", "train.keep_checkpoints=true", *overrides],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def _curve(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path / "res" / "curves" / "pi-t.json"


def _rows(tmp_path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (tmp_path / "res" / "runs").glob("*.json")),
                  key=lambda r: r["time_start"])


@pytest.mark.slow  # ~3-6 min (two curves, a kill, a resume): the longest test of the default tier; `make test-slow`
def test_each_curve_point_scores_its_own_weights_and_a_killed_curve_resumes(tmp_path):
    out = _curve(tmp_path)
    first = json.loads(out.read_text())
    points = first["points"]
    assert list(points) == ["base", "0", "1", "2"] and first["resumed_from_step"] is None
    (row,) = _rows(tmp_path)  # the curve's one row: finished, with what the curve file says
    assert row["status"] == "ok" and row["run_id"] == first["run_id"]
    assert (row["method"], row["eval"]) == ("pi_curve", "quick")
    assert list(row["metrics"]["curve"]["points"]) == ["base", "0", "1", "2"]
    assert row["metrics"]["curve"]["points"]["2"]["ppl_books"] == points["2"]["ppl_books"]
    assert row["train_info"]["steps"] == 2 and row["train_info"]["losses"] == first["losses"]
    study = {**{k: row[k] for k in ("model", "data", "train")}, "status": "ok", "method": "pi", "eval": "tiny",
             "run_id": "study", "metrics": {}, "config": {}}
    entries = RowSet([study, row], load_spec()).entries  # the study's pi entry holds the study's row only
    assert [r["run_id"] for e in entries if e.method == "pi" for r in e.rows] == ["study"]
    ppl = {k: p["ppl_books"]["ppl"] for k, p in points.items()}
    nll = {k: p["records"]["ppl_books"] for k, p in points.items()}
    for L in ppl["base"]:  # PI (x8) applied changes every PPL; two steps at lr 1e-3 change it again
        assert ppl["0"][L] > 1.2 * ppl["base"][L], (L, ppl)
        assert nll["2"][L] != nll["0"][L] and nll["0"][L] != nll["base"][L]

    # killed after step 1: the file has points up to 1 and no 'finished'; the checkpoint of step 1 is on disk
    killed = {k: v for k, v in first.items() if k not in ("finished", "losses", "train_seconds", "resumed_from_step",
                                                           "tokens_per_second")}
    killed["points"] = {k: v for k, v in points.items() if k != "2"}
    killed["points"]["1"]["marker"] = "kept from the killed run"
    out.write_text(json.dumps(killed))
    again = json.loads(_curve(tmp_path).read_text())
    assert again["resumed_from_step"] == 1 and list(again["points"]) == ["base", "0", "1", "2"]
    assert again["points"]["1"].get("marker") == "kept from the killed run"
    resumed = _rows(tmp_path)[-1]  # a new row, saying where it resumed and holding the points kept
    assert resumed["status"] == "ok" and resumed["train_info"]["resumed_from_step"] == 1
    assert resumed["metrics"]["curve"]["points"]["1"]["marker"] == "kept from the killed run"
    for L, v in again["points"]["2"]["records"]["ppl_books"].items():  # the resumed step 2 = the uninterrupted one
        assert v == pytest.approx(nll["2"][L], rel=1e-5, abs=1e-5)


def test_a_bad_curve_setting_is_one_line_and_a_failed_row(tmp_path):
    r = _run(tmp_path, "curve.at=[0,2]")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["curve failed: curve.at: [0, 2] is not a list of steps (valid: integers "
                                             ">= 1, e.g. curve.at=[16,64,256,512])"]
    (row,) = _rows(tmp_path)
    assert (row["status"], row["method"]) == ("failed", "pi_curve") and row["error"].startswith("curve.at: [0, 2]")


@pytest.mark.parametrize("override, rc, line", [
    ("curve.at=x", 1, "curve failed: curve.at: 'x' is not a list of steps (valid: integers >= 1, e.g. "
                      "curve.at=[16,64,256,512])"),  # a scalar where a list belongs: was a ValueError of OmegaConf
    ("curve.att=3", 2, "config error: Could not override 'curve.att'. (valid keys of curve: at, tag)"),
    ("method=nosuch", 2, "config error: In 'config': Could not find 'method/nosuch' (available: abf, base, clex, "),
])
def test_a_bad_curve_command_line_is_one_line_naming_the_choices_and_a_failed_row(tmp_path, override, rc, line):
    """The curve script refuses as ``run.py`` does (``precheck.config_refusal`` with its own root config, whose keys
    the line lists), and a non-list ``curve.at`` gets the curve's own line."""
    r = _run(tmp_path, override)
    assert r.returncode == rc
    (got,) = r.stderr.strip().splitlines()
    assert got.startswith(line), got
    assert [x["status"] for x in _rows(tmp_path)] == ["failed"]


def test_a_curve_sweep_is_checked_job_by_job_before_any_job_runs(tmp_path):
    """As ``run.py -m``: a bad ``curve.at`` in the second job stops the sweep before the first curve trains."""
    r = _run(tmp_path, "-m", "curve.at=[1,2],[0]")
    assert r.returncode == 2, r.stderr[-3000:]
    (got,) = r.stderr.strip().splitlines()
    assert got.startswith("config error in sweep job [") and "curve.at: [0] is not a list of steps" in got, got
    assert [x["status"] for x in _rows(tmp_path)] == ["failed"]
    assert not (tmp_path / "res" / "curves").exists()


@pytest.mark.slow  # ~20 s idle: the recipe-curve tool's sweep past a failed curve (a study tool, not a run's path)
def test_a_curve_sweep_goes_on_past_a_failed_curve(tmp_path):
    """A curve that fails while running (its PPL data missing) is one line and a failed row; the sweep's next curve
    still runs to an ``ok`` row and its curve file, and the sweep exits non-zero."""
    (tmp_path / "empty").mkdir()
    r = _run(tmp_path, "-m", f"eval.suite.ppl_books.dataset=dir:{tmp_path}/empty,shakespeare", "eval.lengths=[512]",
             "curve.at=[1]")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "curve failed: " in r.stderr and "sweep failed" in r.stderr.strip().splitlines()[-1]
    assert sorted(x["status"] for x in _rows(tmp_path)) == ["failed", "ok"]
    assert (tmp_path / "res" / "curves" / "pi-t.json").exists()
