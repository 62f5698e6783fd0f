"""LongBench generation throughput on tiny_llama: the 16 fixture tasks, one sample each, at a 4C prompt budget
(C: the native window of ``conf/model/tiny_llama.yaml``) with generation capped at 32 new tokens (official lengths
are 32..512). Reports samples/s over the generate calls (prompt prefill + KV-cache decoding), and the whole-evaluator
wall time.

    python scripts/bench.py longbench
    python scripts/bench.py --smoke longbench    # a C budget, 2 new tokens (seconds)
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path


def run(smoke: bool = False) -> dict:
    from harness.evals import EvalContext
    from harness.evals.longbench import LongBench
    from harness.models import load_model

    handle = load_model("tiny_llama")  # its builder: the shipped weights and C from conf/model/tiny_llama.yaml
    budget, cap = (1, 2) if smoke else (4, 32)
    args = LongBench.Args(samples=1, max_length=budget * handle.native_ctx, max_gen_cap=cap)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        out = LongBench(args).run(handle, None, EvalContext(run_dir=Path(d)))
        wall = time.time() - t0
        recs = [json.loads(x) for x in (Path(d) / "samples" / "longbench.jsonl").read_text().splitlines()]
    return {"model": "tiny_llama", "native_ctx": handle.native_ctx, "prompt_budget": args.max_length,
            "max_gen_cap": cap, "smoke": smoke, "samples": len(recs), "samples_per_s": out["samples_per_s"],
            "wall_s": round(wall, 2), "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in recs) / len(recs), 1),
            "new_tokens_total": sum(r["new_tokens"] for r in recs), "average": out["average"]}


if __name__ == "__main__":
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
