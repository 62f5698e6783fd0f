"""One run lifecycle (``harness.lifecycle``): the row a run records into from start to finish, and the method hook
the fine-tuning stage calls instead of a method-specific stage."""
from __future__ import annotations

import json

import pytest

from harness import lifecycle, results
from harness.conf_utils import compose


def test_a_run_records_stages_and_finishes_with_the_row_schema(results_env):
    """start -> record / record_eval / stage -> finish: the row on disk after each step holds what was recorded,
    with exactly the schema's keys, and ``finish`` stops the heartbeat and settles the status."""
    cfg = compose(["model=tiny_llama", "train=none", "eval=quick"])
    run = lifecycle.start(cfg, run_dir=results_env / "outputs" / "r")
    assert run in lifecycle.STARTED
    on_disk = lambda: json.loads(run.path.read_text())  # noqa: E731
    assert on_disk()["status"] == "running" and on_disk()["heartbeat"]
    assert json.loads((results_env / "outputs" / "r" / "run.json").read_text())["run_id"] == run.row["run_id"]
    run.record(model_info={"path": "x"})
    assert on_disk()["model_info"] == {"path": "x"}
    run.record_eval("passkey", {"accuracy": {"64": 1.0}}, 0.5, 2)
    row = on_disk()
    assert row["metrics"] == {"passkey": {"accuracy": {"64": 1.0}}}
    assert row["eval_versions"] == {"passkey": 2} and row["timings"] == {"eval.passkey": 0.5}
    with run.stage("load"):
        pass
    assert on_disk()["timings"]["load"] >= 0
    with pytest.raises(RuntimeError), run.stage("search"):
        raise RuntimeError("boom")
    assert "search" not in on_disk()["timings"]  # a stage that raised records nothing; fail says why
    assert run.finish() is None
    row = on_disk()
    assert row["status"] == "ok" and row["time_end"] and list(row) == list(results.ROW_FIELDS)
    assert run.path not in results.live._BEATING
    lifecycle.STARTED.remove(run)


def test_a_failed_run_is_one_line_with_the_traceback_kept(results_env):
    cfg = compose(["model=tiny_llama", "train=none", "eval=quick"])
    run = lifecycle.start(cfg, run_dir=results_env / "outputs" / "f")
    try:
        raise ValueError("first line\nsecond line")
    except ValueError as e:
        line = run.fail(e)
    assert line == "ValueError: first line" == json.loads(run.path.read_text())["error"]
    assert "second line" in (results_env / "outputs" / "f" / "error.log").read_text()
    lifecycle.STARTED.remove(run)


def test_merge_settles_a_shared_row_by_one_rule(tmp_path):
    """``merge``: the parts' states decide the status (failed > running > ok) and the row is written once."""
    fresh = lambda: {"run_id": "sh-x", "status": "running", "error": None, "time_end": None}  # noqa: E731
    for parts, errors, status in (({"a": "ok", "b": "missing"}, [], "running"), ({"a": "ok", "b": "ok"}, [], "ok"),
                                  ({"a": "ok", "b": "failed"}, ["shard b: boom"], "failed")):
        row = lifecycle.merge(tmp_path, "sh-x", fresh, lambda r, p=parts, e=errors: (p, e))
        assert row["status"] == status and row["error"] == (errors[0] if errors else None)
        assert json.loads(results.row_path(tmp_path, "sh-x").read_text())["status"] == status
    assert not results.row_path(tmp_path, "sh-x").with_suffix(".lock").exists()


@pytest.mark.integration
def test_finetune_stage_records_what_the_methods_hook_returns(results_env, monkeypatch):
    """The fine-tuning stage calls ``Method.after_finetune`` for every method (no method named in the pipeline) and
    adds what it returns to ``train_info``; the hook sees the fine-tuned model and the run directory."""
    from transformers import AutoTokenizer

    from harness import pipeline
    from harness.models import ModelHandle
    from harness.models.tiny_llama import ASSET_DIR
    from tests.conftest import random_llama

    cfg = compose(["model=tiny_llama", "method=pi", "train=tiny", "eval=quick"])
    method, train = pipeline.validate(cfg, data=False)
    tok = AutoTokenizer.from_pretrained(str(ASSET_DIR))
    handle = ModelHandle(random_llama(vocab=len(tok)), tok, "random", 64, {})
    monkeypatch.setattr(pipeline, "build_data", lambda *a, **k: [])
    monkeypatch.setattr("harness.train.loop.finetune", lambda *a, **k: {"steps": 3})
    seen = []

    def hook(h, ctx):
        seen.append((h, ctx.run_dir, ctx.seed))
        return {"own_stage": {"done": True}}

    monkeypatch.setattr(method, "after_finetune", hook)
    info = pipeline.finetune(cfg, handle, method, train, results_env / "run")
    assert info["own_stage"] == {"done": True} and info["steps"] == 3
    assert seen == [(handle, results_env / "run", int(cfg.seed))]
    assert (results_env / "run" / "checkpoint" / "config.json").is_file()


def test_a_sigterm_right_after_the_row_is_written_leaves_one_failed_row(results_env, monkeypatch):
    """The race CI hit under load: SIGTERM (``Terminated``) landing between writing the row and registering the run
    left the row ``running`` and a second, failed row beside it. The run is registered first, so ``run_guarded``
    finishes that one row."""
    from harness.train import Terminated

    write = results.start_heartbeat

    def write_then_signal(results_dir, row):
        write(results_dir, row)
        raise Terminated("terminated by SIGTERM")

    monkeypatch.setattr(results, "start_heartbeat", write_then_signal)
    cfg = compose(["model=tiny_llama", "train=none", "eval=quick"])
    n = len(lifecycle.STARTED)
    with pytest.raises(SystemExit):
        lifecycle.run_guarded(lambda: lifecycle.start(cfg, run_dir=results_env / "outputs" / "t"), [])
    rows = list(results.read_rows(results_env / "results"))
    assert [(r["status"], r["error"]) for r in rows] == [("failed", "Terminated: terminated by SIGTERM")]
    del lifecycle.STARTED[n:]
