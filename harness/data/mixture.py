"""Per-source length upsampling and packing (Fu et al. 2024, "Data Engineering for Scaling Language Models to 128K
Context", as used by the controlled study's SlimPajama mixture).

What Fu et al.'s ``slimpajama_packing.py --down_sample_mode per_source`` does: give every source its token budget
from the original SlimPajama mix (the source mix is kept), and within a source keep every long document but keep a
short one only with probability ``down_sample_ratio`` (0.1), so the share of long documents rises. Here
``upsample = 1 / down_sample_ratio`` and the same rule is applied while walking each source's documents in a seeded
random order, cycling through the source again when it is exhausted before its budget is met (small offline
sources; SlimPajama never cycles at 1B tokens).

Packing: the accepted documents of all sources are interleaved in a seeded random order, each wrapped as
``BOS doc EOS``, concatenated and cut into chunks of exactly ``seq_len`` tokens across document boundaries, as the
controlled study's data (``Leooyii/Slimpajama_downsample_32k_1B``) is. To make the realised token shares equal the
targets (not just in expectation), each source's budget is counted in stream tokens (BOS/EOS included), the budgets
sum to exactly ``n_chunks * seq_len`` and the last document drawn for a source is truncated to fill its budget:
one truncated document per source, nothing dropped at the end of the stream.

Document-boundary attention (LongRoPE2-style mixed windows) does not change the data: BOS marks each document
start, and ``harness.train.step.document_position_ids`` derives position ids (and with them a block-diagonal
causal mask) at training time when ``train.doc_masking=true``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pick:
    source: str
    index: int  # document index within its source
    take: int  # tokens of the document used (= its length except for the last, truncated, pick of a source)


def source_budgets(shares: dict[str, float], total_tokens: int) -> dict[str, int]:
    """Integer token budgets proportional to ``shares`` summing exactly to ``total_tokens`` (largest remainder)."""
    if not shares or any(v < 0 for v in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError(f"data shares must be non-negative and not all zero: {shares}")
    tot = sum(shares.values())
    exact = {s: total_tokens * v / tot for s, v in shares.items()}
    out = {s: int(np.floor(x)) for s, x in exact.items()}
    rest = total_tokens - sum(out.values())
    for s in sorted(exact, key=lambda s: exact[s] - out[s], reverse=True)[:rest]:
        out[s] += 1
    return out


def keep_probability(length: int, long_threshold: int, upsample: float) -> float:
    """Fu et al.: long documents are always kept, short ones with probability 1 / upsample."""
    if upsample < 1:
        raise ValueError(f"upsample must be >= 1 (1 = no upsampling), got {upsample}")
    return 1.0 if length >= long_threshold else 1.0 / upsample


def sample_source(lengths: list[int], budget: int, long_threshold: int, upsample: float,
                  rng: np.random.Generator, overhead: int, source: str = "") -> list[Pick]:
    """Walk the documents of one source in random order (re-shuffled each pass), keep each with
    ``keep_probability``, until ``budget`` stream tokens (document + ``overhead`` BOS/EOS tokens) are filled."""
    lengths = [int(n) for n in lengths]
    if not lengths or max(lengths) == 0:
        raise ValueError(f"data source {source!r} has no (non-empty) documents")
    picks: list[Pick] = []
    got = 0
    while got < budget:
        for i in rng.permutation(len(lengths)):
            n = lengths[i]
            if n == 0 or rng.random() >= keep_probability(n, long_threshold, upsample):
                continue
            room = budget - got - overhead
            if room <= 0:
                got = budget  # the remainder is too small for even one token: close with padding below
                break
            take = min(n, room)
            picks.append(Pick(source, int(i), take))
            got += take + overhead
            if got >= budget:
                break
    return picks


def sample_mixture(docs_by_source: dict[str, list], shares: dict[str, float], n_tokens: int, long_threshold: int,
                   upsample: float, seed: int, overhead: int = 2) -> list[Pick]:
    """The picks of every source (budgets from ``shares``), interleaved in a seeded random order."""
    missing = set(shares) - set(docs_by_source)
    if missing:
        raise ValueError(f"no documents for data sources {sorted(missing)}")
    rng = np.random.default_rng(seed)
    budgets = source_budgets(shares, n_tokens)
    picks: list[Pick] = []
    for src in shares:  # fixed order: reproducible for a seed
        lengths = [len(d) for d in docs_by_source[src]]
        picks += sample_source(lengths, budgets[src], long_threshold, upsample, rng, overhead, src)
    order = rng.permutation(len(picks))
    return [picks[i] for i in order]


def pack(docs_by_source, picks: list[Pick], seq_len: int, n_tokens: int, bos: int | None, eos: int | None,
         pad: int | None = None) -> np.ndarray:
    """Concatenate ``BOS doc EOS`` for every pick and cut into ``[n_tokens // seq_len, seq_len]`` chunks."""
    n_chunks = max(1, n_tokens // seq_len)
    need = n_chunks * seq_len
    pieces: list[np.ndarray] = []
    have = 0
    for p in picks:
        d = docs_by_source[p.source][p.index]
        parts = ([[bos]] if bos is not None else []) + [d[: p.take]] + ([[eos]] if eos is not None else [])
        for part in parts:
            a = np.asarray(part, dtype=np.int64)
            pieces.append(a)
            have += len(a)
        if have >= need:
            break
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    if len(stream) < need:  # only when overhead tokens are absent (bos/eos None) or budgets were rounded down
        fill = pad if pad is not None else (eos if eos is not None else 0)
        stream = np.concatenate([stream, np.full(need - len(stream), fill, dtype=np.int64)])
    dtype = np.uint16 if stream.max(initial=0) < 65536 else np.int32
    return stream[:need].astype(dtype).reshape(n_chunks, seq_len)


def source_token_counts(picks: list[Pick], overhead: int = 2) -> dict[str, int]:
    """Stream tokens per source (a document's BOS/EOS count for its source)."""
    counts: dict[str, int] = {}
    for p in picks:
        counts[p.source] = counts.get(p.source, 0) + p.take + overhead
    return counts


def source_token_shares(picks: list[Pick], overhead: int = 2) -> dict[str, float]:
    """Realised share of packed tokens per source."""
    counts = source_token_counts(picks, overhead)
    tot = sum(counts.values()) or 1
    return {k: v / tot for k, v in counts.items()}


def long_token_share(lengths_by_source: dict[str, list[int]], picks: list[Pick] | None, long_threshold: int) -> float:
    """Share of tokens coming from documents of at least ``long_threshold`` tokens: in the picks, or (``picks``
    None) in the natural corpus."""
    if picks is None:
        tot = sum(sum(v) for v in lengths_by_source.values())
        long = sum(n for v in lengths_by_source.values() for n in v if n >= long_threshold)
    else:
        tot = sum(p.take for p in picks)
        long = sum(p.take for p in picks if lengths_by_source[p.source][p.index] >= long_threshold)
    return long / max(1, tot)


def mixture_stats(docs_by_source, picks: list[Pick], shares: dict[str, float], long_threshold: int,
                  overhead: int = 2) -> dict:
    """Provenance of a built mixture: target vs realised shares, long-document share before/after upsampling."""
    lengths = {s: [len(d) for d in docs] for s, docs in docs_by_source.items()}
    tot = sum(shares.values())
    per_src = {}
    for s in shares:
        sub = {s: lengths[s]}
        mine = [p for p in picks if p.source == s]
        per_src[s] = {"documents": len(mine),
                      "long_share_natural": round(long_token_share(sub, None, long_threshold), 4),
                      "long_share_sampled": round(long_token_share(sub, mine, long_threshold), 4)}
    # natural long share of the *mix*: each source's natural share weighted by its target share (comparable with
    # the sampled share; the raw corpus total would be dominated by whichever source is largest on disk)
    natural = sum(shares[s] / tot * long_token_share({s: lengths[s]}, None, long_threshold) for s in shares)
    return {"target_shares": {s: v / tot for s, v in shares.items()}, "shares": source_token_shares(picks, overhead),
            "tokens": source_token_counts(picks, overhead),
            "long_threshold": long_threshold, "long_share_natural": natural,
            "long_share_sampled": long_token_share(lengths, picks, long_threshold), "sources": per_src,
            "documents": len(picks)}
