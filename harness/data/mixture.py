"""Per-source length upsampling and packing (Fu et al. 2024, "Data Engineering for Scaling Language Models to 128K
Context", as used by the controlled study's SlimPajama mixture).

Keep each source's token share at its target, and within each source raise the share of long documents
(length >= ``long_threshold``) by sampling them with weight ``upsample`` relative to short ones. Documents are then
concatenated in sampled order (BOS before each, EOS after) and cut into chunks of exactly ``seq_len`` tokens across
document boundaries. Deterministic given the seed.
"""
from __future__ import annotations

import numpy as np


def sample_mixture(docs_by_source: dict[str, list[list[int]]], shares: dict[str, float], n_tokens: int,
                   long_threshold: int, upsample: float, seed: int) -> list[tuple[str, int]]:
    """Draw (source, doc index) pairs until each source has about ``shares[s] * n_tokens`` tokens."""
    rng = np.random.default_rng(seed)
    total = sum(shares.values())
    picks: list[tuple[str, int]] = []
    for src, docs in docs_by_source.items():
        if not docs:
            raise ValueError(f"data source {src!r} has no documents")
        target = n_tokens * shares[src] / total
        lens = np.array([len(d) for d in docs], dtype=np.float64)
        w = np.where(lens >= long_threshold, upsample, 1.0)
        p = w / w.sum()
        got = 0
        while got < target:
            i = int(rng.choice(len(docs), p=p))
            picks.append((src, i))
            got += len(docs[i]) + 2
    order = rng.permutation(len(picks))
    return [picks[i] for i in order]


def pack(docs_by_source, picks, seq_len: int, n_tokens: int, bos: int | None, eos: int | None) -> np.ndarray:
    n_chunks = max(1, n_tokens // seq_len)
    stream: list[int] = []
    for src, i in picks:
        stream += ([bos] if bos is not None else []) + docs_by_source[src][i] + ([eos] if eos is not None else [])
        if len(stream) >= n_chunks * seq_len:
            break
    while len(stream) < n_chunks * seq_len:  # top up by cycling (only for very small sources)
        stream += stream[: n_chunks * seq_len - len(stream)]
    dtype = np.uint16 if max(stream) < 65536 else np.int32
    return np.asarray(stream[: n_chunks * seq_len], dtype=dtype).reshape(n_chunks, seq_len)


def source_token_shares(docs_by_source, picks) -> dict[str, float]:
    counts: dict[str, int] = {}
    for src, i in picks:
        counts[src] = counts.get(src, 0) + len(docs_by_source[src][i])
    tot = sum(counts.values())
    return {k: v / tot for k, v in counts.items()}
