"""slimpajama_upsampled: the controlled study's fine-tuning data (cluster), built from a local SlimPajama sample.

The study trains on ``Leooyii/Slimpajama_downsample_32k_1B``: SlimPajama with Fu et al.'s (2024) *per-source length
upsampling* (keep the SlimPajama source mix, keep every document of >= 4K tokens and 10% of the shorter ones), 1B
tokens packed into 32K-token chunks across document boundaries. The study's release has no code to build it (its
README points to FranxYao/Long-Context-Data-Engineering); this builder is that recipe, over a local directory
prepared offline by ``scripts/prepare_cluster_data.py`` (download on a login node, train from the directory).

Input: ``path`` holds SlimPajama shards as ``*.jsonl``, ``*.jsonl.zst`` (needs ``zstandard``) or ``*.parquet``, with
records ``{"text": ..., "meta": {"redpajama_set_name": "RedPajamaC4"}}`` (the layout of cerebras/SlimPajama-627B).

Streaming, so 1B tokens never sit in memory as Python lists: shards are read in a seeded order, a document's length
is first *estimated* from its characters (``chars_per_token``, as Fu et al. do, to skip tokenising most short
documents), the keep/drop decision uses that estimate, and kept documents are tokenised and stored as numpy arrays
until their source's budget is full. Budgets, truncation of each source's last document and packing are the shared
``harness.data.mixture`` code (``local_mix`` uses the same functions over offline sources). The result goes through
the memory-mapped cache like every builder (key: tokenizer, arguments, length, tokens, seed).

How many shards a budget needs: short documents are kept at 1/upsample, so the builder reads several times the
tokens it keeps. ``shards_needed`` sizes a download from the first shards' documents with this module's own
length estimate and ``keep_probability`` (``scripts/prepare_cluster_data.py --estimate`` prints it), and shards
that still run out before the budget is full are one ConfigError line naming the count needed.

Paper vs Fu et al.: Fu's threshold is 4096 tokens (the pretrained window), not the 32K training length; it is
``long_threshold`` here (0 = the training length).
"""
from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness import progress
from harness.config import ConfigError
from harness.data import DATA, DataArgs, cached_chunks
from harness.data.mixture import Pick, keep_probability, mixture_stats, pack, source_budgets

# SlimPajama's token proportions by source (the SlimPajama data card; Fu et al.'s SLIMPAJAMA_ORIGINAL_MIX).
SLIMPAJAMA_MIX = {
    "RedPajamaCommonCrawl": 0.522, "RedPajamaC4": 0.267, "RedPajamaGithub": 0.052, "RedPajamaBook": 0.042,
    "RedPajamaArXiv": 0.046, "RedPajamaWikipedia": 0.038, "RedPajamaStackExchange": 0.033,
}


def _default_shares():
    return dict(SLIMPAJAMA_MIX)


SHARD_SUFFIXES = (".jsonl", ".jsonl.zst", ".parquet")


def shard_files(path: Path, suffixes: tuple[str, ...] = SHARD_SUFFIXES) -> list[Path]:
    """The data files under ``path`` in their numbering order (``example_train_2`` before ``example_train_10``), so
    that "the first K shards" of a local copy are the hub's first K; the hub client's bookkeeping folder
    (``.cache/``, which ``snapshot_download(local_dir=...)`` writes) is not data."""
    def natural(p: Path):
        rel = p.relative_to(path).as_posix()
        return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", rel)]

    return sorted((p for p in path.rglob("*") if p.is_file() and p.name.endswith(suffixes)
                   and ".cache" not in p.relative_to(path).parts), key=natural)


def read_shard(f: Path):
    """Yield (source, text) from one shard file."""
    if f.name.endswith(".parquet"):
        import pandas as pd

        df = pd.read_parquet(f)
        for text, meta in zip(df["text"], df["meta"] if "meta" in df else [None] * len(df)):
            yield _source_of(meta, f), text
        return
    if f.name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as e:
            raise ConfigError("reading *.jsonl.zst shards needs `pip install zstandard`") from e
        fh = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(f, "rb")), encoding="utf-8")
    else:
        fh = open(f, encoding="utf-8")
    with fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                yield _source_of(r.get("meta"), f), r["text"]


def iter_records(path: Path, seed: int):
    """Yield (source, text) from every shard under ``path`` (shards in a seeded order)."""
    files = shard_files(path)
    if not files:
        raise ConfigError(f"data=slimpajama_upsampled: no *.jsonl / *.jsonl.zst / *.parquet shards under {path} "
                          f"(prepare them with scripts/prepare_cluster_data.py)")
    for i in np.random.default_rng(seed).permutation(len(files)):
        yield from read_shard(files[i])


def estimate_tokens(text: str, chars_per_token: float) -> int:
    """A document's length in tokens before tokenising it (Fu et al.: characters / LLAMA_CHAR_TO_TOKEN_RATIO); the
    keep/drop decision of the upsampling rule is taken on this estimate."""
    return int(len(text) / chars_per_token)


def shard_lengths(files: list[Path], chars_per_token: float) -> dict[str, list[int]]:
    """Estimated token length of every document in ``files``, per source (the input of :func:`shards_needed`)."""
    out: dict[str, list[int]] = {}
    for f in files:
        for src, text in read_shard(f):
            out.setdefault(src, []).append(estimate_tokens(text, chars_per_token))
    return out


def kept_tokens(lengths: list[int], long_threshold: int, upsample: float, overhead: int) -> float:
    """The stream tokens the builder is expected to keep from documents of these lengths: each document's tokens
    plus its BOS/EOS, times its ``keep_probability`` (long always, short with p = 1/upsample)."""
    return sum(keep_probability(n, long_threshold, upsample) * (n + overhead) for n in lengths)


def shards_needed(lengths: dict[str, list[int]], n_files: int, shares: dict[str, float], n_tokens: int,
                  long_threshold: int, upsample: float, overhead: int = 2) -> dict[str, dict]:
    """Per source of ``shares``: its budget of the ``n_tokens`` (``source_budgets``), the tokens one shard is
    expected to yield under the upsampling rule (``lengths`` read from ``n_files`` shards) and the shards its
    budget needs (None when the sample holds no document of that source). The largest count is what the builder
    needs: it stops only when every source's budget is full."""
    out = {}
    for src, budget in source_budgets(shares, n_tokens).items():
        per_shard = kept_tokens(lengths.get(src, []), long_threshold, upsample, overhead) / max(1, n_files)
        out[src] = {"budget": budget, "kept_per_shard": per_shard,
                    "shards": math.ceil(budget / per_shard) if per_shard > 0 else None}
    return out


def _source_of(meta, f: Path) -> str:
    if isinstance(meta, str):
        meta = json.loads(meta)
    if isinstance(meta, dict) and meta.get("redpajama_set_name"):
        return meta["redpajama_set_name"]
    return f.parent.name  # a directory per source


@DATA.register("slimpajama_upsampled")
class SlimPajamaUpsampled:
    @dataclass
    class Args(DataArgs):
        name: str = "slimpajama_upsampled"
        path: str = ""  # local directory of SlimPajama shards (scripts/prepare_cluster_data.py)
        # token share per source; empty = SLIMPAJAMA_MIX (SlimPajama's own mix). Not a non-empty default: to_args
        # would merge it with the YAML's dict and add sources.
        shares: dict = field(default_factory=dict)
        long_threshold: int = 4096  # Fu et al.: 4K tokens (0 = the training length)
        upsample: float = 10.0  # = 1 / Fu's down_sample_ratio 0.1: short documents kept with probability 0.1
        chars_per_token: float = 3.6  # length estimate before tokenising (Fu: LLAMA_CHAR_TO_TOKEN_RATIO)

    @staticmethod
    def collect(a: SlimPajamaUpsampled.Args, records, tokenize, n_tokens: int, long_threshold: int,
                overhead: int, n_shards: int) -> tuple[dict[str, list[np.ndarray]], list[Pick], dict[str, int]]:
        """Stream records, keep long documents and a 1/upsample share of short ones per source until every
        source's budget is full. Returns documents, picks (in arrival order) and the estimated lengths seen.
        Records running out first is one ConfigError line with the shards the budget needs, scaled from what
        the ``n_shards`` shards read gave the source furthest from its budget."""
        rng = np.random.default_rng(a.seed)
        budgets = source_budgets(a.shares, n_tokens)
        got = {s: 0 for s in budgets}
        docs: dict[str, list[np.ndarray]] = {s: [] for s in budgets}
        picks: list[Pick] = []
        seen = {s: {"documents": 0, "est_tokens": 0, "est_long_tokens": 0} for s in budgets}
        ticker = progress.Ticker()   # a line at once, then every HARNESS_PROGRESS_S seconds: the counts so far
        for src, text in records:
            ticker.tick(lambda: f"data slimpajama_upsampled: {sum(v['documents'] for v in seen.values()):,} documents "
                                f"read, {len(picks):,} kept, {sum(got.values()):,} of {sum(budgets.values()):,} "
                                "tokens")
            if src not in budgets or got[src] >= budgets[src]:
                continue
            est = estimate_tokens(text, a.chars_per_token)
            seen[src]["documents"] += 1
            seen[src]["est_tokens"] += est
            seen[src]["est_long_tokens"] += est if est >= long_threshold else 0
            if rng.random() >= keep_probability(est, long_threshold, a.upsample):
                continue
            ids = np.asarray(tokenize(text), dtype=np.int64)
            room = budgets[src] - got[src] - overhead
            if len(ids) == 0 or room <= 0:
                got[src] = budgets[src] if room <= 0 else got[src]
                continue
            take = min(len(ids), room)
            docs[src].append(ids[:take])
            picks.append(Pick(src, len(docs[src]) - 1, take))
            got[src] += take + overhead
            if all(got[s] >= budgets[s] for s in budgets):
                break
        short = [s for s in budgets if got[s] < budgets[s]]
        if short:
            worst = min(short, key=lambda s: got[s] / budgets[s])
            if got[worst]:
                need = math.ceil(n_shards * budgets[worst] / got[worst])
                how = (f"{worst} filled {got[worst]:,} of its {budgets[worst]:,} tokens, so about {need} shards are "
                       f"needed: scripts/prepare_cluster_data.py --slimpajama-shards {need}")
            else:
                how = f"they hold no kept {worst} document: download more shards"
            raise ConfigError(f"data=slimpajama_upsampled: the {n_shards} shards under {a.path} ran out before the "
                              f"{n_tokens:,}-token budget was filled; {how}")
        return docs, picks, seen

    @staticmethod
    def build(a: SlimPajamaUpsampled.Args, tokenizer, seq_len: int, n_tokens: int):
        if not a.shares:
            a.shares = _default_shares()
        if not a.path or not Path(a.path).is_dir():
            raise ConfigError(f"data=slimpajama_upsampled: data.path={a.path!r} is not a directory "
                              f"(prepare it offline with scripts/prepare_cluster_data.py)")

        def make():
            n = (n_tokens // seq_len) * seq_len
            threshold = a.long_threshold or seq_len
            overhead = (tokenizer.bos_token_id is not None) + (tokenizer.eos_token_id is not None)
            tok = lambda t: tokenizer(t, add_special_tokens=False).input_ids  # noqa: E731
            docs, picks, seen = SlimPajamaUpsampled.collect(a, iter_records(Path(a.path), a.seed), tok, n,
                                                            threshold, overhead, len(shard_files(Path(a.path))))
            order = np.random.default_rng(a.seed + 1).permutation(len(picks))
            picks = [picks[i] for i in order]
            arr = pack(docs, picks, seq_len, n, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
            stats = mixture_stats(docs, picks, a.shares, threshold, overhead)
            stats["seen"] = seen  # natural (pre-sampling) long share, from the character-based length estimate
            tot = sum(a.shares.values())
            for s_, v in seen.items():  # per source natural long share, and the mix-weighted total
                stats["sources"][s_]["long_share_natural"] = round(v["est_long_tokens"] / max(1, v["est_tokens"]), 4)
            stats["long_share_natural"] = sum(a.shares[s_] / tot * stats["sources"][s_]["long_share_natural"]
                                              for s_ in seen)
            return arr, stats

        return cached_chunks(a, tokenizer, seq_len, n_tokens, make)
