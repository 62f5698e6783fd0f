"""A generating evaluator's prompts against a bare prefill plus greedy decode of the same tokens (issue 61).

Model: the shipped tiny_llama as its builder loads it, float32. Subject: the ``passkey`` and ``niah`` evaluators'
``run`` on ``n`` prompts at L (building the prompts, the prefix reuse of ``PrefixCache``, decoding, scoring, the
records: all they do per row). Peer: transformers' ``generate`` (greedy, ``max_new_tokens`` = the evaluator's
budget, ``min_new_tokens`` the same so neither side stops earlier) on the token ids of the very prompts the
evaluator built, one prompt at a time. ``rounds`` rounds, order drawn per round (``benchmarks.common.compare``); the
ratio is the evaluator's time / the peer's over the same prompts. Target: ``ratio <= 1.1``. Beside it: the prompt
tokens the evaluator did not encode again (``tokens_reused``) and the prefill FLOPs' fraction of the machine's fp32
matmul limit.

    python scripts/bench.py prompt
    python scripts/bench.py --smoke prompt       # C/2, 2 prompts, 3 rounds, the slowed-variant check (seconds)
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from benchmarks import common

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
BOUND = 1.1
FACTORS = (1, 4)


def _evaluator(name: str, L: int, n: int, gen: int):
    from harness.evals.niah import NeedleInAHaystack
    from harness.evals.passkey import Passkey

    if name == "passkey":
        return Passkey(Passkey.Args(samples=n, gen_tokens=gen, lengths=[L]))
    return NeedleInAHaystack(NeedleInAHaystack.Args(depth_intervals=n, gen_tokens=gen, lengths=[L], buffer=-1))


def _prompt_ids(name: str, ev, tok, L: int) -> list[list[int]]:
    """The token ids of the prompts ``ev`` builds at L (the same generators its ``run`` draws from)."""
    from harness.evals.passkey import passkey_samples

    if name == "passkey":
        return [tok(s["prompt"]).input_ids for s in passkey_samples(tok, L, ev.args.samples, 0, ev.args.gen_tokens)]
    return [tok(p).input_ids for _, _, p, _, _ in ev.prompts(tok, [L])]


def run(smoke: bool = False) -> dict:
    from harness.evals import EvalContext
    from harness.models import load_model

    common.threads()
    h = load_model("tiny_llama")
    C, model, tok = h.native_ctx, h.model, h.tokenizer
    factors, rounds, n, gen = ((0.5,), 3, 2, 4) if smoke else (FACTORS, ROUNDS, 6, 8)
    geo = common.geometry(model.config)
    lim = common.limit(torch.float32)
    out = {"model": "tiny_llama", "native_ctx": C, "dtype": "float32", "threads": torch.get_num_threads(),
           "rounds": rounds, "prompts": n, "gen_tokens": gen, "limit": lim, "smoke": smoke, "bound": BOUND}
    with tempfile.TemporaryDirectory() as d:
        for name in ("passkey", "niah"):
            per = {}
            for f in factors:
                L = int(f * C)
                ev = _evaluator(name, L, n, gen)
                ids = _prompt_ids(name, ev, tok, L)
                box = {}

                def subject(ev=ev, box=box):
                    box["out"] = ev.run(h, None, EvalContext(run_dir=Path(d), autocast="float32"))

                @torch.no_grad()
                def peer(ids=ids):
                    for x in ids:
                        model.generate(torch.tensor([x]), max_new_tokens=gen, min_new_tokens=gen, do_sample=False,
                                       pad_token_id=tok.pad_token_id)

                res = common.target(common.compare(subject, peer, rounds, seed=int(f * 8)), BOUND,
                                    "transformers generate (greedy) on the same prompt ids", f"the {name} evaluator's "
                                    "time")
                o = box["out"]
                prefill = sum(common.forward_flops(geo, len(x)) for x in ids)
                res.update(prompt_tokens=sum(len(x) for x in ids), tokens_reused=o.get("tokens_reused"),
                           tokens_encoded=o.get("tokens_encoded"),
                           prefill_fraction_of_limit=common.fraction(prefill, res["subject_s"], lim))
                per[f"{f:g}C"] = res
                if smoke and name == "passkey":
                    out["target_can_fail"] = common.can_fail(subject, peer, BOUND)
            out[name] = per
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
