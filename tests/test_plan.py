"""``scripts/plan.py`` (issue 17): the cost plan of a cluster sweep is a formula of the composed configs; these tests
pin the formulas to hand-computed values and check that the throughput's source is always labelled."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import plan
from harness.conf_utils import group_defaults
from harness.evals.ppl import ASSUMED_DOC_TOKENS


def plan_script():
    from harness.tools import plan as tool

    return tool


@pytest.fixture(scope="module")
def table1():
    return plan_script().build(["experiment=paper_llama2", "hydra/launcher=slurm_a100"], plan.PlanArgs(bench="/none"))


def test_llama2_shape_is_the_published_parameter_count():
    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
    assert s.params == 6_738_415_616  # LLaMA-2-7B
    assert s.matmul_params == s.params - s.embed - (2 * 32 + 1) * 4096


def test_table1_points_tokens_memory_flops(table1):
    rows = {r["row"]: r for r in table1["points"]}
    assert len(rows) == 12 and {"LLaMA2", "PI", "LongLoRA", "Landmark", "NTK-64K-2B"} <= set(rows)
    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
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
    n = 10 * ASSUMED_DOC_TOKENS
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
    # nothing runs faster than all 8 GPUs busy (each point's train and eval wall hours are rounded to 0.1 h)
    assert s["wall_hours"] * 8 >= s["gpu_hours"] - 2 * 0.05 * 8 * s["points"]


# ------------------------------------------------------------------------------ evaluation memory and generation
GIB = 2**30


def test_niah_at_128k_needs_two_gpus_and_every_length_has_its_peak(table1):
    """The issue: NIAH to 128k does not fit one 80 GB A100 (KV cache 62.5 GiB + weights 12.6 GiB + prefill), so the
    plan puts it on 2 GPUs (model parallel); 64k fits one. Every evaluator and length carries its peak memory."""
    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
    pi = {r["row"]: r for r in table1["points"]}["PI"]["eval"]
    niah = pi["niah"]["lengths"]
    assert max(niah) == 128000 and len(niah) == 40
    top = niah[128000]
    assert top["memory_gib"]["kv_cache"] == 62.5  # 2 x 32 x 32 x 128 x 128000 x 2 bytes
    assert top["memory_gib"]["weights"] == round(2 * s.params / GIB, 2) == 12.55
    assert top["memory_gib"]["prefill"] == round(128000 * 2 * (4 * 4096 + 3 * 11008 + 2 * 128) / GIB, 2)  # the MLP
    assert 80 < top["peak_gib"] < 88 and top["gpus_needed"] == 2 and top["model_parallel"]
    assert top["replicas"] == 4  # 8 GPUs of the node, 2 per replica
    assert niah[min(niah, key=lambda L: abs(L - 65536))]["gpus_needed"] == 1
    for key, v in pi.items():
        for L, p in v["lengths"].items():
            assert p["peak_gib"] > 12.5 and p["gpus_needed"] >= 1, (key, L)
    ppl = pi["ppl_pg19"]["lengths"][65536]  # no KV cache: PPL at 64k is the weights plus one layer's activations
    assert ppl["memory_gib"]["kv_cache"] == 0 and not ppl["model_parallel"]
    mp = table1["summary"]["model_parallel"]
    assert {"evaluator": "niah", "length": 128000, "gpus_needed": 2, "peak_gib": top["peak_gib"]} in mp
    assert {x["evaluator"] for x in mp} == {"niah"}


def test_evaluation_gpu_hours_count_generated_tokens(table1):
    """Decoding is memory-bandwidth bound: per generated token, weights + KV cache at L read at the A100's HBM
    bandwidth x the assumed efficiency; generated tokens per prompt from each evaluator's settings."""
    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
    row = {r["row"]: r for r in table1["points"]}["PI"]
    ev = row["eval"]
    assert ev["passkey"]["gen_tokens_per_prompt"] == 8 and ev["niah"]["gen_tokens_per_prompt"] == 50
    assert ev["ruler"]["gen_tokens_per_prompt"] == pytest.approx((8 * 128 + 30 + 120 + 50 + 2 * 32) / 13)
    assert ev["manyshot_trec"]["gen_tokens_per_prompt"] == 64
    assert ev["ppl_pg19"]["generated_tokens"] == 0 and ev["ppl_pg19"]["decode_gpu_hours"] == 0
    pk = ev["passkey"]["lengths"][65536]
    read = 2 * s.params + 2 * 32 * 32 * 128 * 65536 * 2
    assert pk["decode_gpu_hours"] == pytest.approx(50 * 8 * read / (2.0e12 * plan.ASSUMED_DECODE_EFFICIENCY) / 3600)
    prefill = 50 * 65536 * (2 * s.matmul_params + 4 * 32 * 32 * 128 * 65536) / (plan.ASSUMED_MFU * 312e12) / 3600
    assert pk["prefill_gpu_hours"] == pytest.approx(prefill)
    assert pk["wall_hours"] == pytest.approx((prefill + pk["decode_gpu_hours"]) / 8)  # 8 replicas of one GPU
    top = ev["niah"]["lengths"][128000]  # two GPUs per replica: GPU-hours x 2, wall over 4 replicas
    assert top["gpu_hours"] == pytest.approx(2 * 4 * top["wall_hours"])
    assert row["eval_decode_gpu_hours"] > 0
    assert row["eval_gpu_hours"] == pytest.approx(sum(v["gpu_hours"] for v in ev.values()), abs=0.1)
    assert row["eval_gpu_hours"] == pytest.approx(
        sum(v["prefill_gpu_hours"] + v["decode_gpu_hours"] for v in ev.values()), abs=0.2)
    assert row["wall_hours"] == pytest.approx(row["train"]["wall_hours"] + row["eval_wall_hours"], abs=0.1)


def test_h200_holds_niah_at_128k_on_one_gpu_and_the_plan_prints_it(capsys):
    """A composed config with NIAH at 131072 (2^17) tokens: 64 GiB of KV cache; one H200, two A100s."""
    script = plan_script()
    over = ["experiment=paper_llama2", "point=paper_llama2/pi", "eval.suite.niah.context_lengths=[1000,131072,3]"]
    p = script.build(over, plan.PlanArgs(bench="/none", gpu="H200"))
    niah = p["points"][0]["eval"]["niah"]["lengths"]
    assert sorted(niah) == [1000, 66036, 131072]
    assert niah[131072]["memory_gib"]["kv_cache"] == 64.0 and niah[131072]["gpus_needed"] == 1  # 141 GiB
    assert p["summary"]["model_parallel"] == []
    a100 = script.build(over, plan.PlanArgs(bench="/none"))
    assert a100["points"][0]["eval"]["niah"]["lengths"][131072]["gpus_needed"] == 2
    script.show(a100)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "niah" in ln and "131072" in ln and "│" in ln)
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    assert cells[:2] == ["niah", "131072"] and cells[4:6] == ["2", "YES"], cells
    assert "model parallel (one input spans several GPUs, device_map): niah at 131072 (2 GPUs" in " ".join(out.split())


def test_every_hub_model_yaml_has_a_shape_for_the_plan():
    """A cluster plan needs each hub model's shape where the weights are not: every model YAML with a hub id declares
    it (``shape``: a fact of the checkpoint, in the model's own YAML), and the plan reads it from there."""
    import yaml

    from harness.conf_utils import CONF_DIR
    from harness.plan import Shape

    nodes = [yaml.safe_load(p.read_text()) for p in sorted((CONF_DIR / "model").rglob("*.yaml"))]
    hub = [n for n in nodes if isinstance(n.get("path"), str) and "/" in n["path"]
           and not n["path"].startswith(("/", "."))]
    assert len(hub) >= 12 and all(Shape(**n["shape"]).params > 0 for n in hub if "shape" in n), hub
    assert not [n["name"] for n in hub if "shape" not in n]
    assert "Leooyii/" not in Path(plan.__file__).read_text() and "meta-llama/" not in Path(plan.__file__).read_text()


# ------------------------------------------------------------------------------ checkpoint space (issue 32, item 3)
def test_checkpoint_space_per_point_and_for_the_sweep(table1):
    """One ZeRO-3 save = 2 P (bf16 weights) + 12 P_t (fp32 master + Adam m, v) + 4 P_t (the EMA's fp32
    partitions); at the peak the kept saves plus the one being written, plus the final bf16 weights."""
    from harness.train.checkpoint import KEEP_LAST

    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
    rows = {r["row"]: r for r in table1["points"]}
    pi = rows["PI"]["train"]["checkpoints"]
    save = 2 * s.params + 12 * s.params + 4 * s.params
    assert pi["save_gb"] == round(save / 1e9, 1) and pi["saves"] == 953 // 50
    assert pi["saves_at_peak"] == KEEP_LAST + 1 and pi["final_gb"] == round(2 * s.params / 1e9, 1)
    assert pi["peak_gb"] == round(((KEEP_LAST + 1) * save + 2 * s.params) / 1e9, 1)
    assert pi["after_gb"] == pi["final_gb"]  # train.keep_checkpoints=false: the saves are removed at the end
    assert "2 P (bf16 weights) + 12 P_t (fp32 master + Adam m, v) + 4 P_t (fp32 EMA)" in pi["formula"]
    ll = rows["LongLoRA"]["train"]["checkpoints"]  # the frozen weights are saved, the optimizer covers P_t only
    p_t = rows["LongLoRA"]["train"]["trained_params"]
    assert ll["save_gb"] == round((2 * s.params + 16 * p_t) / 1e9, 1) < pi["save_gb"] / 5
    assert "checkpoints" not in (rows["Self-Extend"]["train"] or {})  # frozen: nothing saved
    summary = table1["summary"]
    trained = [r["train"]["checkpoints"] for r in table1["points"] if r["train"]]
    assert summary["checkpoint_peak_gb"] == pytest.approx(sum(c["peak_gb"] for c in trained), abs=0.1)
    assert summary["checkpoint_after_gb"] == pytest.approx(sum(c["after_gb"] for c in trained), abs=0.1)


def test_checkpoint_space_follows_the_recipe(capsys):
    """keep_checkpoints keeps KEEP_LAST saves after the run; save_every=0 saves nothing; no EMA, no EMA term; a run
    shorter than two saves holds fewer at its peak. `make plan` prints the formula and the sweep's total."""
    from harness.train.checkpoint import KEEP_LAST

    s = plan.Shape(**group_defaults("model", "llama2_7b")["shape"])
    kept = plan.checkpoint_space(s, s.params, steps=953, save_every=50, ema=True, keep=True)
    assert kept["kept_after"] == KEEP_LAST and kept["after_gb"] == round(
        (KEEP_LAST * 18 * s.params + 2 * s.params) / 1e9, 1)
    none = plan.checkpoint_space(s, s.params, steps=953, save_every=0, ema=True, keep=True)
    assert none["saves"] == 0 and none["peak_gb"] == none["after_gb"] == none["final_gb"]
    no_ema = plan.checkpoint_space(s, s.params, steps=953, save_every=50, ema=False, keep=False)
    assert no_ema["save_gb"] == round(14 * s.params / 1e9, 1) and "EMA" not in no_ema["formula"]
    one = plan.checkpoint_space(s, s.params, steps=60, save_every=50, ema=True, keep=False)
    assert one["saves"] == 1 and one["saves_at_peak"] == 1
    script = plan_script()
    p = script.build(["experiment=paper_llama2", "point=paper_llama2/pi", "hydra/launcher=slurm_a100"],
                     plan.PlanArgs(bench="/none"))
    script.show(p)
    out = " ".join(capsys.readouterr().out.split())
    assert "2 P (bf16 weights) + 12 P_t (fp32 master + Adam m, v) + 4 P_t (fp32 EMA)" in out
    assert f"the sweep's points at once: {p['summary']['checkpoint_peak_gb']:,.0f} GB at the peak" in out
