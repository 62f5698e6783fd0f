"""Bad settings and damaged files, each one line naming the key, value or file (issue 58's inputs): evaluation
lengths that measure nothing or are not numbers, training settings out of range, safetensors that are truncated,
empty or of another shape than their config, a truncated GGUF file. (The run-level behaviour, a failed row and
exit 1, is the bad-input catalogue's: ``scripts/bad_inputs.py``.)"""
from __future__ import annotations

import json
import shutil

import pytest

from harness import pipeline
from harness.config import ConfigError
from harness.sweeps import compose
from tests.conftest import random_llama

BASE = ["method=base", "train=none", "eval=quick"]


@pytest.mark.parametrize("args, words", [
    (["eval.lengths=[]"], "eval.suite.ppl_books: no length to evaluate"),  # an ok row that measured nothing
    (["eval.lengths=[nan]"], "eval.lengths: nan is not a possible evaluation length"),  # a raw ValueError
    (["train=quick", "train.global_batch=0"], "train.global_batch: 0 is not an integer >= 1"),  # ZeroDivisionError
    (["train=quick", "train.weight_decay=-0.1"], "train.weight_decay: -0.1 is not a number >= 0"),  # accepted
    (["train=quick", "train.save_every=-5"], "train.save_every: -5 is not an integer >= 0"),  # saved every step
])
def test_a_setting_out_of_range_is_one_line(args, words):
    with pytest.raises(ConfigError, match=words) as e:
        pipeline.setup(compose(BASE + args), data=False)
    assert len(str(e.value).splitlines()) == 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import AutoTokenizer

    from harness import api

    d = tmp_path_factory.mktemp("good") / "model"
    tok = AutoTokenizer.from_pretrained(api.TINY_LLAMA)
    random_llama(vocab=len(tok), hidden=64, layers=2, heads=4, ctx=256, theta=1000.0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _damaged(folder, tmp_path, how):
    d = tmp_path / "damaged"
    shutil.copytree(folder, d)
    w = d / "model.safetensors"
    if how == "truncated":
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif how == "empty":
        w.write_bytes(b"")
    else:
        cfg = json.loads((d / "config.json").read_text())
        cfg[how] = cfg[how] // 2
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("how, words", [("truncated", "model.safetensors is not a readable safetensors file"),
                                        ("empty", "model.safetensors is not a readable safetensors file"),
                                        ("vocab_size", "lm_head.weight is \\[4096, 64\\] but config.json implies "
                                                       "\\[2048, 64\\]"),
                                        ("hidden_size", "but config.json implies")])
def test_a_damaged_model_folder_is_one_line_naming_the_file(folder, tmp_path, how, words):
    """Before: safetensors' "incomplete metadata" without the file, or transformers' multi-line mismatch report."""
    from harness.models import load_pretrained

    d = _damaged(folder, tmp_path, how)
    with pytest.raises(ConfigError, match=words) as e:
        load_pretrained(str(d), "float32", "sdpa")
    assert str(d) in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_truncated_gguf_file_is_one_line_naming_the_file(tmp_path):
    """``gguf_to_hf`` on a truncated GGUF named the folder it sat in ('/tmp'), not the file."""
    from harness.models import load_pretrained

    f = tmp_path / "model.gguf"
    f.write_bytes(b"")
    with pytest.raises(ConfigError, match=f"cannot load model from '{f}'.*truncated or damaged GGUF"):
        load_pretrained(str(tmp_path), "float32", "sdpa", gguf_file=f.name)


def test_committed_results_carry_no_machine_paths():
    """Every JSON file under ``results/`` (rows, the GPU check's records, factor files, the archive) names files
    relative to the checkout: no absolute path (``scripts/portable_results.py`` rewrote them; a finished run of the
    checkout records its paths that way, ``lifecycle.PATH_FIELDS``). The check can fail."""
    from harness.results import REPO, machine_paths, portable

    bad = []
    for f in sorted((REPO / "results").rglob("*.json")):
        try:
            obj = json.loads(f.read_text())
        except ValueError:
            continue
        bad += [f"{f.relative_to(REPO)}: {p}" for p in machine_paths(obj)]
    assert not bad, bad[:10]
    assert machine_paths({"run_dir": "/work/x/outputs/run"}) and not machine_paths({"u": "https://a.org/b/c"})
    assert portable({"run_dir": f"{REPO}/outputs/r", "command": f"/opt/venv/bin/python3 {REPO}/run.py"}) == \
        {"run_dir": "outputs/r", "command": "python3 run.py"}
