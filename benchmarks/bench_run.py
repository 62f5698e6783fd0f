"""The embedded default run (`python run.py`, i.e. `make run` after set-up): wall time, fine-tuning tokens/s and
each evaluator's tokens/s (tokens fed to the model / evaluator wall time)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _eval_tokens(m: dict) -> int:
    if "scored" in m:  # ppl: windows x length
        return sum(v.get("tokens", 0) for v in m["scored"].values())
    if "accuracy" in m and "samples_per_length" in m:  # passkey
        return sum(int(L) * m["samples_per_length"] for L in m["accuracy"])
    return 0


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HARNESS_RESULTS_DIR": f"{tmp}/res", "HARNESS_OUTPUT_DIR": f"{tmp}/out",
               "HARNESS_CKPT_DIR": f"{tmp}/ck", "HARNESS_CACHE_DIR": f"{tmp}/cache"}
        t0 = time.time()
        r = subprocess.run([sys.executable, str(ROOT / "run.py")], env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.time() - t0
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        row = json.loads(next(Path(tmp, "res", "runs").glob("*.json")).read_text())
    out = {"wall_seconds": round(wall, 1), "target_seconds": 180, "status": row["status"],
           "train_tokens_per_second": (row.get("train_info") or {}).get("tokens_per_second"),
           "train_seconds": (row.get("train_info") or {}).get("train_seconds"), "evaluators": {}}
    for key, m in row["metrics"].items():
        secs = row["timings"].get(f"eval.{key}")
        toks = _eval_tokens(m)
        out["evaluators"][key] = {"seconds": secs, "tokens": toks,
                                  "tokens_per_second": round(toks / secs, 1) if secs and toks else None}
    return out
