"""The RoPE critical dimension (LongRoPE2, Shang et al. 2025, Sec. 2-3; Liu et al. 2023 "Scaling laws of
RoPE-based extrapolation") and the closed-form factor vectors used to seed the search.

Notation: ``d`` rotary dimension, ``b`` RoPE base, ``L`` pretraining window (C), pair ``i = 0..d/2-1`` has
frequency ``theta_i = b^(-2i/d)`` and period ``T_i = 2*pi / theta_i``. A rescale factor ``lambda_i`` divides the
frequency: ``theta'_i = theta_i / lambda_i`` (the LongRoPE / transformers "longrope" convention).

Theoretical critical dimension (LongRoPE2, Eq. in Sec. 3.1): ``d_tcd = 2 * ceil((d/2) * log_b(L / 2pi))``: the first
dimension whose period exceeds the pretraining window, i.e. pair ``k_tcd = d_tcd / 2`` is the first pair that never
completed a full rotation during pretraining (``T_k > L``). Worked values: LLaMA3-8B (b=5e5, L=8192, d=128) gives
d_tcd = 70 (pair 35); LLaMA2-7B (b=1e4, L=4096, d=128) gives 92 (pair 46); tiny_llama (b=1e3, L=256, d=64) gives 36
(pair 18: "14 of 32 pairs have period > C" in its model card). The released LongRoPE2 LLaMA3 long factors switch
regime at pair 33 (dim 66) instead, the paper's "real critical dimension" (found by the search, see
``harness.search.evolution``).
"""
from __future__ import annotations

import math

import numpy as np


def critical_pair(d: int, base: float, L: int) -> int:
    """``k_tcd = ceil((d/2) * log_b(L / 2pi))``, clamped to [0, d/2]."""
    k = math.ceil((d / 2) * math.log(L / (2 * math.pi)) / math.log(base) - 1e-12)
    return int(min(max(k, 0), d // 2))


def theoretical_critical_dim(d: int, base: float, L: int) -> int:
    """``d_tcd = 2 * ceil((d/2) * log_b(L / 2pi))`` (LongRoPE2)."""
    return 2 * critical_pair(d, base, L)


def periods(d: int, base: float) -> np.ndarray:
    """Period in tokens of every RoPE pair: ``2 pi b^(2i/d)``."""
    i = np.arange(d // 2, dtype=np.float64)
    return 2 * math.pi * base ** (2 * i / d)


def pi_factors(d: int, s: float) -> np.ndarray:
    """Position Interpolation: every pair divided by s."""
    return np.full(d // 2, float(s))


def ntk_factors(d: int, s: float) -> np.ndarray:
    """NTK-aware base change ``b' = b s^(d/(d-2))`` written as per-pair factors: ``lambda_i = s^(2i/(d-2))``
    (1 for the highest frequency, exactly s for the lowest)."""
    i = np.arange(d // 2, dtype=np.float64)
    return float(s) ** (2 * i / (d - 2))


def yarn_factors(d: int, s: float, base: float, L: int, beta_fast: float = 32.0, beta_slow: float = 1.0) -> np.ndarray:
    """YaRN's ramp written as LongRoPE's initial factors (``microsoft/LongRoPE evolution/search.py``):
    ``lambda_i = s (1 - mask_i) + mask_i`` with ``mask = 1 - ramp`` and YaRN's correction range (beta 32 / 1).
    Note this blends the factors linearly, not the frequencies as YaRN itself does; it is only a seed."""
    def dim(r):
        return d * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))

    low = max(math.floor(dim(beta_fast)), 0)
    high = min(math.ceil(dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    i = np.arange(d // 2, dtype=np.float64)
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    mask = 1.0 - ramp
    return float(s) * (1.0 - mask) + mask


def yarn_frequency_factors(d: int, s: float, base: float, L: int, beta_fast: float = 32.0,
                           beta_slow: float = 1.0) -> np.ndarray:
    """YaRN's own frequencies (``jquesnelle/yarn``, transformers "yarn") as factors: YaRN blends the *frequencies*,
    ``theta'_i = (theta_i / s) ramp_i + theta_i (1 - ramp_i)``, so ``lambda_i = 1 / (ramp_i / s + 1 - ramp_i)``."""
    lin = yarn_factors(d, s, base, L, beta_fast, beta_slow)
    ramp = (lin - 1.0) / (float(s) - 1.0) if s > 1 else np.zeros_like(lin)
    return 1.0 / (ramp / float(s) + 1.0 - ramp)


def ntk_below(lam_k: float, k: int) -> np.ndarray:
    """LongRoPE2's factors below the critical pair k: NTK-like geometric growth that reaches the critical pair's
    factor, ``lambda_i = lambda_k^(i/k)`` for i < k (the released LLaMA3 long factor has exactly this shape:
    ``r^i`` with ``r^33 = lambda_33``)."""
    if k <= 0:
        return np.zeros(0)
    i = np.arange(k, dtype=np.float64)
    return float(lam_k) ** (i / k)


def su_mscale(s: float, L: int) -> float:
    """LongRoPE's "su" attention factor, also transformers' "longrope" default: ``sqrt(1 + ln s / ln L)``."""
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))


def yarn_mscale(s: float) -> float:
    return 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0


def mscale_of(policy, s: float, L: int) -> float:
    """``su`` | ``yarn`` | a number (LongRoPE ``magnitude_scaling_policy``)."""
    if isinstance(policy, (int, float)):
        return float(policy)
    p = str(policy).strip().lower()
    if p == "su":
        return su_mscale(s, L)
    if p == "yarn":
        return yarn_mscale(s)
    try:
        return float(p)
    except ValueError:
        raise ValueError(f"unknown mscale policy {policy!r} (su | yarn | <number>)") from None
