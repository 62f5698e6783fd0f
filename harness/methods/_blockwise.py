"""Shared plumbing for the approximate-attention methods (not a method: the leading underscore keeps it out of the
registry's autoload).

- ``register_attention(name, fn)``: registers ``fn`` with transformers' ``AttentionInterface`` and a mask builder
  with ``AttentionMaskInterface`` that hands the attention function the plain 2-D key-padding mask ``[B, kv]``
  (bool, True = real token) instead of a dense 4-D mask; causality is applied inside the attention functions.
- ``rotate``: re-rotate already-RoPE-rotated q/k by a position delta (rotations compose: R(a)R(b) = R(a+b)), in the
  rotate_half layout transformers uses, angles computed in float64.
- ``online_softmax_attention``: a blocked attention kernel (query blocks x key tiles, running max / sum as in
  FlashAttention) that never materialises more than one [block_q x block_k] score tile per head; the method supplies
  the key ranges each query block needs and a per-tile score function (which may mix several logit sets, e.g. the
  neighbour and grouped logits of Self-Extend). GQA: queries are viewed as [B, H_kv, groups, L, D], keys/values are
  never expanded.
"""
from __future__ import annotations

import math

import torch

from harness.methods.rope import require_static_rope, rotary_modules

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------------- registration
def padding_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """Mask builder for our attention names: the 2-D key-padding mask (or None when there is no padding)."""
    if attention_mask is None:
        return None
    m = attention_mask.to(torch.bool)
    if kv_length is not None and m.shape[-1] > kv_length:
        m = m[:, -kv_length:]
    return None if bool(m.all()) else m


def register_attention(name: str, fn) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, padding_mask)


def attention_modules(model) -> list:
    """The self-attention modules of a Llama-family decoder (anything with q_proj/k_proj/v_proj/o_proj)."""
    return [m for m in model.modules() if all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj"))]


def sliding_window(config) -> int | None:
    """The sliding attention window a config applies (Mistral-7B-v0.1: 4096), None when every layer is full."""
    sw = getattr(config, "sliding_window", None)
    if not sw or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(sw)


def attach_rope(model) -> torch.Tensor:
    """Store the model's RoPE inverse frequencies on every attention module (``module.harness_inv_freq``)."""

    rot = rotary_modules(model)
    if not rot:
        raise ValueError("model has no rotary embedding module")
    inv = rot[0].inv_freq.detach().to(torch.float64).clone()
    for m in attention_modules(model):
        m.harness_inv_freq = inv
    return inv


def install(model, attn_name: str, attr: str, settings: tuple) -> None:
    """Switch ``model`` to the registered attention ``attn_name``: RoPE frequencies and ``settings`` (stored as
    ``module.<attr>``) on every attention module, then ``set_attn_implementation``. A checkpoint whose config carries
    a static rope scaling with attention factor 1 (Llama-3.1's ``llama3``, a PI checkpoint's ``linear``) keeps it;
    a length-dependent one or one with an attention factor (dynamic NTK, YaRN, LongRoPE) is refused with one line."""

    require_static_rope(model, f"method={attn_name.removeprefix('harness_')}")
    # these attention functions see every key their scheme allows, as the originals (LongLM, LM-Infinite, ...) do on
    # Mistral: a sliding window in the config is not applied; the method's params() records that (checkpoint_attention)
    model.harness_sliding_window_dropped = sliding_window(model.config)
    attach_rope(model)
    for m in attention_modules(model):
        setattr(m, attr, settings)
    model.set_attn_implementation(attn_name)


# ---------------------------------------------------------------------------------------------------- positions
def key_valid(attention_mask, batch: int, kv_len: int, device) -> torch.Tensor:
    """[B, kv] bool: True for real keys. ``attention_mask`` is what ``padding_mask`` returned (2-D or None)."""
    if attention_mask is None:
        return torch.ones(batch, kv_len, dtype=torch.bool, device=device)
    if attention_mask.dim() != 2:
        raise ValueError("approximate-attention methods take a 2-D padding mask, not a prepared 4-D mask")
    m = attention_mask.to(device=device, dtype=torch.bool)
    if m.shape[-1] < kv_len:  # mask shorter than the cache: the missing (oldest) keys are real
        m = torch.cat([m.new_ones(m.shape[0], kv_len - m.shape[-1]), m], dim=-1)
    return m[:, -kv_len:].expand(batch, kv_len)


def positions(position_ids, batch: int, q_len: int, kv_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pos [B, q], k_pos [B, kv]) as int64: the positions RoPE rotated the queries / keys with. Cached keys are
    taken to be contiguous and to end right before the first query (true for every cache this harness uses)."""
    if position_ids is None:
        q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[None].expand(batch, q_len)
    else:
        q_pos = position_ids.to(device=device, dtype=torch.long).expand(batch, q_len)
    past = kv_len - q_len
    if past == 0:
        return q_pos, q_pos
    start = q_pos[:, :1] - past
    k_past = start + torch.arange(past, device=device)[None]
    return q_pos, torch.cat([k_past, q_pos], dim=1)


# ---------------------------------------------------------------------------------------------------- RoPE
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, H, L, D] (already RoPE-rotated) by ``delta`` positions: [B, L] or [L] (int or float).
    Only the first 2*len(inv_freq) dims rotate (partial rotary)."""
    rd = 2 * inv_freq.shape[0]
    d = delta.to(torch.float64)
    if d.dim() == 1:
        d = d[None]
    ang = d[..., None] * inv_freq.to(device=x.device, dtype=torch.float64)  # [B, L, rd/2]
    ang = torch.cat((ang, ang), dim=-1)[:, None]  # [B, 1, L, rd]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xr = x[..., :rd]
    out = xr * cos + rotate_half(xr) * sin
    return out if rd == x.shape[-1] else torch.cat((out, x[..., rd:]), dim=-1)


def rotate_each(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Like ``rotate`` but ``delta`` has shape x.shape[:-1] (or broadcasts to it): one delta per vector."""
    rd = 2 * inv_freq.shape[0]
    ang = delta.to(torch.float64)[..., None] * inv_freq.to(device=x.device, dtype=torch.float64)
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xr = x[..., :rd]
    out = xr * cos + rotate_half(xr) * sin
    return out if rd == x.shape[-1] else torch.cat((out, x[..., rd:]), dim=-1)


# ---------------------------------------------------------------------------------------------------- kernel
def group_q(q: torch.Tensor, n_kv: int) -> torch.Tensor:
    """[B, H, L, D] -> [B, H_kv, H/H_kv, L, D] (head h uses kv head h // (H/H_kv), as transformers' repeat_kv)."""
    b, h, L, d = q.shape
    return q.view(b, n_kv, h // n_kv, L, d)


def tile_scores(qg: torch.Tensor, k: torch.Tensor, qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
    """Raw dot products of query rows [qs, qe) and keys [ks, ke): [B, H_kv, g, bq, bk]."""
    return torch.matmul(qg[:, :, :, qs:qe], k[:, :, None, ks:ke].transpose(-1, -2))


def online_softmax_attention(qg_shape, v: torch.Tensor, score_fn, key_ranges, block_q: int = 256,
                             block_k: int = 512) -> torch.Tensor:
    """softmax(scores) @ v, blocked. ``qg_shape`` = (B, H_kv, g, L_q, D); ``v`` [B, H_kv, kv, D];
    ``key_ranges(qs, qe)`` -> list of (ks, ke) key-index ranges query rows [qs, qe) may attend to;
    ``score_fn(qs, qe, ks, ke)`` -> scaled scores [B, H_kv, g, bq, bk] with -inf where masked, or None to skip.
    Rows with no visible key get a zero output. Returns [B, H_kv*g, L_q, D] in v's dtype (fp32 accumulation)."""
    b, n_kv, g, lq, d = qg_shape
    outs = []
    for qs in range(0, lq, block_q):
        qe = min(lq, qs + block_q)
        m = torch.full((b, n_kv, g, qe - qs), NEG_INF, device=v.device, dtype=torch.float32)
        den = torch.zeros_like(m)
        acc = torch.zeros(b, n_kv, g, qe - qs, d, device=v.device, dtype=torch.float32)
        for ks0, ke0 in key_ranges(qs, qe):
            for ks in range(ks0, ke0, block_k):
                ke = min(ke0, ks + block_k)
                s = score_fn(qs, qe, ks, ke)
                if s is None:
                    continue
                s = s.float()
                m_new = torch.maximum(m, s.amax(dim=-1))
                m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - m_safe[..., None])
                corr = torch.exp(m - m_safe)
                den = den * corr + p.sum(dim=-1)
                acc = acc * corr[..., None] + torch.matmul(p, v[:, :, None, ks:ke].float())
                m = m_new
        out = acc / torch.where(den > 0, den, torch.ones_like(den))[..., None]
        outs.append(out)
    out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
    return out.reshape(b, n_kv * g, lq, d).to(v.dtype)


def attend(query: torch.Tensor, value: torch.Tensor, score_fn, key_ranges, block_q: int, block_k: int):
    """``online_softmax_attention`` for an AttentionInterface function: query [B, H, L_q, D] -> the interface's
    (output [B, L_q, H, D] in the query's dtype, no attention weights)."""
    b, h, lq, d = query.shape
    n_kv = value.shape[1]
    out = online_softmax_attention((b, n_kv, h // n_kv, lq, d), value, score_fn, key_ranges, block_q, block_k)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(r for r in ranges if r[1] > r[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def first_real_keys(valid: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """The first ``n`` real (unpadded) keys of each row ([B, kv] mask; LM-Infinite's global tokens, StreamingLLM's
    sinks) and the key index one past the last of them over the batch (0 when there is none)."""
    rank = valid.long().cumsum(-1) - 1  # index among the real keys of the row
    first = valid & (rank < n)
    return first, (int(first.nonzero()[:, 1].max()) + 1 if bool(first.any()) else 0)


def first_and_band_ranges(kv: int, lq: int, n_first: int, band: int):
    """``ranges(qs, qe)`` for ``attend``: the key ranges a query block [qs, qe) visits when each query sees the first
    ``n_first`` keys and its own last ``band`` keys (LM-Infinite's global + local branches, StreamingLLM's sinks +
    window). ``kv`` keys, the ``lq`` queries are the last ``lq`` of them."""
    def ranges(qs, qe):
        first, last = kv - lq + qs, kv - lq + qe  # key indices of the block's first query, one past the last
        return merge_ranges([(0, min(n_first, last)), (max(0, first - band + 1), last)])

    return ranges


def default_scaling(module, scaling):
    return scaling if scaling is not None else 1.0 / math.sqrt(module.head_dim)
