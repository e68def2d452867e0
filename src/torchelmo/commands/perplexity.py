"""``elmo perplexity``: the command line over :meth:`torchelmo.lm.model.LanguageModel.perplexity`."""

from __future__ import annotations

import json

from ..io.fileio import atomic_path, check_destination
from ..lm.corpus import expand_files
from ..lm.model import PERPLEXITY_MODES, LanguageModel
from ..runtime import add_device_args, apply_device_args, positive_int


def _run_perplexity(args) -> int:
    if args.json:
        check_destination(args.json)   # before the model loads and the text is scored
    device = apply_device_args(args)
    lm = LanguageModel.from_pretrained(args.model).to(device)
    files = expand_files(args.files)
    r = lm.perplexity(files, args.mode, batch_size=args.batch_size, unroll=args.unroll)
    r = {"model": str(args.model), "files": [str(f) for f in files], "mode": args.mode,
         "params": lm.num_parameters(), **r}
    text = json.dumps(r, indent=2)
    print(text)
    if args.json:
        with atomic_path(args.json) as tmp:
            tmp.write_text(text + "\n")
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("perplexity", help="perplexity of an LM on text (both directions)")
    p.add_argument("model", help="the LM: a directory written by elmo train (e.g. RUN/best) or a "
                                 "Hugging Face Hub id owner/name[@revision]")
    p.add_argument("files", nargs="+", help="files or globs, one sentence per line")
    p.add_argument("--mode", choices=PERPLEXITY_MODES, default="sentence",
                   help="sentence: each sentence from a zero state; stream: the text as contiguous "
                        "streams with carried state (as word-level LM papers)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="sentences (sentence) or streams (stream) per batch (default 64)")
    p.add_argument("--unroll", type=positive_int, default=20, help="stream mode: tokens per step (default 20)")
    add_device_args(p)
    p.add_argument("--json", default=None, help="also write the result to this file")
    p.set_defaults(func=_run_perplexity)
