"""Intrinsic evaluators (issue 6): PPL-evaluator throughput vs the model's raw forward, peak RSS of a 16k-token
SmolLM2 PPL pass, RULER generation time.

- ``ppl_vs_forward_tiny_llama`` (2C..32C) and ``ppl_vs_forward_smollm2_135m`` (8k): tokens/s of the ``ppl``
  evaluator (``Perplexity.run`` on one document of the length, i.e. reading and tokenising it, the chunked NLL and
  the per-window records included) vs a plain ``model(input_ids)`` forward of the same L tokens (full logits, no
  loss, ``torch.inference_mode``), model as loaded (``base``: plain RoPE, so every length runs). Both protocols:
  ``yarn`` (one truncated window ``[BOS] + doc[:L-1]``) and ``longlora`` (one window of L tokens,
  ``max_windows: 1``); SmolLM2 runs ``yarn`` only (each pass takes minutes here). ``ratio`` = evaluator tokens/s /
  forward tokens/s (target >= 0.9): the median over repeats of forward time / evaluator time, measured back to
  back, in the order forward, yarn, longlora on even repeats and the reverse on odd ones, so that a drift of the
  machine's speed (this VM's varies by 15-50% from minute to minute with nothing else running) favours neither
  side; the ratio of the medians and the process-CPU ratio are reported beside it.
- ``smollm2_16k_ppl_rss``: a fresh subprocess loads SmolLM2 and runs the ``ppl`` evaluator at 16384 tokens;
  ``ru_maxrss`` at the end (load + pass, the whole process), RSS after loading, and the pass's own peak (VmHWM reset
  through ``/proc/self/clear_refs`` after loading). Target: well under 8 GiB.
- ``ruler_generation``: 13 tasks x 100 samples x {C, 2C, 4C, 8C} with the tiny tokenizer and the tiny
  suite's RULER settings (qa_1/qa_2 from a small hand-made SQuAD/HotpotQA-format file of short paragraphs, so every
  task fits from 1024 on), wall and process-CPU seconds (target <= 60 s).

The whole suite's cost per method is its own benchmark, ``benchmarks/bench_suite.py``.

Environment: ``BENCH_THREADS`` (torch threads, default min(2, cores)), ``BENCH_REPEATS`` (tiny_llama, at least
7 per length), ``BENCH_BUDGET_S`` (tiny_llama: more repeats while a length's raw forwards take less than this many
seconds in all, default 10), ``BENCH_SMOLLM2=0`` skips SmolLM2 (two loads, ~10 passes of 8k-16k tokens: the slow
part on 2 cores),
``BENCH_RULER_SAMPLES`` (default 100), ``BENCH_LENGTHS`` (tiny_llama lengths in tokens, default 2C..32C with C the
native window of ``conf/model/tiny_llama.yaml``).

    python scripts/bench.py evals
    python scripts/bench.py --smoke evals        # one length, one repeat, SmolLM2 skipped (seconds)
"""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _threads() -> int:
    return int(os.environ.get("BENCH_THREADS", min(2, os.cpu_count() or 1)))


def _doc_text(tok, n: int) -> str:
    """Held-out Shakespeare (the PPL analogue of PG19), repeated if needed, cut to about n tokens of ``tok``."""
    from harness.data.sources import load_source

    ids: list[int] = []
    for d in load_source("shakespeare", "test"):
        ids += tok(d.text, add_special_tokens=False).input_ids
        if len(ids) >= n:
            break
    while len(ids) < n:
        ids += ids
    return tok.decode(ids[:n])


def _clock(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def ppl_vs_forward(handle, lengths, repeats: int, protocols=("yarn", "longlora"), budget_s: float = 0.0) -> dict:
    """Interleaved repeats: for each length, for each repeat: the raw forward and the evaluator per protocol, in
    alternating order. At least ``repeats`` repeats per length, more for short lengths: as many as fit in
    ``budget_s`` seconds of raw forwards (a 1k forward takes ~0.15 s, and single timings vary by 15-50% here)."""
    import torch

    from harness.evals import EvalContext
    from harness.evals.ppl import Perplexity

    model, tok = handle.model, handle.tokenizer
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        jobs = {}
        for L in lengths:
            doc_dir = Path(d) / f"doc{L}"  # one document of ~L + 600 tokens: 2 longlora starts (1 kept), yarn cuts it
            doc_dir.mkdir()
            (doc_dir / "d.txt").write_text(_doc_text(tok, L + 600))
            ctx = EvalContext(Path(d) / f"run{L}", 0, "auto", nll_cache=None)  # no cache: every repeat computes
            evs = {p: Perplexity(Perplexity.Args(dataset=f"dir:{doc_dir}", samples=1, lengths=[L], min_tokens=L,
                                                 protocol=p, max_windows=1)) for p in protocols}
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            doc = tok((doc_dir / "d.txt").read_text(), add_special_tokens=False).input_ids
            x = torch.tensor([bos + doc[: L - len(bos)]])  # the tokens both protocols score
            assert x.shape[1] == L

            def forward(x=x):
                with torch.inference_mode():
                    model(input_ids=x)

            fns = {"forward": forward}
            for p, ev in evs.items():
                fns[p] = lambda ev=ev, ctx=ctx: ev.run(handle, None, ctx)
            jobs[L] = fns
            # the evaluator must score what the bench times: one window of L tokens per protocol
            for ev in evs.values():
                r = ev.run(handle, None, ctx)
                assert r["scored"][str(L)]["windows"] == 1 and r["scored"][str(L)]["tokens"] == L - 1, r["scored"]
        wall = {L: {k: [] for k in fns} for L, fns in jobs.items()}
        cpu = {L: {k: [] for k in fns} for L, fns in jobs.items()}
        n_rep = {}
        for L, fns in jobs.items():
            t_fwd = _clock(fns["forward"])[0]
            n_rep[L] = max(repeats, int(budget_s / max(t_fwd, 1e-3)))
            for r in range(n_rep[L]):
                order = list(fns) if r % 2 == 0 else list(fns)[::-1]  # alternate: drift favours neither side
                for k in order:
                    w, c = _clock(fns[k])
                    wall[L][k].append(w)
                    cpu[L][k].append(c)
    for L in lengths:
        fw, fc = statistics.median(wall[L]["forward"]), statistics.median(cpu[L]["forward"])
        row = {"forward_tok_s": round(L / fw, 1), "repeats": n_rep[L],
               "forward_wall_s": [round(v, 3) for v in wall[L]["forward"]]}
        for p in protocols:
            ew, ec = statistics.median(wall[L][p]), statistics.median(cpu[L][p])
            paired = statistics.median(f / e for f, e in zip(wall[L]["forward"], wall[L][p]))
            row[p] = {"ppl_eval_tok_s": round(L / ew, 1), "ratio": round(paired, 3),
                      "ratio_of_medians": round(fw / ew, 3), "ratio_cpu": round(fc / ec, 3),
                      "wall_s": [round(v, 3) for v in wall[L][p]]}
        out[str(L)] = row
    out["summary"] = {p: {"min_ratio": min(out[str(L)][p]["ratio"] for L in lengths),
                          "min_ratio_cpu": min(out[str(L)][p]["ratio_cpu"] for L in lengths)} for p in protocols}
    out["min_repeats"], out["budget_s"] = repeats, budget_s
    return out


RSS_CHILD = r"""
import json, os, resource, tempfile, time
import torch
torch.set_num_threads({threads})
from pathlib import Path
from harness.evals import EvalContext
from harness.evals.ppl import Perplexity
from harness.models import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # kB
    return None

GiB = 2 ** 30
L = {length}
t0 = time.time()
h = load_model("smollm2_135m")
load_s = time.time() - t0
after_load = {{"rss": status("VmRSS"), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}
with tempfile.TemporaryDirectory() as d:
    (Path(d) / "d.txt").write_text(Path({doc!r}).read_text())
    ev = Perplexity(Perplexity.Args(dataset=f"dir:{{d}}", samples=1, lengths=[L], min_tokens=L))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM: the pass's own peak
        reset = True
    except OSError:
        reset = False
    t0 = time.time()
    r = ev.run(h, None, EvalContext(Path(d), 0, "auto"))
    pass_s = time.time() - t0
assert r["scored"][str(L)]["tokens"] == L - 1, r["scored"]
end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT " + json.dumps({{
    "length": L, "ppl": round(r["ppl"][str(L)], 3), "peak_rss_gib": round(end / GiB, 3),
    "rss_after_load_gib": round(after_load["rss"] / GiB, 3),
    "peak_rss_during_load_gib": round(after_load["ru_maxrss"] / GiB, 3),
    "pass_peak_rss_gib": round(status("VmHWM") / GiB, 3) if reset else None,
    "load_s": round(load_s, 1), "pass_s": round(pass_s, 1), "threads": torch.get_num_threads()}}))
"""


def smollm2_rss(tok, length: int = 16384) -> dict:
    """Peak RSS of a ``length``-token SmolLM2 PPL pass in a fresh process (``ru_maxrss``; target well under 8 GiB)."""
    with tempfile.TemporaryDirectory() as d:
        doc = Path(d) / "doc.txt"
        doc.write_text(_doc_text(tok, length + 64))
        code = RSS_CHILD.format(threads=_threads(), length=length, doc=str(doc))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not lines:
        raise RuntimeError(f"smollm2 RSS child failed ({r.returncode}): {r.stderr[-1500:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    res["target_gib"] = 8
    return res


def ruler_generation(tok, lengths: list[int], samples: int = 100) -> dict:
    from omegaconf import OmegaConf

    from harness.evals.ruler_data import ALL_TASKS, DoesNotFit, RulerGenerator

    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "eval" / "tiny.yaml"))["suite"]["ruler"]
    with tempfile.TemporaryDirectory() as d:
        rng = random.Random(0)
        paras = [{"context": f"Paragraph {i}: " + " ".join(rng.choice(["land", "river", "city", "king", "north"])
                                                            for _ in range(20)) + f" The capital is City{i}.",
                  "qas": [{"question": f"What is the capital in paragraph {i}?", "is_impossible": False,
                           "answers": [{"text": f"City{i}"}]}]} for i in range(400)]
        squad = Path(d) / "squad.json"
        squad.write_text(json.dumps({"data": [{"paragraphs": paras[i : i + 5]} for i in range(0, 400, 5)]}))
        hotpot = Path(d) / "hotpot.json"
        hotpot.write_text(json.dumps([{"question": f"Who built tower {i}?", "answer": f"Builder{i}",
                                       "context": [[f"Tower {i}", [f"Tower {i} was built by Builder{i}. "]],
                                                   [f"Other {i}", ["An unrelated paragraph about hills. "]]]}
                                      for i in range(300)]))
        gen = RulerGenerator(tok, tokens_to_generate=cfg["tokens_to_generate"], small_threshold=cfg["small_threshold"],
                             essay_increment=cfg["essay_increment"], vt_icl_length=cfg["vt_icl_length"],
                             squad_path=str(squad), hotpotqa_path=str(hotpot))
        per_len, skipped, n = {}, {}, 0
        w0, c0 = time.perf_counter(), time.process_time()
        for L in lengths:
            t = time.perf_counter()
            for task in ALL_TASKS:
                try:
                    n += len(gen.samples(task, L, samples))
                except DoesNotFit:
                    skipped.setdefault(str(L), []).append(task)
            per_len[str(L)] = round(time.perf_counter() - t, 2)
        return {"tasks": len(ALL_TASKS), "samples_per_task": samples, "lengths": list(lengths),
                "samples_generated": n, "wall_s": round(time.perf_counter() - w0, 2),
                "cpu_s": round(time.process_time() - c0, 2), "target_s": 60, "wall_s_per_length": per_len,
                "skipped (do not fit)": skipped}


def run(smoke: bool = False) -> dict:
    """Smoke: one length (C) once, RULER's generation of one sample per task at 2C, SmolLM2 skipped."""
    import torch

    from harness.models import load_model

    torch.set_num_threads(_threads())
    tiny = load_model("tiny_llama")  # its builder: the shipped weights and C from conf/model/tiny_llama.yaml
    C = tiny.native_ctx
    if smoke:
        lengths, repeats, budget, ruler = [C], 1, 0.0, dict(lengths=[2 * C], samples=1)
    else:
        lengths = [int(x) for x in os.environ.get("BENCH_LENGTHS", "").split(",") if x] or [m * C for m in
                                                                                            (2, 4, 8, 16, 32)]
        repeats, budget = int(os.environ.get("BENCH_REPEATS", "7")), float(os.environ.get("BENCH_BUDGET_S", "10"))
        ruler = dict(lengths=[m * C for m in (1, 2, 4, 8)], samples=int(os.environ.get("BENCH_RULER_SAMPLES", "100")))
    res = {"threads": torch.get_num_threads(), "load": os.getloadavg(), "native_ctx": C, "smoke": smoke,
           "ruler_generation": ruler_generation(tiny.tokenizer, **ruler),
           "ppl_vs_forward_tiny_llama": ppl_vs_forward(tiny, lengths, repeats, budget_s=budget)}
    del tiny
    if smoke:
        res["smollm2"] = "skipped (smoke)"
    elif os.environ.get("BENCH_SMOLLM2", "1") != "0":
        smol = load_model("smollm2_135m")
        res["ppl_vs_forward_smollm2_135m"] = ppl_vs_forward(smol, [8192], 4, protocols=("yarn",))
        tok = smol.tokenizer
        del smol
        res["smollm2_16k_ppl_rss"] = smollm2_rss(tok)
    else:
        res["smollm2"] = "skipped (BENCH_SMOLLM2=0)"
    res["load_after"] = os.getloadavg()
    return res
