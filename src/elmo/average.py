"""Weight averaging: ``elmo average`` (the mean of several snapshots of one training run).

Averaging the parameters of the last few checkpoints of a run (Polyak averaging, done after the
fact) smooths the noise of the final optimisation steps and usually lowers perplexity a little,
at no training cost. ``elmo train --keep-checkpoints N`` keeps the last N checkpoints under
``RUN/checkpoints/`` for this; LM directories written by ``elmo train`` (``RUN/best``,
``RUN/model``) can be averaged too. All inputs must have the same shapes (the same run, or runs of
the same configuration and vocabulary); the result is an ordinary LM directory.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from .errors import ElmoError
from .lm import LanguageModel


def load_lm(source: str | Path) -> LanguageModel:
    """An LM from an LM directory (``save_pretrained``) or a training checkpoint (``checkpoint.pt``)."""
    path = Path(source)
    if path.is_dir():
        return LanguageModel.from_pretrained(path)
    if not path.is_file():
        raise ElmoError(f"{path}: no such LM directory or checkpoint")
    from .train import _load_checkpoint, lm_from_checkpoint
    return lm_from_checkpoint(_load_checkpoint(path), path)


@torch.no_grad()
def average(sources: Sequence[str | Path]) -> LanguageModel:
    """The element-wise mean of the parameters of ``sources`` (LM dirs or checkpoints), as an LM
    shaped like the first one. Accumulates in float64, so the order of the inputs does not matter
    beyond rounding of the final cast."""
    if not sources:
        raise ElmoError("average: no models given")
    first = load_lm(sources[0])
    ref = first.state_dict()
    acc = {k: v.double().clone() for k, v in ref.items() if v.is_floating_point()}
    for src in sources[1:]:
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
                acc[k] += v.double()
            elif not torch.equal(v, ref[k]):  # integer buffers (none today) must agree
                raise ElmoError(f"{src}: non-float tensor {k} differs from {sources[0]}")
    n = len(sources)
    first.load_state_dict({k: (acc[k] / n).to(v.dtype) if k in acc else v for k, v in ref.items()})
    return first


def _run_average(args) -> int:
    sources = list(args.models)
    lm = average(sources)
    lm.save_pretrained(args.output, extra={"average": {"sources": [str(s) for s in sources], "n": len(sources)}})
    print(f"{args.output}: the mean of {len(sources)} model(s)", file=sys.stderr)
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("average", help="average the parameters of snapshots of one LM (checkpoint averaging)")
    p.add_argument("models", nargs="+", help="LM directories or checkpoint files (e.g. RUN/checkpoints/*.pt)")
    p.add_argument("-o", "--output", required=True, help="LM directory to write")
    p.set_defaults(func=_run_average)
