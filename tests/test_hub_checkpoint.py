"""``model=hub model.path=<folder or cached hub id>``: any checkpoint, its window, dtype and name read from its own
``config.json``; a missing or wrong path is one line and a failed row that names the model option."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
from omegaconf import OmegaConf

from harness.conf_utils import compose
from harness.models.tiny_llama import ASSET_DIR
from tests import forkrun
from tests.conftest import ROOT


def _checkpoint(tmp_path, name="my-ckpt", **config_changes):
    d = tmp_path / name
    shutil.copytree(ASSET_DIR, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(config_changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_folder_gives_its_window_dtype_and_name(tmp_path):
    d = _checkpoint(tmp_path, max_position_embeddings=1024, dtype="bfloat16")
    m = OmegaConf.to_container(compose(["model=hub", f"model.path={d}", "method=base", "train=none"]).model,
                               resolve=True)
    assert (m["name"], m["native_ctx"], m["dtype"], m["builder"]) == ("my-ckpt", 1024, "bfloat16", "hub")
    # every one of them stays overridable
    m = OmegaConf.to_container(compose(["model=hub", f"model.path={d}", "model.native_ctx=512", "model.name=x",
                                        "model.dtype=float32", "method=base", "train=none"]).model, resolve=True)
    assert (m["name"], m["native_ctx"], m["dtype"]) == ("x", 512, "float32")


def test_a_cached_hub_id_resolves_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--Model-7B" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"max_position_embeddings": 32768, "torch_dtype": "float16"}))
    (tmp_path / "hub" / "models--org--Model-7B" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--Model-7B" / "refs" / "main").write_text("a" * 40)
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    m = OmegaConf.to_container(compose(["model=hub", "model.path=org/Model-7B", "method=base", "train=none"]).model,
                               resolve=True)
    assert (m["name"], m["native_ctx"], m["dtype"]) == ("org--Model-7B", 32768, "float16")


def test_the_checkpoint_loads_and_runs_through_the_pipeline(tmp_path):
    from harness import pipeline

    d = _checkpoint(tmp_path)
    cfg = compose(["model=hub", f"model.path={d}", "method=yarn", "train=none", "eval=quick"])
    method, _ = pipeline.validate(cfg)
    handle = pipeline.load_and_extend(cfg, method)
    assert handle.name == "my-ckpt" and handle.native_ctx == 512
    assert handle.model.config.rope_parameters["rope_type"] == "yarn"


@pytest.mark.parametrize("args,line", [
    (["model=hub"], "config error: model.path is required"),
    (["model=hub", "model.path=/no/such/folder"], "config error: model.path: '/no/such/folder' is neither a folder"),
])
def test_a_missing_or_wrong_path_is_one_line_and_a_row_naming_the_model(tmp_path, args, line):
    env = {"HARNESS_RESULTS_DIR": str(tmp_path / "results"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    p = forkrun.run([sys.executable, "run.py", *args, "method=base", "train=none"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    err = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(line), p.stderr
    (row,) = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
    assert (row["status"], row["model"], row["method"]) == ("failed", "hub", "base")


def test_run_py_on_a_checkpoint_folder_writes_an_ok_row_that_says_what_ran(tmp_path):
    d = _checkpoint(tmp_path, name="my-ckpt")
    env = {"HARNESS_RESULTS_DIR": str(tmp_path / "results"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    p = forkrun.run([sys.executable, "run.py", "model=hub", f"model.path={d}", "method=yarn", "train=none",
                        "eval=quick", "eval.lengths=[512,1024]", "eval.suite.passkey.samples=2",
                        "eval.suite.ppl_books.samples=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
    info = row["model_info"]
    assert (row["status"], row["model"]) == ("ok", "my-ckpt")
    assert (info["native_ctx"], info["dtype"], info["device"], info["attn_implementation"]) == (512, "float32", "cpu",
                                                                                               "sdpa")
    assert row["metrics"]["passkey"]["accuracy"].keys() == {"512", "1024"}
    assert "eval passkey: 2/2 prompts at " in p.stderr  # progress in a log (no terminal): a line per prompt set
