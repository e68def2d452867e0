"""Weight averaging: ``elmo average`` (the mean of several snapshots of one training run).

Averaging the parameters of the last few checkpoints of a run (Polyak averaging, done after the
fact) smooths the noise of the final optimisation steps and usually lowers perplexity a little,
at no training cost. ``elmo train --keep-checkpoints N`` keeps the last N checkpoints under
``RUN/checkpoints/`` for this; LM directories written by ``elmo train`` (``RUN/best``,
``RUN/model``) can be averaged too. All inputs must have the same shapes (the same run, or runs of
the same configuration and vocabulary); the result is an ordinary LM directory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import ElmoError
from ..lm.model import LanguageModel
from .checkpoint import load_lm


def _normalised(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise ElmoError(f"average: {len(w)} weight(s) for {n} model(s)")
    if any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        raise ElmoError(f"average: weights must be finite, non-negative and not all zero, got {w}")
    return [x / sum(w) for x in w]


@torch.no_grad()
def average(sources: Sequence[str | Path], weights: Sequence[float] | None = None) -> LanguageModel:
    """The element-wise mean of the parameters of ``sources`` (LM dirs or checkpoints), as an LM
    shaped like the first one. ``weights`` (normalised to sum 1) makes it a weighted mean, e.g. an
    interpolation between a model and the one it was fine-tuned from. Accumulates in float64, so the
    order of the inputs does not matter beyond rounding of the final cast."""
    if not sources:
        raise ElmoError("average: no models given")
    w = _normalised(weights, len(sources))
    first = load_lm(sources[0])
    ref = first.state_dict()
    acc = {k: v.double() * w[0] for k, v in ref.items() if v.is_floating_point()}
    for src, wi in zip(sources[1:], w[1:]):
        other = load_lm(src)
        if other.vocab.tokens != first.vocab.tokens:
            raise ElmoError(f"{src}: another vocabulary than {sources[0]}; only snapshots of one model can be averaged")
        sd = other.state_dict()
        if set(sd) != set(ref):
            diff = sorted(set(sd) ^ set(ref))
            raise ElmoError(f"{src}: other parameters than {sources[0]} ({', '.join(diff[:3])} ...)")
        for k, v in sd.items():
            if v.shape != ref[k].shape:
                raise ElmoError(f"{src}: {k} has shape {tuple(v.shape)}, {sources[0]} has {tuple(ref[k].shape)}")
            if k in acc:
                acc[k] += v.double() * wi
            elif not torch.equal(v, ref[k]):  # integer buffers (none today) must agree
                raise ElmoError(f"{src}: non-float tensor {k} differs from {sources[0]}")
    first.load_state_dict({k: acc[k].to(v.dtype) if k in acc else v for k, v in ref.items()})
    return first
