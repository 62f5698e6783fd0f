"""Per-sample records of a run (``row["run_dir"]/samples/<name>.jsonl``) read for the tables' 95% intervals.

The statistic is the mean of group means (a group = one length, one task or one shot count), resampled within each
group by ``harness.stats.bootstrap_mean`` (the harness's one bootstrap), so it reproduces how the evaluators
aggregate: a per-length accuracy is one group, a RULER/LongBench average over tasks is several. An interval is
returned only when the records' own statistic reproduces the number in the row (x1 or x100); otherwise the records
do not describe that number and no interval is printed.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from harness import stats
from harness.safe import is_safe_name


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime: float) -> tuple:
    return tuple(_read(path))


def _read(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
    except OSError:
        return []
    return out


def samples_file(row: dict, names: list[str]) -> Path | None:
    """The first existing ``samples/<name>.jsonl`` of the row's run directory (suite entry, then evaluator name)."""
    run_dir = row.get("run_dir")
    if not run_dir:
        return None
    for n in names:
        if not is_safe_name(n):
            continue
        p = Path(run_dir) / "samples" / f"{n}.jsonl"
        if p.is_file():
            return p
    return None


def score_of(rec: dict, keys: list[str]) -> float | None:
    for k in keys:
        v = rec.get(k)
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
    return None


@functools.lru_cache(maxsize=256)
def _indexed(path: str, mtime: float, score_keys: tuple, where_keys: tuple, group_by: str | None) -> dict:
    """{values of where_keys: {group: scores}} of one file, built once per (file, query shape)."""
    idx: dict = {}
    for r in _read_cached(path, mtime):
        s = score_of(r, list(score_keys))
        if s is None:
            continue
        k = tuple(str(r.get(w)) for w in where_keys)
        idx.setdefault(k, {}).setdefault(str(r.get(group_by)) if group_by else "", []).append(s)
    return {k: [np.asarray(v, dtype=float) for _, v in sorted(g.items())] for k, g in idx.items()}


def file_groups(path: Path, score_keys: list[str], where: dict, group_by: str | None) -> list[np.ndarray]:
    keys = tuple(sorted(where))
    try:
        idx = _indexed(str(path), path.stat().st_mtime, tuple(score_keys), keys, group_by)
    except OSError:
        return []
    return idx.get(tuple(str(where[k]) for k in keys), [])


def mean_of_means(groups: list[np.ndarray]) -> float:
    return float(np.mean([g.mean() for g in groups]))


def interval_for(row: dict, names: list[str], score_keys: list[str], where: dict, group_by: str | None,
                 reported: float | None):
    """CI of ``reported`` from the row's per-sample file, in the units of ``reported``; None when not derivable."""
    if reported is None or not math.isfinite(reported):
        return None
    p = samples_file(row, names)
    if p is None:
        return None
    groups = file_groups(p, score_keys, where, group_by)
    if not groups or sum(len(g) for g in groups) < 2:
        return None
    m = mean_of_means(groups)
    for scale in (1.0, 100.0):
        if abs(m * scale - reported) <= 1e-3 * max(1.0, abs(reported)) + 1e-6:
            _, lo, hi = stats.bootstrap_mean(groups)
            return lo * scale, hi * scale
    return None
