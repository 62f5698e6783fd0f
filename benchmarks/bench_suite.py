"""The whole default evaluation suite's cost per method (issue 20): wall and process-CPU seconds of
``conf/eval/tiny.yaml`` (the powered suite: 50 passkey prompts, 8 documents, 20 RULER samples, 10 NIAH depths per
length, C..16C) on tiny_llama, per method and per suite entry, frozen weights (a fine-tuned checkpoint costs the same
to evaluate: same shapes, same code path).

Each method is measured in a fresh model, one after another, with ``BENCH_THREADS`` torch threads (default 1: how
the study runs its points, two processes on two cores); the machine's load average is recorded before and after
each method, so a number measured beside other work says so. Results merge into ``results/bench.json`` ``suite``
method by method: measuring one method again replaces only its entry (each entry has its own time, code commit and
load), so the table can be filled over several sessions.

    python scripts/bench.py suite                                   # BENCH_SUITE_METHODS, default below
    BENCH_SUITE_METHODS=base,self_extend python scripts/bench.py suite
    BENCH_SUITE_ENTRIES=passkey,ppl_books BENCH_SUITE_LENGTHS=512,1024 python scripts/bench.py suite   # shorter
    python scripts/bench.py --smoke suite                           # two methods, make run's suite cut to C

Default methods: one of each attention code path the study evaluates (``base``: plain SDPA; ``ntk_frozen``: dynamic
RoPE; ``yarn``: static RoPE + scaling; ``lm_infinite`` / ``self_extend`` / ``dca``: the blockwise merged-softmax
paths; ``landmark``: grouped retrieval).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

FULL_ONLY = True  # `make bench --full` (or by name): minutes to tens of minutes on 2 cores

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "base,ntk_frozen,yarn,lm_infinite,self_extend,dca,landmark"


def suite_cost(methods: list[str], suite: str = "tiny", model: str = "tiny_llama", only: list[str] | None = None,
               lengths: list[int] | None = None, overrides: list[str] | None = None) -> dict:
    """Wall and process-CPU seconds of the ``suite`` (the default: the powered tiny suite) per method, per suite
    entry, frozen weights (a fine-tuned checkpoint costs the same to evaluate: same shapes, same code path). Each
    method in a fresh model; the first call of each entry includes its data preparation (tokenising the books and
    haystacks), as in a real run. ``only``: a subset of suite entries; ``lengths``: override the suite's lengths;
    ``overrides``: more command-line overrides of the composed config."""
    import torch
    from omegaconf import OmegaConf

    from harness.conf_utils import compose
    from harness.evals import EvalContext, build_evaluators
    from harness.methods import build_method
    from harness.models import build_model

    out: dict = {"suite": suite, "model": model, "threads": torch.get_num_threads(), "methods": {}}
    for name in methods:
        over = [f"model={model}", f"method={name}", "train=none", f"eval={suite}"]
        if lengths:
            over.append(f"eval.lengths=[{','.join(str(x) for x in lengths)}]")
        cfg = compose([*over, *(overrides or [])])
        suite_cfg = OmegaConf.to_container(cfg.eval.suite, resolve=True)
        if only:
            suite_cfg = {k: v for k, v in suite_cfg.items() if k in only}
        handle = build_model(cfg.model)
        method = build_method(cfg.method)
        method.apply(handle)
        method.eval_mode(handle)
        res: dict = {"entries": {}, "n": {}}
        with tempfile.TemporaryDirectory() as d:
            ctx = EvalContext(Path(d), int(cfg.seed), str(cfg.autocast), batch_tokens=int(cfg.eval_batch_tokens))
            w0, c0 = time.perf_counter(), time.process_time()
            for (key, node), ev in zip(suite_cfg.items(), build_evaluators(suite_cfg)):
                w, c = time.perf_counter(), time.process_time()
                m = ev.run(handle, method, ctx)
                res["entries"][key] = {"wall_s": round(time.perf_counter() - w, 1),
                                       "cpu_s": round(time.process_time() - c, 1)}
                if "tokens_reused" in m:
                    res["entries"][key]["tokens_reused"] = m["tokens_reused"]
                    res["entries"][key]["tokens_encoded"] = m["tokens_encoded"]
                res["n"][key] = {k: node.get(k) for k in ("samples", "depth_intervals", "tasks") if k in node}
                print(f"suite_cost {name} {key}: {res['entries'][key]}", flush=True)
            res["wall_s"] = round(time.perf_counter() - w0, 1)
            res["cpu_s"] = round(time.process_time() - c0, 1)
        res["lengths"] = list(cfg.eval.lengths)
        out["methods"][name] = res
        per = ", ".join(f"{k} {v['wall_s']}" for k, v in res["entries"].items())
        print(f"suite_cost {name}: {res['wall_s']} s wall, {res['cpu_s']} s CPU ({per})", flush=True)
        del handle
    out["load_after"] = os.getloadavg()
    return out


def _csv(key: str) -> list[str] | None:
    v = os.environ.get(key, "")
    return [x for x in v.split(",") if x] or None


# smoke: two methods on ``make run``'s suite cut to a few prompts at the native window C (the configs' ``ctx_x``)
SMOKE = dict(methods=["base", "self_extend"], suite="run",
             overrides=["eval.lengths=${ctx_x:1}", "eval.suite.ppl_books.samples=1",
                        "eval.suite.ppl_books.lengths=${ctx_x:1}", "eval.suite.passkey.samples=2"])


def run(smoke: bool = False) -> dict:
    import torch

    from harness.results import git_sha, now_iso

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    if smoke:  # never merged into results/bench.json's suite table
        res = suite_cost(SMOKE["methods"], suite=SMOKE["suite"], overrides=SMOKE["overrides"])
        return {**res, "smoke": True}
    methods = _csv("BENCH_SUITE_METHODS") or DEFAULT.split(",")
    lengths = [int(x) for x in _csv("BENCH_SUITE_LENGTHS") or []] or None
    only = _csv("BENCH_SUITE_ENTRIES")
    prev = {}
    f = ROOT / "results" / "bench.json"
    if f.exists():
        prev = ((json.loads(f.read_text()).get("suite") or {}).get("results") or {}).get("methods") or {}
    out = {}
    for m in methods:
        load_before = os.getloadavg()
        res = suite_cost([m], only=only, lengths=lengths)
        entry = res["methods"][m]
        entry.update(time=now_iso(), git_sha=git_sha(), threads=res["threads"], load_before=load_before,
                     load_after=res["load_after"], partial=bool(only or lengths))
        out[m] = entry
    merged = {**prev, **out}
    return {"suite": "tiny", "model": "tiny_llama", "methods": merged,
            "measured_now": sorted(out), "kept_from_before": sorted(set(prev) - set(out))}
