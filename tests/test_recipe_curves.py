"""scripts/recipe_curves.py: every curve point is measured on the weights of that point (regression: the PPL
windows cached at the base point were returned at every later point, so a curve showed the base's PPL throughout),
and a killed curve resumes from its last checkpoint, keeping the points it had written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _curve(tmp_path):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "recipe_curves.py"), "method=pi", "train=tiny",
                        "train.tokens=8192", "train.lr=1e-3", "train.warmup_steps=1", "+curve.at=[1,2]",
                        "+curve.eval=quick", "+curve.tag=t", "train.keep_checkpoints=true"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path / "res" / "curves" / "pi-t.json"


def test_each_curve_point_scores_its_own_weights_and_a_killed_curve_resumes(tmp_path):
    out = _curve(tmp_path)
    first = json.loads(out.read_text())
    points = first["points"]
    assert list(points) == ["base", "0", "1", "2"] and first["resumed_from_step"] is None
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
    for L, v in again["points"]["2"]["records"]["ppl_books"].items():  # the resumed step 2 = the uninterrupted one
        assert v == pytest.approx(nll["2"][L], rel=1e-5, abs=1e-5)
