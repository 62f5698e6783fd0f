"""Bootstrap 95% intervals from per-sample scores (``row["run_dir"]/samples/<name>.jsonl``).

The statistic is the mean of group means (a group = one length, one task or one shot count), resampled within each
group (stratified percentile bootstrap), so it reproduces how the evaluators aggregate: a per-length accuracy is
one group, a RULER/LongBench average over tasks is several. An interval is returned only when the records' own
statistic reproduces the number in the row (x1 or x100); otherwise the records do not describe that number and no
interval is printed.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime: float) -> tuple:
    return tuple(_read(path))


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file (unreadable lines skipped); cached per (path, mtime) within one build."""
    try:
        return list(_read_cached(str(path), Path(path).stat().st_mtime))
    except OSError:
        return []


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


def groups_from(records: list[dict], score_keys: list[str], where: dict, group_by: str | None) -> list[np.ndarray]:
    """Scores of the records matching ``where`` ({field: value}, compared as strings), split by ``group_by``."""
    groups: dict = {}
    for r in records:
        if any(str(r.get(k)) != str(v) for k, v in where.items()):
            continue
        s = score_of(r, score_keys)
        if s is None:
            continue
        groups.setdefault(str(r.get(group_by)) if group_by else "", []).append(s)
    return [np.asarray(v, dtype=float) for _, v in sorted(groups.items())]


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


def bootstrap_ci(groups: list[np.ndarray], resamples: int = 1000, seed: int = 0, level: float = 0.95):
    """Percentile interval of the mean of group means under resampling within each group."""
    groups = [g for g in groups if len(g)]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    stats = np.zeros(resamples)
    for g in groups:
        idx = rng.integers(0, len(g), size=(resamples, len(g)))
        stats += g[idx].mean(axis=1)
    stats /= len(groups)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def interval_for(row: dict, names: list[str], score_keys: list[str], where: dict, group_by: str | None,
                 reported: float | None, resamples: int = 1000, seed: int = 0):
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
            lo, hi = bootstrap_ci(groups, resamples, seed)
            return lo * scale, hi * scale
    return None
