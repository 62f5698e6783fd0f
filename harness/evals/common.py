"""Model-side primitives shared by every evaluator: chunked token NLL (never a [length x vocab] logit tensor)
and greedy generation with the KV cache."""
from __future__ import annotations

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
    last) takes a strided path that costs ~3x the LM-head matmul itself (``make bench``, ``evals``)."""
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
        nll = F.cross_entropy(logits.reshape(B * (e - s), -1), ids[:, s + 1 : e + 1].reshape(-1), reduction="none")
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
        from transformers import DynamicCache

        dev = model_device(self.model)
        dec, head = self.model.get_decoder(), self.model.get_output_embeddings()
        n = self._common_prefix(ids)
        if n == 0:
            cache = DynamicCache()
        else:
            cache = self.cache
            extra = cache.get_seq_length() - n
            if extra > 0:
                cache.crop(-extra)
        self.cache, self.ids = None, []  # invalid until this prompt is fully encoded
        feed = torch.tensor([ids[n:]], device=dev)
        pos = torch.arange(n, len(ids), device=dev)[None]
        with autocast(dev, self.dtype):
            h = dec(input_ids=feed, past_key_values=cache, use_cache=True, position_ids=pos)
            logits = head(h.last_hidden_state[:, -1:])
        self.tokens_reused += n
        self.tokens_encoded += len(ids) - n
        out: list[int] = []
        stops = set(stop_ids)
        for i in range(max_new_tokens):
            nxt = int(logits[0, -1].float().argmax())
            if nxt in stops:
                break
            out.append(nxt)
            if i == max_new_tokens - 1:
                break
            p = torch.tensor([[len(ids) + i]], device=dev)
            with autocast(dev, self.dtype):
                h = dec(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=cache, use_cache=True,
                        position_ids=p)
                logits = head(h.last_hidden_state[:, -1:])
        if self.enabled:
            extra = cache.get_seq_length() - len(ids)
            if extra > 0:
                cache.crop(-extra)
            self.cache, self.ids = cache, list(ids)
        return out
