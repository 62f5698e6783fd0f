"""Foundation: registries, config validation, results rows, the PI method, checkpoint/method checks, training loop."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from harness.config import ConfigError
from harness.methods import METHODS, build_method, check_checkpoint_method, save_method
from harness.models import MODELS
from harness.results import atomic_write_json, read_rows
from tests import forkrun
from tests.conftest import ROOT, random_llama


def test_registries_match_yaml_files():
    """Every registered method/model has a YAML and every YAML names a registered component (its ``name``, or for a
    model that is only data its ``builder``: ``hub``)."""
    from omegaconf import OmegaConf

    for reg, group in ((METHODS, "method"), (MODELS, "model")):
        yamls = [OmegaConf.load(p) for p in sorted((ROOT / "conf" / group).glob("*.yaml"))]
        used = {str(y.get("builder") or y.name) for y in yamls}
        assert used <= set(reg.names()) and set(reg.names()) <= used


def test_typo_in_method_key_is_one_clear_line():
    with pytest.raises(ConfigError) as e:
        build_method({"name": "pi", "sclae": 4})
    msg = str(e.value)
    assert "method=pi" in msg and "sclae" in msg and "\n" not in msg


def test_unknown_method_name():
    with pytest.raises(ConfigError, match="method=nope: unknown method 'nope'; known: abf, base"):  # one line
        build_method({"name": "nope"})


def test_pi_matches_transformers_linear():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = random_llama(hidden=128, heads=2, theta=10000.0)  # head dim 64
    base = model.model.rotary_emb.inv_freq.clone()
    m = build_method({"name": "pi", "scale": 8})
    from harness.models import ModelHandle

    m.apply(ModelHandle(model, None, "x", 64))
    got = model.model.rotary_emb.inv_freq
    torch.testing.assert_close(got, base / 8, rtol=0, atol=0)
    ref, att = ROPE_INIT_FUNCTIONS["linear"](model.config, "cpu")
    torch.testing.assert_close(got, ref)
    # cos at position s*m under PI equals the default cos at m
    pos = torch.arange(0, 64, dtype=torch.float32)
    torch.testing.assert_close(torch.cos(8 * pos[:, None] * got[None]), torch.cos(pos[:, None] * base[None]),
                               atol=1e-4, rtol=0)


def test_checkpoint_method_mismatch_refused(tmp_path):
    save_method(tmp_path, build_method({"name": "pi", "scale": 8}))
    check_checkpoint_method(tmp_path, build_method({"name": "pi", "scale": 8}))
    with pytest.raises(ConfigError, match="trained or saved with method 'pi'"):
        check_checkpoint_method(tmp_path, build_method({"name": "base"}))
    with pytest.raises(ConfigError, match="does not match"):
        check_checkpoint_method(tmp_path, build_method({"name": "pi", "scale": 4}))


def test_atomic_rows_never_torn(tmp_path):
    for i in range(5):
        atomic_write_json(tmp_path / "runs" / f"r{i}.json", {"run_id": f"r{i}", "status": "ok", "x": list(range(1000))})
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    rows = read_rows(tmp_path)
    assert sorted(r["run_id"] for r in rows) == [f"r{i}" for i in range(5)]
    assert not list((tmp_path / "runs").glob("*.tmp"))


def test_train_loop_decreases_loss_and_records_ema(tmp_path):
    from harness.models import ModelHandle
    from harness.train import TrainArgs
    from harness.train.loop import finetune

    model = random_llama(vocab=64, hidden=32, layers=1, heads=2, ctx=32)
    rng = np.random.default_rng(0)
    pattern = rng.integers(3, 64, size=16)
    chunks = np.stack([np.roll(np.tile(pattern, 4), -i) for i in range(16)])  # learnable periodic data
    a = TrainArgs(name="t", enabled=True, seq_len=64, tokens=64 * 4 * 12, global_batch=4, micro_batch=2, lr=5e-3,
                  warmup_steps=2, ema=True, ema_decay=0.5, autocast="float32", save_every=0)
    info = finetune(ModelHandle(model, None, "x", 32), build_method({"name": "base"}), chunks, a, tmp_path / "ck", "fp")
    assert info["steps"] == 12 and info["tokens_seen"] == 64 * 4 * 12
    assert info["effective_global_batch"] == 4 and info["grad_accumulation"] == 2
    assert info["ema"]["decay"] == 0.5 and info["ema"]["steps"] == 12
    assert info["losses"][-1] < info["losses"][0] - 0.5


def test_nan_loss_is_an_error(tmp_path):
    from harness.models import ModelHandle
    from harness.train import TrainArgs
    from harness.train.loop import finetune

    model = random_llama(vocab=64, hidden=32, layers=1, heads=2, ctx=32)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(float("nan"))
    chunks = np.ones((4, 16), dtype=np.int64)
    a = TrainArgs(name="t", enabled=True, seq_len=16, tokens=16 * 2 * 2, global_batch=2, autocast="float32", ema=False)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss \(nan\) at step 0 of 2"):
        finetune(ModelHandle(model, None, "x", 32), build_method({"name": "base"}), chunks, a, tmp_path, "fp")


def test_train_args_impossible_lengths():
    from harness.train import TrainArgs

    with pytest.raises(ConfigError, match="less than one step"):
        TrainArgs(name="t", enabled=True, seq_len=4096, tokens=100, global_batch=2).validate()
    with pytest.raises(ConfigError, match="multiple"):
        TrainArgs(name="t", enabled=True, seq_len=16, tokens=10**6, global_batch=3, micro_batch=2).validate()


def _run(args, env):
    return forkrun.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT, timeout=600)


def _env(tmp_path):
    return {"HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
            "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.parametrize("args,expect", [
    (["method=nope"], "method"),
    (["method.sclae=3"], "sclae"),
    (["train=tiny", "train.seq_len=-5"], "seq_len"),
])
def test_bad_input_one_line_and_failed_row(tmp_path, args, expect):
    r = _run(args + ["eval=quick"], _env(tmp_path))
    assert r.returncode != 0
    err_lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    last = err_lines[-1]
    assert expect in last and "Traceback" not in r.stderr, r.stderr
    rows = read_rows(tmp_path / "res")
    assert len(rows) == 1 and rows[0]["status"] == "failed" and expect in rows[0]["error"]


def test_cfg_job_composes_for_cluster_model(tmp_path):
    r = _run(["method=pi", "model=llama2_7b", "--cfg", "job"], _env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "meta-llama/Llama-2-7b-hf" in r.stdout and "native_ctx: 4096" in r.stdout


def test_row_schema_is_typed_and_every_key_is_documented(tmp_path):
    """``results.Row`` lists every key a row may carry with a comment each; ``new_row`` writes exactly
    ``ROW_FIELDS`` in that order; every committed row uses only those keys."""
    import inspect
    import json

    from harness import results

    src = inspect.getsource(results.Row).splitlines()
    for k in results.Row.__annotations__:
        (line,) = [ln for ln in src if ln.strip().startswith(f"{k}:")]
        assert "#" in line, f"row key {k!r} has no comment"
    row = results.new_row("x", {"model": {"name": "m"}}, None, tmp_path)
    assert tuple(row) == results.ROW_FIELDS and row["model"] == "m" and row["schema"] == results.SCHEMA_VERSION
    for f in sorted((ROOT / "results").glob("*/runs/*.json")):  # every committed study's rows
        extra = set(json.loads(f.read_text())) - set(results.Row.__annotations__)
        assert not extra, f"{f.name}: keys outside results.Row: {sorted(extra)}"
