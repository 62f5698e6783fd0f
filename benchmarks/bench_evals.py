"""Intrinsic evaluators (issue 6): peak RSS of a 16k-token SmolLM2 PPL pass, RULER generation time. (The PPL
evaluator's speed against its peers, the paper release's loop and lm-eval's, is ``benchmarks/bench_ppl.py``.)

- ``smollm2_16k_ppl_rss``: a fresh subprocess loads SmolLM2 and runs the ``ppl`` evaluator at 16384 tokens;
  ``ru_maxrss`` at the end (load + pass, the whole process), RSS after loading, and the pass's own peak (VmHWM reset
  through ``/proc/self/clear_refs`` after loading). Target: well under 8 GiB.
- ``ruler_generation``: 13 tasks x 100 samples x {C, 2C, 4C, 8C} with the tiny tokenizer and the tiny
  suite's RULER settings (qa_1/qa_2 from a small hand-made SQuAD/HotpotQA-format file of short paragraphs, so every
  task fits from 1024 on), wall and process-CPU seconds (target <= 60 s).

The whole suite's cost per method is its own benchmark, ``benchmarks/bench_suite.py``.

Environment: ``BENCH_THREADS`` (torch threads, default min(2, cores)), ``BENCH_SMOLLM2=0`` skips SmolLM2 (a load
and one 16k pass: the slow part on 2 cores), ``BENCH_RULER_SAMPLES`` (default 100).

    python scripts/bench.py evals
    python scripts/bench.py --smoke evals        # RULER's generation of one sample per task at 2C, SmolLM2 skipped
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_ONLY = True  # `make bench --full` (or by name): minutes to tens of minutes on 2 cores
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
    """Smoke: RULER's generation of one sample per task at 2C, SmolLM2 skipped."""
    import torch

    from harness.models import load_model

    torch.set_num_threads(_threads())
    tiny = load_model("tiny_llama")  # its builder: the shipped weights and C from conf/model/tiny_llama.yaml
    C = tiny.native_ctx
    ruler = dict(lengths=[2 * C], samples=1) if smoke else \
        dict(lengths=[m * C for m in (1, 2, 4, 8)], samples=int(os.environ.get("BENCH_RULER_SAMPLES", "100")))
    res = {"threads": torch.get_num_threads(), "load": os.getloadavg(), "native_ctx": C, "smoke": smoke,
           "ruler_generation": ruler_generation(tiny.tokenizer, **ruler)}
    del tiny
    if smoke:
        res["smollm2"] = "skipped (smoke)"
    elif os.environ.get("BENCH_SMOLLM2", "1") != "0":
        smol = load_model("smollm2_135m")
        tok = smol.tokenizer
        del smol
        res["smollm2_16k_ppl_rss"] = smollm2_rss(tok)
    else:
        res["smollm2"] = "skipped (BENCH_SMOLLM2=0)"
    res["load_after"] = os.getloadavg()
    return res
