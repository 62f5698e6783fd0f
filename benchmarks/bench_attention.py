"""Approximate-attention methods: peak memory and time of one decoder forward at 16C (tiny_llama: 8192 tokens)
versus the ``base`` method's sdpa forward at the same length (issue 4: Self-Extend and LM-Infinite must stay within
1.5x of base, i.e. no dense [L x L] score/mask per head).

Each measurement runs in a fresh subprocess: load the model, apply the method, warm up at C, then record the resident
set size (RSS) right before the 16C forward and its peak during it (a sampling thread reading /proc/self/statm every
~0.2 ms, plus ``ru_maxrss``). The reported number is the peak increase over the pre-forward RSS, i.e. the memory the
forward itself needs (weights excluded). The model is the shipped tiny_llama as its builder loads it (``load_model``:
the weights and the native window C of ``conf/model/tiny_llama.yaml``), each method from its own YAML, put on it as a
run does (``pipeline.extend``).

Second part (issue 17, ``backends``): the fused backend (``attention.backend=flex``, ``harness/methods/flex.py``) vs
the reference tile loops, one fp32 decoder forward of tiny_llama at the tiny suite's lengths C..16C, median of 3 after
a warm-up, in one process; plus LongLoRA's S2-Attn and packed-document masking (documents of C/2 tokens) at the
training length 8C (forward + backward). On CPU, torch 2.13 runs flex_attention eagerly (an unfused implementation
that materialises the scores behind a dynamo trace; its compiled CPU path has no log-sum-exp and no backward), and
CPU backward goes through the dense evaluation of the same masks, so ``auto`` keeps the reference on CPU; these
numbers say by how much.

    python scripts/bench.py attention
    python scripts/bench.py --smoke attention    # every method at 2C in one process, the backends at C (seconds)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

FULL_ONLY = True  # `make bench --full` (or by name): minutes to tens of minutes on 2 cores

CHILD = r"""
import gc, json, os, resource, threading, time, ctypes
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
from harness.methods import build_method
from harness.models import load_model
from harness.pipeline import extend

page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
for name, mult in {jobs!r}:
    handle = load_model("tiny_llama")  # its builder: the shipped weights and C from conf/model/tiny_llama.yaml
    extend(handle, build_method({{"name": name}}), log=lambda _: None)
    C = handle.native_ctx
    L = mult * C
    dec = handle.model.get_decoder()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (1, L), generator=gen)
    with torch.no_grad():
        dec(input_ids=ids[:, :C], use_cache=False)  # warm-up (kernels, lazy init)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    before = rss()
    peak = [before]
    stop = [False]
    def sample():
        while not stop[0]:
            r = rss()
            if r > peak[0]:
                peak[0] = r
            time.sleep(0.0002)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.time()
    with torch.no_grad():
        out = dec(input_ids=ids, use_cache=False).last_hidden_state
    secs = time.time() - t0
    stop[0] = True
    t.join()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({{"method": name, "length": L, "native_ctx": C, "seconds": round(secs, 2),
                      "rss_before_mb": round(before / 2**20, 1),
                      "peak_increase_mb": round((peak[0] - before) / 2**20, 1),
                      "ru_maxrss_increase_mb": round(max(0, maxrss - before) / 2**20, 1),
                      "finite": bool(torch.isfinite(out).all())}}), flush=True)
"""


def _child(code: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


def measure(jobs: list[tuple[str, int]]) -> list[dict]:
    """One process for ``jobs`` ([(method, multiple of C)]): a row per job, or one error row per job."""
    p = _child(CHILD.format(jobs=list(jobs)), 3600)
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or len(rows) != len(jobs):
        err = (p.stderr.strip().splitlines() or ["?"])[-1]
        return [{"method": name, "error": err} for name, _ in jobs]
    return rows


BACKENDS_CHILD = r"""
import json, os, statistics, sys, time, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
from harness.methods import build_method
from harness.methods import flex as fx
from harness.models import load_model
from harness.pipeline import extend

def timed(fn, reps={reps}):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return round(statistics.median(ts), 4)

out = []
gen = torch.Generator().manual_seed(0)
for name in ("base", "self_extend", "lm_infinite"):
    handle = load_model("tiny_llama")  # its builder: the shipped weights and C from conf/model/tiny_llama.yaml
    extend(handle, build_method({{"name": name}}), "reference", log=lambda _: None)
    dec = handle.model.get_decoder()
    C = handle.native_ctx
    for mult in {mults!r}:
        ids = torch.randint(10, 1000, (1, mult * C), generator=gen)
        for backend in (("sdpa",) if name == "base" else ("reference", "flex")):
            for m in fx.bw.attention_modules(handle.model):
                m.harness_attn_backend = "reference" if backend == "sdpa" else backend
            with torch.no_grad():
                sec = timed(lambda: dec(input_ids=ids, use_cache=False))
            out.append({{"method": name, "backend": backend, "tokens": mult * C, "part": "prefill (no grad)",
                         "seconds": sec}})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
for name, docs in (("longlora", False), ("base", True)):
    for backend in ("reference", "flex"):
        handle = load_model("tiny_llama")
        meth = build_method({{"name": name}})
        extend(handle, meth, backend, log=lambda _: None)
        meth.train_mode(handle)
        model = handle.model
        model.train()
        C = handle.native_ctx
        L = {train_mult} * C
        ids = torch.randint(10, 1000, (1, L), generator=gen)
        kw = {{"position_ids": (torch.arange(L) % (C // 2))[None], "use_cache": False}} if docs else {{}}
        def step():
            model(input_ids=ids, labels=ids, **kw).loss.backward()
            model.zero_grad(set_to_none=True)
        with torch.no_grad():
            fwd = timed(lambda: model(input_ids=ids, **kw), reps=min(2, {reps}))
        out.append({{"method": name + ("+documents" if docs else " (S2-Attn)"), "backend": backend, "tokens": L,
                     "part": "training forward (no grad)", "seconds": fwd}})
        out.append({{"method": name + ("+documents" if docs else " (S2-Attn)"), "backend": backend, "tokens": L,
                     "part": "training forward + backward", "seconds": timed(step, reps=min(2, {reps}))}})
        print(json.dumps(out[-2:]), file=sys.stderr, flush=True)
print(json.dumps(out))
"""


FULL = dict(length=16, methods=("base", "self_extend", "lm_infinite", "landmark", "longlora"), reps=3,
            mults=(1, 2, 4, 8, 16), train_mult=8)
SMOKE = dict(length=2, methods=("base", "self_extend", "lm_infinite", "landmark", "longlora"), reps=1, mults=(1,),
             train_mult=1)


def backends(size: dict) -> dict:
    p = _child(BACKENDS_CHILD.format(reps=size["reps"], mults=tuple(size["mults"]), train_mult=size["train_mult"]),
               7200)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    ratio = {}
    for r in rows:
        if r["backend"] == "flex":
            ref = next(x for x in rows if x["method"] == r["method"] and x["tokens"] == r["tokens"]
                       and x["part"] == r["part"] and x["backend"] == "reference")
            ratio[f"{r['method']} @ {r['tokens']} ({r['part']})"] = round(r["seconds"] / ref["seconds"], 2)
    return {"model": "tiny_llama (4 layers, fp32, batch 1)", "device": "cpu", "rows": rows,
            "flex_over_reference_time": ratio,
            "flex_no_slower": {k: v <= 1.0 for k, v in ratio.items()}}


def run(smoke: bool = False) -> dict:
    """Every method's 16C forward in a process of its own (smoke: all at 2C in one process, and the backends at C
    once each: that every path runs)."""
    size = SMOKE if smoke else FULL
    jobs = [(m, size["length"]) for m in size["methods"]]
    found = measure(jobs) if smoke else [r for job in jobs for r in measure([job])]
    rows = {r["method"]: r for r in found}
    base = rows["base"].get("peak_increase_mb")
    for r in rows.values():
        if base and "peak_increase_mb" in r:
            r["peak_vs_base"] = round(r["peak_increase_mb"] / base, 3) if base > 0 else None
    limit = {m: rows[m].get("peak_vs_base") for m in ("self_extend", "lm_infinite")}
    return {"length_multiple_of_C": size["length"], "smoke": smoke, "rows": rows,
            "within_1.5x_of_base": {m: (v is not None and v <= 1.5) for m, v in limit.items()},
            "backends": backends(size)}


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
