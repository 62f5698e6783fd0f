"""Intervals for the numbers the harness reports (ground floor: imports nothing from the harness).

- ``wilson(k, n)``: the Wilson score interval of a binomial proportion (accuracies, pass rates).
- ``paired_bootstrap(a, b)``: percentile bootstrap interval of ``mean(a) - mean(b)`` over paired items (the same
  documents / prompts scored by two models), and of a ratio of geometric means for perplexities.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n`` (``(0, 1)`` when ``n == 0``)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0,
                     level: float = 0.95, stat: str = "mean_diff") -> tuple[float, float, float]:
    """(point, lo, hi) of a paired statistic over items ``i`` (``a[i]`` and ``b[i]`` measured on the same item).

    ``stat="mean_diff"``: ``mean(a) - mean(b)``. ``stat="ppl_ratio"``: ``a`` and ``b`` are per-item mean NLLs (nats)
    weighted equally; the statistic is ``exp(mean(a) - mean(b))``, the ratio of the two perplexities."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-d samples, got {a.shape} and {b.shape}")
    d = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(resamples, len(d)))
    boot = d[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    point = d.mean()
    if stat == "ppl_ratio":
        return float(math.exp(point)), float(math.exp(lo)), float(math.exp(hi))
    if stat != "mean_diff":
        raise ValueError(f"unknown statistic {stat!r} (mean_diff | ppl_ratio)")
    return float(point), float(lo), float(hi)
