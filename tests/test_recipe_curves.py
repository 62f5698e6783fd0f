"""scripts/recipe_curves.py: every curve point is measured on the weights of that point (regression: the PPL
windows cached at the base point were returned at every later point, so a curve showed the base's PPL throughout)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_each_curve_point_scores_its_own_weights(tmp_path):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "recipe_curves.py"), "method=pi", "train=tiny",
                        "train.tokens=8192", "train.lr=1e-3", "train.warmup_steps=1", "+curve.at=[2]",
                        "+curve.eval=quick", "+curve.tag=t"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    points = json.loads((tmp_path / "res" / "curves" / "pi-t.json").read_text())["points"]
    assert list(points) == ["base", "0", "2"]
    ppl = {k: p["ppl_books"]["ppl"] for k, p in points.items()}
    nll = {k: p["records"]["ppl_books"] for k, p in points.items()}
    for L in ppl["base"]:  # PI (x8) applied changes every PPL; two steps at lr 1e-3 change it again
        assert ppl["0"][L] > 1.2 * ppl["base"][L], (L, ppl)
        assert nll["2"][L] != nll["0"][L] and nll["0"][L] != nll["base"][L]
