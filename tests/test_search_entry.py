"""scripts/search_rope.py as a user runs it: a bad command line is one line naming the key and its choices, a failed
row, exit 2, before any model loads (as ``run.py``: ``precheck.config_refusal`` with the search's own root config);
``target_length`` is a multiple of the model's native window by default (4C on every model); a search that fails
while running is one line and a failed row, and in a sweep the other searches still run."""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness.conf_utils import compose
from tests import forkrun
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

# the cheapest real search: one iteration of a population of 2 on one 1024-token document, no verification
SMALL = ["search.population=2", "search.parents=1", "search.iterations=1", "search.samples=1", "search.batch=2",
         "target_length=1024", "verify.enabled=false", "search.mutations=1", "search.crossovers=0"]


def _run(tmp_path, *overrides):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out")}
    return forkrun.run([sys.executable, str(ROOT / "scripts" / "search_rope.py"), *overrides],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def _rows(tmp_path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "res" / "runs").glob("*.json"))]


@pytest.mark.parametrize("override, line", [
    ("search=nosuch", "config error: In 'search_config': Could not find 'search/nosuch' (available: longrope, "),
    ("search.iteratons=3", "config error: Could not override 'search.iteratons'. (valid keys of search: algorithm, "),
    ("target_length=abc", "config error: target_length: 'abc' is not a length in tokens >= the native window "
                          "C = 512 (valid: an integer, e.g. target_length=2048 = 4C)"),
    ("target_length=100", "config error: target_length: 100 is not a length in tokens >= the native window C = 512"),
    ("search.iterations=-1", "config error: search.iterations: -1 is not an integer >= 0"),
    ("search.algorithm=foo", "config error: search=longrope_tiny: algorithm must be longrope | longrope2, got 'foo'"),
])
def test_a_bad_search_command_line_is_one_line_a_failed_row_and_exit_2(tmp_path, override, line):
    r = _run(tmp_path, override)
    assert r.returncode == 2, r.stderr[-3000:]
    (got,) = r.stderr.strip().splitlines()  # no Hydra "Error executing job" line, no traceback, no model loaded
    assert got.startswith(line), got
    assert [x["status"] for x in _rows(tmp_path)] == ["failed"]


def test_target_length_is_4C_on_every_model():
    for model, c in (("tiny_llama", 512), ("llama2_7b", 4096), ("phi2", 2048)):
        cfg = compose([f"model={model}"], config_name="search_config")
        assert (int(cfg.model.native_ctx), cfg.target_length) == (c, 4 * c)


def test_a_search_sweep_is_checked_job_by_job_before_any_job_runs(tmp_path):
    """As ``run.py -m``: one bad job (an unknown seed in the second) stops the sweep before the first job runs."""
    r = _run(tmp_path, "-m", "search.seeds=[pi],[nosuch]", *SMALL)
    assert r.returncode == 2, r.stderr[-3000:]
    (got,) = r.stderr.strip().splitlines()
    assert got.startswith("config error in sweep job [search.seeds=[nosuch] ") and "unknown seed 'nosuch'" in got
    assert [x["status"] for x in _rows(tmp_path)] == ["failed"] and not (tmp_path / "res" / "factors").exists()


def test_a_search_sweep_goes_on_past_a_failed_search(tmp_path):
    """``-m search.dataset=<a missing folder>,shakespeare``: the first job fails while running (its row failed, one
    line), the second still runs and writes its factors file and an ``ok`` row; the sweep exits non-zero."""
    r = _run(tmp_path, "-m", f"search.dataset=dir:{tmp_path}/none,shakespeare", *SMALL)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "search failed: " in r.stderr and "sweep failed" in r.stderr.strip().splitlines()[-1]
    rows = _rows(tmp_path)
    assert sorted(x["status"] for x in rows) == ["failed", "ok"], [x.get("error") for x in rows]
    assert list((tmp_path / "res" / "factors").glob("*.json"))
