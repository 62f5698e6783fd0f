"""Fine-tuning data: one file + one YAML per dataset builder (``data=local_mix``), registered by short name.

A builder turns its arguments plus the tokenizer into a ``TokenChunks`` array: ``[n_chunks, seq_len]`` token ids,
packed across document boundaries as the controlled study does, tokenised once into a memory-mapped cache keyed by
(tokenizer, sources, length, seed, ...) so a second run reuses it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.config import ConfigError, to_args
from harness.registry import Registry

DATA: Registry = Registry("data", "harness.data")


@dataclass
class DataArgs:
    name: str = ""
    cache_dir: str = ".cache/data"
    seed: int = 0


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256(json.dumps(sorted(vocab.items())[:5000]).encode())
    h.update(str(len(vocab)).encode())
    return h.hexdigest()[:12]


def cached_chunks(args, tokenizer, seq_len: int, n_tokens: int, build) -> np.ndarray:
    """Load the chunk array for this (args, tokenizer, seq_len, n_tokens) from cache, or ``build()`` and store it.

    ``build`` returns the array, or ``(array, stats)``: the stats (mixture provenance) go to the ``.json`` beside
    the ``.npy`` with the cache key. Writes are atomic (temporary file + rename), so concurrent readers (the ranks
    of a distributed run) only ever see a complete cache file."""
    key = json.dumps({"args": asdict(args), "tok": tokenizer_fingerprint(tokenizer), "L": seq_len, "N": n_tokens},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = Path(args.cache_dir) / f"{args.name}-{seq_len}-{digest}.npy"
    if path.exists():
        return np.load(path, mmap_mode="r")
    out = build()
    arr, stats = out if isinstance(out, tuple) else (out, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, arr)
    (path.with_suffix(".json")).write_text(json.dumps({"key": json.loads(key), "shape": list(arr.shape),
                                                       "dtype": str(arr.dtype), "stats": stats}, indent=1))
    tmp.replace(path)
    return np.load(path, mmap_mode="r")


def build_data(cfg, tokenizer, seq_len: int, n_tokens: int) -> np.ndarray:
    name = cfg.get("name") if hasattr(cfg, "get") else None
    if not name:
        raise ConfigError("data config has no name")
    cls = DATA.get(name)
    args = to_args(cls.Args, cfg, f"data={name}")
    if seq_len <= 0 or n_tokens < seq_len:
        raise ConfigError(f"data={name}: impossible lengths (seq_len={seq_len}, tokens={n_tokens})")
    return cls.build(args, tokenizer, seq_len, n_tokens)
