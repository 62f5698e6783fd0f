"""Per-method extra cost of one forward pass at 8C over ``base`` (issue 3; target <= 5%).

Model: tiny_llama's architecture with random weights (4 layers, hidden 256, 4 heads of dim 64, vocab 4096, C = 256,
rope_theta 1000), float32, sdpa, one sequence of 8C = 2048 tokens through the decoder (``get_decoder()``, the
evaluators' path). Each method is timed as the median of ``REPEATS`` forwards after one warm-up (which also fills
CLEX's frequency grid and LongRoPE's long factors); methods are interleaved with ``base`` round by round so
machine-load drift hits all alike. Reported: seconds per forward and overhead = median / base median - 1.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

METHODS = ["base", "pi", "ntk_frozen", "ntk_32k", "ntk_64k", "yarn", "ntk_by_parts", "abf", "entropy_abf", "longrope",
           "longrope2", "clex", "llama3"]
REPEATS = int(os.environ.get("BENCH_REPEATS", "15"))  # interleaved; fewer left +-10% noise on a 0.25 s forward
C = 256


def build(name):
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.conf_utils import group_defaults
    from harness.methods import build_method
    from harness.models import ModelHandle

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=C,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    build_method(group_defaults("method", name)).apply(ModelHandle(model, None, "bench", C, {}))
    return model


@torch.no_grad()
def forward_seconds(model, ids) -> float:
    t0 = time.perf_counter()
    model.get_decoder()(input_ids=ids, use_cache=False)
    return time.perf_counter() - t0


def run() -> dict:
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    ids = torch.randint(3, 4096, (1, 8 * C))
    models = {m: build(m) for m in METHODS}
    times = {m: [] for m in METHODS}
    for m in METHODS:
        forward_seconds(models[m], ids)  # warm-up
    for _ in range(REPEATS):
        for m in METHODS:
            times[m].append(forward_seconds(models[m], ids))
    base = statistics.median(times["base"])
    out = {"length": 8 * C, "repeats": REPEATS, "target_overhead": 0.05, "methods": {}}
    for m in METHODS:
        med = statistics.median(times[m])
        out["methods"][m] = {"seconds": round(med, 4), "overhead": round(med / base - 1, 4),
                             "within_target": med / base - 1 <= 0.05}
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
