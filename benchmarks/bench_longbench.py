"""LongBench generation throughput on tiny_llama: the 16 fixture tasks, one sample each, at a 4C prompt budget
(1024 tokens) with generation capped at 32 new tokens (official lengths are 32..512). Reports samples/s over the
generate calls (prompt prefill + KV-cache decoding), and the whole-evaluator wall time."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path


def run() -> dict:
    from harness.evals import EvalContext
    from harness.evals.longbench import LongBench
    from harness.models import load_model

    handle = load_model("tiny_llama")
    args = LongBench.Args(samples=1, max_length=4 * handle.native_ctx, max_gen_cap=32)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        out = LongBench(args).run(handle, None, EvalContext(run_dir=Path(d)))
        wall = time.time() - t0
        recs = [json.loads(x) for x in (Path(d) / "samples" / "longbench.jsonl").read_text().splitlines()]
    return {"model": "tiny_llama", "prompt_budget": args.max_length, "max_gen_cap": 32, "samples": len(recs),
            "samples_per_s": out["samples_per_s"], "wall_s": round(wall, 2),
            "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in recs) / len(recs), 1),
            "new_tokens_total": sum(r["new_tokens"] for r in recs), "average": out["average"]}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
