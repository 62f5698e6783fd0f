"""What every benchmark shares (issue 61): a ratio against a named peer measured in the same process, the machine's
limit beside it, and a target that can fail.

- :func:`compare`: ``subject`` and ``peer`` (callables doing the same work) timed in ``rounds`` rounds, the order of
  the two drawn at random in each round (a seeded generator: reproducible), after one untimed call of each. The
  ratio is subject time / peer time per round; the figure is the geometric mean over rounds with the Student t
  interval of the mean log ratio (``harness.stats.mean_interval``, ``t``: the interval chosen for few samples),
  exponentiated. Adjacent calls share the machine's state, so a drift of its speed cancels in the ratio.
- :func:`verdict`: a target ``ratio <= bound`` is ``within`` when the whole interval is at or below the bound,
  ``not within`` when the whole interval is above it, ``inconclusive`` otherwise: a number near the bound is never
  called either way by its point value.
- :func:`can_fail`: the same comparison with the subject deliberately slowed (run twice more, so at least 3x its
  time): its verdict must be ``not within``, else the target cannot fail at that size (``--smoke`` records it, and
  the default test tier asserts it for every benchmark).
- :func:`limit`: the dense matmul throughput of this machine for a dtype, a 2048^3 product timed in this process
  (``harness.plan.device_flops``), and :func:`forward_flops`: a forward's FLOPs from the model's geometry,
  ``2 N T + 2 T^2 d l`` (N the matmul weights with the LM head, T tokens, causal attention over d = heads x
  head_dim in l layers): ``fraction`` = FLOPs / seconds / limit, how far from the machine a path runs.
"""
from __future__ import annotations

import math
import os
import random
import time

import numpy as np

from harness import stats

LEVEL = 0.95


def timed(fn) -> float:
    """Wall seconds of one call of ``fn``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(subject, peer, rounds: int, seed: int = 0, warm: bool = True) -> dict:
    """The subject / peer time ratio over ``rounds`` rounds, order randomised per round (module docstring)."""
    if warm:
        subject()
        peer()
    rng = random.Random(seed)
    ts, tp, order = [], [], []
    for _ in range(rounds):
        first = rng.random() < 0.5
        order.append("subject" if first else "peer")
        if first:
            ts.append(timed(subject))
            tp.append(timed(peer))
        else:
            tp.append(timed(peer))
            ts.append(timed(subject))
    logs = np.log(np.asarray(ts) / np.asarray(tp))
    ci = stats.mean_interval(logs, "t") if len(logs) >= stats.MIN_DOCS else None
    out = {"ratio": round(float(math.exp(logs.mean())), 4), "rounds": rounds,
           "ci": [round(math.exp(ci[1]), 4), round(math.exp(ci[2]), 4)] if ci else None,
           "subject_s": round(float(np.median(ts)), 5), "peer_s": round(float(np.median(tp)), 5),
           "subject_first": order.count("subject"), "interval": "Student t on log(subject / peer), exponentiated"}
    return out


def verdict(res: dict, bound: float) -> str:
    """``within`` | ``not within`` | ``inconclusive`` for a target ratio <= ``bound`` (module docstring)."""
    ci = res.get("ci")
    if not ci:
        return "inconclusive"
    return "within" if ci[1] <= bound else "not within" if ci[0] > bound else "inconclusive"


def target(res: dict, bound: float, peer: str, what: str) -> dict:
    """``res`` with its target, the peer's name and the verdict."""
    return {**res, "target": f"{what} <= {bound:g} x {peer}", "bound": bound, "peer": peer,
            "verdict": verdict(res, bound)}


def slowed(fn, factor: int = 3):
    """``fn`` run ``factor`` times: the deliberately slowed variant of a measured function."""
    def run():
        for _ in range(factor):
            fn()
    return run


def can_fail(subject, peer, bound: float, rounds: int = 3) -> dict:
    """The comparison with the subject slowed 3x: ``{"verdict", "ratio", "fails": True}`` when the target catches it."""
    res = compare(slowed(subject), peer, max(rounds, stats.MIN_DOCS), warm=False)
    v = verdict(res, bound)
    return {"verdict": v, "ratio": res["ratio"], "ci": res["ci"], "fails": v == "not within"}


_LIMITS: dict = {}


def limit(dtype) -> dict:
    """This process's dense matmul throughput for ``dtype`` on the CPU (FLOP/s of a 2048^3 product, the best of
    repeated calls over 0.3 s; measured once per process)."""
    import torch

    from harness.plan import device_flops

    key = str(dtype)
    if key not in _LIMITS:
        _LIMITS[key] = device_flops(torch.device("cpu"), dtype)
    return {"dtype": key.removeprefix("torch."), "matmul_flops_per_s": round(_LIMITS[key] / 1e9, 1) * 1e9,
            "threads": torch.get_num_threads(), "how": "a 2048^3 matmul, best of repeated calls over 0.3 s"}


def geometry(config) -> dict:
    """The numbers :func:`forward_flops` needs, from a transformers config."""
    c = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    h, layers, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    per_layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * inter  # q, o, k, v, gate / up / down
    return {"matmul_params": layers * per_layer + vocab * h, "decoder_params": layers * per_layer, "layers": layers,
            "attn_dim": heads * hd}


def forward_flops(geo: dict, tokens: int, batch: int = 1, lm_head: bool = True) -> float:
    """FLOPs of one causal forward over ``tokens`` tokens: ``2 N T + 2 T^2 d l`` per sequence (N with the LM head,
    or without it for the decoder alone, ``lm_head=False``: ``get_decoder()``'s forward)."""
    T = tokens
    n = geo["matmul_params"] if lm_head else geo["decoder_params"]
    return batch * (2 * n * T + 2 * T * T * geo["attn_dim"] * geo["layers"])


def fraction(flops: float, seconds: float, lim: dict) -> float:
    return round(flops / seconds / lim["matmul_flops_per_s"], 4) if seconds > 0 else 0.0


def threads() -> int:
    """Torch threads of a benchmark: ``BENCH_THREADS``, default min(2, cores)."""
    import torch

    n = int(os.environ.get("BENCH_THREADS", min(2, os.cpu_count() or 1)))
    torch.set_num_threads(n)
    return n


def load() -> float:
    return round(os.getloadavg()[0], 2)
