"""How far from the machine a prefill runs (issue 61): one decoder forward against a dense matmul of the same FLOPs,
in the same dtype and process.

Peer: a dense product of an M x 2048 by a 2048 x 2048 matrix, M such that it holds the forward's FLOPs
(``common.forward_flops``: ``2 N T + 2 T^2 d l``, N the decoder's matmul weights, no LM head): the machine's limit
for the dtype. The ratio forward / matmul time is 1 / the fraction of the limit the forward reaches. Where that
fraction is under 30%, ``torch.profiler`` says where the time goes (the top ops by self time: what limits it).

- the shipped tiny_llama at 1C and 4C, in float32 and in bfloat16 autocast (what ``autocast: auto`` picks on a CPU
  with AMX), ``rounds`` rounds, order drawn per round (``benchmarks.common.compare``);
- ``--full`` also: SmolLM2-135M (the shipped GGUF, dequantised) at 8k and 16k tokens in bfloat16 autocast, one
  forward each (n = 1: no interval; minutes on 2 cores).

    python scripts/bench.py limit
    python scripts/bench.py --full limit
    python scripts/bench.py --smoke limit        # C/2, float32, 3 rounds (seconds)
"""
from __future__ import annotations

import os

import torch

from benchmarks import common

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
N = 2048


def same_flops_matmul(flops: float, dtype):
    """The peer: products of an M x N by an N x N matrix (N = 2048, the limit's shape) holding ``flops``: ``k`` of
    M = N and one of the remaining rows (2 M N^2 FLOPs each)."""
    b = torch.randn(N, N, dtype=dtype)
    rows = max(1, round(flops / (2 * N * N)))
    k, rest = divmod(rows, N)
    a = torch.randn(N, N, dtype=dtype)
    r = torch.randn(rest, N, dtype=dtype) if rest else None

    def call():
        for _ in range(k):
            a @ b
        if r is not None:
            r @ b
    return call, rows


def forward(model, ids, dtype):
    dec = model.get_decoder()

    @torch.no_grad()
    def call():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            dec(input_ids=ids, use_cache=False)
    return call


def where_time_goes(call) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        call()
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return {e.key: round(e.self_cpu_time_total / total, 3) for e in rows[:6]}


def measure(model, L: int, dtype, rounds: int, geo: dict) -> dict:
    ids = torch.randint(3, model.config.vocab_size, (1, L), generator=torch.Generator().manual_seed(0))
    flops = common.forward_flops(geo, L, lm_head=False)  # the decoder's forward
    peer, k = same_flops_matmul(flops, dtype)
    sub = forward(model, ids, dtype)
    if rounds > 1:
        res = common.compare(sub, peer, rounds, seed=L)
    else:   # one forward each (SmolLM2): n = 1, no interval
        sub(), peer()
        res = {"ratio": round(common.timed(sub) / common.timed(peer), 4), "rounds": 1, "ci": None}
    frac = round(1 / res["ratio"], 4) if res["ratio"] else 0.0
    res.update(tokens=L, flops=flops, fraction_of_limit=frac,
               peer=f"a {k} x {N} by {N} x {N} {str(dtype).removeprefix('torch.')} matmul (the same FLOPs)")
    if frac < 0.3:
        res["what_limits_it"] = where_time_goes(sub)
    return res


def run(smoke: bool = False, full: bool = False) -> dict:
    from harness.models import load_model

    common.threads()
    tiny = load_model("tiny_llama")
    C = tiny.native_ctx
    geo = common.geometry(tiny.model.config)
    dtypes = (torch.float32,) if smoke else (torch.float32, torch.bfloat16)
    factors, rounds = ((0.5,), 3) if smoke else ((1, 4), ROUNDS)
    out = {"threads": torch.get_num_threads(), "smoke": smoke,
           "limits": {str(dt).removeprefix("torch."): common.limit(dt) for dt in dtypes}, "tiny_llama": {}}
    for dt in dtypes:
        for f in factors:
            out["tiny_llama"][f"{str(dt).removeprefix('torch.')} {f:g}C"] = measure(tiny.model, int(f * C), dt,
                                                                                    rounds, geo)
    if full:
        smol = load_model("smollm2_135m")
        g2 = common.geometry(smol.model.config)
        out["smollm2_135m"] = {f"bfloat16 {L}": measure(smol.model, L, torch.bfloat16, 1, g2) for L in (8192, 16384)}
    else:
        out["smollm2_135m"] = "not run (--full)"
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:], full="--full" in sys.argv[1:]), indent=1))
