"""``scripts/pretrain_tiny.py`` on a device and at a size other than the shipped one (for a GPU session's larger
base): a fresh stage takes the sizes it is given and records where it trained; the bad combinations fail with one
clear line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

SCRIPT = [sys.executable, str(ROOT / "scripts" / "pretrain_tiny.py")]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def test_fresh_stage_takes_its_sizes_and_records_its_device(tmp_path):
    out = tmp_path / "m"
    r = subprocess.run(SCRIPT + ["--out", str(out), "--steps", "2", "--batch", "1", "--seq-len", "64", "--layers", "2",
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
    bad = subprocess.run(SCRIPT + ["--init-from", str(out), "--out", str(tmp_path / "m2"), "--layers", "6",
                                   "--gate-samples", "0"], env=ENV, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "--layers only apply to a fresh model" in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when there is no GPU")
def test_cuda_without_a_gpu_is_one_clear_error(tmp_path):
    r = subprocess.run(SCRIPT + ["--out", str(tmp_path / "m"), "--device", "cuda", "--gate-samples", "0"],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == \
        "pretrain_tiny: --device cuda but torch sees no CUDA device"
