"""``scripts/plan.py`` (issue 17): the cost plan of a cluster sweep is a formula of the composed configs; these tests
pin the formulas to hand-computed values and check that the throughput's source is always labelled."""
from __future__ import annotations

import json

import pytest
from conftest import ROOT, load_file_module

from harness import plan


def plan_script():
    return load_file_module(ROOT / "scripts" / "plan.py", "plan_script")


@pytest.fixture(scope="module")
def table1():
    return plan_script().build(["experiment=paper_llama2", "hydra/launcher=slurm_a100"], plan.PlanArgs(bench="/none"))


def test_llama2_shape_is_the_published_parameter_count():
    s = plan.Shape(**plan.SHAPES["llama2_7b"])
    assert s.params == 6_738_415_616  # LLaMA-2-7B
    assert s.matmul_params == s.params - s.embed - (2 * 32 + 1) * 4096


def test_table1_points_tokens_memory_flops(table1):
    rows = {r["row"]: r for r in table1["points"]}
    assert len(rows) == 12 and {"LLaMA2", "PI", "LongLoRA", "Landmark", "NTK-64K-2B"} <= set(rows)
    s = plan.Shape(**plan.SHAPES["llama2_7b"])
    pi = rows["PI"]["train"]
    assert pi["seq_len"] == 32768 and pi["steps"] == 10**9 // (32 * 32768) == 953
    assert pi["tokens"] == 953 * 32 * 32768 and pi["world_size"] == 8
    m = pi["memory_gib_per_rank"]
    assert m["parameters"] == round(2 * s.params / 8 / 2**30, 2)
    assert m["optimizer"] == round(12 * s.params / 8 / 2**30, 2)
    assert m["activations.logits_and_loss"] == round(10 * 32768 * 32000 / 2**30, 2)
    assert pi["flops_per_token"] == 6 * s.matmul_params + 12 * 32 * 32 * 128 * 32768  # PaLM, full fine-tuning
    assert pi["fits"] and rows["NTK-64K"]["train"]["seq_len"] == 65536
    ll = rows["LongLoRA"]["train"]
    lora = 32 * 4 * 8 * (4096 + 4096)
    assert ll["trained_params"] == lora + s.embed + (2 * 32 + 1) * 4096
    assert ll["flops_per_token"] == 4 * s.matmul_params + 2 * lora + 12 * 32 * 32 * 128 * 32768 * 0.25  # S2: N/4
    lm = rows["Landmark"]["train"]  # the recipe's 32k sequences, split into 512-token pieces: PI's steps and tokens
    assert lm["seq_len"] == 32768 and lm["steps"] == pi["steps"] and lm["tokens"] == pi["tokens"]
    assert lm["flops_per_token"] == 6 * s.matmul_params + 12 * 32 * 32 * 128 * 512
    assert rows["Self-Extend"]["train"] is None and rows["Self-Extend"]["eval_gpu_hours"] > 0
    two = rows["NTK-64K-2B"]["train"]
    assert two["steps"] == 2 * 10**9 // (32 * 65536) and two["tokens"] == two["steps"] * 32 * 65536


def test_eval_prompt_tokens_per_evaluator(table1):
    ev = {r["row"]: r["eval"] for r in table1["points"]}["PI"]
    assert ev["passkey"]["prompt_tokens"] == 50 * (4096 + 8192 + 16384 + 32768 + 65536)
    assert ev["ruler"]["prompt_tokens"] == 13 * 500 * (4096 + 8192 + 16384 + 32768 + 65536)
    assert ev["niah"]["prompts"] == 40 * 10
    n = 10 * plan.ASSUMED_DOC_TOKENS
    windows = {L: len(range(0, n - L, 256)) - 1 for L in (2048, 4096, 8192, 16384, 32768, 65536)}
    assert ev["ppl_pg19"]["prompt_tokens"] == sum(L * w for L, w in windows.items())
    assert "ASSUMPTION" in ev["ppl_pg19"]["basis"] and "UPPER BOUND" in ev["longbench"]["basis"]


def test_throughput_source_is_labelled_and_measured_mfu_is_used(table1, tmp_path):
    first = table1["points"][0]["throughput"]
    assert first["source"].startswith("ASSUMPTION") and first["mfu"] == plan.ASSUMED_MFU
    assert "no GPU-hours" in table1["summary"]["paper"]
    bench = {"mode": "gpu", "device": {"name": "NVIDIA A100-SXM4-80GB"}, "model": {"layers": 4},
             "train": [{"method": "base", "backend": "sdpa", "tokens": 32768, "mfu": 0.5, "status": "ok"},
                       {"method": "base", "backend": "sdpa", "tokens": 8192, "mfu": 0.3, "status": "ok"}]}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    p = plan_script().build(["experiment=paper_llama2", "point=paper_llama2/pi"],
                            plan.PlanArgs(bench=str(tmp_path / "b.json")))
    row = p["points"][0]
    assert row["throughput"]["mfu"] == 0.5 and row["throughput"]["source"].startswith("MEASURED")
    pi = {r["row"]: r for r in table1["points"]}["PI"]
    assert row["train"]["gpu_hours"] == pytest.approx(pi["train"]["gpu_hours"] * plan.ASSUMED_MFU / 0.5, rel=1e-2)
    s = table1["summary"]
    assert s["gpus_per_job"] == 8 and s["timeout_hours_per_attempt"] == 24
    assert s["wall_hours"] >= s["gpu_hours"] / 8
