"""self_extend: Self-Extend (Jin et al. 2024, "LLM Maybe LongLM"; datamllab/LongLM), frozen.

What the original does (``self_extend_patch/Llama.py::self_extend_forward``, eager path, prefill): every query at
position m attends to keys n with
- neighbour attention (normal RoPE, relative distance m - n) when 0 <= m - n < W, and
- grouped attention when m - n >= W: the query is rotated at ``m // G + W - W/G`` and the key at ``n // G``, so the
  relative distance is ``m//G - n//G + W - W/G`` (the controlled study's Eq. 15 with M = W, N = G);
the two logit sets are merged with ``where(neighbour_mask, neighbour, group)`` and go through ONE softmax. Maximum
length ``(C - W) * G + W``.

Discrepancy kept as a flag: ``Llama.py``'s eager forward (prefill and decode alike) and its flash prefill shift by
``W - W/G`` (true division); only its flash *decode* path (``flash_self_extend_forward``, q_len == 1), the legacy
patch and the ``Llama_4_40.py`` eager path use ``W - W//G`` (floor), as does the paper's Eq. 15. Default
``float_shift: false`` = Eq. 15; the two agree whenever W % G == 0 (the study's W=1024, G=64 and this harness's
defaults). Prefill and decode use the same formula here, so the original's flash prefill/decode mismatch for
W % G != 0 does not exist in this implementation.

Implementation: a registered transformers attention function (``AttentionInterface``), so the model stays stock:
q/k arrive rotated at their true positions; the grouped copies are obtained by re-rotating by the position delta
(RoPE rotations compose). Attention is computed blockwise with an online softmax (``_blockwise.py``): no dense
[L x L] score or mask tensor is built, peak extra memory is O(block_q x block_k) per head. GQA keys/values are
never expanded. Padding: 2-D attention masks are honoured (keys masked); group positions follow ``position_ids``
(use padding-aware position ids for left padding, as ``generate`` does). Not implemented: the optional
``scale_base`` log-scaling of queries (the original's default -1 = off) and the flash-attention LSE merge (the
result is the same as the eager merge up to rounding).

Units: the neighbour window is in units of the native window C (``window: 0.25`` = C/4: 1024 tokens on LLaMA2-7B,
the study's W); the group size G is a position divisor (dimensionless), 64 on every model. With W = C/4 and G = 64
the largest grouped position at 16C is C/4 + 15.75C/64 ~= C/2 on any model (LLaMA2: 1024 + 63488/64 = 2016 ~=
4096/2), the README's rule of thumb (C/2 .. 2C/3 > W + (N-W)/G), and the maximum length (C-W)*G+W = 48.25 C.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import ConfigError, window_tokens
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_self_extend"


def group_shift(window: int, group: int, float_shift: bool) -> float:
    return window - window / group if float_shift else window - window // group


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, group: int,
                       float_shift: bool = False) -> torch.Tensor:
    """Eq. 15: the relative position Self-Extend uses for query position m and key position n (reference formula,
    [..., q, k], float64)."""
    m = q_pos[..., :, None].to(torch.float64)
    n = k_pos[..., None, :].to(torch.float64)
    grouped = torch.div(m, group, rounding_mode="floor") - torch.div(n, group, rounding_mode="floor") + \
        group_shift(window, group, float_shift)
    return torch.where(m - n < window, m - n, grouped)


def self_extend_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                          **kwargs):
    window, group, float_shift, block_q, block_k = module.harness_self_extend
    if fx.use_fused(module, query):  # attention.backend: flex (two flex calls merged by log-sum-exp)
        return fx.self_extend(module, query, key, value, attention_mask, bw.default_scaling(module, scaling),
                              position_ids, window, group, group_shift(window, group, float_shift))
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]
    dev = query.device
    scale = bw.default_scaling(module, scaling)
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, dev)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    q_idx = torch.arange(kv - lq, kv, device=dev)
    k_idx = torch.arange(kv, device=dev)
    qf, kf = query.float(), key.float()
    shift = group_shift(window, group, float_shift)
    need_group = bool((q_pos.max() - k_pos.min()) >= window) if kv > 0 else False
    if need_group:
        qg_pos = torch.div(q_pos, group, rounding_mode="floor") + shift
        kg_pos = torch.div(k_pos, group, rounding_mode="floor")
        q_grp = bw.group_q(bw.rotate(qf, qg_pos - q_pos, inv), n_kv)
        k_grp = bw.rotate(kf, kg_pos - k_pos, inv)
    q_nb = bw.group_q(qf, n_kv)

    def score(qs, qe, ks, ke):
        ok = (q_idx[qs:qe, None] >= k_idx[None, ks:ke])[None] & valid[:, None, ks:ke]  # [B, bq, bk]
        dist = q_pos[:, qs:qe, None] - k_pos[:, None, ks:ke]
        nb = dist < window
        use_n = bool((ok & nb).any())
        use_g = need_group and bool((ok & ~nb).any())
        if not (use_n or use_g):
            return None
        if use_n and use_g:
            s = torch.where(nb[:, None, None], bw.tile_scores(q_nb, kf, qs, qe, ks, ke),
                            bw.tile_scores(q_grp, k_grp, qs, qe, ks, ke))
        elif use_n:
            s = bw.tile_scores(q_nb, kf, qs, qe, ks, ke)
        else:
            s = bw.tile_scores(q_grp, k_grp, qs, qe, ks, ke)
        return (s * scale).masked_fill(~ok[:, None, None], bw.NEG_INF)

    def ranges(qs, qe):
        return [(0, min(kv, kv - lq + qe))]

    return bw.attend(query, value, score, ranges, block_q, block_k)


bw.register_attention(ATTN_NAME, self_extend_attention)


@METHODS.register("self_extend")
class SelfExtend(Method):
    needs = BLOCKWISE

    @dataclass
    class Args(MethodArgs):
        name: str = "self_extend"
        window: float = 0.25  # W in units of C (LLaMA2 / LCEG: 1024 = C/4)
        group: int = 64  # G, group size (LLaMA2 / LCEG: 64; a position divisor, the same on every model)
        float_shift: bool = False  # grouped query shift W - W/G (eager prefill code) instead of W - W//G (Eq. 15)
        block_q: int = 256  # query rows per block of the blocked attention
        block_k: int = 512  # keys per score tile

    def check(self, native_ctx: int, train=None) -> int:
        """Checks the settings; returns the window W in tokens."""
        a = self.args
        w = window_tokens(a.window, native_ctx, "method=self_extend: window", zero_ok=False)
        if not 1 <= w < native_ctx:
            raise ConfigError(f"method=self_extend: window = {a.window:g} C = {w} tokens; the neighbour window must "
                              f"be 1 token .. below the native window C = {native_ctx} (valid: "
                              f"{1 / native_ctx:g} <= window < 1)")
        if a.group < 1 or a.block_q < 1 or a.block_k < 1:
            raise ConfigError(f"method=self_extend: group, block_q and block_k must be >= 1, got {a.group}, "
                              f"{a.block_q}, {a.block_k}")
        return w

    def apply(self, handle) -> None:
        a = self.args
        w = self.check(handle.native_ctx)
        bw.install(handle.model, ATTN_NAME, "harness_self_extend", (w, a.group, a.float_shift, a.block_q, a.block_k))

    def max_length(self, handle) -> int | None:
        w = self.check(handle.native_ctx)
        return (handle.native_ctx - w) * self.args.group + w
