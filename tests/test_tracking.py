"""wandb, offline (issue 45): runs grouped by sweep and tagged model / method / train / eval; evaluation results on
the evaluation-length axis and as a table with n and intervals (the lines ``make export`` writes)."""
from __future__ import annotations

import pytest

from controlled_study.export import flatten
from harness import tracking
from harness.conf_utils import compose
from harness.stats import wilson
from tests.test_tables import make_row


@pytest.mark.integration   # wandb.init starts its service process
def test_wandb_groups_tags_and_logs_an_evaluation_table_with_n_and_intervals(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose(["logger=wandb", "method=yarn", "train=none", "eval=quick", "+study.experiment=my_look"])
    row = make_row(tmp_path, "r1-yarn", "yarn", train="none", suites=("ppl", "passkey"))
    row.update(eval="quick", run_dir=str(tmp_path / "run"), status="ok")
    pk = row["metrics"]["passkey"]   # as the evaluator writes it: its Wilson interval per length
    pk["ci"] = {L: list(wilson(sum(v), len(v))) for L, v in pk["correct"].items()}
    (tmp_path / "run").mkdir()
    tr = tracking.start(cfg, row, table_lines=flatten)
    assert tr.run.group == "my_look"      # no sweep: the study
    assert set(tr.run.tags) == {"model:tiny_llama", "method:yarn", "train:none", "eval:quick"}
    tr.log_step(1, 2, 3.0, 100.0, 1e-4)
    for key, out in row["metrics"].items():
        tr.log(key, out)
    tracking.finish(tr, row)
    cols = tr.table.columns
    assert {"value", "ci_low", "ci_high", "n", "length", "entry", "metric"} <= set(cols)
    lines = [dict(zip(cols, d)) for d in tr.table.data]
    pk = [ln for ln in lines if ln["entry"] == "passkey" and ln["metric"] == "accuracy"]
    assert pk and all(ln["n"] == 10 and ln["ci_low"] <= ln["value"] <= ln["ci_high"] for ln in pk)
    assert len(lines) == len(flatten(row))


def test_group_is_the_explicit_one_then_the_study():
    assert tracking.group(compose(["logger=wandb", "logger.group=g1", "+study.experiment=s"])) == "g1"
    assert tracking.group(compose(["logger=wandb", "+study.experiment=s"])) == "s"
    assert tracking.group(compose(["logger=wandb"])) is None
    assert tracking.tags({"model": "m", "method": "pi", "train": "tiny", "eval": "run"}) == [
        "model:m", "method:pi", "train:tiny", "eval:run"]
