"""A configuration's hash (the row's ``config_hash``: what ``make study`` skips on, a sharded run's id) names what a
run measures, not where it ran: the execution settings added for GPUs keep every recorded row matched."""
from __future__ import annotations

from harness.results import config_hash
from tests.conftest import ROOT, load_file_module


def test_execution_settings_are_not_part_of_the_hash():
    cfg = {"model": {"name": "m"}, "seed": 0}
    assert config_hash(cfg) == config_hash({**cfg, "device": "cuda:3", "eval_world_size": 8})
    assert config_hash(cfg) != config_hash({**cfg, "seed": 1})
    data = {**cfg, "data": {"name": "local_mix", "seed": 0}}
    assert config_hash(data) == config_hash({**data, "data": {**data["data"], "max_tokens": 5, "scale": "cpu"}})
    assert config_hash(data) != config_hash({**data, "data": {**data["data"], "seed": 1}})


def test_the_committed_tiny_study_rows_still_match_their_points(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("HARNESS_RESULTS_DIR", raising=False)
    study = load_file_module(ROOT / "scripts" / "study.py", "study_for_hash_test")
    jobs, _ = study.plan(["experiment=tiny_study"])
    # matched by hash: done, or (a fine-tuned point measured by an older convergence gate) to run again for the gate
    assert jobs and all(j["done"] or j["old_gate"] for j in jobs), [j["label"] for j in jobs
                                                                    if not (j["done"] or j["old_gate"])]
