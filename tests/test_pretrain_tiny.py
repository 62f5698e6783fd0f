"""``scripts/pretrain_tiny.py`` on a device and at a size other than the shipped one (for a GPU session's larger
base): a fresh stage takes the sizes it is given and records where it trained; the bad combinations fail with one
clear line."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from conftest import ROOT

from tests import forkrun

SCRIPT = [sys.executable, str(ROOT / "scripts" / "pretrain_tiny.py")]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


@pytest.mark.slow  # ~20 s idle: a fresh pretraining stage of the shipped tiny model (an asset's build)
def test_fresh_stage_takes_its_sizes_and_records_its_device(tmp_path):
    out = tmp_path / "m"
    r = forkrun.run(SCRIPT + ["--out", str(out), "--steps", "2", "--batch", "1", "--seq-len", "64", "--layers", "2",
                                 "--hidden", "64", "--heads", "2", "--intermediate", "128", "--gate-samples", "0",
                                 "--threads", "1", "--device", "cpu"],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]) == \
        (2, 64, 2, 128)
    stage = json.loads((out / "pretrain_stats.json").read_text())["stages"][-1]
    assert stage["device"] == "cpu (1 threads)"
    assert stage["architecture"] == {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128}
    # a continued stage keeps its parent's sizes: asking for others is an error, not silently ignored
    bad = forkrun.run(SCRIPT + ["--init-from", str(out), "--out", str(tmp_path / "m2"), "--layers", "6",
                                   "--gate-samples", "0"], env=ENV, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "--layers only apply to a fresh model" in bad.stderr


def test_fresh_stage_on_the_shipped_tokenizer(tmp_path):
    """``--tokenizer-from``: a from-scratch candidate keeps the shipped token ids (no tokenizer is trained); with
    ``--init-from`` (which keeps its parent's tokenizer) it is one clear error."""
    from harness.models.tiny_llama import ASSET_DIR

    out = tmp_path / "m"
    r = forkrun.run(SCRIPT + ["--out", str(out), "--tokenizer-from", str(ASSET_DIR), "--steps", "2", "--batch", "1",
                                 "--seq-len", "64", "--layers", "1", "--hidden", "64", "--heads", "2",
                                 "--intermediate", "128", "--gate-samples", "0", "--threads", "1", "--device", "cpu"],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "tokenizer.json").read_bytes() == (ASSET_DIR / "tokenizer.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    bad = forkrun.run(SCRIPT + ["--init-from", str(out), "--tokenizer-from", str(ASSET_DIR),
                                   "--out", str(tmp_path / "m2"), "--gate-samples", "0"],
                         env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == \
        "pretrain_tiny: --tokenizer-from is for a fresh model; --init-from keeps its parent's"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when there is no GPU")
def test_cuda_without_a_gpu_is_one_clear_error(tmp_path):
    r = forkrun.run(SCRIPT + ["--out", str(tmp_path / "m"), "--device", "cuda", "--gate-samples", "0"],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == \
        "pretrain_tiny: --device cuda but torch sees no CUDA device"


def test_block_expansion_keeps_the_function_and_renumbers_the_cache():
    """LLaMA Pro's block expansion: the grown model computes what the original did (new blocks start as identity:
    zero output projections), its layers are numbered for the KV cache, and decoding with the cache still agrees."""
    from conftest import load_file_module, random_llama

    pt = load_file_module(ROOT / "scripts" / "pretrain_tiny.py")
    model = random_llama(layers=3).eval()
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        before = model(x).logits
        greedy = model.generate(x[:1, :20], max_new_tokens=6, do_sample=False)
    added = pt.expand_layers(model, 2)
    assert added == [1, 3] and model.config.num_hidden_layers == 5 == len(model.model.layers)
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3, 4]
    for i in added:
        assert not model.model.layers[i].self_attn.o_proj.weight.any()
        assert not model.model.layers[i].mlp.down_proj.weight.any()
        assert model.model.layers[i].self_attn.q_proj.weight.any()  # a copy of its neighbour, not blank
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
        assert torch.equal(model.generate(x[:1, :20], max_new_tokens=6, do_sample=False), greedy)


def test_ruler_key_probe_swaps_the_keys(capsys):
    """The model card's key probe: with ``--keys train`` the needles' keys come from the training vocabulary."""
    from conftest import load_file_module

    from harness.data import synthetic as S
    from harness.evals import ruler_data as R

    probe = load_file_module(ROOT / "scripts" / "probes" / "ruler_key_probe.py")
    saved = R.niah_words, R.RULER_NIAH_NEEDLE, R.RULER_TASKS
    tasks_before = repr(R.RULER_TASKS)
    try:
        probe.main(["--keys", "train", "--samples", "2", "--length", "512", "--noun", "secret"])
        assert set(R.niah_words()) == {f"{a}-{n}" for a in S.ADJS for n in S.NOUNS}
        assert R.RULER_NIAH_NEEDLE.startswith("One of the secret ") and "special magic" not in repr(R.RULER_TASKS)
        assert repr(saved[2]) == tasks_before  # the templates themselves are not edited
    finally:
        R.niah_words, R.RULER_NIAH_NEEDLE, R.RULER_TASKS = saved
    out = capsys.readouterr().out
    assert all(f"{t} at 512, keys train, noun secret:" in out for t in probe.TASKS) and "(n = 2)" in out
