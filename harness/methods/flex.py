"""Fused attention backends for the methods whose attention is not plain causal (not a method: it registers nothing;
the pipeline, the ranks and the benchmarks use it through its public names). Selected by config,
``attention.backend``:

- ``reference``: the methods' own blocked tile loops (``_blockwise.py`` and the method files): the tested reference;
- ``flex``: ``torch.nn.attention.flex_attention`` with block masks (``create_block_mask``), no new kernel;
- ``auto`` (default): ``flex`` on CUDA, ``reference`` on CPU (measured: ``make bench``, key ``attention``; on CPU
  torch's flex_attention is an unfused, materialising implementation behind a dynamo trace, ~0.2 s per call).

What each method's fused path computes (every one equals its reference, tested on CPU in
``tests/test_attention_backends.py``):

- Self-Extend: two flex calls, the neighbour band (``0 <= m - n < W``, the normal logits) and the grouped part
  (``m - n >= W``, queries / keys re-rotated to their grouped positions), each returning its log-sum-exp; merged by
  log-sum-exp, which is exactly one softmax over the union (the original's flash path merges the same way).
- LM-Infinite: one flex call over the local band (``0 <= i - j < n_local``), plus the global branch (at most
  ``n_global`` keys seen at the clipped distance) as a plain [L x n_global] matmul; merged by log-sum-exp.
- LongLoRA's S2-Attn (training): one flex call whose mask depends on the head (half the heads in groups of G, the
  other half in groups shifted by G/2; ``s2_impl: roll`` rolls the shifted heads' q/k/v around the call, as the
  original does), instead of one SDPA call per group. Outside training LongLoRA is plain causal attention (SDPA).
- Plain causal attention with document masking (``harness_causal``): causal + key padding + documents found from
  ``position_ids`` that restart (transformers' ``find_packed_sequence_indices`` rule: a new document wherever the
  position does not grow by 1), as one flex block mask instead of transformers' dense [B, 1, L, L] mask. Installed
  for the methods that keep the model's own attention (RoPE methods, LongRoPE2's mixed windows, ``train.doc_masking``)
  when the backend is ``flex`` (or ``auto`` on CUDA while the model uses ``sdpa``); a call with one document and no
  padding goes to SDPA's causal kernel. Entropy-ABF wraps whatever implementation the model has (its query scaling
  happens before), so under ``flex`` it wraps this one.
- Landmark: no fused path. Its grouped softmax needs a normaliser per (query, block) pair, which neither a mask nor a
  pointwise ``score_mod`` can express; the reference stays (``auto`` picks it; an explicit ``flex`` fails clearly).

Kernel policy: CUDA runs ``torch.compile(flex_attention)`` and ``torch.compile(create_block_mask)``, each compiled once
per process with dynamic shapes over one module-level mask function (``band_mask``, see "the kernel" below; block-
sparse: empty tiles are skipped, so the local bands cost O(L x window)); a decoding step (one query) is
``row_attention``; CPU runs flex_attention eagerly. torch 2.13's CPU flex_attention has no backward ("FlexAttention
does not support backward on CPU") and its compiled CPU path has no log-sum-exp; so when a CPU call needs gradients,
the same mask function is evaluated densely here (``dense_attention``: the math flex's eager path performs, tested
equal to it), which makes the training paths' gradients testable on CPU.
Block masks are cached across the layers of one forward (same mask, same positions / padding tensors).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.config import ConfigError
from harness.device import is_accelerator
from harness.methods import _blockwise as bw

BACKENDS = ("auto", "reference", "flex")
CAUSAL_NAME = "harness_causal"
STOCK = ("sdpa", "eager")  # model attention implementations that harness_causal may replace


@dataclass
class AttentionArgs:
    """The ``attention`` config node (conf/config.yaml)."""

    backend: str = "auto"  # auto | reference | flex

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"attention.backend={self.backend!r} is not one of {', '.join(BACKENDS)}")


# ---------------------------------------------------------------------------------------------------- selection
def set_backend(model, backend: str = "auto") -> None:
    """Choose the attention backend of ``model`` (call before ``method.apply``): stored on every attention module
    (``module.harness_attn_backend``, read by the methods' attention functions at call time); a model that still uses
    a stock implementation (sdpa / eager) is switched to ``harness_causal`` when the backend is ``flex``, or ``auto``
    on a CUDA machine, so packed documents get a block mask instead of a dense one."""
    AttentionArgs(backend).validate()
    for m in bw.attention_modules(model):
        m.harness_attn_backend = backend
    impl = getattr(model.config, "_attn_implementation", None)
    if impl in STOCK and (backend == "flex" or (backend == "auto" and torch.cuda.is_available())):
        model.set_attn_implementation(CAUSAL_NAME)


def resolve(module, device: torch.device) -> str:
    """The backend an attention call runs: ``reference`` or ``flex`` (``auto`` resolved by the tensors' device)."""

    b = getattr(module, "harness_attn_backend", "auto")
    if b == "auto":
        return "flex" if is_accelerator(device) else "reference"
    return b


def use_fused(module, query: torch.Tensor, method: str | None = None, reason: str = "") -> bool:
    """True when this call should take the fused path. ``method`` + ``reason``: the method has no fused path; an
    explicit ``flex`` is refused with one clear line, ``auto`` falls back to the reference."""
    b = resolve(module, query.device)
    if method is not None and b != "reference":
        if getattr(module, "harness_attn_backend", "auto") == "auto":
            return False
        raise ValueError(f"attention.backend={b} is not available for method={method}: {reason}; "
                         f"use attention.backend=reference (or auto)")
    return b != "reference"


# ---------------------------------------------------------------------------------------------------- the kernel
# On a GPU, flex_attention and create_block_mask run compiled: ONE ``torch.compile`` of each per process and backend,
# with dynamic shapes, so that prefill, decoding and prefix reuse at any length, for every method, reuse the same few
# graphs. What keeps dynamo's guards from failing call after call: every mask is the same module-level mask function
# (``band_mask``: its code object is the one dynamo guards on), and everything that varies between calls (positions,
# padding, documents, the query offset, the band's bounds) is a tensor it reads, never a Python number captured in a
# closure (a number is specialised: a new graph per value, and past ``torch._dynamo.config.recompile_limit`` (8) dynamo
# stops compiling and every later call runs the unfused, materialising flex_attention: [B, H, L, L] scores).
# The inputs are canonical too: q/k/v contiguous (a KV cache's views have strides that follow its capacity), no tensor
# captured twice (``q_pos is k_pos`` at a prefill is a guard), and the compiled calls trace without duck sizing (Lq ==
# KV at a prefill would tie two symbols) and size-oblivious (batch 1 and 2 share one graph): what is left is bounded
# whatever the length, batch, padding or reuse (a query of one block or several; with or without log-sum-exp).
# ``tests/test_flex_compile.py`` counts the compilations and the calls that ran outside a compiled graph under
# dynamo's own guards (backend "eager" on the CPU).
KERNEL_BACKEND = "inductor"  # torch.compile's backend for the accelerator's kernels
_KERNELS: dict = {}  # backend -> (compiled flex_attention, compiled create_block_mask)
_MASKS: list = []  # [(key, tensors, BlockMask)], most recent last
BIG = 2**62  # an unbounded band


def kernels(device: torch.device):
    """``(flex_attention, create_block_mask)`` as they run on ``device``: compiled once per process (dynamic shapes)
    on a GPU, eager on the CPU (torch's CPU flex is an unfused implementation either way: ``make bench``)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not is_accelerator(device):
        return flex_attention, create_block_mask
    backend = KERNEL_BACKEND
    if backend not in _KERNELS:
        _KERNELS[backend] = (_no_fallback(torch.compile(flex_attention, backend=backend, dynamic=True)),
                             _no_fallback(torch.compile(create_block_mask, backend=backend, dynamic=True)))
    return _KERNELS[backend]


class KernelFallback(RuntimeError):
    """A compiled flex kernel reached dynamo's recompile limit: the call would run unfused."""


def _no_fallback(compiled):
    """``compiled`` with dynamo's fallback made an error: past ``recompile_limit`` graphs of one kernel dynamo would
    run every later call unfused (flex_attention then materialises the [B, H, Lq, KV] scores: ~16 GiB at 16k on
    LLaMA-2-7B, with a warning printed once); here that call raises ``KernelFallback`` in one line instead
    (``torch._dynamo.config.fail_on_recompile_limit_hit``, set for these calls only, with the tracing settings of
    the kernel notes above)."""

    def call(*args, **kwargs):
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), \
                    torch.fx.experimental._config.patch(use_duck_shape=False, backed_size_oblivious=True):
                return compiled(*args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as e:
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            raise KernelFallback(f"a compiled flex kernel reached torch._dynamo's recompile_limit "
                                 f"({torch._dynamo.config.recompile_limit} graphs) at inputs {shapes}: it would run "
                                 f"unfused from here on (the [B, H, Lq, KV] scores in memory); "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    return call


def run_kernel(fn, *args, **kwargs):
    """The one place a flex kernel (flex_attention, create_block_mask) is called. (The test suite's virtual node,
    ``tests/virtual_node.py``, runs it on the CPU data behind its emulated GPUs.)"""
    return fn(*args, **kwargs)


def band_mask(q_pos, k_pos, valid, docs, off, lo, hi):
    """The mask of every non-training fused path: key ``ki`` is visible from query ``qi`` when it is not in the future
    (``qi + off >= ki``), not padding (``valid [B, KV]``), in the query's document (``docs [B, KV]``, the documents of
    the keys; the query's is ``docs[b, qi + off]``) and at a distance ``q_pos - k_pos`` in ``[lo, hi)``
    (``q_pos [B, Lq]``, ``k_pos [B, KV]``). ``off``, ``lo``, ``hi``: 0-d tensors. One code object for every method,
    length and offset (see the kernel notes above)."""

    def mask(b, h, qi, ki):
        d = q_pos[b, qi] - k_pos[b, ki]
        return (qi + off >= ki) & valid[b, ki] & (docs[b, qi + off] == docs[b, ki]) & (d >= lo) & (d < hi)

    return mask


def band(q_pos, k_pos, valid, off: int, lo: int = -BIG, hi: int = BIG, docs=None):
    """``band_mask`` and its tensors: ``(mask_mod, tensors)`` for :func:`flex` (``docs`` None: one document)."""
    dev = valid.device
    # never an expanded (stride-0) view: one stride pattern
    q_pos, k_pos, valid = q_pos.contiguous(), k_pos.contiguous(), valid.contiguous()
    if k_pos.untyped_storage().data_ptr() == q_pos.untyped_storage().data_ptr():
        k_pos = k_pos.clone()  # never one tensor twice: dynamo guards on the aliasing (a graph with, one without)
    if docs is None:
        docs = torch.zeros(valid.shape, dtype=torch.int64, device=dev)
    scalars = tuple(torch.tensor(x, dtype=torch.int64, device=dev) for x in (off, lo, hi))
    tensors = (q_pos, k_pos, valid, docs, *scalars)
    return band_mask(*tensors), tensors


def block_mask(mask_mod, key: tuple, tensors: tuple, batch: int, heads: int | None, q_len: int, kv_len: int,
               device: torch.device, source: tuple | None = None):
    """``create_block_mask`` with a small cache: the layers of one forward share one block mask. ``source``: the
    tensors the mask's ``tensors`` were derived from (the forward's ``position_ids`` and padding mask, each possibly
    None) -- a cached mask with the same ``key`` (kind, parameters, sizes) made from the very same source tensors,
    unmodified since (their version counters), is reused without reading a device value (no host sync per layer).
    Without ``source`` the captured ``tensors`` themselves are compared (``torch.equal``: a host sync each)."""
    full_key = (key, batch, heads, q_len, kv_len, str(device))
    for k, ts, bm in reversed(_MASKS):
        if k != full_key:
            continue
        if source is not None and isinstance(ts, _Source) and ts.same(source):
            return bm
        if source is None and not isinstance(ts, _Source) and \
                all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(ts, tensors)):
            return bm
    bm = run_kernel(kernels(device)[1], mask_mod, batch, heads, q_len, kv_len, device=device)
    kept = _Source(source) if source is not None else tuple(t.detach().clone() for t in tensors)
    _MASKS.append((full_key, kept, bm))
    del _MASKS[:-8]
    return bm


class _Source:
    """The source tensors of a cached block mask, held (so no other tensor takes their identity while cached) with
    their version counters (an in-place change makes them another source). An inference tensor has no version
    counter; it is matched by identity alone (the harness never changes position ids or padding masks in place)."""

    def __init__(self, tensors: tuple):
        self.tensors = tuple(tensors)
        self.versions = tuple(_version(t) for t in self.tensors)

    def same(self, tensors: tuple) -> bool:
        return len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors)) and \
            all(_version(t) == v for t, v in zip(tensors, self.versions))


def _version(t):
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter
        return None


def dense_attention(q, k, v, mask_mod, scale: float):
    """The math of flex_attention with a mask function, evaluated densely in float32 (differentiable on any device):
    q [B, H, Lq, D], k/v [B, H_kv, KV, D] -> (out [B, H, Lq, D] float32, lse [B, H, Lq] natural log, -inf for rows
    with no visible key, whose output is 0 as flex's)."""
    b, h, lq, _ = q.shape
    n_kv, kv = k.shape[1], k.shape[2]
    dev = q.device
    idx = (torch.arange(b, device=dev)[:, None, None, None], torch.arange(h, device=dev)[None, :, None, None],
           torch.arange(lq, device=dev)[None, None, :, None], torch.arange(kv, device=dev)[None, None, None, :])
    m = mask_mod(*idx).expand(b, h, lq, kv)
    g = h // n_kv
    kk = k.float().repeat_interleave(g, dim=1) if g > 1 else k.float()
    vv = v.float().repeat_interleave(g, dim=1) if g > 1 else v.float()
    s = torch.matmul(q.float(), kk.transpose(-1, -2)) * scale
    seen = m.any(-1)
    lse = torch.logsumexp(torch.where(m, s, torch.where(seen[..., None], bw.NEG_INF, 0.0)), dim=-1)
    lse = torch.where(seen, lse, torch.full_like(lse, bw.NEG_INF))
    p = torch.exp(s - torch.where(seen, lse, 0.0)[..., None]) * m
    return torch.matmul(p, vv), lse


def row_attention(q, k, v, mask_mod, scale: float):
    """Attention of one query row per head (decoding, Lq = 1) with a mask function, without flex: scores [B, H, 1, KV]
    in the inputs' dtype (GQA by grouping the query heads, no copy of the keys), softmax in float32 -> (out [B, H, 1,
    D] float32, lse [B, H, 1]). O(KV) memory, as a decoding kernel; no block mask to build per step and no
    query-length-1 graph for dynamo to specialise."""
    b, h, lq, d = q.shape
    n_kv, kv = k.shape[1], k.shape[2]
    g = h // n_kv
    dev = q.device
    idx = (torch.arange(b, device=dev)[:, None, None, None], torch.arange(h, device=dev)[None, :, None, None],
           torch.arange(lq, device=dev)[None, None, :, None], torch.arange(kv, device=dev)[None, None, None, :])
    m = mask_mod(*idx).expand(b, h, lq, kv)
    s = torch.matmul(q.reshape(b, n_kv, g * lq, d), k.transpose(-1, -2)).float().view(b, h, lq, kv) * scale
    seen = m.any(-1)
    lse = torch.logsumexp(torch.where(m, s, torch.where(seen[..., None], bw.NEG_INF, 0.0)), dim=-1)
    lse = torch.where(seen, lse, torch.full_like(lse, bw.NEG_INF))
    p = torch.exp(s - torch.where(seen, lse, 0.0)[..., None]) * m
    out = torch.matmul(p.view(b, n_kv, g * lq, kv).to(v.dtype), v).float().view(b, h, lq, d)
    return out, lse


def flex(q, k, v, mask_mod, key: tuple, tensors: tuple, scale: float, heads: bool = False, lse: bool = False,
         source: tuple | None = None):
    """One flex_attention call: q [B, H, Lq, D], k/v [B, H_kv, KV, D] (GQA not expanded) -> out [B, H, Lq, D]
    (float32 when ``lse``, else q's dtype) and, with ``lse``, the log-sum-exp [B, H, Lq] (float32, natural log).
    ``mask_mod(b, h, q_idx, kv_idx)`` indexes the captured ``tensors``; ``heads``: the mask depends on the head.
    A decoding step (one query) is :func:`row_attention`. ``source``: what ``tensors`` were derived from
    (:func:`block_mask`)."""
    b, h, lq, _ = q.shape
    kv = k.shape[2]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.device.type == "cpu" and grad:
        out, l_ = dense_attention(q, k, v, mask_mod, scale)
        return (out, l_) if lse else out.to(q.dtype)
    if lq == 1 and not grad:
        out, l_ = row_attention(q, k, v, mask_mod, scale)
        return (out, l_) if lse else out.to(q.dtype)
    from torch.nn.attention.flex_attention import AuxRequest

    bm = block_mask(mask_mod, key, tensors, b, h if heads else None, lq, kv, q.device, source)
    # a contiguous query (a projection's transposed view, or a re-rotated copy): one stride pattern for dynamo
    res = run_kernel(kernels(q.device)[0], q.contiguous(), k.contiguous(), v.contiguous(), block_mask=bm, scale=scale,
                     enable_gqa=k.shape[1] != h, return_aux=AuxRequest(lse=True) if lse else None)
    if lse:
        out, aux = res
        return out.float(), aux.lse.float()
    return res


def merge(parts) -> torch.Tensor:
    """Log-sum-exp merge of attention over disjoint key sets: [(out [B, H, L, D], lse [B, H, L])] -> the output of
    one softmax over their union (float32). Rows that see no key anywhere give 0."""
    lses = torch.stack([lse for _, lse in parts])
    m = lses.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lses - m)
    den = w.sum(0)
    out = sum(o.float() * w[i][..., None] for i, (o, _) in enumerate(parts))
    return out / torch.where(den > 0, den, torch.ones_like(den))[..., None]


def attention_result(out: torch.Tensor, query: torch.Tensor):
    """An AttentionInterface return value: (out [B, L, H, D] in the query's dtype, no weights)."""
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def attention_context(query, key, attention_mask, position_ids):
    b, _, lq, _ = query.shape
    kv = key.shape[2]
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, query.device)
    valid = bw.key_valid(attention_mask, b, kv, query.device)
    return q_pos, k_pos, valid, kv - lq


# ---------------------------------------------------------------------------------------------------- Self-Extend
def self_extend(module, query, key, value, attention_mask, scale: float, position_ids, window: int, group: int,
                shift: float):
    """Self-Extend (neighbour band + grouped positions, one softmax) as two flex calls merged by log-sum-exp."""
    q_pos, k_pos, valid, off = attention_context(query, key, attention_mask, position_ids)
    inv = module.harness_inv_freq
    src = (position_ids, attention_mask)
    near, tensors = band(q_pos, k_pos, valid, off, hi=window)
    parts = [flex(query, key, value, near, ("se_near", window, off), tensors, scale, lse=True, source=src)]
    # the grouped part always runs (no host read of whether any distance reaches the window: a part with no visible
    # key has log-sum-exp -inf and adds exactly nothing to the merge)
    qg_pos = torch.div(q_pos, group, rounding_mode="floor") + shift
    kg_pos = torch.div(k_pos, group, rounding_mode="floor")
    q_grp = bw.rotate(query.float(), qg_pos - q_pos, inv).to(query.dtype)
    k_grp = bw.rotate(key.float(), kg_pos - k_pos, inv).to(key.dtype)
    far, tensors = band(q_pos, k_pos, valid, off, lo=window)
    parts.append(flex(q_grp, k_grp, value, far, ("se_far", window, off), tensors, scale, lse=True, source=src))
    return attention_result(merge(parts), query)


# ---------------------------------------------------------------------------------------------------- LM-Infinite
def lm_infinite(module, query, key, value, attention_mask, scale: float, position_ids, n_global: int, n_local: int,
                limit: int):
    """LM-Infinite's Lambda mask: the local band through flex, the (at most n_global) global keys seen at the
    clipped distance as a small dense matmul, merged by log-sum-exp."""
    q_pos, k_pos, valid, off = attention_context(query, key, attention_mask, position_ids)
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]

    local, tensors = band(q_pos, k_pos, valid, off, hi=n_local)
    parts = [flex(query, key, value, local, ("lmi_local", n_local, off), tensors, scale, lse=True,
                  source=(position_ids, attention_mask))]
    rank = valid.long().cumsum(-1) - 1
    is_global = valid & (rank < n_global)
    if attention_mask is None:  # no padding: the first n_global keys, known without reading a device value
        g_end = min(n_global, kv)
    else:
        g_end = int(is_global.nonzero()[:, 1].max()) + 1 if bool(is_global.any()) else 0
    # the global branch always runs when there are global keys (no host read of whether one is beyond the local band:
    # a row that sees none has log-sum-exp -inf and adds exactly nothing to the merge)
    if g_end:
        d_star = min(limit, kv - 1)
        q_stat = bw.group_q(bw.rotate(query.float(), d_star - q_pos, inv), n_kv)  # [B, H_kv, g, Lq, D]
        k_stat = bw.rotate(key[:, :, :g_end].float(), -k_pos[:, :g_end], inv)  # [B, H_kv, g_end, D]
        s = torch.matmul(q_stat, k_stat[:, :, None].transpose(-1, -2)) * scale  # [B, H_kv, g, Lq, g_end]
        q_idx = torch.arange(off, kv, device=query.device)
        k_idx = torch.arange(g_end, device=query.device)
        glob = ((q_idx[:, None] >= k_idx[None])[None] & is_global[:, None, :g_end]
                & (q_pos[:, :, None] - k_pos[:, None, :g_end] >= n_local))  # [B, Lq, g_end]
        glob = glob[:, None, None]
        seen = glob.any(-1)
        lse = torch.logsumexp(torch.where(glob, s, torch.where(seen[..., None], bw.NEG_INF, 0.0)), dim=-1)
        lse = torch.where(seen, lse, torch.full_like(lse, bw.NEG_INF))
        p = torch.exp(s - torch.where(seen, lse, 0.0)[..., None]) * glob
        out = torch.matmul(p, value[:, :, None, :g_end].float())  # [B, H_kv, g, Lq, D]
        parts.append((out.reshape(b, h, lq, d), lse.reshape(b, h, lq)))
    return attention_result(merge(parts), query)


# ---------------------------------------------------------------------------------------------------- S2-Attn
def s2(query, key, value, attention_mask, scale: float, group: int, shift: bool, impl: str):
    """LongLoRA's shifted sparse attention in one flex call (training: q/k/v [B, *, N, D], N % group == 0)."""
    b, h, n, d = query.shape
    valid = bw.key_valid(attention_mask, b, n, query.device)
    h0 = h // 2 if shift else h
    if impl == "roll" and h0 < h:  # forward_noflashattn: roll(-G//2) the shifted heads, roll(G//2) back
        r = -group // 2
        rep = h // key.shape[1]
        k = key.repeat_interleave(rep, dim=1) if rep > 1 else key
        v = value.repeat_interleave(rep, dim=1) if rep > 1 else value
        q = torch.cat([query[:, :h0], query[:, h0:].roll(r, 2)], dim=1)
        k = torch.cat([k[:, :h0], k[:, h0:].roll(r, 2)], dim=1)
        v = torch.cat([v[:, :h0], v[:, h0:].roll(r, 2)], dim=1)
        valid_r = valid.roll(r, 1)

        def rolled(bi, hi, qi, ki):
            ok = torch.where(hi < h0, valid[bi, ki], valid_r[bi, ki])
            return ((qi >= ki) & ok & (qi // group == ki // group)) | (qi == ki)

        o = flex(q, k, v, rolled, ("s2_roll", group, h0), (valid,), scale, heads=True, source=(attention_mask,))
        return attention_result(torch.cat([o[:, :h0], o[:, h0:].roll(group // 2, 2)], dim=1), query)
    front = group - group // 2  # forward_flashattn: segments [0, G//2), [G//2, G//2 + G), ... on shifted heads

    def segments(bi, hi, qi, ki):
        sq = torch.where(hi < h0, qi // group, (qi + front) // group)
        sk = torch.where(hi < h0, ki // group, (ki + front) // group)
        return ((qi >= ki) & valid[bi, ki] & (sq == sk)) | (qi == ki)

    return attention_result(flex(query, key, value, segments, ("s2", group, h0), (valid,), scale, heads=True,
                                 source=(attention_mask,)), query)


# ---------------------------------------------------------------------------------------------------- documents
def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] document index of every token: a new document wherever the position does not grow by exactly 1
    (transformers' ``find_packed_sequence_indices``)."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


_DOCS: list = []  # [(_Source of the position ids, (batch, length, device), documents or None)], most recent last


def packed_documents(position_ids, b: int, lq: int, device) -> torch.Tensor | None:
    """[B, L] document ids when ``position_ids`` restart (several packed documents), else None. Whether they
    restart is a host read of a device value; the layers of one forward share the answer (the same position ids,
    unmodified: ``_Source``), so it is read once per forward, not once per layer."""
    where = (b, lq, str(device))
    for src, w, docs in reversed(_DOCS):
        if w == where and src.same((position_ids,)):
            return docs
    ids = document_ids(position_ids.to(device).expand(b, lq))
    docs = ids if bool((ids[:, -1] > 0).any()) else None
    _DOCS.append((_Source((position_ids,)), where, docs))
    del _DOCS[:-4]
    return docs


def causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                     **kwargs):
    """``harness_causal``: causal attention with key padding and document masking, as one flex block mask; SDPA's
    causal kernel when there is a single document and no padding."""
    b, h, lq, d = query.shape
    kv = key.shape[2]
    scale = bw.default_scaling(module, scaling)
    gqa = key.shape[1] != h
    docs = None
    if position_ids is not None and attention_mask is None and kv == lq:
        docs = packed_documents(position_ids, b, lq, query.device)
    if docs is None and attention_mask is None and (kv == lq or lq == 1):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=kv == lq and lq > 1, scale=scale,
                                             enable_gqa=gqa)
        return out.transpose(1, 2).contiguous(), None
    valid = bw.key_valid(attention_mask, b, kv, query.device)
    off = kv - lq
    q_pos = torch.zeros(b, lq, dtype=torch.int64, device=query.device)
    k_pos = torch.zeros(b, kv, dtype=torch.int64, device=query.device)
    mask, tensors = band(q_pos, k_pos, valid, off, docs=docs)
    return attention_result(flex(query, key, value, mask, ("causal", off, docs is not None), tensors, scale,
                                 source=(position_ids, attention_mask)), query)


bw.register_attention(CAUSAL_NAME, causal_attention)


__all__ = ["AttentionArgs", "BACKENDS", "CAUSAL_NAME", "band", "band_mask", "block_mask", "causal_attention",
           "dense_attention", "document_ids", "flex", "kernels", "lm_infinite", "merge", "resolve", "row_attention",
           "run_kernel", "s2", "self_extend", "set_backend", "use_fused"]
