"""``make gpu-check`` cannot rot: ``scripts/gpu_check.py --smoke`` runs its whole code path on CPU (tiny_llama written
as a hub folder, run.py sweeps over methods at 2C and 4C, DeepSpeed steps, bench_gpu) into a temp folder; without a
CUDA GPU the real mode stops with one line and writes nothing."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch
from conftest import ROOT, load_file_module

from tests import forkrun

SCRIPT = ROOT / "scripts" / "gpu_check.py"
REAL_OUT = ROOT / "results" / "gpu_check.json"


def gpu_check():
    return load_file_module(SCRIPT)


def stat_or_none(p):
    return p.stat().st_mtime_ns if p.exists() else None


@pytest.mark.slow  # 90 s; the GPU window's command is now make gpu-study, rehearsed in the default tier
def test_smoke_runs_every_check_through_run_py(tmp_path):
    before = stat_or_none(REAL_OUT)
    work = tmp_path / "work"
    r = forkrun.run([sys.executable, str(SCRIPT), "--smoke", "--work", str(work)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert stat_or_none(REAL_OUT) == before  # the smoke never touches results/gpu_check.json
    d = json.loads((work / "gpu_check.json").read_text())
    assert d["mode"] == "smoke" and d["ok"] is True and d["failed"] == []
    assert d["device"]["count"] == 0 and d["versions"]["torch"] == torch.__version__
    assert d["model"]["source"] == "tiny_llama" and d["model"]["native_ctx"] == 128 and d["lengths"] == [256, 512]
    assert (work / "cache" / "hub" / "tiny_llama" / "config.json").is_file()  # the hub folder run.py loaded
    # one row per method, made by run.py from the hub folder, passkey at both lengths; the Hydra callback timed it
    assert set(d["methods"]) == {"base", "self_extend"}
    for name, m in d["methods"].items():
        assert m["status"] == "ok" and set(m["passkey_accuracy"]) == {"256", "512"}
        assert m["seconds"] > 0 and m["peak_allocated_gib"] is None  # CPU: no CUDA allocator to read
        row = json.loads(open(m["row"]).read())
        assert row["method"] == name and row["model"] == "tiny_llama_hub" and row["status"] == "ok"
        assert "model=hub" in row["command"] and row["config"]["model"]["path"].endswith("hub/tiny_llama")
    c = d["checks"]
    for name in ("base", "self_extend"):  # each method in its own run.py process, within the budget
        m = c["methods"][name]
        assert m["status"] == "ok" and f"run.py method={name} " in m["command"] and 0 < m["seconds"] <= m["limit_s"]
    assert d["budget_s"] == gpu_check().SMOKE_BUDGET_S
    assert c["train"]["status"] == "ok" and c["train"]["train_info"]["engine"] == "deepspeed"
    assert c["train"]["train_info"]["steps"] == 2 and c["train"]["train_info"]["seq_len"] == 256
    assert c["data_parallel"]["status"] == "skipped"
    assert c["bench_gpu"]["status"] == "ok" and json.loads((work / "bench_gpu.json").read_text())["generate"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the real mode would run")
def test_without_cuda_one_line_and_nothing_written(tmp_path):
    out = tmp_path / "gpu_check.json"
    before = stat_or_none(REAL_OUT)
    r = forkrun.run([sys.executable, str(SCRIPT), "--out", str(out), "--work", str(tmp_path / "w")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 2
    assert r.stderr.strip().startswith("gpu_check: no CUDA GPU") and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and stat_or_none(REAL_OUT) == before


def test_smoke_refuses_the_real_summary_path():
    assert gpu_check().main(["--smoke", "--out", str(REAL_OUT)]) == 2


def test_method_verdict_from_rows():
    """A method passes only with an ok row that measured passkey at both lengths."""
    v = gpu_check().method_verdict
    peaks = [{"method": "pi", "seconds": 3.5, "peak_allocated_bytes": 3 * 2**30}]
    row = {"method": "pi", "status": "ok", "run_id": "r", "_path": "p",
           "metrics": {"passkey": {"accuracy": {"256": 1.0, "512": 0.5}, "skipped": {}}}}
    ok = v(row, [256, 512], peaks)
    assert ok["status"] == "ok" and ok["seconds"] == 3.5 and ok["peak_allocated_gib"] == 3.0
    part = v({**row, "metrics": {"passkey": {"accuracy": {"256": 1.0}, "skipped": {"512": "too long"}}}}, [256, 512],
             peaks)
    assert part["status"] == "failed" and "[512]" in part["error"]
    bad = v({**row, "status": "failed", "error": "eval.suite.passkey: out of memory"}, [256, 512], [])
    assert bad["status"] == "failed" and "out of memory" in bad["error"] and bad["seconds"] is None
    assert v(None, [256, 512], [])["status"] == "failed"


@pytest.mark.slow
def test_smollm2_hub_folder_is_the_gguf_model(tmp_path):
    """The hub folder gpu-check writes from the shipped GGUF loads with the generic ``hub`` builder (as run.py's
    ``model=hub model.path=...``) and gives the GGUF model's logits exactly."""
    from harness.models import build_model, load_model

    folder = tmp_path / "hub"
    r = forkrun.run([sys.executable, str(SCRIPT), "--hub", "smollm2_135m", str(folder)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    info = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("GPU_CHECK_INFO "))[15:])
    assert info["hub"]["native_ctx"] == 8192 and info["hub"]["dtype"] == "float32"
    hub = build_model({"name": "smollm2_135m_hub", "builder": "hub", "path": str(folder), "native_ctx": 8192,
                       "dtype": "float32", "attn_implementation": "sdpa"})
    ref = load_model("smollm2_135m")
    ids = ref.tokenizer("The passkey is 4711. Remember it.", return_tensors="pt").input_ids
    assert hub.tokenizer("The passkey is 4711. Remember it.", return_tensors="pt").input_ids.tolist() == ids.tolist()
    with torch.no_grad():
        assert torch.equal(hub.model(ids).logits, ref.model(ids).logits)


def test_budget_divides_one_time_among_the_parts_and_passes_on_what_is_left():
    b = gpu_check().Budget(100, {"hub": 1, "method 0": 1, "train": 2})
    assert b.limit("hub") == 25
    b.spent("hub", 5)  # 20 s unused: the next part may take them
    assert b.limit("method 0") == 45
    b.spent("method 0", 45)
    assert b.limit("train") <= 50
    b.total = 0  # spent: nothing more starts
    assert b.limit("train") == 0


def test_a_part_past_its_time_is_stopped_and_recorded(tmp_path):
    g = gpu_check()
    t0 = time.time()
    rec = g.run_check("slow", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), 1, tmp_path,
                      False)
    assert rec["status"] == "timeout" and rec["limit_s"] == 1 and time.time() - t0 < 30
    assert g.run_check("none", ["true"], {}, 0, tmp_path, False)["status"] == "skipped"


def test_default_model_has_llama2_7b_layers_and_the_shipped_tokenizer():
    model, tok, native = gpu_check().geometry_model(2, device="meta")
    c = model.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (4096, 32, 32, 11008)
    assert c.num_hidden_layers == 2 and native == 4096 and c.vocab_size == len(tok)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_the_default_budget_holds_the_expected_seconds_of_what_runs():
    g = gpu_check()
    e = g.expected_seconds(22, 4, set())
    assert e["methods"] == g.EXPECTED_S["method"] * 6  # 22 methods, 4 at a time: 6 rounds
    # the default: every shipped method, GPU_JOBS at a time, and every other part fit the default budget
    n = len(list((ROOT / "conf" / "method").glob("*.yaml")))
    assert sum(g.expected_seconds(n, g.GPU_JOBS, set()).values()) <= g.BUDGET_S
    assert set(e) == {"hub", "methods", "train", "data_parallel", "bench_gpu"}
    assert set(g.expected_seconds(3, 4, {"train", "bench_gpu"})) == {"hub", "methods", "data_parallel"}
    assert g.expected_seconds(3, 1, set())["methods"] == 3 * g.EXPECTED_S["method"]


def test_methods_run_jobs_at_a_time_under_one_deadline(tmp_path):
    """Three processes that each wait for the other two to have started finish only when run three at a time; with one
    at a time the first is killed at the deadline and the rest are never started."""
    g = gpu_check()
    barrier = ("import pathlib, sys, time; d = pathlib.Path(sys.argv[1]); (d / sys.argv[2]).touch(); t = time.time()\n"
               "while len(list(d.iterdir())) < 3 and time.time() - t < 60: time.sleep(0.05)\n"
               "sys.exit(0 if len(list(d.iterdir())) == 3 else 1)")
    for jobs, name in ((3, "together"), (1, "alone")):
        d = tmp_path / name
        d.mkdir()
        cmds = {n: [sys.executable, "-c", barrier, str(d), n] for n in ("a", "b", "c")}
        (tmp_path / f"logs_{name}").mkdir()
        recs = g.run_pool(cmds, dict(os.environ), 30 if jobs == 3 else 3, jobs, tmp_path / f"logs_{name}", False)
        assert list(recs) == ["a", "b", "c"]
        if jobs == 3:
            assert all(r["status"] == "ok" for r in recs.values()), recs
        else:
            assert recs["a"]["status"] == "timeout" and recs["b"]["status"] == recs["c"]["status"] == "skipped"


def test_gpu_memory_sampler_reads_nvidia_smi(tmp_path):
    """The sampler that runs only where nvidia-smi exists (never in the smoke): a stand-in nvidia-smi on PATH that
    prints two GPUs' memory.used; the check's record carries the peak (the first H200 run died here: the thread's
    stop event shadowed threading.Thread._stop)."""
    g = gpu_check()
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 1234\necho 56\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    old = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        rec = g.run_check("sampled", [sys.executable, "-c", "import time; time.sleep(1)"], env, 30, tmp_path, True)
    finally:
        os.environ["PATH"] = old
    assert rec["status"] == "ok" and rec["peak_gpu_memory_used_mib"] == [1234, 56]
