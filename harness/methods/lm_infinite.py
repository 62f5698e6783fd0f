"""lm_infinite: LM-Infinite (Han et al. 2023; Glaciohound/LM-Infinite), frozen.

What the original does (``models/llama.py::attn_forward_factory`` with ``use_lambda_mask=True`` and
``models/lambda_attention.py::Lambda_Attention_Matrix``; ``convert_llama_model(model, local_branch, global_branch)``
sets ``limit_distance = local_branch``): a Lambda-shaped mask. A query i attends to
- the local branch: keys j with 0 <= i - j < n_local, with the normal RoPE logit q_rot(i) . k_rot(j);
- the global branch: the first n_global keys when i - j >= n_local, with the "stationary" logit: query rotated at
  d* = min(limit_distance, kv_len - 1), key rotated at position 0, i.e. every far global token is seen at the
  clipped relative distance d* (the pretrained length);
- nothing else: the middle tokens get exactly zero weight. One softmax over the union, scale 1/sqrt(head_dim).
The controlled study (LCEG ``eval_perplexity/eval_lm_infinite.py``) uses ``convert_llama_model(model, 4096, 10)``:
n_local = 4096 = C, n_global = 10. Units: ``n_local`` and ``limit_distance`` are in units of the native window C
(``n_local: 1`` = C: 4096 on LLaMA2-7B); ``n_global`` is a count of starting tokens (10 on
every model, as in the original, whose global branch does not scale with the window).

The original's non-Lambda reference path (``detailed_lambda_attention``) differs when limit_distance != n_local
(it gives logit 0 rather than -inf to n_local <= i-j < limit_distance); this implements the Lambda semantics, the
one the study ran. Also unlike the original (no GQA: k/v viewed with num_heads), grouped KV heads work.

Implementation: a registered transformers attention function (the model stays stock). q/k arrive rotated at their
true positions; the stationary query is obtained by re-rotating by (d* - m), the stationary global keys by (0 - n).
Attention is blocked (``_blockwise.py``): each query block only visits the global keys and its local band, so
memory and time are O(L (n_local + n_global)) and no [L x L] tensor exists. Padding: "the first n_global tokens"
are the first n_global real (unpadded) keys of each row, distances come from ``position_ids``, so right padding,
and left padding with padding-aware position ids, give each row its unpadded result. Decoding with the KV cache
keeps the full cache (as the original HEAD does) and attends to global + last n_local keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import ConfigError, window_tokens
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_lm_infinite"


def lm_infinite_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                          **kwargs):
    n_global, n_local, limit, block_q, block_k = module.harness_lm_infinite
    if fx.use_fused(module, query):  # attention.backend: flex (local band + global keys, log-sum-exp merge)
        return fx.lm_infinite(module, query, key, value, attention_mask, bw.default_scaling(module, scaling),
                              position_ids, n_global, n_local, limit)
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]
    dev = query.device
    scale = bw.default_scaling(module, scaling)
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, dev)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    is_global, g_end = bw.first_real_keys(valid, n_global)  # [B, kv]
    q_idx = torch.arange(kv - lq, kv, device=dev)
    k_idx = torch.arange(kv, device=dev)
    qf, kf = query.float(), key.float()
    q_rot = bw.group_q(qf, n_kv)
    d_star = min(limit, kv - 1)
    far = bool((q_pos.max() - k_pos[:, :g_end].min()) >= n_local) if g_end else False
    if far:
        q_stat = bw.group_q(bw.rotate(qf, d_star - q_pos, inv), n_kv)
        k_stat = bw.rotate(kf[:, :, :g_end], -k_pos[:, :g_end], inv)

    def score(qs, qe, ks, ke):
        causal = (q_idx[qs:qe, None] >= k_idx[None, ks:ke])[None] & valid[:, None, ks:ke]
        dist = q_pos[:, qs:qe, None] - k_pos[:, None, ks:ke]
        local = causal & (dist < n_local)
        glob = causal & (dist >= n_local) & is_global[:, None, ks:ke]
        use_l, use_g = bool(local.any()), far and ks < g_end and bool(glob.any())
        if not (use_l or use_g):
            return None
        s = bw.tile_scores(q_rot, kf, qs, qe, ks, ke) if use_l else None
        if use_g:
            kg = min(ke, g_end)
            sg = bw.tile_scores(q_stat, k_stat, qs, qe, ks, kg)
            if kg < ke:
                sg = torch.cat([sg, sg.new_zeros(*sg.shape[:-1], ke - kg)], dim=-1)
            s = sg if s is None else torch.where(glob[:, None, None], sg, s)
        return (s * scale).masked_fill(~(local | glob)[:, None, None], bw.NEG_INF)

    return bw.attend(query, value, score, bw.first_and_band_ranges(kv, lq, g_end, n_local), block_q, block_k)


bw.register_attention(ATTN_NAME, lm_infinite_attention)


@METHODS.register("lm_infinite")
class LMInfinite(Method):
    needs = BLOCKWISE

    @dataclass
    class Args(MethodArgs):
        name: str = "lm_infinite"
        n_global: int = 10  # G: starting tokens always attended (LCEG: 10; a token count)
        n_local: float = 1.0  # M: local window in units of C (LCEG: 4096 = 1 C of LLaMA2)
        limit_distance: float = 0.0  # x C: distance the global tokens are seen at; 0 = n_local (convert_llama_model)
        block_q: int = 256
        block_k: int = 512

    def check(self, native_ctx: int, train=None) -> tuple[int, int]:
        """Checks the settings; returns (n_local, limit_distance) in tokens."""
        a = self.args
        n_local = window_tokens(a.n_local, native_ctx, "method=lm_infinite: n_local", zero_ok=False)
        limit = window_tokens(a.limit_distance, native_ctx, "method=lm_infinite: limit_distance") or n_local
        if n_local < 1 or limit < 1 or a.n_global < 0 or a.block_q < 1 or a.block_k < 1:
            raise ConfigError(f"method=lm_infinite: need n_local and limit_distance >= 1 token (got {n_local}, "
                              f"{limit} tokens = {a.n_local:g} C, {a.limit_distance:g} C), n_global >= 0 (got "
                              f"{a.n_global}), block_q, block_k >= 1")
        return n_local, limit

    def resolved(self, handle) -> tuple[int, int]:
        return self.check(handle.native_ctx)

    def apply(self, handle) -> None:
        a = self.args
        n_local, limit = self.resolved(handle)
        bw.install(handle.model, ATTN_NAME, "harness_lm_infinite", (a.n_global, n_local, limit, a.block_q, a.block_k))
