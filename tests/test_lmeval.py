"""lm-eval in both directions, offline, on local task YAMLs: the harness's model ``harness`` for lm-eval (a method
applied), and the ``short_context`` evaluator on any lm-eval task (refusing one whose data is not offline)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import api
from harness.config import ConfigError
from tests.conftest import ROOT

DOCS = [{"question": f"What is {a} plus {b}?", "choices": [str(a + b), str(a + b + 1), str(a * b + 7)], "label": 0}
        for a, b in ((1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (7, 2))]


def local_task(folder, name="local_sums", dataset_path="json"):
    """A multiple-choice lm-eval task YAML reading a local JSONL file (``dataset_path: json`` + ``data_files``), or a
    hub dataset by name (``dataset_path``), which offline cannot be read."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    data = f"dataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n" if dataset_path == "json" else ""
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: {dataset_path}\n{data}test_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_target: label\ndoc_to_choice: choices\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return folder


@pytest.mark.integration  # lm-eval's evaluation starts a process
def test_the_registered_model_applies_the_method_and_runs_a_local_task(tmp_path):
    """``harness`` in lm-eval's registry: pretrained + method + the method's settings (its units) in model_args, the
    rest HFLM's; the loaded model carries the method; lm-eval scores a local task with it."""
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    from harness import lmeval

    lmeval.register()
    lm = get_model("harness").create_from_arg_string(f"pretrained={api.TINY_LLAMA},method=yarn,scale=4,max_length=256",
                                                     {"batch_size": 2, "device": "cuda:0"})
    assert lm.model.harness_method.name == "yarn" and lm.model.harness_method.args.scale == 4
    assert lm.model.config.rope_parameters["rope_type"] == "yarn" and lm.max_length == 256
    tasks = local_task(tmp_path / "tasks")
    res = simple_evaluate(model=lm, tasks=["local_sums"], task_manager=TaskManager(include_path=str(tasks),
                                                                                  include_defaults=False))
    assert 0 <= res["results"]["local_sums"]["acc,none"] <= 1 and res["n-samples"]["local_sums"]["effective"] == 6


def test_split_args_sends_method_settings_to_the_method_and_the_rest_to_hflm():
    from harness.lmeval import split_args

    assert split_args("self_extend", {"window": 0.25, "group": 8, "batch_size": 4}) == (
        {"window": 0.25, "group": 8}, {"batch_size": 4})
    assert split_args(None, {"batch_size": 4}) == ({}, {"batch_size": 4})


@pytest.mark.integration  # lm-eval's evaluation starts a process
def test_short_context_runs_an_lm_eval_task_that_is_not_one_of_the_four(tmp_path, monkeypatch):
    """A harness suite entry runs any lm-eval task by name (here a local YAML under include_path): its score,
    document count and metric land in the row like the four local tasks'."""
    monkeypatch.chdir(tmp_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tasks = local_task(tmp_path / "tasks")
    model = AutoModelForCausalLM.from_pretrained(api.TINY_LLAMA)
    tok = AutoTokenizer.from_pretrained(api.TINY_LLAMA)
    row = api.evaluate(model, tok, evaluator="short_context", tasks=["local_sums"], include_path=str(tasks),
                       num_fewshot={}, lengths=[1])
    out = row["metrics"]["short_context"]
    assert row["status"] == "ok" and out["n"] == {"local_sums": 6} and out["metric"] == {"local_sums": "acc"}
    assert 0 <= out["tasks"]["local_sums"] <= 100 and out["average"] == out["tasks"]["local_sums"]


def test_an_lm_eval_task_whose_data_is_not_offline_is_refused_in_one_line(tmp_path):
    """A task YAML naming a hub dataset that is not in the local cache: refused before the model loads."""
    from harness.evals import EVALS

    tasks = local_task(tmp_path / "tasks", name="hub_sums", dataset_path="some-org/not-cached-dataset")
    ev = EVALS.build({"name": "short_context", "tasks": ["hub_sums"], "include_path": str(tasks)}, "eval")
    with pytest.raises(ConfigError) as e:
        ev.check_data("eval.suite.short_context")
    line = str(e.value)
    assert "\n" not in line and "lm-eval task 'hub_sums' cannot read its data offline" in line
    bad = EVALS.build({"name": "short_context", "tasks": ["x"], "include_path": str(tmp_path / "nope")}, "eval")
    with pytest.raises(ConfigError, match="include_path: .* is not a folder"):
        bad.check_data("eval.suite.short_context")


@pytest.mark.integration
def test_the_documented_lm_eval_command_runs_a_local_task_with_a_method(tmp_path):
    """``python -m harness.lmeval --model harness ...``: lm-eval's own command line, offline, a method applied."""
    tasks = local_task(tmp_path / "tasks")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "harness.lmeval", "--model", "harness", "--model_args",
                        f"pretrained={api.TINY_LLAMA},method=pi,scale=2", "--tasks", "local_sums", "--include_path",
                        str(tasks), "--batch_size", "2", "--output_path", str(tmp_path / "out")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "local_sums" in r.stdout and "'method': 'pi'" in r.stdout
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert results and "acc,none" in json.loads(results[0].read_text())["results"]["local_sums"]
