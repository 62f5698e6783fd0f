"""longrope2: LongRoPE2 (Shang et al. 2025; code: microsoft/nnscaler ``examples/longrope2/``).

Frequencies: rope type ``longrope2`` (registered here): the original RoPE for sequences of length <= C, the
LongRoPE ``long_factor`` set beyond (``rope_modifier.py::get_longrope_inv_freq``: ``seq_len = max(position_ids) + 1``,
long iff ``seq_len > C``), i.e. the released configuration (``short_factor = [1.0] * d/2``). Factors come from a
LongRoPE factors file (same format as ``longrope``; only ``long_factor`` is read).

Attention factor (methods.md section 9): the released Llama-3-8B config has no ``attention_factor``, so
transformers' longrope computes ``sqrt(1 + ln s / ln C)`` and applies it to cos/sin in *both* regimes; short inputs
are then not bit-identical to the base model. ``short_attention: same`` (default) reproduces that code;
``short_attention: one`` makes the short regime exactly the original RoPE (attention factor 1 for length <= C), the
paper's description. The switch is a stateless hook (``rope.LengthDependentRope``) and, with ``kv_cache: refresh``,
cached keys are re-rotated when decoding crosses C.

Mixed context window training (``data/process.py``): short documents packed into long rows with ``position_ids``
restarting per document (so max position < C and the original RoPE is used, with document-causal masks from
transformers' packed-sequence detection), long rows with the rescaled RoPE. Here ``train_batch`` turns a fraction
``short_fraction`` of the micro-batches (deterministically interleaved) into rows of C-token segments with restarted
positions and no loss on each segment's first token; the others stay long rows. Paper's ratio is by data source,
not specified as a fraction; 0.5 is our default. Tiny analogue: C = 256, target 2048 (paper: 8k -> 128k).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from harness.config import ConfigError
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.longrope import factors_digest, load_factors, progressive_lineage
from harness.methods.rope import (
    default_inv_freq,
    make_length_dependent,
    register_rope_type,
    rope_dims,
    set_rope_parameters,
)


def longrope2_parameters(config, device=None, seq_len=None, layer_type=None):
    """Original RoPE (attention factor per ``short_attention``) for seq_len <= C, long factors beyond."""
    rp = config.rope_parameters
    base, dim = rope_dims(config)
    c = int(rp["original_max_position_embeddings"])
    att = float(rp["attention_factor"])
    inv = default_inv_freq(base, dim, device)
    if seq_len is not None and int(seq_len) > c:
        return inv / torch.tensor(rp["long_factor"], dtype=torch.float32, device=device), att
    return inv, (att if rp.get("short_attention", "same") == "same" else 1.0)


register_rope_type("longrope2", longrope2_parameters,
                   required=("long_factor", "original_max_position_embeddings", "attention_factor"),
                   optional=("short_attention", "factor"))


@METHODS.register("longrope2")
class LongRoPE2(Method):
    needs = ROPE
    restarts_positions = True  # mixed context windows: short rows of documents with their own positions

    @dataclass
    class Args(MethodArgs):
        name: str = "longrope2"
        factors: str = ""  # LongRoPE factors file ("" = shipped tiny_llama 256 -> 2048 default)
        short_attention: str = "same"  # same (released code) | one (exact original RoPE within C)
        attention_factor: float = 0.0  # 0 = file's value, else sqrt(1 + ln s / ln C)
        short_fraction: float = 0.5  # mixed context window training: share of micro-batches packed from C-token docs
        kv_cache: str = "refresh"

    def __init__(self, args):
        super().__init__(args)
        self.native_ctx = None
        self.calls = 0

    def check(self, native_ctx: int, train=None) -> None:
        a = self.args
        if a.short_attention not in ("same", "one") or not 0 <= a.short_fraction <= 1 or a.attention_factor < 0:
            raise ConfigError(f"method=longrope2: short_attention must be same|one, 0 <= short_fraction <= 1, "
                              f"attention_factor >= 0; got {a.short_attention!r}, {a.short_fraction}, "
                              f"{a.attention_factor}")

    def check_data(self, native_ctx: int) -> None:
        load_factors(self.args.factors, None, native_ctx)

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        model = handle.model
        _, dim = rope_dims(model.config)
        f = load_factors(a.factors, dim // 2, handle.native_ctx)
        c, target = int(f["original_max_position_embeddings"]), int(f["max_position_embeddings"])
        s = target / c
        att = (a.attention_factor or f.get("attention_factor")
               or (math.sqrt(1 + math.log(s) / math.log(c)) if s > 1 else 1.0))
        set_rope_parameters(model, rope_type="longrope2", long_factor=list(map(float, f["long_factor"])),
                            original_max_position_embeddings=c, attention_factor=float(att), factor=s,
                            short_attention=a.short_attention)
        make_length_dependent(model, longrope2_parameters, a.kv_cache)
        self.native_ctx = c

    def is_short_batch(self, k: int) -> bool:
        f = self.args.short_fraction
        return math.floor((k + 1) * f) > math.floor(k * f)

    def train_batch(self, input_ids):
        k, self.calls = self.calls, self.calls + 1
        c = self.native_ctx
        n = input_ids.shape[1]
        if c is None or n <= c or not self.is_short_batch(k):
            return {"input_ids": input_ids, "labels": input_ids}
        pos = (torch.arange(n, device=input_ids.device) % c)[None].expand(input_ids.shape[0], -1)
        labels = input_ids.clone()
        labels[:, ::c] = -100  # the first token of a segment is not predicted from the previous segment
        # use_cache=False: transformers only derives document masks from restarting positions without a cache
        return {"input_ids": input_ids, "labels": labels, "position_ids": pos, "use_cache": False}

    def params(self) -> dict:
        return {**super().params(), "factors_sha256": factors_digest(self.args.factors)}

    def accepts_checkpoint(self, saved: dict, directory) -> bool:
        return progressive_lineage(saved, json.loads(json.dumps(self.params(), sort_keys=True)), self.args.factors,
                                   directory)
