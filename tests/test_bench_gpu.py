"""``make bench-gpu`` cannot rot: its ``--smoke`` mode runs every section on CPU at tiny sizes (issue 17). Without a
CUDA GPU the real mode measures nothing and writes nothing."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT, load_file_module


def bench_gpu():
    return load_file_module(ROOT / "benchmarks" / "bench_gpu.py")


def test_bench_gpu_smoke_runs_every_section(tmp_path):
    out = tmp_path / "bench_gpu.json"
    assert bench_gpu().main(["--smoke", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["mode"] == "smoke" and d["model"]["layers"] == 2 and d["torch"] == torch.__version__
    for section, size in (("prefill", "tokens"), ("train", "tokens"), ("generate", "prompt_tokens"),
                          ("agreement", "tokens")):
        rows = d[section]
        assert rows and all(r["status"] == "ok" and r[size] > 0 for r in rows), section
    methods = {(r["method"], r["backend"]) for r in d["prefill"]}
    assert {("base", "sdpa"), ("self_extend", "flex"), ("self_extend", "reference"), ("lm_infinite", "flex"),
            ("landmark", "reference")} <= methods
    assert all(r["latency_s"] > 0 for r in d["prefill"])
    assert all(r["tokens_per_s"] > 0 and r["flops_per_token"] > 0 for r in d["train"])
    assert all(r["decode_tokens_per_s"] > 0 for r in d["generate"])
    fp32 = [r for r in d["agreement"] if r["dtype"] == "float32"]
    assert len(fp32) == 5 and all(r["max_abs_diff"] <= 1e-5 for r in fp32)
    assert all(r["grad_max_abs_diff"] <= 1e-4 for r in fp32 if "grad_max_abs_diff" in r)
    assert {r["dtype"] for r in d["agreement"]} == {"float32", "bfloat16"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the real mode would measure")
def test_bench_gpu_without_cuda_writes_nothing(tmp_path):
    out = tmp_path / "bench_gpu.json"
    assert bench_gpu().main(["--out", str(out)]) == 2
    assert not out.exists()


def test_flops_per_token_is_palm_for_full_training():
    mod = bench_gpu()
    shape = mod.model_shape(mod.SMOKE_MODEL)
    model = mod.make_model(shape, 2, "cpu", torch.float32)
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    T = 256
    attn = 12 * 2 * shape["heads"] * shape["head_dim"] * T
    assert mod.flops_per_token(model, T) == 6 * n + attn
    for p in model.parameters():
        p.requires_grad_(False)
    assert mod.flops_per_token(model, T) == 4 * n + attn
