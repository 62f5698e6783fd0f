"""streaming_llm: StreamingLLM / attention sinks (Xiao et al. 2023; mit-han-lab/streaming-llm), frozen.

What the original does (``streaming_llm/enable_streaming_llm.py::enable_streaming_llm(model, start_size,
recent_size)``):
- ``kv_cache.py::StartRecentKVCache``: after every forward the cache is cut to its first ``start_size`` entries (the
  attention sinks) plus its last ``recent_size`` entries (``__call__``; ``evict_for_space`` makes room for a prompt the
  same way before it is fed).
- ``pos_shift/modify_llama.py::llama_pos_shift_attention_forward``: keys are cached *un-rotated*; at every forward the
  whole cache is rotated at its positions *within the cache* (``key_position_ids = arange(kv_seq_len)``), and the
  query at its ``position_ids``, which transformers 4.33 derives from the (evicted) cache length: the query sits at the
  last cache position. Relative distances therefore never exceed the cache size, however long the stream is.
- ``examples/eval_long_ppl.py`` (the paper's perplexity): the text is fed one token at a time, evicting after each
  step. Token t then attends to keys {0..start_size-1} U {t-recent_size..t} with positions re-indexed inside that set.

Prefill semantics here (a prefill of L tokens equals that token-by-token loop): query i attends to the keys
{0..n_sink-1} U {i-window+1..i}, with positions re-assigned within that set (sinks at 0..n_sink-1, the window right
after them, the query last), one softmax, scale 1/sqrt(head_dim). Equivalently, in relative distances:
- a window key (0 <= i - j < window) keeps its true distance i - j (the window is contiguous, so re-indexing does not
  change distances inside it);
- a sink (one of the first n_sink keys, i - j >= window) is seen at distance min(i, n_sink + window - 1) - j: its
  cache slot j against the query's cache slot, the last one;
- every other key gets exactly zero weight.
So the query's cache holds at most n_sink + window keys and no relative distance reaches n_sink + window. The
original's ``recent_size`` R is ``window = R + 1`` here (its cache holds start_size + R keys after eviction and one
more, the new token, during the forward). Decoding with the KV cache follows the same rule (the query at position t
sees the sinks and the last ``window`` keys of the cache), so greedy decoding equals the dense rule recomputed at
every step; the original's chatbot (``examples/run_streaming_llama.py``) instead feeds a whole prompt in one dense
causal forward after ``evict_for_space``: that prompt-level chunking is not reproduced (each query gets its own
window).

Not LM-Infinite (``lm_infinite.py``): LM-Infinite keeps the true positions of the local band and sees *all* far
global tokens at one clipped "stationary" distance (query rotated at min(limit, kv - 1), key at 0), with no cache
and no position re-assignment. StreamingLLM re-assigns positions inside its cache: the sinks sit at cache slots
0..n_sink-1, each at its own distance (n_sink + window - 1 - j) from the query, and the band keeps its in-cache
(= true) distances.

Settings and units: ``n_sink`` is an absolute count of starting tokens (the original's 4 on every model: the sinks
are the first tokens whatever the window; the paper finds four initial tokens enough);
``window`` is in units of the native window C, and 0 (default) means C - n_sink, so the cache is exactly the native
window (the README FAQ: "the maximum cache size for StreamingLLM on Llama-2 remains 4096"; its chatbot's absolute
start_size 4 + recent_size 2000 on 2048-window models is about the same cache). On LLaMA2-7B the default is
4 + 4092 = 4096 keys.

Implementation: a registered transformers attention function (the model stays stock; its cache keeps post-RoPE keys
at their true positions). The sinks' in-cache distance is obtained by re-rotating the query by
min(q_pos, n_sink + window - 1) - q_pos (rotations compose). Attention is blocked (``_blockwise.py``): each query
block visits only the sink keys and its band, so no [L x L] tensor exists and time is O(L (n_sink + window)).
Decoding keeps the full HF cache (nothing is evicted; only sinks + window are read): memory is not the original's
bounded cache, the arithmetic is. Padding: the sinks are the first n_sink real keys of each row and distances come
from ``position_ids``, so right padding, and left padding with padding-aware position ids, give each row its unpadded
result. No fused (flex) path: ``attention.backend=auto`` runs this reference on every device, ``flex`` is refused
with one line.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import ConfigError, window_tokens
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_streaming_llm"


def streaming_llm_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                            position_ids=None, **kwargs):
    n_sink, window, block_q, block_k = module.harness_streaming_llm
    fx.use_fused(module, query, method="streaming_llm", reason="no fused path is implemented (the blocked reference "
                 "visits only the sinks and the window)")  # auto -> this reference; flex -> one line
    inv = module.harness_inv_freq
    b, h, lq, d = query.shape
    n_kv, kv = key.shape[1], key.shape[2]
    dev = query.device
    scale = bw.default_scaling(module, scaling)
    q_pos, k_pos = bw.positions(position_ids, b, lq, kv, dev)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    is_sink, g_end = bw.first_real_keys(valid, n_sink)  # [B, kv]
    q_idx = torch.arange(kv - lq, kv, device=dev)
    k_idx = torch.arange(kv, device=dev)
    qf, kf = query.float(), key.float()
    q_band = bw.group_q(qf, n_kv)
    last_slot = n_sink + window - 1  # the query's cache slot once the window has left the sinks behind
    shifted = bool((q_pos > last_slot).any())
    q_sink = bw.group_q(bw.rotate(qf, q_pos.clamp(max=last_slot) - q_pos, inv), n_kv) if shifted else q_band

    def score(qs, qe, ks, ke):
        causal = (q_idx[qs:qe, None] >= k_idx[None, ks:ke])[None] & valid[:, None, ks:ke]
        dist = q_pos[:, qs:qe, None] - k_pos[:, None, ks:ke]
        band = causal & (dist < window)
        sink = causal & ~band & is_sink[:, None, ks:ke]
        use_b, use_s = bool(band.any()), ks < g_end and bool(sink.any())
        if not (use_b or use_s):
            return None
        if use_b and use_s and shifted:
            s = torch.where(band[:, None, None], bw.tile_scores(q_band, kf, qs, qe, ks, ke),
                            bw.tile_scores(q_sink, kf, qs, qe, ks, ke))
        else:
            s = bw.tile_scores(q_band if use_b or not shifted else q_sink, kf, qs, qe, ks, ke)
        return (s * scale).masked_fill(~(band | sink)[:, None, None], bw.NEG_INF)

    return bw.attend(query, value, score, bw.first_and_band_ranges(kv, lq, g_end, window), block_q, block_k)


bw.register_attention(ATTN_NAME, streaming_llm_attention)


@METHODS.register("streaming_llm")
class StreamingLLM(Method):
    needs = BLOCKWISE

    @dataclass
    class Args(MethodArgs):
        name: str = "streaming_llm"
        n_sink: int = 4  # attention sinks: the first tokens, always kept (the original's start_size 4; a token count)
        window: float = 0.0  # recent window in units of C, the query included; 0 = C - n_sink (cache = C)
        block_q: int = 256
        block_k: int = 512

    def check(self, native_ctx: int, train=None) -> int:
        """Checks the settings; returns the window in tokens."""
        a = self.args
        if isinstance(a.n_sink, bool) or not isinstance(a.n_sink, int) or a.n_sink < 0:
            raise ConfigError(f"method=streaming_llm: n_sink = {a.n_sink!r} is not a token count (valid: an integer "
                              f">= 0; the original keeps 4)")
        w = window_tokens(a.window, native_ctx, "method=streaming_llm: window")
        if not float(a.window):
            w = native_ctx - a.n_sink
        if w < 1:
            raise ConfigError(f"method=streaming_llm: window = {a.window:g} C = {w} tokens with n_sink = {a.n_sink} "
                              f"and C = {native_ctx}; the recent window needs >= 1 token (valid: window >= "
                              f"{1 / native_ctx:g}, or 0 = C - n_sink with n_sink < C)")
        if a.block_q < 1 or a.block_k < 1:
            raise ConfigError(f"method=streaming_llm: block_q and block_k must be >= 1, got {a.block_q}, {a.block_k}")
        return w

    def apply(self, handle) -> None:
        a = self.args
        w = self.check(handle.native_ctx)
        bw.install(handle.model, ATTN_NAME, "harness_streaming_llm", (a.n_sink, w, a.block_q, a.block_k))
