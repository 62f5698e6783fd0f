"""Intervals for every number the harness shows: 95% Wilson intervals for accuracies, bootstrap intervals for
means and perplexities, Newcombe intervals for differences of proportions, a rank correlation with its interval.

Ground floor (numpy only): evaluators call it to store an interval beside each aggregate in the row, the console
summary and ``make tables`` / ``make findings`` call it to compare methods. Every function returns plain floats.

- ``wilson(k, n)``: score interval of a proportion (Wilson 1927); sound at n = 5 and at 0/n or n/n, where the normal
  approximation collapses to a zero-width interval. ``bounded_interval``: the same for graded scores in [0, top]
  (NIAH word overlap, RULER string match), conservative.
- ``newcombe_diff(a, b, paired)``: difference of two proportions p_a - p_b. Unpaired: Newcombe (1998, Stat Med 17:873)
  method 10, the hybrid score interval built from the two Wilson intervals. Paired (the same prompts scored by two
  methods): Newcombe (1998, Stat Med 17:2635) method 10, the same construction with the phi correlation of the pairs.
- ``bootstrap_mean`` / ``bootstrap_diff``: percentile bootstrap of a mean (stratified: the mean of group means,
  resampled within each group) and of a difference of means, paired (same units resampled jointly) or not.
- ``ppl_interval`` / ``ppl_diff`` / ``ppl_ratio``: perplexity = exp(mean NLL) resampled over documents (windows);
  paired against another method on the same documents.
- ``spearman`` / ``spearman_interval``: rank correlation (average ranks for ties) and its bootstrap interval over units.

A difference is called a difference only when its interval excludes zero (``excludes``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054
LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of k successes in n trials (k may be a float: an accuracy x n rounded by the caller)."""
    if not n or n <= 0:
        return None
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def _binary(x) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    return a


def bounded_interval(values, top: float = 1.0) -> tuple[float, float, float] | None:
    """(mean, lo, hi) of scores in [0, top] (a list, or a list of equal-size strata: the mean of their means is then
    the pooled mean). Wilson on the pooled sum: exact for 0/1 scores, conservative for graded ones (a [0, 1] score
    with mean p has variance <= p(1 - p)). Unlike a percentile bootstrap it never collapses to a zero-width interval
    at 0 or at the top, where a miniature study's cells often sit."""
    gs = _groups(values)
    x = np.concatenate(gs) / top if gs else np.asarray([])
    if x.size == 0:
        return None
    ci = wilson(float(np.clip(x, 0, 1).sum()), int(x.size))
    return float(np.mean([g.mean() for g in gs])), ci[0] * top, ci[1] * top


def newcombe_diff(a: Sequence[float], b: Sequence[float], paired: bool = False,
                  z: float = Z95) -> tuple[float, float, float] | None:
    """(p_a - p_b, lo, hi) for 0/1 outcomes ``a`` and ``b``.

    ``paired``: a[i] and b[i] score the same item (same prompt), len(a) == len(b); the interval uses the phi
    correlation of the pairs (Newcombe 1998, paired method 10, with its continuity adjustment
    max(ad - bc - n/2, 0) when ad > bc; phi = 0 when a margin is constant). Unpaired: the hybrid score interval
    (phi = 0)."""
    a, b = _binary(a), _binary(b)
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        return None
    pa, pb = float(a.mean()), float(b.mean())
    la, ua = wilson(a.sum(), na, z)
    lb, ub = wilson(b.sum(), nb, z)
    phi = 0.0
    if paired:
        if na != nb:
            raise ValueError("paired difference needs equal lengths")
        e = float(np.sum((a == 1) & (b == 1)))
        f = float(np.sum((a == 1) & (b == 0)))
        g = float(np.sum((a == 0) & (b == 1)))
        h = float(np.sum((a == 0) & (b == 0)))
        den = (e + f) * (g + h) * (e + g) * (f + h)
        num = e * h - f * g
        if num > 0:  # Newcombe's continuity adjustment of phi for positive association
            num = max(num - na / 2, 0.0)
        phi = num / math.sqrt(den) if den > 0 else 0.0
    d = pa - pb
    delta = math.sqrt(max((pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2, 0.0))
    eps = math.sqrt(max((ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2, 0.0))
    return d, max(-1.0, d - delta), min(1.0, d + eps)


def is_binary(x) -> bool:
    a = np.asarray(x, dtype=float).ravel()
    return a.size > 0 and bool(np.all((a == 0) | (a == 1)))


def _quantiles(stats: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def _resample_means(groups: list[np.ndarray], rng, resamples: int) -> np.ndarray:
    """Bootstrap replicates of the mean of group means (each group resampled within itself)."""
    stats = np.zeros(resamples)
    for g in groups:
        idx = rng.integers(0, len(g), size=(resamples, len(g)))
        stats += g[idx].mean(axis=1)
    return stats / len(groups)


def bootstrap_mean(groups, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float] | None:
    """(mean of group means, lo, hi); ``groups`` is one sequence of scores or a list of them (strata)."""
    gs = _groups(groups)
    if not gs:
        return None
    m = float(np.mean([g.mean() for g in gs]))
    lo, hi = _quantiles(_resample_means(gs, np.random.default_rng(seed), resamples))
    return m, lo, hi


def _groups(groups) -> list[np.ndarray]:
    if groups is None:
        return []
    if len(groups) and np.isscalar(groups[0]):
        groups = [groups]
    return [np.asarray(g, dtype=float) for g in groups if len(g)]


def bootstrap_diff(a, b, paired: bool = False, resamples: int = RESAMPLES,
                   seed: int = SEED) -> tuple[float, float, float] | None:
    """(mean(a) - mean(b), lo, hi); ``paired``: a[i], b[i] measured on the same unit, resampled jointly."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return None
    rng = np.random.default_rng(seed)
    d = float(a.mean() - b.mean())
    if paired:
        if len(a) != len(b):
            raise ValueError("paired difference needs equal lengths")
        idx = rng.integers(0, len(a), size=(resamples, len(a)))
        stats = (a[idx] - b[idx]).mean(axis=1)
    else:
        stats = a[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1) - \
            b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    lo, hi = _quantiles(stats)
    return d, lo, hi


# -- perplexity ---------------------------------------------------------------------------------------------------
MIN_DOCS = 3  # fewer documents than this: no interval (a percentile bootstrap of 2 values is not an interval)


def ppl_interval(nll: Sequence[float], resamples: int = RESAMPLES,
                 seed: int = SEED) -> tuple[float, float, float] | None:
    """(exp(mean nll), lo, hi) over per-document (per-window) mean NLLs; the PPL protocols' aggregate."""
    x = np.asarray(nll, dtype=float)
    if len(x) < MIN_DOCS or not np.all(np.isfinite(x)):
        return None
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    lo, hi = _quantiles(np.exp(x[idx].mean(axis=1)))
    return math.exp(float(x.mean())), lo, hi


def ppl_diff(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES,
             seed: int = SEED) -> tuple[float, float, float] | None:
    """(PPL_a - PPL_b, lo, hi), documents paired (a[i], b[i] are the same document)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b) or len(a) < MIN_DOCS:
        return None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    stats = np.exp(a[idx].mean(axis=1)) - np.exp(b[idx].mean(axis=1))
    lo, hi = _quantiles(stats)
    return math.exp(a.mean()) - math.exp(b.mean()), lo, hi


def ppl_ratio(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES,
              seed: int = SEED) -> tuple[float, float, float] | None:
    """(PPL_a / PPL_b, lo, hi), documents paired."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b) or len(a) < MIN_DOCS:
        return None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    stats = np.exp(a[idx].mean(axis=1) - b[idx].mean(axis=1))
    lo, hi = _quantiles(stats)
    return math.exp(a.mean() - b.mean()), lo, hi


# -- rank correlation ---------------------------------------------------------------------------------------------
def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):  # average ranks for ties
        m = x == v
        if m.sum() > 1:
            r[m] = r[m].mean()
    return r


def spearman(x, y) -> float | None:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or len(x) != len(y):
        return None
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_interval(x, y, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float] | None:
    """(rho, lo, hi): percentile bootstrap over the (x, y) pairs; resamples with a constant margin are dropped."""
    rho = spearman(x, y)
    if rho is None:
        return None
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(resamples):
        i = rng.integers(0, len(x), len(x))
        s = spearman(x[i], y[i])
        if s is not None:
            stats.append(s)
    if len(stats) < resamples // 2:
        return None
    lo, hi = _quantiles(np.asarray(stats))
    return rho, lo, hi


def excludes(ci, value: float = 0.0) -> int:
    """+1 when the interval lies entirely above ``value``, -1 entirely below, 0 when it contains it (or is None)."""
    if ci is None:
        return 0
    lo, hi = ci[-2], ci[-1]
    if lo > value:
        return 1
    if hi < value:
        return -1
    return 0


def fmt_ci(est, decimals: int = 2, scale: float = 1.0) -> str:
    """'v [lo, hi]' (or 'v' when there is no interval) for a (v, lo, hi) triple."""
    if est is None:
        return "\u2014"
    v = est[0] * scale
    if len(est) < 3 or est[1] is None:
        return f"{v:.{decimals}f}"
    return f"{v:.{decimals}f} [{est[1] * scale:.{decimals}f}, {est[2] * scale:.{decimals}f}]"
