"""Pieces every probe shares: layer names, per-feature standardization, the early-stopped fit.

The task modules (:mod:`.pos`, :mod:`.wsd`, :mod:`.ner`) import these from here and never from
one another, so a change to one probe cannot silently change another.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn as nn

from ..errors import ElmoError


def check_seeds(seeds, what: str) -> None:
    """Probes trained per input: a positive integer (1.5, 0 and True are errors)."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ElmoError(f"{what}: seeds must be a positive integer, got {seeds!r}")


def layer_names(num_layers: int) -> list[str]:
    """``["E0", ..., "E{L-1}"]`` for ``num_layers`` representations (E0 is the char-CNN layer)."""
    return [f"E{k}" for k in range(num_layers)]


class Standardize(nn.Module):
    """``(x - mean) / std`` with training-set statistics, per feature (and per layer for ``(L, F)``).

    A linear probe on standardized features has the same capacity as on raw ones; standardizing
    makes the optimiser treat every layer alike (a random LSTM's outputs are tiny), and makes the
    mix weights compare layers at equal scale.
    """

    def __init__(self, mean: np.ndarray, std: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean, self.std
        if x.dim() == 3 and mean.dim() == 2:  # (L, B, F) with (L, F) statistics
            mean, std = mean.unsqueeze(1), std.unsqueeze(1)
        return (x.float() - mean) / std

    @classmethod
    def fit(cls, x: np.ndarray, token_axis: int = 0, chunk: int = 65536) -> Standardize:
        # float64 sums in chunks: a float16 (L, N, F) array is never cast whole.
        n = x.shape[token_axis]
        s = s2 = 0.0
        for a in range(0, n, chunk):
            xb = np.take(x, np.arange(a, min(n, a + chunk)), axis=token_axis).astype(np.float64)
            s = s + xb.sum(token_axis)
            s2 = s2 + (xb ** 2).sum(token_axis)
        mean = s / max(n, 1)
        std = np.sqrt(np.maximum(s2 / max(n, 1) - mean ** 2, 0.0))
        return cls(mean, np.where(std > 1e-6, std, 1.0))


def fit_early_stopped(model: nn.Module, epoch_losses: Callable[[], Iterable[torch.Tensor]],
                      dev_score: Callable[[], float], *, lr: float, max_epochs: int, patience: int,
                      weight_decay: float = 0.0, min_epochs: int = 1,
                      tie_break: Callable[[], float] | None = None, lr_decay: float | None = None) -> dict:
    """Adam over ``epoch_losses()`` per epoch, early-stopped on ``dev_score()``.

    ``epoch_losses()`` yields one epoch's mini-batch losses, each computed just before its step
    (the model is in train mode); ``dev_score()`` scores the model after the epoch (higher is
    better). Training stops after ``patience`` epochs without a strict improvement, but never
    before ``min_epochs``. ``tie_break()`` (higher is better; called right after ``dev_score()``,
    for the same epoch) decides between epochs of equal dev score, so that a flat stretch of it (a tagger that predicts no entity yet has F1 0 epoch after
    epoch) does not end training while the model still improves. ``lr_decay``: the learning rate
    is multiplied by it after every epoch that does not improve (a plateau schedule with no
    patience, as Hewitt & Manning train their structural probe). The best epoch's weights are
    loaded back and the model is left in eval mode. Returns ``{"best_score", "best_epoch",
    "epochs", "history"}`` (dev score per epoch).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    # any first epoch beats the start, whatever the score's sign (a negated loss is negative)
    best, best_key, best_score, best_epoch, bad = copy.deepcopy(model.state_dict()), (-math.inf, -math.inf), -math.inf, 0, 0
    history: list[float] = []
    for epoch in range(1, max_epochs + 1):
        model.train()
        for loss in epoch_losses():
            opt.zero_grad()
            loss.backward()
            opt.step()
        score = dev_score()
        history.append(score)
        key = (score, tie_break() if tie_break is not None else 0.0)
        if key > best_key:
            best, best_key, best_score, best_epoch, bad = copy.deepcopy(model.state_dict()), key, score, epoch, 0
        else:
            bad += 1
            if bad >= patience and epoch >= min_epochs:
                break
            if lr_decay is not None:
                for group in opt.param_groups:
                    group["lr"] *= lr_decay
    model.load_state_dict(best)
    model.eval()
    return {"best_score": best_score, "best_epoch": best_epoch, "epochs": len(history), "history": history}


def mix_summary(mixes: list[nn.Module]) -> dict:
    """What the trained ScalarMixes of one probe's seeds learnt: their mean ``weights``
    (softmax(s), one per layer) and ``gamma``, and, over more than one seed, each seed's weights
    (``seed_weights``: a claim about the mix must hold for every seed, not for the mean)."""
    out = {"weights": np.mean([m.weights() for m in mixes], axis=0).tolist(),
           "gamma": float(np.mean([m.gamma_value() for m in mixes]))}
    if len(mixes) > 1:
        out["seed_weights"] = [m.weights() for m in mixes]
    return out


def task_sections(results: dict) -> list[tuple[str, dict]]:
    """The per-layer tasks of ``results`` in report order: ``(name, flat summary)``; the two
    dependency probes are ``deps_uas`` and ``deps_labels``, tag probes ``tag`` / ``tag:NAME``."""
    out = [(t, results[t]) for t in ("pos", "pos_xpos", "pos_wsj") if t in results]
    out += [(f"deps_{t}", results["deps"][t]) for t in ("uas", "labels", "uuas", "uuas_hm") if t in results.get("deps", {})]
    out += [(t, results[t]) for t in ("wsd", "coref") if t in results]
    out += [(t, results[t]) for t in sorted(results) if t == "tag" or t.startswith("tag:")]
    return out
