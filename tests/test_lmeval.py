"""lm-eval in both directions, offline, on local task YAMLs: the harness's model ``harness`` for lm-eval (a method
applied), and the ``short_context`` evaluator on any lm-eval task (refusing one whose data is not offline)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from harness import api
from harness.config import ConfigError
from tests import forkrun
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
    r = forkrun.run([sys.executable, "-m", "harness.lmeval", "--model", "harness", "--model_args",
                        f"pretrained={api.TINY_LLAMA},method=pi,scale=2", "--tasks", "local_sums", "--include_path",
                        str(tasks), "--batch_size", "2", "--output_path", str(tmp_path / "out")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "local_sums" in r.stdout and "'method': 'pi'" in r.stdout
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert results and "acc,none" in json.loads(results[0].read_text())["results"]["local_sums"]


@pytest.mark.parametrize("extra, words", [
    ("method=yarn,scael=2", "scael is neither a setting of method=yarn nor an HFLM argument"),
    ("method=nosuch", "unknown method 'nosuch'"),
    ("method=yarn,scale=abc", "scale"),
    ("method=yarn,scale=-3", "scale"),
    ("method=lm_infinite", "implies no extended window; give max_length"),
])
def test_bad_model_args_are_one_line_before_anything_loads(extra, words):
    """A misspelt setting (it went to HFLM, which ignored it), an unknown method, a non-numeric or out-of-range
    setting, a method that implies no window: one ``ConfigError`` line each, checked before lm-eval reads a task."""
    from harness.lmeval import check_model_args, parse_model_args

    with pytest.raises(ConfigError, match=words) as e:
        check_model_args(parse_model_args(f"pretrained={api.TINY_LLAMA},{extra}"))
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ConfigError, match="is neither a folder"):
        check_model_args({"pretrained": "/no/such/folder", "method": "yarn"})
    with pytest.raises(ConfigError, match="--use_cache with a method"):
        check_model_args({"pretrained": api.TINY_LLAMA, "method": "pi"}, use_cache=True)


def test_max_length_is_the_methods_window():
    """HFLM's ``max_length`` defaulted to the checkpoint's C (every longer prompt cut from the left): it is the window
    the method implies, or the one asked for."""
    from harness.lmeval import check_model_args

    C = 512
    assert check_model_args({"pretrained": api.TINY_LLAMA, "method": "yarn", "scale": 4})["max_length"] == 4 * C
    assert check_model_args({"pretrained": api.TINY_LLAMA, "method": "self_extend", "window": 0.25,
                             "group": 8})["max_length"] == (C - C // 4) * 8 + C // 4
    assert check_model_args({"pretrained": api.TINY_LLAMA})["max_length"] == C
    assert check_model_args({"pretrained": api.TINY_LLAMA, "method": "lm_infinite",
                             "max_length": 3000})["max_length"] == 3000


def passkey_task(folder, prompts):
    """A ``generate_until`` lm-eval task of the given passkey prompts: the first integer of 8 greedy tokens against
    the pass key (the passkey evaluator's own scoring)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pk.jsonl").write_text("".join(json.dumps({"prompt": s["prompt"], "key": str(s["pass_key"])}) + "\n"
                                             for s in prompts))
    (folder / "local_passkey.yaml").write_text(
        f"task: local_passkey\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'pk.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: key\n"
        "target_delimiter: \"\"\n"
        "generation_kwargs:\n  until: [\"<never-stop>\"]\n  max_gen_toks: 8\n  do_sample: false\n"
        "filter_list:\n  - name: first_int\n    filter:\n      - function: regex\n        regex_pattern: \"(\\\\d+)\"\n"
        "      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return folder


@pytest.mark.integration
def test_the_readme_recipe_scores_prompts_longer_than_c_as_the_harness_does(tmp_path):
    """The README's lm-eval recipe (Self-Extend, ``window=0.25,group=8``) on passkey prompts of 2C tokens: lm-eval
    feeds the whole prompt (max_length is the method's window, said at start) and scores what the harness's own
    passkey evaluator scores on the same prompts; with ``max_length`` left at C every prompt is cut, in one line
    each."""
    from transformers import AutoTokenizer

    from harness.evals.passkey import passkey_samples

    tok = AutoTokenizer.from_pretrained(api.TINY_LLAMA)
    n, L = 6, 1024
    prompts = passkey_samples(tok, L, n, seed=0)
    tasks = passkey_task(tmp_path / "tasks", prompts)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    def lm_eval(model_args):
        r = forkrun.run([sys.executable, "-m", "harness.lmeval", "--model", "harness", "--model_args",
                            model_args, "--tasks", "local_passkey", "--include_path", str(tasks), "--batch_size", "1",
                            "--output_path", str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        (res,) = sorted((tmp_path / "out").rglob("results_*.json"), key=lambda p: p.stat().st_mtime)[-1:]
        return json.loads(res.read_text())["results"]["local_passkey"]["exact_match,first_int"], r.stderr

    args = f"pretrained={api.TINY_LLAMA},method=self_extend,window=0.25,group=8"
    acc, err = lm_eval(args)
    assert "max_length = 3200 tokens (method=self_extend" in err and "is cut to" not in err
    model, tok2 = api.load(api.TINY_LLAMA, method="self_extend", window=0.25, group=8)
    row = api.evaluate(model, tok2, evaluator="passkey", lengths=[2], samples=n, results_dir=tmp_path / "rows",
                       overrides=["autocast=float32"])
    ours = row["metrics"]["passkey"]["accuracy"][str(L)]
    assert acc == pytest.approx(ours), (acc, ours)


def test_every_prompt_lm_eval_cuts_is_one_line(capsys):
    """With ``max_length`` at C, a 2C passkey prompt is cut from the left by lm-eval: one line says so, for a
    generation request and a loglikelihood one."""
    from lm_eval.api.instance import Instance
    from transformers import AutoTokenizer

    from harness import lmeval
    from harness.evals.passkey import passkey_samples

    cls = lmeval.register()
    lm = cls(pretrained=api.TINY_LLAMA, method="self_extend", window=0.25, group=8, max_length=512, batch_size=1)
    (s,) = passkey_samples(AutoTokenizer.from_pretrained(api.TINY_LLAMA), 1024, 1, seed=0)
    lm.generate_until([Instance("generate_until", {}, (s["prompt"], {"until": ["<x>"], "max_gen_toks": 2}), 0)],
                      disable_tqdm=True)
    lm.loglikelihood([Instance("loglikelihood", {}, (s["prompt"], " 1"), 0)], disable_tqdm=True)
    err = capsys.readouterr().err
    assert "max_length = 512 tokens (method=self_extend" in err
    assert "a generate_until prompt of" in err and "a loglikelihood prompt of" in err and "cut to its last" in err


@pytest.mark.integration  # lm-eval's simple_evaluate, called here directly, starts a process for its environment info
def test_short_context_reads_lm_evals_own_aggregates_for_rolling_and_generation_tasks(tmp_path, monkeypatch):
    """A ``loglikelihood_rolling`` task (per document a ``(loglik, words)`` pair: it stopped the evaluator, which
    averaged per-document values as floats) and a ``generate_until`` task: the row reports lm-eval's own aggregate
    of each (word perplexity, a corpus-level number, unscaled; exact match x100), the same as ``simple_evaluate``."""
    monkeypatch.chdir(tmp_path)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.evals.short_context import contract_lm

    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "texts.jsonl").write_text("".join(json.dumps({"text": f"The river runs by the town number {i}. "
                                                                    * 3}) + "\n" for i in range(4)))
    (folder / "local_rolling.yaml").write_text(
        f"task: local_rolling\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'texts.jsonl'}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    from transformers import AutoTokenizer as _T

    passkey_task(folder, __import__("harness.evals.passkey", fromlist=["x"]).passkey_samples(
        _T.from_pretrained(api.TINY_LLAMA), 256, 3, seed=0))
    model = AutoModelForCausalLM.from_pretrained(api.TINY_LLAMA)
    tok = AutoTokenizer.from_pretrained(api.TINY_LLAMA)
    row = api.evaluate(model, tok, evaluator="short_context", tasks=["local_rolling", "local_passkey"],
                       include_path=str(folder), num_fewshot={}, lengths=[1], overrides=["autocast=float32"])
    out = row["metrics"]["short_context"]
    assert row["status"] == "ok" and out["n"] == {"local_rolling": 4, "local_passkey": 3}
    ref = simple_evaluate(model=contract_lm(model, tok, 1, 512), tasks=["local_rolling", "local_passkey"],
                          task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                          bootstrap_iters=0)["results"]
    assert out["metric"]["local_rolling"] == "word_perplexity"
    assert out["tasks"]["local_rolling"] == pytest.approx(ref["local_rolling"]["word_perplexity,none"], rel=1e-3)
    assert out["tasks"]["local_rolling"] > 1  # a perplexity, not scaled as an accuracy
    assert out["tasks"]["local_passkey"] == pytest.approx(100 * ref["local_passkey"]["exact_match,first_int"], abs=0.01)
