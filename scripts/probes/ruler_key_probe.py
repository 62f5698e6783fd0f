"""Probe of the tiny_llama model card: RULER's multi-key / multi-value tasks at a length, with the needle keys drawn
from RULER's word lists (as the evaluator does) or from the training vocabulary (``harness.data.synthetic``'s
adjective-noun pairs), and optionally with RULER's "special magic" (a phrase the template filter keeps out of training)
replaced by another phrase: which difference between the training wordings and RULER's keeps a look-up learned in
pretraining from firing.

    python scripts/probes/ruler_key_probe.py --model DIR --keys train --length 512 --samples 50
    python scripts/probes/ruler_key_probe.py --model DIR --noun secret
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from harness.data import synthetic as S
from harness.evals import EvalContext, build_evaluators
from harness.evals import ruler_data as R
from harness.evals.gate import RULER_TINY
from harness.models import load_model
from harness.models.tiny_llama import ASSET_DIR
from harness.stats import bounded_interval

TASKS = ["niah_multikey_1", "niah_multikey_2", "niah_multivalue"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ASSET_DIR))
    ap.add_argument("--keys", choices=["ruler", "train"], default="ruler")
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--noun", default="", help="replace 'special magic' in the needles, question and answer prefix")
    ap.add_argument("--seed", type=int, default=1234, help="the gate's seed: the same prompts as the model card's")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.keys == "train":
        words = sorted({f"{x}-{y}" for x in S.ADJS for y in S.NOUNS})
        R.niah_words = lambda: words  # the generator draws keys through this module attribute
    if a.noun:  # module-level names the generator reads; RULER_TASKS is copied, never edited in place
        R.RULER_NIAH_NEEDLE = R.RULER_NIAH_NEEDLE.replace("special magic", a.noun)
        R.RULER_TASKS = {k: {f: v.replace("special magic", a.noun) if isinstance(v, str) else v for f, v in t.items()}
                         for k, t in R.RULER_TASKS.items()}
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    handle = load_model("tiny_llama", path=a.model, native_ctx=int(cfg["max_position_embeddings"]))
    with tempfile.TemporaryDirectory() as d:
        ctx = EvalContext(run_dir=Path(d), seed=a.seed)
        ev, = build_evaluators({"ruler": {"name": "ruler", "samples": a.samples, "lengths": [a.length],
                                          "tasks": TASKS, **RULER_TINY}})
        ev.run(handle, None, ctx)
        scores: dict = {}
        path = ctx.samples_path("ruler")
        for line in open(path) if Path(path).exists() else []:
            r = json.loads(line)
            scores.setdefault(r["task"], []).append(r["score"])
    for t in TASKS:
        s = scores.get(t)
        if not s:
            print(f"{t} at {a.length}: does not fit")
            continue
        est = [x / 100 for x in bounded_interval(s, 100.0)]  # RULER scores are 0..100
        what = f"keys {a.keys}" + (f", noun {a.noun}" if a.noun else "")
        print(f"{t} at {a.length}, {what}: {est[0]:.2f} [{est[1]:.2f}, {est[2]:.2f}] (n = {len(s)})")


if __name__ == "__main__":
    main()
