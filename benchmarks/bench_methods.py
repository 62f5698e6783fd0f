"""Per-method extra cost of one forward pass at 8C over ``base`` (issue 3; target <= 5%).

Model: the shipped tiny_llama as its model config builds it (``conf/model/tiny_llama.yaml``: the native window C and
the weights come from there, never from this file), float32, sdpa, one sequence of 8C tokens through the decoder
(``get_decoder()``, the evaluators' path). Methods: ``base`` and every registered method that changes the position
encoding or its scaling and keeps full attention (its ``needs`` asks for RoPE but is not ``BLOCKWISE``: the blockwise
methods' cost is ``bench_attention``'s), each built from its own YAML and put on the model the way a run does
(``pipeline.extend``, then ``eval_mode``). Each method is timed as the median of ``REPEATS`` forwards after one
warm-up (which also fills CLEX's frequency grid and LongRoPE's long factors); methods are interleaved with ``base``
round by round so machine-load drift hits all alike. Reported: seconds per forward and overhead = median / base
median - 1, and the 1-minute load average before and after.

    python scripts/bench.py methods
    python scripts/bench.py --smoke methods      # 2C, one repeat: that every method's path runs (seconds)
"""
from __future__ import annotations

import os
import statistics
import time

import torch

REPEATS = int(os.environ.get("BENCH_REPEATS", "15"))  # interleaved; fewer left +-10% noise on a 0.25 s forward
MODEL = "tiny_llama"
TARGET = 0.05


def methods() -> list[str]:
    """``base`` and every method whose evaluation forward is full attention under changed RoPE (class ``needs``)."""
    from harness.methods import BLOCKWISE, METHODS

    return ["base"] + [n for n, cls in METHODS.items() if cls.needs.rope and cls.needs != BLOCKWISE]


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


@torch.no_grad()
def forward_seconds(model, ids) -> float:
    t0 = time.perf_counter()
    model.get_decoder()(input_ids=ids, use_cache=False)
    return time.perf_counter() - t0


def run(smoke: bool = False) -> dict:
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    load0 = os.getloadavg()[0]
    names = methods()
    handles = {m: build(m) for m in names}
    C = handles["base"].native_ctx
    mult, repeats = (2, 1) if smoke else (8, REPEATS)
    ids = torch.randint(3, handles["base"].model.config.vocab_size, (1, mult * C),
                        generator=torch.Generator().manual_seed(0))
    times = {m: [] for m in names}
    for m in names:
        forward_seconds(handles[m].model, ids)  # warm-up
    for _ in range(repeats):
        for m in names:
            times[m].append(forward_seconds(handles[m].model, ids))
    base = statistics.median(times["base"])
    out = {"model": MODEL, "native_ctx": C, "length": mult * C, "repeats": repeats, "target_overhead": TARGET,
           "smoke": smoke, "methods": {}}
    for m in names:
        med = statistics.median(times[m])
        out["methods"][m] = {"seconds": round(med, 4), "overhead": round(med / base - 1, 4),
                             "within_target": med / base - 1 <= TARGET}
    out["loadavg_1min"] = {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)}
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(smoke="--smoke" in sys.argv[1:]), indent=1))
