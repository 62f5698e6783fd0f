"""Intervals for every number the harness shows: 95% Wilson intervals for accuracies, t and bootstrap intervals for
means and perplexities, Newcombe intervals for differences of proportions, a rank correlation with its interval.

Ground floor (numpy, and scipy.special for the normal and t quantiles): evaluators call it to store an interval beside
each aggregate in the row, the console summary and ``make tables`` / ``make findings`` call it to compare methods.
The one bootstrap of the harness lives here (``controlled_study.samples`` only reads per-sample files). Every function
returns plain floats. ``tests/test_stats.py`` cross-checks them against scipy.stats and statsmodels.

- ``wilson(k, n)``: score interval of a proportion (Wilson 1927); sound at n = 5 and at 0/n or n/n, where the normal
  approximation collapses to a zero-width interval. ``bounded_interval``: the same for graded scores in [0, top]
  (NIAH word overlap, RULER string match), conservative.
- ``newcombe_diff(a, b, paired)``: difference of two proportions p_a - p_b. Unpaired: Newcombe (1998, Stat Med 17:873)
  method 10, the hybrid score interval built from the two Wilson intervals. Paired (the same prompts scored by two
  methods): Newcombe (1998, Stat Med 17:2635) method 10, the same construction with the phi correlation of the pairs.
- ``mean_interval(x, method)``: the mean of a few values (per-document NLLs or their paired differences) with a
  Student t, BCa bootstrap or percentile bootstrap interval; vectorised over rows for the coverage simulation.
  ``SMALL_N`` is the method that simulation chose for n = 8 documents (``tests/test_stats.py``): the percentile
  bootstrap undercovers there.
- ``bootstrap_mean`` / ``bootstrap_diff``: percentile bootstrap of a mean (stratified: the mean of group means,
  resampled within each group) and of a difference of means, paired (same units resampled jointly) or not: for
  hundreds of prompts, where the percentile interval is sound.
- ``ppl_interval`` / ``ppl_ratio``: perplexity = exp(mean NLL) over documents (windows), alone or as a paired ratio
  against another method on the same documents: ``SMALL_N`` on the (log-scale) mean NLL, exponentiated.
- ``spearman`` / ``spearman_interval``: rank correlation (average ranks for ties) and its bootstrap interval over units.

A difference is called a difference only when its interval excludes zero (``excludes``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr, ndtri, stdtrit

Z95 = 1.959963984540054
LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
SMALL_N = "t"   # the interval of a mean over a few documents (n = 8): chosen by tests/test_stats.py's simulation


def z_for(level: float) -> float:
    """The standard normal quantile of a two-sided ``level`` interval (1.96 for 0.95)."""
    return float(ndtri((1 + level) / 2))


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


def _row_quantiles(sorted_rows: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row quantiles ``q[:, 0]``, ``q[:, 1]`` of rows sorted ascending (linear interpolation, numpy's default)."""
    pos = np.clip(q, 0.0, 1.0) * (sorted_rows.shape[1] - 1)
    i = np.floor(pos).astype(int)
    j = np.minimum(i + 1, sorted_rows.shape[1] - 1)
    rows = np.arange(sorted_rows.shape[0])[:, None]
    v = sorted_rows[rows, i] + (pos - i) * (sorted_rows[rows, j] - sorted_rows[rows, i])
    return v[:, 0], v[:, 1]


def mean_interval(x, method: str = SMALL_N, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED):
    """(mean, lo, hi) of the mean of ``x`` by ``method``: ``t`` (Student t), ``bca`` (bootstrap, bias-corrected and
    accelerated: Efron 1987, acceleration from the jackknife) or ``percentile`` (bootstrap). ``x`` 2-D: one sample
    per row, and the three are arrays (the coverage simulation). None for fewer than ``MIN_DOCS`` values or a
    non-finite one. A sample without spread has the zero-width interval at its mean."""
    a = np.asarray(x, dtype=float)
    one = a.ndim == 1
    a = np.atleast_2d(a)
    n = a.shape[1]
    if n < MIN_DOCS or not np.all(np.isfinite(a)):
        return None
    m = a.mean(axis=1)
    if method == "t":
        h = stdtrit(n - 1, (1 + level) / 2) * a.std(axis=1, ddof=1) / math.sqrt(n)
        lo, hi = m - h, m + h
    elif method in ("bca", "percentile"):
        alpha = np.array([(1 - level) / 2, (1 + level) / 2])
        idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
        lo, hi = np.empty(len(a)), np.empty(len(a))
        for s in range(0, len(a), 256):   # blocks of rows: rows x resamples x n stays small
            blk, mb = a[s:s + 256], m[s:s + 256]
            boot = np.sort(blk[:, idx].mean(axis=2), axis=1)
            q = np.broadcast_to(alpha, (len(blk), 2))
            if method == "bca":
                with np.errstate(divide="ignore", invalid="ignore"):
                    z0 = ndtri((boot < mb[:, None]).mean(axis=1))
                    jack = (blk.sum(axis=1, keepdims=True) - blk) / (n - 1)
                    dj = jack.mean(axis=1, keepdims=True) - jack
                    acc = (dj ** 3).sum(axis=1) / (6 * (dj ** 2).sum(axis=1) ** 1.5)
                    zz = z0[:, None] + ndtri(alpha)[None, :]
                    q = ndtr(z0[:, None] + zz / (1 - acc[:, None] * zz))
            lo[s:s + 256], hi[s:s + 256] = _row_quantiles(boot, np.nan_to_num(q, nan=0.5))
    else:
        raise ValueError(f"mean_interval: unknown method {method!r} (t, bca, percentile)")
    flat = a.std(axis=1) == 0
    lo, hi = np.where(flat, m, lo), np.where(flat, m, hi)
    return (float(m[0]), float(lo[0]), float(hi[0])) if one else (m, lo, hi)


def p_value(interval_at, value: float = 0.0, tol: float = 1e-6) -> float | None:
    """Two-sided p-value of "the quantity equals ``value``" from a family of intervals ``interval_at(level) ->
    (v, lo, hi)``: the smallest alpha whose 1 - alpha interval excludes ``value`` (the test the interval inverts),
    found by bisection. Holm's correction (``holm``) needs it for every kind of interval the findings print."""
    def out(level):
        ci = interval_at(level)
        return ci is not None and excludes(ci, value) != 0

    if interval_at(LEVEL) is None:
        return None
    if not out(tol):            # not excluded even at a near-zero level: the value is the estimate
        return 1.0
    lo, hi = tol, 1 - 1e-12     # levels: excluded at lo
    if out(hi):
        return 1e-12
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if out(mid) else (lo, mid)
    return 1 - lo


def holm(pvalues: Sequence[float], alpha: float = 1 - LEVEL) -> list[bool]:
    """Holm's step-down rejections (1979) at family-wise level ``alpha``: the k-th smallest p-value (k = 0, 1, ...) is
    rejected when it and every smaller one are at most alpha / (m - k)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [False] * len(pvalues)
    for k, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - k):
            break
        out[i] = True
    return out


def _resample_means(groups: list[np.ndarray], rng, resamples: int) -> np.ndarray:
    """Bootstrap replicates of the mean of group means (each group resampled within itself)."""
    stats = np.zeros(resamples)
    for g in groups:
        idx = rng.integers(0, len(g), size=(resamples, len(g)))
        stats += g[idx].mean(axis=1)
    return stats / len(groups)


def bootstrap_mean(groups, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[float, float, float] | None:
    """(mean of group means, lo, hi); ``groups`` is one sequence of scores or a list of them (strata)."""
    gs = _groups(groups)
    if not gs:
        return None
    m = float(np.mean([g.mean() for g in gs]))
    lo, hi = _quantiles(_resample_means(gs, np.random.default_rng(seed), resamples), level)
    return m, lo, hi


def _groups(groups) -> list[np.ndarray]:
    if groups is None:
        return []
    if len(groups) and np.isscalar(groups[0]):
        groups = [groups]
    return [np.asarray(g, dtype=float) for g in groups if len(g)]


def bootstrap_diff(a, b, paired: bool = False, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[float, float, float] | None:
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
    lo, hi = _quantiles(stats, level)
    return d, lo, hi


# -- perplexity ---------------------------------------------------------------------------------------------------
MIN_DOCS = 3  # fewer documents than this: no interval (two values give no spread to speak of)


def ppl_interval(nll: Sequence[float], method: str = SMALL_N,
                 level: float = LEVEL) -> tuple[float, float, float] | None:
    """(exp(mean nll), lo, hi) over per-document (per-window) mean NLLs; the PPL protocols' aggregate. The interval
    is ``method``'s for the mean NLL, exponentiated."""
    return _exp(mean_interval(nll, method, level))


def ppl_ratio(a: Sequence[float], b: Sequence[float], method: str = SMALL_N,
              level: float = LEVEL) -> tuple[float, float, float] | None:
    """(PPL_a / PPL_b, lo, hi), documents paired (a[i], b[i] are the same document): ``method``'s interval for the
    mean per-document NLL difference, exponentiated (PPL_a / PPL_b = exp(mean(a - b)))."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b):
        return None
    return _exp(mean_interval(a - b, method, level))


def _exp(est) -> tuple | None:
    """``exp`` of each of ``est`` (a mean NLL and its interval), or None when one overflows (a PPL that is not a
    finite number is no result)."""
    if est is None:
        return None
    try:
        return tuple(math.exp(v) for v in est)
    except OverflowError:
        return None


def cluster_ppl_ratio(a: Sequence[float], ga: Sequence, b: Sequence[float], gb: Sequence, method: str = "t",
                      level: float = LEVEL, resamples: int = RESAMPLES,
                      seed: int = SEED) -> tuple[float, float, float] | None:
    """(PPL_a / PPL_b, lo, hi) for per-window mean NLLs ``a`` and ``b`` whose windows come from documents ``ga`` /
    ``gb`` (the same documents, cut into windows of two lengths): PPL = exp(mean window NLL), and the interval treats
    the windows of one document as dependent (clustered by document). ``t``: the cluster-robust (CR1) standard error
    of the difference of the two means, Student t with G - 1 degrees of freedom (G documents); ``bootstrap``:
    documents resampled with replacement, all their windows with them (percentile). None with fewer than
    ``MIN_DOCS`` documents in common."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ga, gb = np.asarray(ga), np.asarray(gb)
    docs = sorted(set(ga.tolist()) & set(gb.tolist()))
    if len(docs) < MIN_DOCS or len(a) != len(ga) or len(b) != len(gb):
        return None
    keep_a, keep_b = np.isin(ga, docs), np.isin(gb, docs)
    a, ga, b, gb = a[keep_a], ga[keep_a], b[keep_b], gb[keep_b]
    d = float(a.mean() - b.mean())
    g = len(docs)
    if method == "t":
        u = np.array([(a[ga == k] - a.mean()).sum() / len(a) - (b[gb == k] - b.mean()).sum() / len(b) for k in docs])
        se = math.sqrt(g / (g - 1) * float((u ** 2).sum()))
        from scipy.stats import t as student

        h = float(student.ppf(0.5 + level / 2, g - 1)) * se
        return math.exp(d), math.exp(d - h), math.exp(d + h)
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        sa = {k: a[ga == k] for k in docs}
        sb = {k: b[gb == k] for k in docs}
        reps = np.empty(resamples)
        for i in range(resamples):
            pick = rng.integers(0, g, g)
            xa = np.concatenate([sa[docs[j]] for j in pick])
            xb = np.concatenate([sb[docs[j]] for j in pick])
            reps[i] = xa.mean() - xb.mean()
        lo, hi = _quantiles(reps, level)
        return math.exp(d), math.exp(float(lo)), math.exp(float(hi))
    raise ValueError(f"cluster_ppl_ratio: unknown method {method!r} (t, bootstrap)")


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


def spearman_replicates(x, y, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Bootstrap replicates of Spearman's rho over the (x, y) pairs; resamples with a constant margin are dropped."""
    from scipy.stats import rankdata  # average ranks for ties, row by row; imported here: scipy.stats takes ~1 s

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    rx, ry = rankdata(x[idx], axis=1), rankdata(y[idx], axis=1)
    rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx ** 2).sum(axis=1) * (ry ** 2).sum(axis=1))
    ok = den > 0
    return (rx[ok] * ry[ok]).sum(axis=1) / den[ok]


def spearman_interval(x, y, resamples: int = RESAMPLES, seed: int = SEED,
                      level: float = LEVEL) -> tuple[float, float, float] | None:
    """(rho, lo, hi): percentile bootstrap over the (x, y) pairs (``spearman_replicates``); None when half the
    resamples have a constant margin."""
    rho = spearman(x, y)
    if rho is None:
        return None
    stats = spearman_replicates(x, y, resamples, seed)
    if len(stats) < resamples // 2:
        return None
    lo, hi = _quantiles(stats, level)
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
