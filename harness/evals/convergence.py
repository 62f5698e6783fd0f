"""The convergence gate of a fine-tuned row: did fine-tuning adapt the model to the method, or is the row measuring
an unfinished recipe?

The paper's fine-tuned PI stays within 4% of LLaMA2's perplexity inside the native window and retrieves there
(Table 2, Figure 1). A fine-tuned row of this harness therefore passes when, inside the native window C,
- its perplexity on held-out books is within ``max_ppl_ratio`` (10%) of the base model's on the same documents
  (point estimate of the paired ratio; the 95% paired-bootstrap interval is recorded beside it), and
- its passkey accuracy at C is at least ``min_passkey`` (0.9; Wilson interval recorded).
The base is measured in the same run, before the method is applied, on the same documents and prompts, so the
comparison is paired. Rows that fail are kept, marked ``converged: false``, and left out of comparisons by
``make tables`` / ``make findings`` (a footnote names them). The thresholds are fixed here, not per method.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from harness.evals import EvalContext, build_evaluators
from harness.stats import ppl_ratio, wilson

MAX_PPL_RATIO = 1.10
MIN_PASSKEY = 0.9


def _suite(C: int, docs: int, prompts: int) -> dict:
    return {"ppl_books": {"name": "ppl", "dataset": "shakespeare", "samples": docs, "lengths": [C]},
            "passkey": {"name": "passkey", "samples": prompts, "lengths": [C]}}


def measure(handle, method=None, seed: int = 0, docs: int = 8, prompts: int = 50, autocast: str = "auto") -> dict:
    """Per-document NLL (books, YaRN protocol, length C) and per-prompt passkey correctness at C."""
    C = int(handle.native_ctx)
    suite = _suite(C, docs, prompts)
    with tempfile.TemporaryDirectory() as d:
        ctx = EvalContext(run_dir=Path(d), seed=seed, autocast=autocast)
        for ev in build_evaluators(suite):
            ev.run(handle, method, ctx)
        nll = [json.loads(x)["nll"] for x in ctx.samples_path("ppl_yarn").read_text().splitlines() if x.strip()]
        ok = [bool(json.loads(x)["correct"]) for x in ctx.samples_path("passkey").read_text().splitlines()
              if x.strip()]
    return {"length": C, "nll": nll, "passkey": ok}


def verdict(base: dict, tuned: dict) -> dict:
    """The gate's record for the row: paired PPL ratio at C and passkey at C, each with its interval."""
    ratio = ppl_ratio(tuned["nll"], base["nll"])
    k, n = sum(tuned["passkey"]), len(tuned["passkey"])
    acc = k / n if n else None
    ppl_ok = ratio is not None and ratio[0] <= MAX_PPL_RATIO
    pk_ok = acc is not None and acc >= MIN_PASSKEY
    return {
        "length": tuned["length"],
        "ppl_ratio_vs_base": None if ratio is None else {"value": ratio[0], "ci": [ratio[1], ratio[2]],
                                                         "documents": len(tuned["nll"])},
        "ppl": float(np.exp(np.mean(tuned["nll"]))), "base_ppl": float(np.exp(np.mean(base["nll"]))),
        "passkey": {"value": acc, "n": n, "ci": wilson(k, n)},
        "base_passkey": sum(base["passkey"]) / max(1, len(base["passkey"])),
        "rule": f"PPL(C) / base PPL(C) <= {MAX_PPL_RATIO} and passkey(C) >= {MIN_PASSKEY}",
        "converged": bool(ppl_ok and pk_ok),
    }
