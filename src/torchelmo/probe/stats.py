"""Bootstrap confidence intervals over evaluation units (sentences or instances).

A score is a function of counts summed over units: accuracy = correct / tokens, F1 =
2 tp / (2 tp + fp + fn). Resampling *units* (whole sentences for tagging) respects the correlation
of tokens within a sentence, which resampling tokens would ignore.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ElmoError


def accuracy_from_counts(c: np.ndarray) -> np.ndarray:
    """``c[..., 0]`` correct, ``c[..., 1]`` total."""
    return c[..., 0] / np.maximum(c[..., 1], 1)


def f1_from_counts(c: np.ndarray) -> np.ndarray:
    """``c[..., 0]`` tp, ``c[..., 1]`` fp, ``c[..., 2]`` fn (micro F1; 0 when there is nothing)."""
    tp, fp, fn = c[..., 0], c[..., 1], c[..., 2]
    return 2 * tp / np.maximum(2 * tp + fp + fn, 1)


def bootstrap_ci(counts: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and percentile interval of ``stat(sum of counts over units)``.

    ``counts``: ``(n_units, k)`` per-unit counts. Returns ``(estimate, low, high)``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or len(counts) == 0:
        raise ElmoError(f"bootstrap: need (n_units, k) counts with n_units > 0, got shape {counts.shape}")
    if not 0 < level < 1:
        raise ElmoError(f"bootstrap: level must be in (0, 1), got {level}")
    est = float(stat(counts.sum(0)))
    rng = np.random.default_rng(seed)
    n = len(counts)
    sums = np.empty((n_boot, counts.shape[1]))
    # Draw n units with replacement per resample; chunked for memory.
    chunk = max(1, 2 ** 22 // n)
    for a in range(0, n_boot, chunk):
        b = min(n_boot, a + chunk)
        idx = rng.integers(0, n, size=(b - a, n))
        sums[a:b] = counts[idx].sum(1)
    vals = stat(sums)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(vals, [alpha, 1 - alpha])
    return est, float(lo), float(hi)


def paired_diff_ci(counts_a: np.ndarray, counts_b: np.ndarray, stat: Callable[[np.ndarray], np.ndarray],
                   n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``stat(b) - stat(a)`` with a percentile interval, both systems scored on the *same*
    resampled units (a paired bootstrap: what makes a unit hard for both cancels out, so the
    interval is much narrower than the two separate intervals suggest).

    ``counts_a``, ``counts_b``: ``(n_units, k)`` per-unit counts of the two systems on the same units.
    """
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ElmoError(f"paired bootstrap: need two (n_units, k) count arrays of one shape, got {a.shape} and {b.shape}")
    k = a.shape[1]
    return bootstrap_ci(np.concatenate([a, b], 1), lambda c: stat(c[..., k:]) - stat(c[..., :k]),
                        n_boot, level, seed)
