"""Fine-tuning data: one file + one YAML per dataset builder (``data=local_mix``), registered by short name.

A builder turns its arguments plus the tokenizer into a ``TokenChunks`` array: ``[n_chunks, seq_len]`` token ids,
packed across document boundaries as the controlled study does, tokenised once into a memory-mapped cache keyed by
(tokenizer, sources, length, seed, ...) so a second run reuses it.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from harness import progress
from harness.codeversion import data_code_version
from harness.config import ConfigError
from harness.registry import Registry
from harness.safe import safe_file

DATA: Registry = Registry("data", "harness.data")


@dataclass
class DataArgs:
    name: str = ""
    cache_dir: str = ".cache/data"
    seed: int = 0
    # What the data set is for, from its YAML (none of it changes the data, so none of it is in the cache key):
    # the largest training budget (train.tokens) it is meant to fill (0 = no limit but its files), a few words on
    # its scale and the data config for larger budgets; ``check_budget`` refuses a recipe above ``max_tokens``.
    max_tokens: int = 0
    scale: str = ""
    larger: str = ""


# DataArgs fields that describe the data set's intended use, not its content (left out of the cache key)
USE_FIELDS = ("cache_dir", "max_tokens", "scale", "larger")


@runtime_checkable
class DataBuilder(Protocol):
    """The contract of a registered dataset builder: an ``Args`` dataclass (``DataArgs`` or a subclass) and a static
    ``build(args, tokenizer, seq_len, n_tokens) -> [n_chunks, seq_len]`` token array (``build_data`` calls it)."""

    Args: ClassVar[type]

    @staticmethod
    def build(a: Any, tokenizer: Any, seq_len: int, n_tokens: int) -> np.ndarray: ...


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256(json.dumps(sorted(vocab.items())[:5000]).encode())
    h.update(str(len(vocab)).encode())
    return h.hexdigest()[:12]


def cache_key(args, tokenizer, seq_len: int, n_tokens: int) -> dict:
    """What the packed data is a function of: the builder's arguments (without ``cache_dir``: where the cache lives
    does not change the data), the tokenizer, the lengths, the data code and the library versions. Builders must be
    pure functions of this key (no dependence on ``PYTHONHASHSEED``, the working directory or the machine);
    ``tests/test_data.py`` checks it for every registered builder setting and synthetic kind."""

    plain = {k: v for k, v in asdict(args).items() if k not in USE_FIELDS}
    return {"args": plain, "tok": tokenizer_fingerprint(tokenizer), "L": seq_len, "N": n_tokens,
            "code": data_code_version()}


def cached_chunks(args, tokenizer, seq_len: int, n_tokens: int, build) -> np.ndarray:
    """Load the chunk array for this (args, tokenizer, seq_len, n_tokens) from cache, or ``build()`` and store it.

    ``build`` returns the array, or ``(array, stats)``: the stats (mixture provenance) go to the ``.json`` beside
    the ``.npy`` with the cache key. One build per key: it runs under an exclusive ``filelock`` on
    ``<cache>.npy.lock``, and a process that waited on the lock (another array task of the same sweep, or a run
    started while ``scripts/build_data.py`` builds) loads the finished file instead of building it again. Writes
    are atomic (temporary file + rename), so readers that take no lock (the ranks of a distributed run) only ever
    see a complete cache file."""
    key = json.dumps(cache_key(args, tokenizer, seq_len, n_tokens), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = safe_file(args.cache_dir, f"{args.name}-{seq_len}-{digest}", ".npy", "data.name")
    arr, _ = _load_cache(path, seq_len) if path.exists() else (None, None)
    if arr is not None:
        return arr
    path.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(path):
        if path.exists():  # built while this process waited, or an unusable file left by an earlier build
            arr, why = _load_cache(path, seq_len)
            if arr is not None:
                return arr
            print(f"warning: data cache {path} is unusable ({why}); rebuilding it", file=sys.stderr, flush=True)
        t0 = progress.stage(f"data cache {path.name}", f"building {n_tokens} tokens in sequences of {seq_len}")
        out = build()
        arr, stats = out if isinstance(out, tuple) else (out, None)
        progress.done(f"data cache {path.name}", t0, f"{arr.shape[0]} sequences")
        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        tmp, tmp_meta = path.with_name(f".{path.stem}.{tag}.tmp.npy"), path.with_name(f".{path.stem}.{tag}.tmp.json")
        try:
            np.save(tmp, arr)
            tmp_meta.write_text(json.dumps({"key": json.loads(key),
                                            "shape": list(arr.shape), "dtype": str(arr.dtype), "stats": stats},
                                           indent=1))
            tmp_meta.replace(path.with_suffix(".json"))
            tmp.replace(path)
        finally:  # a full disk or a kill leaves no partial file behind
            tmp.unlink(missing_ok=True)
            tmp_meta.unlink(missing_ok=True)
    return np.load(path, mmap_mode="r")


@contextmanager
def _build_lock(path: Path):
    """Hold the exclusive build lock of cache file ``path``, saying on stderr when another process holds it (a
    1B-token build takes hours: a silent wait would look like a hang). No timeout: the holder either finishes the
    file or dies, and the operating system releases a dead process's lock."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path) + ".lock", mode=0o666)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"data cache {path.name}: another process is building it; waiting for its lock", file=sys.stderr,
              flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _load_cache(path: Path, seq_len: int) -> tuple[np.ndarray | None, str | None]:
    """``(array, None)`` for a cache file that loads (without pickles) as ``[n, seq_len]`` integer token ids of the
    shape its ``.json`` recorded, else ``(None, why)``: a truncated, overwritten or foreign file is rebuilt, not
    trusted and not a failure."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {msg[:120]}"
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.shape[1] != seq_len or arr.dtype.kind not in "iu":
        return None, f"holds {getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}, not " \
                     f"[n, {seq_len}] token ids"
    try:
        recorded = json.loads(path.with_suffix(".json").read_text()).get("shape")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded is not None and list(arr.shape) != list(recorded):
        return None, f"shape {list(arr.shape)}, {recorded} when written"
    return arr, None


def check_budget(cfg, train_name: str, tokens: int) -> None:
    """Before anything loads: a training budget larger than the data set is for (its YAML's ``max_tokens``, e.g.
    the CPU miniature's mixture under the paper's 1B-token recipe, which would cycle a few million tokens of
    offline text hundreds of times) is one ConfigError line naming the data config to use instead."""
    name = cfg.get("name") if hasattr(cfg, "get") else None
    if not name:
        raise ConfigError("data config has no name")
    _, a = DATA.args(cfg, f"data={name}")
    if a.max_tokens and tokens > a.max_tokens:
        what = f" is {a.scale}," if a.scale else " is"
        use = f"use data={a.larger}, or " if a.larger else ""
        raise ConfigError(f"data={name}{what} for train.tokens <= {a.max_tokens:,} (data.max_tokens), but "
                          f"train={train_name} asks for {tokens:,}; {use}lower train.tokens")


def build_data(cfg, tokenizer, seq_len: int, n_tokens: int) -> np.ndarray:
    name = cfg.get("name") if hasattr(cfg, "get") else None
    if not name:
        raise ConfigError("data config has no name")
    cls, args = DATA.args(cfg, f"data={name}")
    if seq_len <= 0 or n_tokens < seq_len:
        raise ConfigError(f"data={name}: impossible lengths (seq_len={seq_len}, tokens={n_tokens})")
    return cls.build(args, tokenizer, seq_len, n_tokens)
