"""Each method's evaluation forward against the base's at 1C, 2C, 4C and 8C (issues 3 and 61), in one process.

Model: the shipped tiny_llama as its model config builds it (``load_model``: C and the weights from
``conf/model/tiny_llama.yaml``), float32, one sequence through the decoder (``get_decoder()``, the evaluators' path).
Each method from its own YAML, put on its own copy of the model as a run does (``pipeline.extend``, ``eval_mode``).
Peer: ``base`` (plain RoPE, SDPA) on the same tokens. Per method and length: ``rounds`` rounds in which the method's
forward and the base's run back to back in an order drawn per round (``benchmarks.common.compare``): the figure is
the geometric mean of method / base time with its Student t interval over rounds.

- RoPE-only methods (their ``needs`` ask for RoPE, full attention): the target is ``ratio <= 1.05``, i.e. within a
  few percent of the base, called only when the whole interval says so (``common.verdict``). They change only the
  rotary frequencies (computed once; Dynamic NTK and CLEX recompute them per call above C).
- blockwise methods (Self-Extend, LM-Infinite, DCA, STRING, StreamingLLM, Landmark: ``BLOCKWISE`` or their own
  attention): no target; the ratio is reported with where the time goes (``torch.profiler``: matmul, softmax /
  elementwise and the rest), because on the CPU their reference tile loops are compared with a fused SDPA kernel.
- each forward's fraction of the machine's fp32 matmul limit (``common.limit``, ``common.forward_flops``: the base's
  FLOPs for every method).

The 1-minute load average before and after is recorded (above the core count the machine was contended).

    python scripts/bench.py methods
    python scripts/bench.py --smoke methods      # C/2, 3 rounds, the slowed-variant check (seconds)
"""
from __future__ import annotations

import os

import torch

from benchmarks import common

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
MODEL = "tiny_llama"
BOUND = 1.05
FACTORS = (1, 2, 4, 8)


def methods() -> dict[str, str]:
    """``{name: "rope" | "blockwise"}`` of every registered method but ``base`` (which is the peer)."""
    from harness.methods import BLOCKWISE, METHODS

    return {n: ("blockwise" if cls.needs == BLOCKWISE else "rope") for n, cls in METHODS.items()
            if n != "base" and cls.needs.rope}


def build(name: str):
    """The model as a run of ``method=<name>`` evaluates it: loaded by its builder, the method from its YAML."""
    from harness.methods import build_method
    from harness.models import load_model
    from harness.pipeline import extend

    handle = load_model(MODEL)
    method = build_method({"name": name})
    extend(handle, method, log=lambda _: None)
    method.eval_mode(handle)
    return handle


def forward(handle, ids):
    dec = handle.model.get_decoder()

    @torch.no_grad()
    def call():
        dec(input_ids=ids, use_cache=False)
    return call


def profile(call) -> dict:
    """Share of one call's CPU time in matmuls, in softmax and elementwise ops, and in the rest (``torch.profiler``
    self time by op name)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU]) as p:
        call()
    groups = {"matmul": 0.0, "softmax_elementwise": 0.0, "other": 0.0}
    for e in p.key_averages():
        t = e.self_cpu_time_total
        n = e.key.lower()
        if any(k in n for k in ("mm", "matmul", "linear", "baddbmm", "addmm", "scaled_dot_product")):
            groups["matmul"] += t
        elif any(k in n for k in ("softmax", "exp", "max", "add", "mul", "sub", "div", "where", "masked", "sum",
                                  "logsumexp", "cat", "copy")):
            groups["softmax_elementwise"] += t
        else:
            groups["other"] += t
    total = sum(groups.values()) or 1.0
    ops = sum(e.count for e in p.key_averages())
    return {**{k: round(v / total, 3) for k, v in groups.items()}, "ops": int(ops)}


def run(smoke: bool = False) -> dict:
    common.threads()
    load0 = common.load()
    kinds = methods()
    base = build("base")
    C = base.native_ctx
    factors, rounds = ((0.5,), 3) if smoke else (FACTORS, ROUNDS)
    geo = common.geometry(base.model.config)
    lim = common.limit(torch.float32)
    out = {"model": MODEL, "native_ctx": C, "dtype": "float32", "threads": torch.get_num_threads(),
           "lengths": [int(f * C) for f in factors], "rounds": rounds, "peer": "base (plain RoPE, SDPA), same tokens",
           "limit": lim, "smoke": smoke, "methods": {}}
    gen = torch.Generator().manual_seed(0)
    ids = {f: torch.randint(3, base.model.config.vocab_size, (1, int(f * C)), generator=gen) for f in factors}
    base_fwd = {f: forward(base, ids[f]) for f in factors}
    out["base_fraction_of_limit"] = {}
    for name, kind in kinds.items():
        h = build(name)
        per = {}
        for f in factors:
            res = common.compare(forward(h, ids[f]), base_fwd[f], rounds, seed=f)
            flops = common.forward_flops(geo, int(f * C), lm_head=False)
            res["fraction_of_limit"] = common.fraction(flops, res["subject_s"], lim)
            per[f"{f:g}C"] = common.target(res, BOUND, "base", f"{name} forward time") if kind == "rope" else res
            out["base_fraction_of_limit"].setdefault(f"{f:g}C", common.fraction(flops, res["peer_s"], lim))
        entry = {"kind": kind, "by_length": per}
        if kind == "blockwise":
            entry["profile_at_longest"] = profile(forward(h, ids[factors[-1]]))
        out["methods"][name] = entry
        del h
    out["base_profile_at_longest"] = profile(base_fwd[factors[-1]])
    rope = [(n, L, r["verdict"]) for n, e in out["methods"].items() if e["kind"] == "rope"
            for L, r in e["by_length"].items()]
    out["rope_verdicts"] = {v: sum(1 for _, _, x in rope if x == v) for v in ("within", "inconclusive", "not within")}
    if smoke:   # the target can fail: the base against itself slowed 3x is "not within"
        out["target_can_fail"] = common.can_fail(base_fwd[factors[0]], forward(base, ids[factors[0]]), BOUND)
    out["loadavg_1min"] = {"before": load0, "after": common.load()}
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
