"""Fitness of RoPE factor candidates: perplexity at the target length (LongRoPE) or needle-driven perplexity
(LongRoPE2), scored through the ``longrope`` method's own code.

One way to apply factors: a candidate becomes a factors dict (the factors file's format: long factors, attention
factor, ``n_hat``) and ``harness.methods.longrope.apply_factors`` puts it on the model, exactly as ``run.py
method=longrope`` does with the finished file (transformers' ``"longrope"`` rope type, the length switch, and the
start tokens: positions ``< n_hat`` keep the original RoPE, ``microsoft/LongRoPE rope/longrope.py::
MixedLongRoPEScaledRotaryEmbedding``). At the target length (> C) the ``longrope2`` method computes the same
frequencies (its long set), so both algorithms are scored this way. ``harness.evals.common.token_nll`` (chunked
loss, the evaluators' code) scores the documents, ``batch`` of them per forward; the model's own RoPE is restored
afterwards. ``tests/test_search.py`` checks that the search's reported fitness is what the method then measures.

Needle-driven PPL (LongRoPE2 Sec. 3.2): documents are haystack text with needles (a random number stated once) and,
at the end, a question whose answer is that number; only the answer tokens are scored. Segments are tokenised
separately and concatenated, so the answer positions are known exactly (``answer_mask``).
"""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from harness.evals.common import token_nll
from harness.evals.ppl import load_documents
from harness.methods.longrope import apply_factors
from harness.methods.rope import rebuild_rotary

NEEDLE = "Remember this number, it is the answer: the treasure of the old house is hidden under stone {key}."
QUESTION = "Question: under which stone is the treasure of the old house hidden? Answer: under stone"
ANSWER = " {key}."


# ---------------------------------------------------------------------------------------------------------------
# documents
# ---------------------------------------------------------------------------------------------------------------
def long_documents(tokenizer, dataset: str, split: str, n: int, length: int, offset_windows: int = 0):
    """``n`` windows ``[BOS] + doc[o : o + length - 1]`` from the first documents with enough tokens; window ``o``
    starts at ``offset_windows * (length - 1)`` (0 = the document start, as LongRoPE's ``--truncate``; 1 = the next,
    disjoint stretch of the same documents, used for held-out verification)."""

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

    Each candidate is applied with the ``longrope`` method's ``apply_factors`` (target length = the documents'
    length, window ``native_ctx``) and its documents are scored ``batch`` rows per forward. Cost: one forward per
    document; applying a candidate rebuilds only the rotary module (negligible). The documents are tokenised once
    (``ids``) and candidates already evaluated are never scored again (``Evolution.history``). ``rows`` /
    ``seconds`` count the scored documents and their wall time."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor | None, scale_of, batch: int = 4,
                 chunk: int = 1024, dtype: str = "auto", native_ctx: int | None = None,
                 fixed_long: dict | None = None):
        self.model, self.ids, self.mask = model, ids, mask
        self.scale_of, self.batch, self.chunk, self.dtype = scale_of, max(1, int(batch)), chunk, dtype
        self.native_ctx = int(native_ctx or model.config.max_position_embeddings)
        self.fixed_long = fixed_long  # a factors file: candidates are its *short* factors (LongRoPE's recovery)
        if fixed_long is None and ids.shape[1] <= self.native_ctx:
            raise ValueError(f"fitness documents of {ids.shape[1]} tokens do not exceed the native window "
                             f"{self.native_ctx}: the long factors would never be used")
        if fixed_long is not None and ids.shape[1] > self.native_ctx:
            raise ValueError(f"short-factor fitness documents of {ids.shape[1]} tokens exceed the native window "
                             f"{self.native_ctx}: the short factors would never be used")
        self.rows, self.seconds = 0, 0.0

    def factors(self, cand) -> dict:
        """The candidate as a factors dict (the format ``harness.search.factors_file`` writes)."""
        lam = [float(v) for v in np.asarray(cand.lam, dtype=np.float64)]
        if self.fixed_long is not None:
            f = self.fixed_long
            return {"short_factor": lam, "long_factor": [float(v) for v in f["long_factor"]],
                    "original_max_position_embeddings": self.native_ctx,
                    "max_position_embeddings": int(f["max_position_embeddings"]),
                    "attention_factor": float(self.scale_of(cand)), "n_hat": int(f.get("n_hat") or 0)}
        return {"short_factor": [1.0] * len(lam), "long_factor": lam,
                "original_max_position_embeddings": self.native_ctx, "max_position_embeddings": int(self.ids.shape[1]),
                "attention_factor": float(self.scale_of(cand)), "n_hat": int(cand.n_hat)}

    def __call__(self, cands) -> list[float]:
        import time

        t0 = time.time()
        n_doc = self.ids.shape[0]
        per = torch.zeros(len(cands), n_doc)
        original = dict(self.model.config.rope_parameters or {})
        try:
            with torch.inference_mode():
                for c, cand in enumerate(cands):
                    apply_factors(self.model, self.factors(cand), kv_cache="stale")
                    for s in range(0, n_doc, self.batch):
                        ids = self.ids[s : s + self.batch]
                        mask = self.mask[s : s + self.batch] if self.mask is not None else None
                        nll = token_nll(self.model, ids, self.chunk, self.dtype)
                        per[c, s : s + ids.shape[0]] = masked_ppl(nll, mask).float()
        finally:
            self.model.config.rope_parameters = original
            rebuild_rotary(self.model)
        self.rows += len(cands) * n_doc
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


__all__ = ["Fitness", "long_documents", "masked_ppl", "needle_document", "needle_documents",
           "ppl_with_current_rope"]
