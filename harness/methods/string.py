"""string: STRING, ShifTed Rotary position embeddING (An et al. 2024, "Why Does the Effective Context Length of LLMs
Fall Short?"; HKUNLP/STRING), frozen.

What the original does (``string_for_llama.py``: ``replace_with_string(max_test_length, shifted_offset,
small_local_value)`` patches the Llama attention ``forward``; ``string_flash_forward`` is the prefill, the
``has_kv_cache`` branch of ``forward`` the decoding; ``vllm_string/.../flash_attn_string.py`` does the same): with
S = shifted_offset and W = small_local_value, a query at position i and a key at position j (i - j = d >= 0) are
- the "diagonal" part, normal RoPE, relative distance d, when d < S (prefill: ``flash_attn_func(..., causal=True,
  window_size=[S, 0])``; decoding: the last S keys of the cache);
- the "shifted" part when d >= S: the query is rotated at ``position_ids - S + W``, the key at its true position, so
  the relative distance is d - S + W (prefill: the last L - S queries against the first L - S keys, causal; decoding:
  the cache except its last S keys). The largest distances (those the paper finds under-trained) are dropped and the
  well-trained ones reused; the W nearest diagonals keep an exact local context (README FAQ).
The two flash passes return their log-sum-exp and are merged with the weights 1 / (1 + exp(lse_other - lse_own)),
which is exactly one softmax over the union of their keys. The patched rotary embedding also multiplies cos and sin
by ``attention_factor = 0.1 * ln(2) + 1`` (both implementations: ``RotaryEmbedding._set_cos_sin_cache`` and vLLM's
``ShiftedRotaryEmbedding.mscale``, "similar with Yarn"), so every logit, short inputs included, is multiplied by
(1 + 0.1 ln 2)^2 ~= 1.143; the paper's position matrix (its Fig. 5) does not involve it. Default: as the code
(``attention_factor: 1.0693``); ``attention_factor: 1`` leaves the logits' scale alone (then an input of at most S
tokens is exactly the unmodified model).

Discrepancy kept as a flag: flash-attention's window [S, 0] is inclusive, so the prefill's diagonal pass also covers
d = S, which the shifted pass covers too: in the original's prefill the key at distance exactly S is counted twice
(once at distance S, once at W), while its decoding (the last S keys) and the paper (d >= S shifted) count it once.
Default ``inclusive_window: false`` = the paper and the original's decoding; ``true`` = the original's prefill (here
applied to prefill and decoding alike, as one exact formula: the doubled key's logit is the log-sum-exp of its two
logits).

Units: ``shifted_offset`` and ``local_window`` are in units of the native window C. The original sets
``shifted_offset = int(0.33 * L)`` with L the training length (README quick start: ``L =
config.max_position_embeddings``; its RULER / InfiniteBench scripts use 0.33 x the test length, the NIAH script 0.5
x, about 0.33 C and 0.5 C at their headline setting, test length = training length = 128K); truncated to
tokens as the original (``int``). ``local_window`` (the original's ``small_local_value``) is an absolute 128 on every
model in the original (C/1024 on Llama 3.1's 128K); here it is C/32, which is the original's 128 on LLaMA2-7B's 4096
(16 tokens on tiny_llama's 512, where C/1024 would round to nothing). Lengths beyond C + S - W give shifted distances
beyond C - 1 again: the original has no limit either (it is meant for inputs within the training length), so none is
reported.

Implementation: a registered transformers attention function (the model stays stock). q/k arrive rotated at their
true positions; the shifted query is q re-rotated by W - S (rotations compose). One blocked online softmax
(``_blockwise.py``) takes, per tile, the diagonal logit where d < S and the shifted one where d >= S (the exact
log-sum-exp merge of the two parts, no [L x L] tensor). GQA keys/values are never expanded. Padding: 2-D masks are
honoured and distances come from ``position_ids`` (left padding needs padding-aware position ids, as ``generate``
builds them). Decoding with the KV cache applies the same rule. Not reproduced: the original's preallocated flash
KV cache and chunked-logits loss (memory plumbing), and its bf16 rounding of the scaled cos/sin. No fused (flex)
path: ``attention.backend=auto`` runs this reference on every device, ``flex`` is refused with one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.config import ConfigError, window_tokens
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_string"
CODE_ATTENTION_FACTOR = 0.1 * math.log(2) + 1  # string_for_llama.py::replace_with_string


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor, offset: int, local: int) -> torch.Tensor:
    """The relative position STRING uses for query position m and key position n (reference formula, [..., q, k]):
    m - n below the offset S, m - n - S + W from S on (the paper's position matrix; the decoding path)."""
    d = q_pos[..., :, None] - k_pos[..., None, :]
    return torch.where(d < offset, d, d - offset + local)


def string_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                     **kwargs):
    offset, local, factor, inclusive, block_q, block_k = module.harness_string
    fx.use_fused(module, query, method="string", reason="no fused path is implemented (the blocked reference merges "
                 "the diagonal and shifted parts exactly)")  # auto -> this reference; flex -> one line
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]
    dev = query.device
    scale = bw.default_scaling(module, scaling) * factor * factor  # cos/sin scaled by the factor: q and k both
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, dev)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    q_idx = torch.arange(kv - lq, kv, device=dev)
    k_idx = torch.arange(kv, device=dev)
    qf, kf = query.float(), key.float()
    q_diag = bw.group_q(qf, n_kv)
    need_shift = bool((q_pos.max() - k_pos.min()) >= offset) if kv > 0 else False
    if need_shift:
        q_shift = bw.group_q(bw.rotate(qf, torch.full_like(q_pos, local - offset), inv), n_kv)

    def score(qs, qe, ks, ke):
        ok = (q_idx[qs:qe, None] >= k_idx[None, ks:ke])[None] & valid[:, None, ks:ke]  # [B, bq, bk]
        dist = q_pos[:, qs:qe, None] - k_pos[:, None, ks:ke]
        near = dist < offset
        use_d = bool((ok & near).any())
        use_s = need_shift and bool((ok & ~near).any())
        if not (use_d or use_s):
            return None
        sd = bw.tile_scores(q_diag, kf, qs, qe, ks, ke) if use_d or (use_s and inclusive) else None
        ss = bw.tile_scores(q_shift, kf, qs, qe, ks, ke) if use_s else None
        if sd is not None and ss is not None:
            s = torch.where(near[:, None, None], sd, ss)
            if inclusive:  # the prefill code's key at d = S, in both passes: exp(a) + exp(b) = exp(logaddexp(a, b))
                s = torch.where((dist == offset)[:, None, None], torch.logaddexp(sd * scale, ss * scale) / scale, s)
        else:
            s = sd if ss is None else ss
        return (s * scale).masked_fill(~ok[:, None, None], bw.NEG_INF)

    def ranges(qs, qe):
        return [(0, min(kv, kv - lq + qe))]

    return bw.attend(query, value, score, ranges, block_q, block_k)


bw.register_attention(ATTN_NAME, string_attention)


@METHODS.register("string")
class String(Method):
    needs = BLOCKWISE

    @dataclass
    class Args(MethodArgs):
        name: str = "string"
        shifted_offset: float = 0.33  # S in units of C (README: int(0.33 * training length)); tokens = int(S * C)
        local_window: float = 0.03125  # W in units of C: C/32 = the original's absolute 128 on LLaMA2-7B (C = 4096)
        attention_factor: float = CODE_ATTENTION_FACTOR  # cos/sin scale of the code (0.1 ln 2 + 1); 1 = none
        inclusive_window: bool = False  # true: the prefill code's doubled key at distance exactly S
        block_q: int = 256  # query rows per block of the blocked attention
        block_k: int = 512  # keys per score tile

    def check(self, native_ctx: int, train=None) -> tuple[int, int]:
        """Checks the settings; returns (S, W) in tokens."""
        a = self.args
        window_tokens(a.shifted_offset, native_ctx, "method=string: shifted_offset", zero_ok=False)
        window_tokens(a.local_window, native_ctx, "method=string: local_window")
        s = int(float(a.shifted_offset) * native_ctx)  # the original truncates: int(0.33 * L)
        w = int(round(float(a.local_window) * native_ctx))
        if not 1 <= s <= native_ctx:
            raise ConfigError(f"method=string: shifted_offset = {a.shifted_offset:g} C = {s} tokens; the offset S must "
                              f"be 1 token .. the native window C = {native_ctx} (valid: {1 / native_ctx:g} <= "
                              f"shifted_offset <= 1; the original uses 0.25 .. 0.5)")
        if w >= s:
            raise ConfigError(f"method=string: local_window = {a.local_window:g} C = {w} tokens is not below "
                              f"shifted_offset = {s} tokens; distances from S on become d - S + W, a shift down only "
                              f"when W < S (valid: 0 <= local_window < shifted_offset)")
        f = a.attention_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ConfigError(f"method=string: attention_factor = {f!r} must be a number > 0 (the code's "
                              f"{CODE_ATTENTION_FACTOR:.6g}; 1 = logits unscaled)")
        if a.block_q < 1 or a.block_k < 1:
            raise ConfigError(f"method=string: block_q and block_k must be >= 1, got {a.block_q}, {a.block_k}")
        return s, w

    def apply(self, handle) -> None:
        a = self.args
        s, w = self.check(handle.native_ctx)
        bw.install(handle.model, ATTN_NAME, "harness_string",
                   (s, w, float(a.attention_factor), bool(a.inclusive_window), a.block_q, a.block_k))
