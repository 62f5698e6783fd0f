"""The PPL evaluator against its two peers on the same model and tokens (issue 61), in one process.

Model: the shipped tiny_llama as its builder loads it (``load_model``), float32 (``autocast=float32`` for the
evaluator, so both sides compute in the same dtype), held-out Shakespeare (``dataset: shakespeare``, the PG19
analogue).

- ``vs_release_loop``: the paper release's perplexity loop, on the release's own data format (a pre-tokenised
  ``.bin`` stream: the first two held-out plays, ``tokens_file``), read by both sides. LCEG's
  ``eval_perplexity/eval_*.py`` reuse LongLoRA's
  ``eval.py`` (``dvlab-research/LongLoRA``: ``evaluate``): a window of L tokens starting every ``stride`` tokens of
  the documents' concatenated stream, each through ``model(input_ids=x, labels=x)`` (the full logits and the
  model's own loss), PPL = 2.71828 ** mean loss. Re-implemented here from that arithmetic on the windows our
  ``protocol: longlora`` scores (``max_windows`` of them), so both score the same windows; the two PPLs are
  checked equal (relative 1e-4). Subject: ``Perplexity.run`` (reading the documents, the chunked NLL, the records).
- ``vs_lm_eval``: lm-eval's ``loglikelihood_rolling`` (``HFLM`` on the same model object, ``max_length`` = L,
  batch 1: disjoint rolling windows over the document, every token scored once) against ours on the same
  document with ``protocol: yarn`` and ``all_windows`` (every non-overlapping window of L tokens, every token of
  each scored once): time per scored token, so a few tokens' difference in the windows does not count.

Per length, ``rounds`` rounds with the order drawn per round (``benchmarks.common.compare``); the ratio is ours /
the peer's time (per scored token for lm-eval), with its Student t interval. Target: ours at most 1.1x the peer
(``ratio <= 1.1``), called only when the whole interval says so. Beside it: the forward FLOPs of the scored windows
over the time, a fraction of the machine's fp32 matmul limit (``common.limit``).

    python scripts/bench.py ppl
    python scripts/bench.py --smoke ppl          # C/2 and one window, 3 rounds, the slowed-variant check (seconds)
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch

from benchmarks import common

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
BOUND = 1.1
FACTORS = (1, 2, 4, 8)


def _ours(handle, L: int, protocol: str, windows: int, d: Path, dataset: str = "shakespeare"):
    from harness.evals import EvalContext
    from harness.evals.ppl import Perplexity

    a = Perplexity.Args(dataset=dataset, split="test", protocol=protocol, samples=2 if protocol == "longlora"
                        else 1, lengths=[L], max_windows=windows, all_windows=protocol == "yarn",
                        min_tokens=L if protocol == "yarn" else 0)
    ev = Perplexity(a)
    box = {}

    def call():
        box["out"] = ev.run(handle, None, EvalContext(run_dir=d, autocast="float32", nll_cache=None))
    return call, box, ev


def tokens_file(handle, L: int, windows: int, d: Path) -> list[int]:
    """The first two held-out plays as a LongLoRA ``.bin`` token stream (uint16, each document opened by BOS, as
    LCEG's PG19 / Proof-pile files are): both sides read the same tokens, no tokenising inside the timing."""
    import numpy as np

    from harness.evals.ppl import Perplexity

    ev = Perplexity(Perplexity.Args(dataset="shakespeare", split="test", protocol="longlora", samples=2,
                                    lengths=[L], max_windows=windows))
    stream, _, _ = ev.stream(handle.tokenizer, 0)
    np.asarray(stream, dtype=np.uint16).tofile(d / "stream.bin")
    return stream


def release_loop(model, stream: list[int], starts: list[int], L: int):
    """LongLoRA ``eval.py``'s loop on the given window starts: ``model(input_ids, labels)`` per window, the mean of
    the losses, ``2.71828 ** mean`` (as the original writes e)."""
    box = {}

    @torch.no_grad()
    def call():
        losses = []
        for i in starts:
            x = torch.tensor([stream[i: i + L]])
            losses.append(model(input_ids=x, labels=x, use_cache=False).loss.item())
        box["ppl"] = 2.71828 ** (sum(losses) / len(losses))
    return call, box


def lm_eval_rolling(model, tok, text: str, L: int):
    """lm-eval's ``loglikelihood_rolling`` through ``HFLM`` on the model object (``max_length`` = L, batch 1)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tok, max_length=L, batch_size=1)
    req = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)]
    box = {}

    def call():
        box["loglik"] = lm.loglikelihood_rolling(req, disable_tqdm=True)[0]
    return call, box


def run(smoke: bool = False) -> dict:
    from harness.evals.ppl import longlora_starts, subsample
    from harness.models import load_model

    common.threads()
    h = load_model("tiny_llama")
    C = h.native_ctx
    factors, rounds, windows = ((0.5,), 3, 1) if smoke else (FACTORS, ROUNDS, 4)
    geo = common.geometry(h.model.config)
    lim = common.limit(torch.float32)
    out = {"model": "tiny_llama", "native_ctx": C, "dtype": "float32", "threads": torch.get_num_threads(),
           "rounds": rounds, "limit": lim, "smoke": smoke, "bound": BOUND, "vs_release_loop": {}, "vs_lm_eval": {}}
    with tempfile.TemporaryDirectory() as d:
        for f in factors:
            L = int(f * C)
            stream = tokens_file(h, L, windows, Path(d))
            ours, box, ev = _ours(h, L, "longlora", windows, Path(d), f"bin:{Path(d) / 'stream.bin'}")
            starts = subsample(longlora_starts(len(stream), L, ev.args.stride), windows)
            peer, pbox = release_loop(h.model, stream, starts, L)
            res = common.target(common.compare(ours, peer, rounds, seed=int(f * 8)), BOUND,
                                "LongLoRA eval.py's loop (LCEG's perplexity evaluation)", "the ppl evaluator's time")
            ppl_ours = box["out"]["ppl"][str(L)]
            res.update(windows=len(starts), ppl_ours=round(ppl_ours, 4), ppl_release=round(pbox["ppl"], 4),
                       same_ppl=math.isclose(ppl_ours, pbox["ppl"], rel_tol=1e-4),
                       fraction_of_limit=common.fraction(len(starts) * common.forward_flops(geo, L),
                                                         res["subject_s"], lim))
            out["vs_release_loop"][f"{f:g}C"] = res
            # lm-eval: one document, every token once, per scored token
            ours_y, ybox, yev = _ours(h, L, "yarn", 0, Path(d))
            docs, _ = yev.documents(h.tokenizer, L)
            doc = docs[0][: 4 * L] if not smoke else docs[0][: 2 * L]
            yev.args.samples = 1
            text = h.tokenizer.decode(doc)
            (Path(d) / "one").mkdir(exist_ok=True)
            (Path(d) / "one" / "doc.txt").write_text(text)
            yev.args.dataset = f"dir:{Path(d) / 'one'}"
            peer2, _ = lm_eval_rolling(h.model, h.tokenizer, text, L)
            ours_y()
            our_tokens = ybox["out"]["scored"][str(L)]["tokens"]
            peer_tokens = len(h.tokenizer(text, add_special_tokens=False).input_ids)
            res2 = common.compare(ours_y, peer2, rounds, seed=int(f * 8) + 1)
            scale = peer_tokens / max(1, our_tokens)   # time per scored token
            res2 = {**res2, "ratio": round(res2["ratio"] * scale, 4),
                    "ci": [round(x * scale, 4) for x in res2["ci"]] if res2["ci"] else None,
                    "tokens_ours": our_tokens, "tokens_lm_eval": peer_tokens, "per": "scored token"}
            out["vs_lm_eval"][f"{f:g}C"] = common.target(res2, BOUND, "lm-eval loglikelihood_rolling (HFLM)",
                                                         "the ppl evaluator's time per scored token")
        if smoke:
            L = int(factors[0] * C)
            stream = tokens_file(h, L, windows, Path(d))
            ours, _, ev = _ours(h, L, "longlora", windows, Path(d), f"bin:{Path(d) / 'stream.bin'}")
            peer, _ = release_loop(h.model, stream, subsample(longlora_starts(len(stream), L, ev.args.stride),
                                                              windows), L)
            out["target_can_fail"] = common.can_fail(ours, peer, BOUND)
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
