"""``elmo average``: checkpoint averaging (:func:`torchelmo.train.average.average`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ElmoError
from ..io.fileio import check_destination, check_path_name
from ..train.average import _normalised, average


def _run_average(args) -> int:
    sources = list(args.models)
    check_path_name(args.output)
    if Path(args.output).exists() and not Path(args.output).is_dir():   # checked before the work
        raise ElmoError(f"{args.output}: is a file; -o names the LM directory to write")
    check_destination(args.output, directory=True)   # a read-only or forbidden place: before the work too
    lm = average(sources, args.weights)
    info = {"sources": [str(s) for s in sources], "n": len(sources)}
    if args.weights is not None:
        info["weights"] = _normalised(args.weights, len(sources))
    lm.save_pretrained(args.output, extra={"average": info})
    kind = "weighted mean" if args.weights is not None else "mean"
    print(f"{args.output}: the {kind} of {len(sources)} model(s)", file=sys.stderr)
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("average", help="average the parameters of snapshots of one LM (checkpoint averaging)")
    p.add_argument("models", nargs="+", help="LM directories, checkpoint files (e.g. RUN/checkpoints/*.pt) "
                                             "or Hugging Face Hub ids owner/name[@revision]")
    p.add_argument("-o", "--output", required=True, help="LM directory to write")
    p.add_argument("--weights", type=float, nargs="+", metavar="W",
                   help="one weight per model (normalised to sum 1); default: the plain mean")
    p.set_defaults(func=_run_average)
