"""dca: Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models";
HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``), frozen (training-free).

What the original does (``replace_with_chunkllama(pretraining_length=C)``, ``forward`` and
``ChunkLlamaRotaryEmbedding``): with ``chunk_size = C * 3 // 4`` (s_c) and ``local_window`` w, the sequence is cut
into chunks of ``chunk_len = L = s_c - w`` tokens (by index; chunk j = tokens [jL, (j+1)L)). Keys are rotated at
``n mod L`` (``k_t``). A query at position m (``m mod L`` = its offset in its chunk) attends to
- intra-chunk: the keys of its own chunk, causally, with the query rotated at ``m mod L`` (``q_t``): relative
  position m - n, below L;
- successive-chunk: all keys of the previous chunk, query rotated at ``min(m mod L + L, s_c)`` (``qc_t``): queries
  with m mod L <= w see the previous chunk at its true distance, later ones at distances capped by s_c;
- inter-chunk: all keys of chunks before the previous one, query rotated at the constant ``qc_t[L - 1] =
  min(2L - 1, s_c)`` (= s_c whenever L > w).
Prefill runs one flash-attention call per part and merges them with their log-sum-exps (``merge_attn_outputs``: the
weights exp(lse_i) / sum_j exp(lse_j), computed in fp32 since 2024-06), which is exactly one softmax over the union
of the three key sets. Decoding (``has_kv_cache``, one query) concatenates the three score blocks of the current
chunk ``(kv_len - 1) // L`` with the same query rotations (inter at ``chunk_len - 1``) and takes one softmax: the same
arithmetic as prefill for the last token. Relative positions never exceed s_c < C, at any length.

This implementation: a registered transformers attention function (``AttentionInterface``); the model stays stock,
q/k arrive rotated at their true positions and are re-rotated by the position delta to the original's positions
(RoPE rotations compose), keys once to ``n mod L``, queries to their intra / successive / inter positions. One
blocked online softmax over the union (``_blockwise.online_softmax_attention``: per score tile, each logit is taken
from the part its (query chunk, key chunk) pair belongs to), i.e. the exact log-sum-exp merge, with no [L x L] score
or mask tensor; GQA keys are never expanded. Prefill and decoding use the same code, so the KV-cache path follows
the original's decode arithmetic (for a single new token it is exactly the original's; for several new tokens with a
cache each query uses its own chunk, whereas the original would use the last token's chunk for all of them).
Chunks are counted from ``position_ids`` (the original counts by index and rotates by position ids; the two agree
without padding; with left padding and padding-aware position ids, as ``generate`` builds them, chunks start at
each row's first real token). Inputs of at most L tokens are exactly the unmodified model (intra only, delta 0).

Settings, original vs this file: ``chunk_size`` 0.75 C (``pretraining_length * 3 // 4``: 3072 on LLaMA2-7B);
``local_window`` 0.125 C (the current code's default ``pretraining_length // 8`` = 512 on LLaMA2-7B, since commit
d304027, 2024-04-25; before it, at the paper's release, ``// 16`` = 256: set ``local_window: 0.0625``).
Not reproduced by default: the current code's ``mscale`` (cos and sin both multiplied by ``0.05 ln(l/C) + 1`` once
the length l exceeds C; its comment says the paper's results did not use it). ``mscale: true`` applies it (logits
times its square) from the current key length, statelessly; the original keeps the value of the longest length its
rotary cache has been rebuilt for (the same on one growing sequence, different when a shorter input follows a
longer one). The original composes with PI through the rotary ``scaling_factor``; here the model's own inverse
frequencies are used, so a RoPE scaling already in the model's config composes the same way.
``attention.backend=flex`` (``auto`` on CUDA): three ``flex_attention`` calls (one per part, block masks on the chunk
difference) merged by log-sum-exp, as the original's flash path; ``reference``: the blocked loop above (tested equal).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.config import ConfigError, window_tokens
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_dca"


def query_positions(pos: torch.Tensor, chunk_size: int, local_window: int) -> tuple:
    """The original's rotary positions of a query at position ``pos``: (intra, successive, inter) =
    (pos mod L, min(pos mod L + L, s_c), min(2L - 1, s_c)) with L = s_c - w (``q_t``, ``qc_t``, ``qc_t[L - 1]``)."""
    L = chunk_size - local_window
    m = pos % L
    return m, torch.clamp(m + L, max=chunk_size), torch.full_like(m, min(2 * L - 1, chunk_size))


def mscale_of(kv_len: int, native_ctx: int) -> float:
    """The current code's ``get_mscale(l / C)``: 0.05 ln(l/C) + 1 beyond C, 1 otherwise (applied to cos and sin)."""
    s = kv_len / native_ctx
    return 1.0 if s <= 1 else 0.05 * math.log(s) + 1.0


def dca_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                  **kwargs):
    chunk_size, local_window, mscale, native_ctx, block_q, block_k = module.harness_dca
    L = chunk_size - local_window
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]
    dev = query.device
    scale = bw.default_scaling(module, scaling)
    if mscale:
        scale = scale * mscale_of(kv, native_ctx) ** 2
    if fx.use_fused(module, query):  # attention.backend: flex (three flex calls merged by log-sum-exp)
        return dca_flex(module, query, key, value, attention_mask, scale, position_ids, chunk_size, local_window)
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, dev)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    q_idx = torch.arange(kv - lq, kv, device=dev)
    k_idx = torch.arange(kv, device=dev)
    qf, kf = query.float(), key.float()
    k_c = bw.rotate(kf, k_pos % L - k_pos, inv)  # keys at n mod L
    p_intra, p_succ, p_inter = query_positions(q_pos, chunk_size, local_window)
    q_chunk, k_chunk = torch.div(q_pos, L, rounding_mode="floor"), torch.div(k_pos, L, rounding_mode="floor")
    far = int(q_chunk.max() - k_chunk.min()) if kv > 0 else 0
    q_intra = bw.group_q(bw.rotate(qf, p_intra - q_pos, inv), n_kv)
    q_succ = bw.group_q(bw.rotate(qf, p_succ - q_pos, inv), n_kv) if far >= 1 else None
    q_inter = bw.group_q(bw.rotate(qf, p_inter - q_pos, inv), n_kv) if far >= 2 else None

    def score(qs, qe, ks, ke):
        diff = q_chunk[:, qs:qe, None] - k_chunk[:, None, ks:ke]  # [B, bq, bk]
        ok = (q_idx[qs:qe, None] >= k_idx[None, ks:ke])[None] & valid[:, None, ks:ke] & (diff >= 0)
        s = None
        for qg, sel in ((q_intra, diff == 0), (q_succ, diff == 1), (q_inter, diff >= 2)):
            sel = ok & sel
            if qg is None or not bool(sel.any()):
                continue
            t = bw.tile_scores(qg, k_c, qs, qe, ks, ke)
            s = t if s is None else torch.where(sel[:, None, None], t, s)
        if s is None:
            return None
        return (s * scale).masked_fill(~ok[:, None, None], bw.NEG_INF)

    def ranges(qs, qe):
        return [(0, min(kv, kv - lq + qe))]

    return bw.attend(query, value, score, ranges, block_q, block_k)


def dca_flex(module, query, key, value, attention_mask, scale: float, position_ids, chunk_size: int,
             local_window: int):
    """The fused path: one flex_attention call per part (intra / successive / inter-chunk, each with its query
    rotation and a block mask on the chunk difference), merged by log-sum-exp, as the original merges its flash
    calls (``merge_attn_outputs``)."""
    q_pos, k_pos, valid, off = fx.attention_context(query, key, attention_mask, position_ids)
    L = chunk_size - local_window
    inv = module.harness_inv_freq
    qc, kc = torch.div(q_pos, L, rounding_mode="floor"), torch.div(k_pos, L, rounding_mode="floor")
    k_c = bw.rotate(key.float(), k_pos % L - k_pos, inv).to(key.dtype)
    p_intra, p_succ, p_inter = query_positions(q_pos, chunk_size, local_window)

    def part(kind: str, lo: int, hi: int | None, q_at):
        # the chunk difference qc - kc in [lo, hi]: the shared band mask over chunk indices (one compiled kernel)
        mask, tensors = fx.band(qc, kc, valid, off, lo=lo, hi=fx.BIG if hi is None else hi + 1)
        q = bw.rotate(query.float(), q_at - q_pos, inv).to(query.dtype)
        return fx.flex(q, k_c, value, mask, (kind, L, off), tensors, scale, lse=True,
                       source=(position_ids, attention_mask))

    # all three parts always (no host read of how many chunks apart the farthest pair is: a part with no visible key
    # has log-sum-exp -inf and adds exactly nothing to the merge)
    parts = [part("dca_intra", 0, 0, p_intra), part("dca_succ", 1, 1, p_succ), part("dca_inter", 2, None, p_inter)]
    return fx.attention_result(fx.merge(parts), query)


bw.register_attention(ATTN_NAME, dca_attention)


@METHODS.register("dca")
class DCA(Method):
    needs = BLOCKWISE

    @dataclass
    class Args(MethodArgs):
        name: str = "dca"
        chunk_size: float = 0.75  # s_c in units of C (original: pretraining_length * 3 // 4 = 3072 on LLaMA2-7B)
        local_window: float = 0.125  # w in units of C (current code: C // 8 = 512; paper-era code: C // 16 = 256)
        mscale: bool = False  # the current code's 0.05 ln(l/C) + 1 on cos and sin beyond C (paper: off)
        block_q: int = 256  # query rows per block of the blocked attention
        block_k: int = 512  # keys per score tile

    def check(self, native_ctx: int, train=None) -> tuple[int, int]:
        """Checks the settings; returns (chunk_size, local_window) in tokens."""
        a = self.args
        cs = window_tokens(a.chunk_size, native_ctx, "method=dca: chunk_size", zero_ok=False)
        lw = window_tokens(a.local_window, native_ctx, "method=dca: local_window")
        if not cs < native_ctx:
            raise ConfigError(f"method=dca: chunk_size = {a.chunk_size:g} C = {cs} tokens must be below the native "
                              f"window C = {native_ctx} (relative positions reach chunk_size; valid: 0 < chunk_size "
                              f"< 1)")
        if not 0 <= lw < cs:
            raise ConfigError(f"method=dca: local_window = {a.local_window:g} C = {lw} tokens must be below "
                              f"chunk_size = {cs} tokens (chunk length chunk_size - local_window >= 1; valid: "
                              f"0 <= local_window < chunk_size)")
        if a.block_q < 1 or a.block_k < 1:
            raise ConfigError(f"method=dca: block_q and block_k must be >= 1, got {a.block_q}, {a.block_k}")
        return cs, lw

    def apply(self, handle) -> None:
        a = self.args
        cs, lw = self.check(handle.native_ctx)
        bw.install(handle.model, ATTN_NAME, "harness_dca",
                   (cs, lw, bool(a.mscale), int(handle.native_ctx), a.block_q, a.block_k))
