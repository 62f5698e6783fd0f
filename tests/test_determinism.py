"""The fine-tuning data and the fine-tuned weights are pure functions of (config, seed): the same on every machine,
whatever the process's string-hash seed and wherever the data cache lives (each build in a fresh subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, random_llama

DATA_CHILD = textwrap.dedent("""
    import hashlib, json, random
    from transformers import AutoTokenizer
    from harness.data import build_data
    from harness.data.synthetic import KINDS, FillerFactory, synthetic_document

    tok = AutoTokenizer.from_pretrained({tok!r})
    out = {{}}
    filler = FillerFactory(["A line of filler text.", "Another line, longer than the first one."], 0)
    for kind in sorted(KINDS):  # every kind, including kinds added later
        rng = random.Random(0)
        docs = [synthetic_document(rng, filler, 200, kind=kind) for _ in range(30)]
        out[kind] = hashlib.sha256("\\x00".join(docs).encode()).hexdigest()
    cfg = {{"name": "local_mix", "shares": {{"synthetic": 0.8, "shakespeare": 0.2}}, "synthetic_docs": 60,
            "synthetic_kinds": {{k: 1.0 for k in sorted(KINDS)}}, "doc_tokens": 256, "cache_dir": {cache!r},
            "seed": 0}}
    arr = build_data(cfg, tok, 128, 128 * 24)
    out["stream"] = hashlib.sha256(arr.tobytes()).hexdigest()
    import pathlib
    out["cache_files"] = sorted(p.name for p in pathlib.Path({cache!r}).glob("*.npy"))
    print("RESULT " + json.dumps(out))
""")


def _child(code: str, hashseed: str, extra_env: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, **(extra_env or {})}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_data_identical_across_hash_seeds_and_cache_paths(tmp_path):
    """Every synthetic kind and the packed token stream (cold cache each time) are identical under two
    PYTHONHASHSEEDs and two cache directories, and the cache file name does not depend on the cache's path."""
    tok = str(ROOT / "harness" / "assets" / "tiny_llama")
    a = _child(DATA_CHILD.format(tok=tok, cache=str(tmp_path / "cache_a")), "1")
    b = _child(DATA_CHILD.format(tok=tok, cache=str(tmp_path / "elsewhere" / "cache_b")), "2")
    assert a == b
    assert len(a["cache_files"]) == 1


TRAIN_CHILD = textwrap.dedent("""
    import hashlib, json
    import torch
    torch.set_num_threads(1)
    from harness import conf_utils, pipeline
    from harness.data.synthetic import KINDS

    cfg = conf_utils.compose(["model=tiny_llama", "model.path={model}", "model.native_ctx=64", "method=pi",
                              "method.scale=2.0", "data.shares={{synthetic:1.0}}", "data.synthetic_docs=40",
                              "train=tiny", "train.seq_len=128", "train.tokens=1024", "train.global_batch=2",
                              "train.warmup_steps=1", "train.save_every=0", "train.autocast=float32",
                              "train.lr=1e-2", "eval=quick"])
    cfg.data.synthetic_kinds = {{k: 1.0 for k in sorted(KINDS)}}  # every kind, including kinds added later
    method, train = pipeline.validate(cfg)
    handle = pipeline.load_and_extend(cfg, method)
    info = pipeline.finetune(cfg, handle, method, train, {run!r})
    h = hashlib.sha256()
    for n, p in sorted(handle.model.state_dict().items()):
        h.update(n.encode()); h.update(p.detach().contiguous().numpy().tobytes())
    print("RESULT " + json.dumps({{"weights": h.hexdigest(), "losses": info["losses"]}}))
""")


@pytest.mark.slow  # ~33 s idle: two fresh fine-tunes; the default tier keeps the data's identity across hash seeds and
# cache paths (below) and the exact resume of a killed fine-tune (tests/test_train.py, test_train_gpu_path.py)
def test_two_cold_cache_finetunes_give_identical_weights(tmp_path):
    """One config fine-tuned twice, each time with an empty data cache elsewhere, another hash seed and no
    checkpoint to resume: the same losses and bit-identical weights."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    model = random_llama(vocab=len(tok), hidden=32, layers=2, heads=2, ctx=64, seed=3)
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = []
    for i, seed in enumerate(("11", "12")):
        env = {"HARNESS_CACHE_DIR": str(tmp_path / f"cache{i}"), "HARNESS_CKPT_DIR": str(tmp_path / f"ck{i}"),
               "HARNESS_OUTPUT_DIR": str(tmp_path / f"out{i}"), "HARNESS_RESULTS_DIR": str(tmp_path / f"res{i}")}
        code = TRAIN_CHILD.format(model=str(tmp_path / "model"), run=str(tmp_path / f"run{i}"))
        out.append(_child(code, seed, env))
    assert out[0]["losses"] == out[1]["losses"]
    assert out[0]["weights"] == out[1]["weights"]
    assert len(out[0]["losses"]) == 4
    assert all(Path(tmp_path / f"cache{i}").exists() for i in range(2))  # both built their own cache
