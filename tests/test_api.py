"""The library API (``harness.api``): extend, save / load that keep the method, evaluate, and what is registered.
The README's recipe runs as written, from a directory outside the checkout, in the integration tier."""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from harness import api
from harness.config import ConfigError
from tests import forkrun
from tests.conftest import ROOT, random_llama

C = 512


def tiny_like(tmp_path, seed=0):
    """A small random Llama with the shipped tiny model's vocabulary, rotary dimension (64) and window (C = 512), and
    that model's tokenizer, so every method's defaults (LongRoPE's shipped factors, Landmark's token) apply."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(api.TINY_LLAMA)
    return random_llama(vocab=len(tok), hidden=64, layers=2, heads=4, kv_heads=2, head_dim=64, ctx=C, seed=seed), tok


@pytest.mark.parametrize("name", sorted(api.methods()))
def test_every_method_survives_save_and_load(name, tmp_path):
    """Every registered method: extended, saved, then (a) plain transformers reloads it with identical logits when
    the save is a standard config, or refuses in one line naming the method; (b) ``api.load`` gives identical logits
    either way. The input is 1.25 C long, so length-dependent methods are beyond their window."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny_like(tmp_path)
    api.extend(model, name, tokenizer=tok)
    ids = torch.randint(5, 4000, (1, C + C // 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    rec = api.save(model, tmp_path / "m", tok)
    assert rec["name"] == name and rec["applied_by"] in ("config", "harness")
    if rec["applied_by"] == "config":
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
        with torch.no_grad():
            torch.testing.assert_close(plain(ids).logits, ref, rtol=0, atol=0)
    else:
        with pytest.raises(ValueError) as e:
            AutoModelForCausalLM.from_pretrained(tmp_path / "m")
        line = str(e.value)
        assert "\n" not in line and f"{name} is a harness method" in line and "harness.api.load" in line
    loaded, _ = api.load(tmp_path / "m")
    assert loaded.harness_method.name == name
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref, rtol=0, atol=0)


def test_transformers_expressible_methods_are_standard_configs(tmp_path):
    """The split is by what the model became, not a list of names: PI / YaRN / Llama-3 save as transformers rope
    types; an attention method or a harness rope type is recorded with the rope parameters the model had before."""
    import json

    for name, kind in (("pi", "linear"), ("yarn", "yarn"), ("llama3", "llama3")):
        model, tok = tiny_like(tmp_path)
        api.extend(model, name)
        api.save(model, tmp_path / name)
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        assert cfg["rope_parameters"]["rope_type"] == kind and "attn_implementation" not in cfg
        assert not (tmp_path / name / "method.json").exists()
    for name in ("self_extend", "ntk_dynamic", "abf"):
        model, tok = tiny_like(tmp_path)
        before = dict(model.config.rope_parameters)
        api.extend(model, name)
        rec = api.save(model, tmp_path / name)
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        if name == "abf":  # plain RoPE with another base: a standard config
            assert rec["applied_by"] == "config" and cfg["rope_parameters"]["rope_theta"] == 50 * before["rope_theta"]
        else:
            assert rec["applied_by"] == "harness" and cfg["rope_parameters"] == before
            assert (tmp_path / name / "method.json").exists()


def test_extend_reads_C_from_the_config_and_settings_are_in_units_of_C(tmp_path):
    model, _ = tiny_like(tmp_path)
    api.extend(model, "self_extend", window=0.25, group=4)
    m = model.harness_method
    assert model.harness_native_ctx == C and m.check(C) == C // 4
    assert m.max_length(type("H", (), {"native_ctx": C})()) == (C - C // 4) * 4 + C // 4
    other, _ = tiny_like(tmp_path)
    api.extend(other, "self_extend", native_ctx=256, window=0.25)
    assert other.harness_native_ctx == 256


def test_extend_refuses_in_one_line(tmp_path):
    model, _ = tiny_like(tmp_path)
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        api.extend(model, "nope")
    with pytest.raises(ConfigError, match="windw"):
        api.extend(model, "self_extend", windw=0.25)
    api.extend(model, "base")  # what evaluate() applies to a plain model: it changes nothing, so extend still may
    api.extend(model, "yarn", scale=4)
    with pytest.raises(ConfigError, match="already extended with method 'yarn'"):
        api.extend(model, "pi")


def test_a_dropped_config_setting_is_printed(tmp_path, capsys):
    """Self-Extend on a sliding-window model (Mistral's): the window is not applied, and that is printed."""
    model, _ = tiny_like(tmp_path)
    model.config.sliding_window = 128
    model.config.use_sliding_window = True
    api.extend(model, "self_extend")
    err = capsys.readouterr().err
    assert "method=self_extend: the model's sliding_window = 128 is not applied" in err
    assert model.harness_method.params()["checkpoint_attention"] == {"sliding_window": 128, "action": "dropped"}


def test_load_refuses_another_method_for_a_saved_one(tmp_path):
    model, tok = tiny_like(tmp_path)
    api.extend(model, "self_extend")
    api.save(model, tmp_path / "m", tok)
    with pytest.raises(ConfigError, match="saved with method 'self_extend'"):
        api.load(tmp_path / "m", method="yarn")


def test_methods_and_evaluators_list_their_facts():
    ms, es = api.methods(), api.evaluators()
    assert ms["self_extend"].facts.family == "approximate" and ms["yarn"].facts.trains
    assert ms["self_extend"].settings["window"] == 0.25 and "facts" not in ms["self_extend"].settings
    assert es["passkey"].metric == "accuracy" and es["ppl"].doc


def test_evaluate_a_model_object_on_one_evaluator(tmp_path, monkeypatch):
    """evaluate(model, tok, evaluator=...): one row, lengths in units of C, the method the model carries."""
    monkeypatch.chdir(tmp_path)
    model, tok = tiny_like(tmp_path)
    api.extend(model, "pi", scale=2)
    row = api.evaluate(model, tok, evaluator="passkey", lengths=[0.5, 1], samples=2)
    assert row["status"] == "ok" and row["method"] == "pi" and row["train"] == "none"
    assert set(row["metrics"]["passkey"]["accuracy"]) == {"256", "512"}
    assert row["method_params"]["scale"] == 2 and row["model_info"]["native_ctx"] == C
    assert (tmp_path / "results" / "runs" / f"{row['run_id']}.json").is_file()


def test_evaluate_refuses_beyond_the_cost_limit_before_loading(tmp_path, monkeypatch):
    """A run estimated beyond cost.limit_s is one line, before the model loads (a folder that does not exist as a
    model would fail at load)."""
    monkeypatch.chdir(tmp_path)
    model, tok = tiny_like(tmp_path)
    with pytest.raises(ConfigError, match=r"cost: this run.s evaluation is estimated at .* beyond cost.limit_s=1 "):
        api.evaluate(model, tok, evaluator="passkey", lengths=[1, 2, 4, 8], samples=200,
                     overrides=["cost.limit_s=1"])


README_RECIPE = re.compile(r"\*\*From Python\*\*.*?```python\n(.*?)```", re.S)


@pytest.mark.integration
def test_the_readme_recipe_runs_as_written_outside_the_checkout(tmp_path):
    """The README's library recipe, copied as written, runs in a fresh process whose working directory is outside
    the checkout (its rows land there, not in the checkout's results/), using only the public names."""
    recipe = README_RECIPE.search((ROOT / "README.md").read_text()).group(1)
    assert len(recipe.strip().splitlines()) <= 10
    assert "harness." not in recipe.replace("from harness import api", "")  # only the public front
    (tmp_path / "recipe.py").write_text(recipe)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for k in ("HARNESS_RESULTS_DIR", "HARNESS_OUTPUT_DIR"):
        env.pop(k, None)
    r = forkrun.run([sys.executable, "recipe.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((tmp_path / "results" / "runs").glob("*.json"))
    assert "cost estimate" in r.stderr


def test_evaluate_a_saved_folder_runs_its_recorded_method(tmp_path, monkeypatch):
    """A folder saved with an attention method: evaluate(folder) loads it through model=hub, applies the recorded
    method with its settings (the row says so), and never as plain attention."""
    monkeypatch.chdir(tmp_path)
    model, tok = tiny_like(tmp_path)
    api.extend(model, "self_extend", window=0.125, group=2)
    api.save(model, tmp_path / "m", tok)
    row = api.evaluate(str(tmp_path / "m"), evaluator="passkey", lengths=[0.5], samples=1)
    assert row["status"] == "ok" and row["method"] == "self_extend" and row["model"] == "m"
    assert row["method_params"]["window"] == 0.125 and row["method_params"]["group"] == 2
    assert row["model_info"]["attn_implementation"] == "harness_self_extend"


@pytest.mark.parametrize("name", ["yarn", "self_extend"])  # a method the config expresses, one the harness applies
def test_a_saved_folder_is_refused_under_another_method_before_it_loads(name, tmp_path):
    """``run.py model=hub model.path=<folder> method=base`` on a folder saved with YaRN wrote an ok row labelled
    ``base`` while the folder's RoPE was YaRN's (the method was in its config): the folder is tied to its recorded
    method, checked before anything loads (``pipeline.setup``), and another method, or the same one under other
    settings, is one line naming the folder and the method to ask for."""
    from harness import pipeline
    from harness.conf_utils import compose

    model, tok = tiny_like(tmp_path)
    api.extend(model, name, **({"scale": 4} if name == "yarn" else {}))
    folder = tmp_path / "saved"
    api.save(model, folder, tok)
    base = ["model=hub", f"model.path={folder}", "model.native_ctx=512", "train=none", "eval=quick"]
    for wrong in ("method=base", f"method={name}" + (" method.scale=8" if name == "yarn" else " method.group=4")):
        with pytest.raises(ConfigError, match=rf"checkpoint {folder} was trained or saved with method '{name}'.*"
                                              rf"valid: method={name} with the folder's settings"):
            pipeline.setup(compose(base + wrong.split()), data=False)
    right = [f"method={name}"] + (["method.scale=4"] if name == "yarn" else [])
    pipeline.setup(compose(base + right), data=False)  # its own method, its own settings: accepted


def test_load_checks_the_recorded_method(tmp_path):
    """``api.load`` rebuilds a folder's recorded method with the checks a command line gets: an edited record with an
    impossible setting (YaRN ``scale: -3``) or an unknown method is one ``ConfigError`` line naming it."""
    import json

    model, tok = tiny_like(tmp_path)
    api.extend(model, "yarn", scale=4)
    folder = tmp_path / "saved"
    api.save(model, folder, tok)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["harness_method"]["params"]["scale"] = -3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="scale"):
        api.load(folder)
    cfg["harness_method"]["name"] = "no_such_method"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="records method 'no_such_method', which is no registered method"):
        api.load(folder)


def test_the_api_refuses_wrong_types_and_unknown_names_in_one_line(tmp_path):
    """A path where a model goes, a tokenizer where a model goes, a folder that does not exist, an unknown suite or
    evaluator, a file as the folder to save to: each one ``ConfigError`` line naming what was wrong (before: an
    ``AttributeError``, Hydra's multi-line report, a ``FileNotFoundError`` with a machine path, or, for ``save``,
    nothing at all)."""
    model, tok = tiny_like(tmp_path)
    (tmp_path / "file").write_text("x")
    cases = [(lambda: api.extend(str(tmp_path), "yarn"), "extend: model must be a loaded transformers model, got str"),
             (lambda: api.evaluate(tok, model, evaluator="passkey"), "evaluate: model must be a loaded transformers"),
             (lambda: api.evaluate(model, model, evaluator="passkey"), "evaluate: tokenizer must be a transformers"),
             (lambda: api.evaluate(str(tmp_path / "none"), evaluator="passkey"), "is neither a folder"),
             (lambda: api.evaluate(model, tok, suite="nosuch"), "evaluate: unknown suite 'nosuch' \\(valid: .*quick"),
             (lambda: api.evaluate(model, tok, evaluator="nosuch"), "unknown evaluator 'nosuch' \\(valid: .*passkey"),
             (lambda: api.save(model, tmp_path / "file"), "is a file, not a folder"),
             (lambda: api.load(tmp_path / "none"), "is neither a folder")]
    for call, words in cases:
        with pytest.raises(ConfigError, match=words) as e:
            call()
        assert len(str(e.value).splitlines()) == 1, str(e.value)
