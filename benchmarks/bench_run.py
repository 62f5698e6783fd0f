"""The embedded default run (`python run.py`, i.e. `make run` after set-up; issue 2: <= 3 minutes here): wall time
of the whole process measured from outside, fine-tuning tokens/s, and each evaluator's tokens/s taken from the row
the run writes (its per-evaluator ``timings["eval.<key>"]`` and the token counts in its metrics).

Tokens of an evaluator = context tokens it ran the model over: ``ppl`` windows x length (every window of the
``yarn`` truncated and ``longlora`` protocols is one length long), ``nll_by_position`` documents x length,
``passkey`` samples x length, ``niah`` / ``ruler`` prompt tokens (encoded + reused from the KV cache of the previous
prompt, both recorded by the evaluator); generated tokens are not counted. The run writes its row, run directory,
checkpoint and caches into a temporary directory (never results/runs/).

    python scripts/bench.py run
    python scripts/bench.py --smoke run          # the same process, frozen, a few prompts at C (seconds)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FULL_ONLY = True  # `make bench --full` (or by name): minutes to tens of minutes on 2 cores

ROOT = Path(__file__).resolve().parents[1]


def eval_tokens(m: dict) -> dict:
    """{"tokens": context tokens, "how": what was counted} from one evaluator's metrics in the row."""
    if "scored" in m and "protocol" in m:  # ppl
        return {"tokens": sum(int(L) * v.get("windows", 0) for L, v in m["scored"].items()),
                "how": "windows x length"}
    if "positions" in m:  # nll_by_position
        return {"tokens": int(m.get("length") or 0) * int(m.get("documents") or 0), "how": "documents x length"}
    if "tokens_encoded" in m:  # niah, ruler: prompts through PrefixCache
        enc, reused = int(m["tokens_encoded"]), int(m.get("tokens_reused", 0))
        return {"tokens": enc + reused, "tokens_encoded": enc, "tokens_reused": reused,
                "how": "prompt tokens (encoded + reused prefix)"}
    if "accuracy" in m and "samples_per_length" in m:  # passkey
        return {"tokens": sum(int(L) * m["samples_per_length"] for L in m["accuracy"]), "how": "samples x length"}
    return {"tokens": 0, "how": "unknown evaluator output"}


def summarise(row: dict, wall: float) -> dict:
    info = row.get("train_info") or {}
    out = {"wall_seconds": round(wall, 1), "target_seconds": 180, "status": row["status"], "error": row.get("error"),
           "model": row.get("model"), "method": row.get("method"), "train": row.get("train"), "eval": row.get("eval"),
           "train_seconds": info.get("train_seconds"), "train_tokens_per_second": info.get("tokens_per_second"),
           "train_tokens": info.get("tokens_seen"), "evaluators": {}}
    timings = row.get("timings") or {}
    for key, m in (row.get("metrics") or {}).items():
        secs = timings.get(f"eval.{key}")
        t = eval_tokens(m)
        out["evaluators"][key] = {"seconds": secs, **t,
                                  "tokens_per_second": round(t["tokens"] / secs, 1) if secs and t["tokens"] else None}
    evs = out["evaluators"].values()
    out["eval_seconds"] = round(sum(v["seconds"] or 0 for v in evs), 2)
    out["outside_train_and_eval_seconds"] = round(wall - out["eval_seconds"] - (info.get("train_seconds") or 0), 1)
    return out


# smoke: the embedded default's process and row, frozen, with a few prompts at the native window C (lengths in units
# of C through the configs' own ``ctx_x`` resolver: C is the model config's)
SMOKE = ["train=none", "eval=run", "eval.lengths=${ctx_x:1}", "eval.suite.ppl_books.samples=1",
         "eval.suite.ppl_books.lengths=${ctx_x:1}", "eval.suite.passkey.samples=2"]


def run(args: list[str] | None = None, smoke: bool = False) -> dict:
    args = [*(args or []), *(SMOKE if smoke else [])]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HARNESS_RESULTS_DIR": f"{tmp}/res", "HARNESS_OUTPUT_DIR": f"{tmp}/out",
               "HARNESS_CKPT_DIR": f"{tmp}/ck", "HARNESS_CACHE_DIR": f"{tmp}/cache",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(ROOT / "run.py"), *(args or [])], env=env, cwd=ROOT,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rows = list(Path(tmp, "res", "runs").glob("*.json"))
        if r.returncode or len(rows) != 1:
            raise RuntimeError(f"run.py exited {r.returncode} with {len(rows)} rows: {r.stderr[-2000:]}")
        row = json.loads(rows[0].read_text())
    out = summarise(row, wall)
    out["command"] = "python run.py" + "".join(f" {a}" for a in args)
    out["smoke"] = smoke
    out["load"] = os.getloadavg()
    return out


if __name__ == "__main__":
    argv = sys.argv[1:]
    print(json.dumps(run([a for a in argv if a != "--smoke"], smoke="--smoke" in argv), indent=1))
