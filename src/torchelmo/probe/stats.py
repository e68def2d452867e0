"""Bootstrap confidence intervals over evaluation units (sentences or instances), or over the
documents that hold them.

A score is a function of counts summed over units: accuracy = correct / tokens, F1 =
2 tp / (2 tp + fp + fn). Resampling *units* (whole sentences for tagging) respects the correlation
of tokens within a sentence, which resampling tokens would ignore. Units of one document (a
novel's mentions, a text's sentences) are correlated too: with ``groups``, whole documents are
resampled (a cluster bootstrap: the units' counts summed per document, then documents drawn with
replacement), which is what a claim about texts like the test texts needs.

Several probe seeds: give each seed's counts as its own ``k`` columns and score with
:func:`seed_mean`; every resample then holds the same units for every seed, so the interval
covers the test units and, through the mean, the seeds' spread.
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


def seed_mean(stat: Callable[[np.ndarray], np.ndarray], k: int) -> Callable[[np.ndarray], np.ndarray]:
    """A statistic of counts ``(..., n_seeds * k)``: the mean over seeds of ``stat`` of each seed's
    ``k`` columns."""
    def mean(c: np.ndarray) -> np.ndarray:
        n = c.shape[-1] // k
        return np.mean([stat(c[..., s * k:(s + 1) * k]) for s in range(n)], axis=0)
    return mean


def group_counts(counts: np.ndarray, groups) -> np.ndarray:
    """``(n_units, k)`` counts summed per group: ``(n_groups, k)``, in order of first appearance.
    ``groups``: ``n_units`` labels (a document's name or index per unit)."""
    counts = np.asarray(counts, dtype=np.float64)
    labels = np.asarray(groups)
    if labels.shape != (len(counts),):
        raise ElmoError(f"bootstrap: need one group per unit, got {labels.shape} for {len(counts)} units")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    out = np.zeros((len(first), counts.shape[1]))
    np.add.at(out, inverse, counts)
    return out[np.argsort(first)]


def bootstrap_ci(counts: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0, groups=None) -> tuple[float, float, float]:
    """Point estimate and percentile interval of ``stat(sum of counts over units)``.

    ``counts``: ``(n_units, k)`` per-unit counts; ``groups``: None (units resampled), or each
    unit's document (documents resampled, :func:`group_counts`). Returns ``(estimate, low, high)``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or len(counts) == 0:
        raise ElmoError(f"bootstrap: need (n_units, k) counts with n_units > 0, got shape {counts.shape}")
    if groups is not None:
        counts = group_counts(counts, groups)
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
                   n_boot: int = 1000, level: float = 0.95, seed: int = 0, groups=None) -> tuple[float, float, float]:
    """``stat(b) - stat(a)`` with a percentile interval, both systems scored on the *same*
    resampled units (a paired bootstrap: what makes a unit hard for both cancels out, so the
    interval is much narrower than the two separate intervals suggest).

    ``counts_a``, ``counts_b``: ``(n_units, k)`` per-unit counts of the two systems on the same units;
    ``groups``: as in :func:`bootstrap_ci` (both systems resampled by the same documents).
    """
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ElmoError(f"paired bootstrap: need two (n_units, k) count arrays of one shape, got {a.shape} and {b.shape}")
    k = a.shape[1]
    return bootstrap_ci(np.concatenate([a, b], 1), lambda c: stat(c[..., k:]) - stat(c[..., :k]),
                        n_boot, level, seed, groups)


class UnitScores:
    """Each probe's per-unit counts over its seeds, scored the one way every task reports: the
    mean over seeds of ``stat``, a bootstrap interval over units or, with ``groups``, over
    documents, and paired differences on the same resamples. :meth:`units` is what it scored,
    for anyone to recompute an interval.

    ``k``: counts per unit (2 for accuracy, 3 for F1); ``groups``: each unit's document, or None.
    """

    def __init__(self, stat: Callable[[np.ndarray], np.ndarray], k: int, groups=None, n_boot: int = 1000,
                 seed: int = 0) -> None:
        self.stat, self.k, self.n_boot, self.seed = stat, k, n_boot, seed
        self.groups = None if groups is None else [str(g) for g in groups]
        self.counts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, counts: np.ndarray) -> None:
        """One seed's ``(n_units, k)`` counts of probe ``name``."""
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[1] != self.k:
            raise ElmoError(f"scores: {name}: need (n_units, {self.k}) counts, got {counts.shape}")
        if self.groups is not None and len(counts) != len(self.groups):
            raise ElmoError(f"scores: {name}: {len(counts)} units, but {len(self.groups)} documents given")
        self.counts.setdefault(name, []).append(counts)

    def _all(self, name: str) -> np.ndarray:
        return np.concatenate(self.counts[name], axis=1)          # (n_units, k * seeds)

    def score(self, name: str, key: str) -> dict:
        """``{key: mean over seeds, "ci": [lo, hi], "seeds": [each seed's], "sd": spread}``."""
        runs = self.counts[name]
        est, lo, hi = bootstrap_ci(self._all(name), seed_mean(self.stat, self.k), self.n_boot, seed=self.seed,
                                   groups=self.groups)
        per_seed = [float(self.stat(c.sum(0))) for c in runs]
        return {key: est, "ci": [lo, hi], "seeds": per_seed,
                "sd": float(np.std(per_seed, ddof=1)) if len(runs) > 1 else 0.0}

    def once(self, counts: np.ndarray, key: str) -> dict:
        """``{key, "ci"}`` of counts not kept among the probes' (a baseline's): one run, the same
        resampling."""
        est, lo, hi = bootstrap_ci(counts, self.stat, self.n_boot, seed=self.seed, groups=self.groups)
        return {key: est, "ci": [lo, hi]}

    def paired(self, a: str, b: str) -> dict:
        """``b - a`` (means over seeds) with its paired interval."""
        d, lo, hi = paired_diff_ci(self._all(a), self._all(b), seed_mean(self.stat, self.k), self.n_boot,
                                   seed=self.seed, groups=self.groups)
        return {"diff": d, "ci": [lo, hi]}

    def units(self) -> dict:
        """The per-unit counts (``name -> (n_units, k * seeds)``, seed after seed) and each
        unit's document: what every interval above was computed from."""
        return {"k": self.k, "seeds": max((len(v) for v in self.counts.values()), default=0),
                "resampled": "documents" if self.groups is not None else "units",
                "documents": self.groups, "counts": {n: as_lists(self._all(n)) for n in self.counts}}


def as_lists(c: np.ndarray) -> list:
    """Per-unit counts as JSON lists (whole numbers as ints)."""
    return c.astype(np.int64).tolist() if np.array_equal(c, np.round(c)) else c.tolist()
