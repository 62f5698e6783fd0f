"""Model-side primitives shared by every evaluator: chunked token NLL (never a [length x vocab] logit tensor)
and greedy generation with the KV cache (``GrowingCache``: pre-allocated, written in place, no per-token copy)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# the compute-dtype helpers live on the ground floor (training uses them too); re-exported for the evaluators
from harness.device import DTYPES, autocast, fast_bf16_cpu, model_device, resolve_dtype  # noqa: F401


@torch.inference_mode()
def hidden_states(model, input_ids: torch.Tensor, **kw) -> torch.Tensor:
    """Final hidden states [B, L, H] from the decoder stack, without the LM head."""
    out = model.get_decoder()(input_ids=input_ids, use_cache=False, **kw)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


@torch.inference_mode()
def token_nll(model, input_ids: torch.Tensor, chunk: int = 1024, dtype: str = "auto") -> torch.Tensor:
    """Per-token NLL of ``input_ids[:, 1:]`` given the prefix: [B, L-1] float32.

    The LM head and the log-softmax run over ``chunk`` positions at a time, so peak memory is
    O(chunk x vocab) instead of O(L x vocab). The loss is taken on the flattened ``[B*chunk, vocab]`` logits, as
    HF's own ``labels=`` loss does: ``cross_entropy`` over a transposed ``[B, vocab, chunk]`` view (class dim not
    last) takes a strided path that costs ~3x the LM-head matmul itself (``make bench``, ``evals``). On a model split
    over GPUs by ``device_map`` the inputs go to its first GPU and the loss is taken where the LM head is."""
    dev = model_device(model)
    ids = input_ids.to(dev)
    with autocast(dev, dtype):
        h = hidden_states(model, ids)
    head = model.get_output_embeddings()
    B, n = ids.shape[0], ids.shape[1] - 1
    out = []
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        with autocast(dev, dtype):
            logits = head(h[:, s:e])
        logits = logits.float()
        # the labels go to the logits: a model split over GPUs (device_map) returns them on its last GPU
        labels = ids[:, s + 1 : e + 1].to(logits.device)
        nll = F.cross_entropy(logits.reshape(B * (e - s), -1), labels.reshape(-1), reduction="none")
        out.append(nll.view(B, e - s))
    return torch.cat(out, dim=1)


def window_nlls(model, windows: list[list[int]], chunk: int = 1024, dtype: str = "auto", batch_tokens: int = 0,
                cache: dict | None = None) -> list:
    """Per-token NLL (numpy float32, length len(w) - 1) of every token window in ``windows``, in order.

    Windows of the same length are run together in batches of at most ``batch_tokens`` tokens (0 = one at a time):
    no padding, so every method sees exactly the inputs it sees unbatched (checked for every method against B = 1:
    identical NLL). ``cache`` (a dict owned by one evaluation of one model, ``EvalContext.nll_cache``) keeps each
    window's NLL under its token ids, so evaluators that score the same window (``ppl`` at 16C and
    ``nll_by_position``) compute it once."""
    import numpy as np

    out: list = [None] * len(windows)
    keys = [(dtype, len(w), hash(tuple(w))) for w in windows] if cache is not None else [None] * len(windows)
    todo: dict = {}
    for i, (w, k) in enumerate(zip(windows, keys)):
        if cache is not None and k in cache and cache[k][0] == tuple(w):
            out[i] = cache[k][1]
        else:
            todo.setdefault(len(w), []).append(i)
    for n, idx in todo.items():
        per = max(1, batch_tokens // n) if batch_tokens > 0 else 1
        for s in range(0, len(idx), per):
            part = idx[s : s + per]
            nll = token_nll(model, torch.tensor([windows[i] for i in part]), chunk, dtype).cpu().numpy()
            for j, i in enumerate(part):
                out[i] = np.asarray(nll[j], dtype=np.float32)
                if cache is not None:
                    cache[keys[i]] = (tuple(windows[i]), out[i])
    return out


def reuse_order(prompts: list[list[int]]) -> list[int]:
    """Indices of ``prompts`` (token id lists) in lexicographic order: a depth-first walk of their prefix tree, so
    that each prompt shares the longest possible head with the one before it (what ``PrefixCache`` reuses).
    Prompts that branch off a shared haystack at the needle (passkey, NIAH, RULER) then re-encode only their tail."""
    return sorted(range(len(prompts)), key=lambda i: prompts[i])


def greedy_generate(model, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id=None,
                    dtype: str = "auto", stop_ids: tuple = ()) -> list[int]:
    """Greedy decoding with the KV cache for a single prompt [1, L]. Returns the new token ids.
    (A ``PrefixCache`` without prefix reuse: one decoding loop serves both.)"""
    stops = tuple(stop_ids) + ((eos_token_id,) if eos_token_id is not None else ())
    return PrefixCache(model, dtype, enabled=False).generate(input_ids[0].tolist(), max_new_tokens, stop_ids=stops)


class PrefixCache:
    """Greedy generation with the KV cache that reuses the cache of the previous prompt for the longest common
    token prefix: consecutive prompts sharing a head (the same template, the same haystack up to a needle) are
    not re-encoded from scratch. Same results as ``greedy_generate`` up to float rounding (tested).

    The cache is a ``GrowingCache`` sized before the prefill for the prompt plus ``max_new_tokens`` (decoding writes
    each token's keys in place instead of re-allocating the whole cache per token as ``DynamicCache`` does; reuse
    crops it back to the shared head, in place).

    ``enabled=False`` makes it a plain ``greedy_generate``. Methods whose rotary scaling depends on the total
    sequence length (dynamic NTK) compute the reused prefix with the scale of the previous prompt; prompts of
    one evaluation length differ by a few tokens only, and ``reuse_prefix: false`` in the evaluator YAML turns
    the reuse off."""

    def __init__(self, model, dtype: str = "auto", enabled: bool = True):
        self.model, self.dtype, self.enabled = model, dtype, enabled
        self.ids: list[int] = []
        self.cache = None
        self.tokens_reused = 0
        self.tokens_encoded = 0

    def reset(self) -> None:
        self.ids, self.cache = [], None

    def _common_prefix(self, ids: list[int]) -> int:
        if not self.enabled or self.cache is None or not self.ids:
            return 0
        m = min(len(self.ids), len(ids) - 1)  # at least one token must be fed to get logits
        if m <= 0:
            return 0
        import numpy as np

        a, b = np.asarray(self.ids[:m]), np.asarray(ids[:m])
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else m

    @torch.inference_mode()
    def generate(self, ids: list[int], max_new_tokens: int, stop_ids: tuple = ()) -> list[int]:
        dev = model_device(self.model)
        dec, head = self.model.get_decoder(), self.model.get_output_embeddings()
        n = self._common_prefix(ids)
        need = len(ids) + max_new_tokens  # the prompt and every token fed back: known before decoding starts
        if n == 0:
            cache = _growing_cache_classes()[1](capacity=need)
        else:
            cache = self.cache
            extra = cache.get_seq_length() - n
            if extra > 0:
                cache.crop(-extra)
            cache.reserve(need)
        self.cache, self.ids = None, []  # invalid until this prompt is fully encoded
        feed = torch.tensor([ids[n:]], device=dev)
        pos = torch.arange(n, len(ids), device=dev)[None]
        with autocast(dev, self.dtype):
            h = dec(input_ids=feed, past_key_values=cache, use_cache=True, position_ids=pos)
            logits = head(h.last_hidden_state[:, -1:])
        self.tokens_reused += n
        self.tokens_encoded += len(ids) - n
        # room for the generated tokens at the rate the prompt filled the cache (Landmark adds a landmark every
        # mem_freq tokens; every other method one entry per token): one copy now, none while decoding
        cache.reserve(-(-cache.get_seq_length() * need // len(ids)))
        out = self._decode(dec, head, logits, cache, len(ids), max_new_tokens, dev, set(stop_ids))
        if self.enabled:
            extra = cache.get_seq_length() - len(ids)
            if extra > 0:
                cache.crop(-extra)
            self.cache, self.ids = cache, list(ids)
        return out


    def _decode(self, dec, head, logits, cache, n: int, max_new_tokens: int, dev, stops: set) -> list[int]:
        """Greedy decoding of at most ``max_new_tokens`` tokens after a prompt of ``n``, up to the first of
        ``stops`` (excluded). Each token stays on the device and is fed back from there; on an accelerator the host
        reads them every ``STOP_CHECK`` tokens when there are stop tokens to look for (else once, at the end): one
        host sync per ``STOP_CHECK`` tokens instead of one per token, so the host queues the next steps while the
        device runs. The tokens decoded past a stop within its group (at most ``STOP_CHECK - 1`` steps) change
        nothing before it (greedy decoding is causal): the output is the same. On the CPU a read waits for nothing
        and every token is read (no step past a stop)."""
        toks, out = [], []
        every = 1 if dev.type == "cpu" else STOP_CHECK  # on the CPU a read waits for nothing: every token, no waste
        for i in range(max_new_tokens):
            if i:
                with autocast(dev, self.dtype):
                    h = dec(input_ids=toks[-1].view(1, 1), past_key_values=cache, use_cache=True,
                            position_ids=torch.full((1, 1), n + i - 1, device=dev))
                    logits = head(h.last_hidden_state[:, -1:])
            toks.append(logits[0, -1].float().argmax())
            if i == max_new_tokens - 1 or (stops and len(toks) % every == 0):
                read = torch.stack(toks[len(out):]).tolist()
                cut = next((j for j, t in enumerate(read) if t in stops), None)
                if cut is not None:
                    return out + read[:cut]
                out += read
        return out


STOP_CHECK = 4  # decoded tokens between two host reads of them on an accelerator (PrefixCache._decode); not measured
# on a GPU yet: a read per token costs the queueing of the next step, a group of 4 at most 3 steps past a stop


@functools.cache
def _growing_cache_classes():
    """``GrowingLayer`` / ``GrowingCache``, built on transformers' ``DynamicLayer`` / ``DynamicCache`` (imported
    lazily, like every transformers import of this module)."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys/values live in pre-allocated buffers ``[B, H, capacity, D]``: ``update``
        writes the new states in place and returns views of the filled part, so a decoding step copies one token's
        keys, not the whole cache (``DynamicLayer`` re-allocates it with ``torch.cat`` every step). ``keys`` /
        ``values`` are exactly the filled length (methods that run their own attention over the cached keys --
        Self-Extend, LM-Infinite, StreamingLLM, Landmark, DCA -- see what they would see with ``DynamicLayer``;
        ``StaticLayer`` would hand them its zero-padded buffer). Past the capacity the buffers grow to
        ``max(needed, 2 x capacity)`` (one copy, amortised O(1) per token). ``crop`` (inherited) slices the view,
        so the next ``update`` overwrites the dropped tail in place; anything that replaces ``keys`` by another
        tensor (``reorder_cache``, batch selection, offloading) is adopted into fresh buffers on the next update."""

        def __init__(self, capacity: int = 0):
            super().__init__()
            self.capacity = int(capacity)
            self._k = self._v = None

        def reset(self) -> None:
            self._k = self._v = None
            super().reset()

        def buffer_len(self) -> int:
            return 0 if self._k is None else self._k.shape[-2]

        def _owns_views(self) -> bool:
            """``keys``/``values`` are still the views of this layer's buffers (nobody replaced them)."""
            return (self._k is not None and self.keys.shape[:2] == self._k.shape[:2]
                    and self.keys.data_ptr() == self._k.data_ptr() and self.values.data_ptr() == self._v.data_ptr())

        def _regrow(self, like_k, like_v, cap: int) -> None:
            """New buffers of ``cap`` tokens holding the filled part (one copy)."""
            n = self.get_seq_length()
            k = like_k.new_empty((*like_k.shape[:2], cap, like_k.shape[-1]), dtype=self.dtype, device=self.device)
            v = like_v.new_empty((*like_v.shape[:2], cap, like_v.shape[-1]), dtype=self.dtype, device=self.device)
            if n:
                k[..., :n, :].copy_(self.keys)
                v[..., :n, :].copy_(self.values)
            self._k, self._v = k, v
            self.capacity = cap
            self.keys, self.values = k[..., :n, :], v[..., :n, :]

        def reserve(self, total: int) -> None:
            """Room for ``total`` tokens (one copy now instead of a regrow while decoding)."""
            self.capacity = max(self.capacity, int(total))
            if self.is_initialized and self._k is not None and self._owns_views() and self.buffer_len() < total:
                self._regrow(self._k, self._v, self.capacity)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.get_seq_length()
            m = n + key_states.shape[-2]
            if n == 0 and (self._k is None or self._k.shape[:2] != key_states.shape[:2]):
                self._k = self._v = None
            grown = max(m, self.capacity, 2 * self.buffer_len())
            if self._k is None or (n and not self._owns_views()):
                self._regrow(self.keys if n else key_states, self.values if n else value_states, grown)
            elif m > self.buffer_len():
                self._regrow(self._k, self._v, grown)
            self._k[..., n:m, :].copy_(key_states)
            self._v[..., n:m, :].copy_(value_states)
            self.keys, self.values = self._k[..., :m, :], self._v[..., :m, :]
            return self.keys, self.values

    class GrowingCache(DynamicCache):
        """A ``DynamicCache`` of ``GrowingLayer``s (one per decoder layer, created on first use) pre-allocated for
        ``capacity`` tokens; ``reserve(total)`` raises the capacity before a longer prompt + generation."""

        def __init__(self, capacity: int = 0):
            self.capacity = int(capacity)
            Cache.__init__(self, layer_class_to_replicate=lambda: GrowingLayer(self.capacity))

        def reserve(self, total: int) -> None:
            self.capacity = max(self.capacity, int(total))
            for layer in self.layers:
                if isinstance(layer, GrowingLayer):
                    layer.reserve(total)

    return GrowingLayer, GrowingCache


def __getattr__(name: str):
    """``GrowingLayer`` / ``GrowingCache`` on first use (the module imports no transformers at import time)."""
    if name in ("GrowingLayer", "GrowingCache"):
        globals()["GrowingLayer"], globals()["GrowingCache"] = _growing_cache_classes()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
