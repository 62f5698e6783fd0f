"""Fitness of RoPE factor candidates: perplexity at the target length (LongRoPE) or needle-driven perplexity
(LongRoPE2), evaluated for many candidates in one batched forward.

Batching candidates: every rotary module of the model is temporarily replaced by ``CandidateRotary``, which holds
one frequency vector, one attention factor and one ``n_hat`` per *batch row*; the decoder then runs a batch whose
rows are (candidate, document) pairs, and ``harness.evals.common.token_nll`` (chunked loss, the evaluators' code)
scores it. Row ``r`` computes exactly what transformers' ``"longrope"`` rotary computes for a sequence longer than
``original_max_position_embeddings`` with ``long_factor = lam_r`` and ``attention_factor = mscale_r``
(``tests/test_search.py`` checks this against ``set_rope_parameters(rope_type="longrope")``).

Start tokens (LongRoPE's ``n_hat``): positions ``< n_hat`` get the *original* RoPE cos/sin (frequency ``theta_i``,
no attention factor), as ``microsoft/LongRoPE rope/longrope.py::MixedLongRoPEScaledRotaryEmbedding`` overwrites the
first ``n_hat`` rows of its cos/sin cache with the original embedding's. Since q and k share cos/sin, a late query
sees those keys rotated with the original frequencies. This needs more than a frequency vector, so transformers'
"longrope" type cannot express it: ``start_token_rope`` wraps a model's rotary module(s) for it.

Needle-driven PPL (LongRoPE2 Sec. 3.2): documents are haystack text with needles (a random number stated once) and,
at the end, a question whose answer is that number; only the answer tokens are scored. Segments are tokenised
separately and concatenated, so the answer positions are known exactly (``answer_mask``).
"""
from __future__ import annotations

import contextlib
import math
import random

import numpy as np
import torch
from torch import nn

from harness.evals.common import token_nll
from harness.methods.rope import rebuild_rotary, rotary_modules, set_rope_parameters

NEEDLE = "Remember this number, it is the answer: the treasure of the old house is hidden under stone {key}."
QUESTION = "Question: under which stone is the treasure of the old house hidden? Answer: under stone"
ANSWER = " {key}."


def base_inv_freq(model) -> torch.Tensor:
    """The unscaled RoPE frequencies ``theta_i = b^(-2i/d)`` of the model (whatever rope type it carries now)."""
    from harness.methods.rope import rope_base
    from harness.models import rotary_dim

    d = rotary_dim(model.config)
    b = rope_base(model.config)
    return 1.0 / (b ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


class CandidateRotary(nn.Module):
    """Drop-in rotary module: per-row inverse frequencies [B, d/2], attention factors [B] and start tokens [B]."""

    def __init__(self, theta: torch.Tensor, inv_freq: torch.Tensor, scale: torch.Tensor, n_hat: torch.Tensor):
        super().__init__()
        self.theta, self.rows_inv_freq, self.scale, self.n_hat = theta, inv_freq, scale, n_hat
        self.inv_freq = theta  # so that code looking for `inv_freq` still finds a tensor

    @torch.no_grad()
    def forward(self, x, position_ids):
        B = self.rows_inv_freq.shape[0]
        pos = position_ids.float()
        if pos.shape[0] == 1 and B > 1:
            pos = pos.expand(B, -1)
        f = pos[..., None] * self.rows_inv_freq[:, None, :].to(x.device)
        emb = torch.cat((f, f), dim=-1)
        cos = emb.cos() * self.scale[:, None, None]
        sin = emb.sin() * self.scale[:, None, None]
        if int(self.n_hat.max()) > 0:
            f0 = pos[..., None] * self.theta[None, None, :].to(x.device)
            e0 = torch.cat((f0, f0), dim=-1)
            keep = (pos < self.n_hat[:, None].to(pos))[..., None]
            cos = torch.where(keep, e0.cos(), cos)
            sin = torch.where(keep, e0.sin(), sin)
        return cos.to(x.dtype), sin.to(x.dtype)


def _swap_rotary(model, make):
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "inv_freq"):
                setattr(parent, name, make(child))
                swapped.append((parent, name, child))
    if not swapped:
        raise RuntimeError("no rotary-embedding module found in the model")
    return swapped


@contextlib.contextmanager
def candidate_rope(model, lams, scales, n_hats=None):
    """Within the block, batch row r of any forward uses factors ``lams[r]`` (``theta_i / lam_i``), attention factor
    ``scales[r]`` and start tokens ``n_hats[r]``."""
    theta = base_inv_freq(model)
    lam = torch.as_tensor(np.asarray(lams, dtype=np.float32))
    inv = theta[None, :] / lam
    sc = torch.as_tensor(scales, dtype=torch.float32)
    nh = torch.as_tensor(n_hats if n_hats is not None else [0] * len(lam), dtype=torch.int64)
    swapped = _swap_rotary(model, lambda old: CandidateRotary(theta, inv, sc, nh))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


class StartTokenRotary(nn.Module):
    """Wraps a transformers rotary module: positions ``< n_hat`` get the original RoPE (no attention factor)."""

    def __init__(self, inner: nn.Module, theta: torch.Tensor, n_hat: int):
        super().__init__()
        self.inner, self.theta, self.n_hat = inner, theta, int(n_hat)
        self.inv_freq = inner.inv_freq

    def forward(self, x, position_ids):
        cos, sin = self.inner(x, position_ids)
        if self.n_hat <= 0:
            return cos, sin
        pos = position_ids.float()
        f0 = pos[..., None] * self.theta[None, None, :].to(x.device)
        e0 = torch.cat((f0, f0), dim=-1)
        keep = (pos < self.n_hat)[..., None]
        return (torch.where(keep, e0.cos().to(cos.dtype), cos), torch.where(keep, e0.sin().to(sin.dtype), sin))


def apply_factors(model, factors: dict) -> dict:
    """Apply a factors file (dict) with transformers' own "longrope" rope type, plus the start-token wrapper when
    ``n_hat > 0``. This is the evaluation path for a finished search (the ``longrope`` method's job in run.py)."""
    C = int(factors["original_max_position_embeddings"])
    s = float(factors["max_position_embeddings"]) / C
    kw = dict(rope_type="longrope", short_factor=[float(v) for v in factors["short_factor"]],
              long_factor=[float(v) for v in factors["long_factor"]], original_max_position_embeddings=C, factor=s)
    if factors.get("attention_factor") is not None:
        kw["attention_factor"] = float(factors["attention_factor"])
    params = set_rope_parameters(model, **kw)
    n_hat = int(factors.get("n_hat") or 0)
    if n_hat > 0:
        theta = base_inv_freq(model)
        _swap_rotary(model, lambda old: StartTokenRotary(old, theta, n_hat))
    return params


def remove_start_tokens(model) -> None:
    """Undo ``apply_factors``' wrapper (the rope parameters are rebuilt from the config)."""
    rebuild_rotary(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, StartTokenRotary):
                setattr(parent, name, child.inner)


# ---------------------------------------------------------------------------------------------------------------
# documents
# ---------------------------------------------------------------------------------------------------------------
def long_documents(tokenizer, dataset: str, split: str, n: int, length: int, offset_windows: int = 0):
    """``n`` windows ``[BOS] + doc[o : o + length - 1]`` from the first documents with enough tokens; window ``o``
    starts at ``offset_windows * (length - 1)`` (0 = the document start, as LongRoPE's ``--truncate``; 1 = the next,
    disjoint stretch of the same documents, used for held-out verification)."""
    from harness.evals.ppl import load_documents

    bos = tokenizer.bos_token_id
    need = length - (1 if bos is not None else 0)
    start = offset_windows * need
    out = []
    for d in load_documents(dataset, split):
        ids = tokenizer(d.text, add_special_tokens=False).input_ids
        if len(ids) >= start + need:
            out.append(([bos] if bos is not None else []) + ids[start : start + need])
        if len(out) == n:
            break
    if not out:
        raise ValueError(f"no document of {dataset}/{split} has {start + need} tokens")
    return torch.tensor(out)


def needle_document(tokenizer, haystack: list[int], length: int, rng: random.Random, needles: int = 1,
                    digits: int = 5) -> tuple[list[int], list[bool], int]:
    """One needle-driven document of exactly ``length`` tokens: [BOS] + haystack with ``needles`` copies of the
    needle at random depths + question + answer. Returns (ids, answer_mask over ids, key)."""
    key = rng.randint(10 ** (digits - 1), 10 ** digits - 1)
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    needle, question = enc(" " + NEEDLE.format(key=key) + " "), enc("\n" + QUESTION)
    answer = enc(ANSWER.format(key=key))
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    n_hay = length - len(bos) - needles * len(needle) - len(question) - len(answer)
    if n_hay < needles or len(haystack) < n_hay:
        raise ValueError(f"needle document: length {length} too short or haystack too small")
    hay = haystack[:n_hay]
    cuts = sorted(rng.randint(0, n_hay) for _ in range(needles))
    ids, prev = list(bos), 0
    for c in cuts:
        ids += hay[prev:c] + needle
        prev = c
    ids += hay[prev:] + question
    mask = [False] * len(ids) + [True] * len(answer)
    ids += answer
    assert len(ids) == length
    return ids, mask, key


def needle_documents(tokenizer, dataset: str, split: str, n: int, length: int, seed: int = 0, needles: int = 1,
                     digits: int = 5, offset_windows: int = 0):
    """``n`` needle documents (haystacks = the first documents with enough tokens, cycled; each haystack starts at
    token ``offset_windows * (length - 1)`` of its document). Returns (ids [n, L], answer_mask [n, L] bool)."""
    from harness.evals.ppl import load_documents

    rng = random.Random(f"needle-{seed}-{length}")
    start = offset_windows * (length - 1)
    hays = []
    for d in load_documents(dataset, split):
        ids = tokenizer(d.text, add_special_tokens=False).input_ids
        if len(ids) >= start + length:
            hays.append(ids[start:])
        if len(hays) == n:
            break
    if not hays:
        raise ValueError(f"no document of {dataset}/{split} has {start + length} tokens")
    rows, masks = [], []
    for j in range(n):
        ids, mask, _ = needle_document(tokenizer, hays[j % len(hays)], length, rng, needles, digits)
        rows.append(ids)
        masks.append(mask)
    return torch.tensor(rows), torch.tensor(masks)


# ---------------------------------------------------------------------------------------------------------------
# fitness
# ---------------------------------------------------------------------------------------------------------------
def masked_ppl(nll: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-row mean NLL over the scored targets. ``nll`` is [B, L-1] for targets ``ids[:, 1:]``; ``mask`` [B, L] marks
    the scored tokens of ids (None = every target)."""
    if mask is None:
        return nll.mean(dim=1)
    m = mask[:, 1:].to(nll.dtype)
    return (nll * m).sum(dim=1) / m.sum(dim=1).clamp_min(1)


class Fitness:
    """``__call__(candidates) -> [ppl]``: exp(mean over documents of the per-document mean NLL) of each candidate,
    scoring every token (``mask=None``, LongRoPE) or only the answer tokens (LongRoPE2's needle-driven PPL).

    Cost (profiled on tiny_llama, 2048 tokens, 1 thread): the decoder's matmuls ~50 %, flash attention ~25 %, the
    chunked LM head + loss ~20 %; building the per-row cos/sin is negligible, so a candidate costs one forward per
    document and nothing else. The documents are tokenised once (``ids``), the model is never rebuilt (only its
    rotary module is swapped for the duration of a batch), and candidates already evaluated are never scored again
    (``Evolution.history``). ``rows`` / ``seconds`` count the forwards and their wall time."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor | None, scale_of, batch: int = 4,
                 chunk: int = 1024, dtype: str = "auto"):
        self.model, self.ids, self.mask = model, ids, mask
        self.scale_of, self.batch, self.chunk, self.dtype = scale_of, max(1, int(batch)), chunk, dtype
        self.rows, self.seconds = 0, 0.0

    def __call__(self, cands) -> list[float]:
        import time

        t0 = time.time()
        n_doc = self.ids.shape[0]
        items = [(c, j) for c in range(len(cands)) for j in range(n_doc)]
        per = torch.zeros(len(cands), n_doc)
        with torch.inference_mode():
            for s in range(0, len(items), self.batch):
                part = items[s : s + self.batch]
                lams = torch.stack([torch.as_tensor(cands[c].lam, dtype=torch.float32) for c, _ in part])
                scales = [self.scale_of(cands[c]) for c, _ in part]
                nh = [int(cands[c].n_hat) for c, _ in part]
                ids = self.ids[[j for _, j in part]]
                mask = self.mask[[j for _, j in part]] if self.mask is not None else None
                with candidate_rope(self.model, lams, scales, nh):
                    nll = token_nll(self.model, ids, self.chunk, self.dtype)
                for (c, j), v in zip(part, masked_ppl(nll, mask)):
                    per[c, j] = float(v)
        self.rows += len(items)
        self.seconds += time.time() - t0
        return [math.exp(float(per[c].mean())) for c in range(len(cands))]


@torch.no_grad()
def ppl_with_current_rope(model, ids: torch.Tensor, mask: torch.Tensor | None = None, chunk: int = 1024,
                          dtype: str = "auto", batch: int = 1) -> float:
    """The same statistic for whatever RoPE the model carries (baselines and the HF-path check)."""
    vals = []
    for s in range(0, ids.shape[0], batch):
        nll = token_nll(model, ids[s : s + batch], chunk, dtype)
        vals += [float(v) for v in masked_ppl(nll, mask[s : s + batch] if mask is not None else None)]
    return math.exp(sum(vals) / len(vals))


__all__ = ["CandidateRotary", "Fitness", "apply_factors", "candidate_rope", "long_documents", "masked_ppl",
           "needle_document", "needle_documents", "ppl_with_current_rope", "remove_start_tokens", "rotary_modules",
           "start_token_rope"]


def start_token_rope(model, n_hat: int) -> None:
    """Wrap the model's current rotary module(s) so positions < n_hat use the original RoPE."""
    theta = base_inv_freq(model)
    _swap_rotary(model, lambda old: StartTokenRotary(old, theta, n_hat))
