"""``elmo embed`` and ``elmo embed-merge``: the command line over :mod:`torchelmo.embed`."""

from __future__ import annotations

import os
import sys
import warnings

from ..embed.engine import STATEFUL_BATCH_SIZE, STATELESS_BATCH_SIZE, STATELESS_MAX_TOKENS, ElmoWarning
from ..embed.hdf5 import embed_file, merge_shards, parse_shard
from ..errors import ElmoError, warn
from ..model.bilm import BiLM
from ..numerics.backend import BACKENDS, COMPILE_MIN_INPUT_BYTES
from ..numerics.precision import CHOICES as PRECISION_CHOICES
from ..numerics.precision import PRECISION_HELP
from ..runtime import (
    add_device_args,
    add_quiet_args,
    apply_device_args,
    positive_int,
    resolve_cuda_device,
    show_progress,
    show_summary,
)
from ..signals import Interrupts, mark_done


def add_subcommand(sub) -> None:
    """Register ``embed`` and ``embed-merge`` on the ``elmo`` subparsers."""
    p = sub.add_parser("embed", help="embed a text file (one sentence per line) into HDF5",
                       description="ELMo vectors for every line of INPUT, written to OUTPUT in the "
                       "HDF5 layout of AllenNLP's `elmo` command (a dataset per line, named by its "
                       "0-based index, plus sentence_to_index).")
    p.add_argument("input", help="UTF-8 text, one whitespace-tokenised sentence per line ('-': stdin)")
    p.add_argument("output", help="HDF5 file to write (replaced only when the run completes)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--all", dest="layers", action="store_const", const="all",
                      help="all layers: (3, n_tokens, 2P) per line")
    mode.add_argument("--top", dest="layers", action="store_const", const="top",
                      help="the top layer: (n_tokens, 2P)")
    mode.add_argument("--average", dest="layers", action="store_const", const="average",
                      help="the mean of the layers: (n_tokens, 2P)")
    p.add_argument("--options-file", help="published options.json (with --weight-file)")
    p.add_argument("--weight-file", help="published weights HDF5 (with --options-file)")
    p.add_argument("--model", help="model directory or published name (default: the embedded model)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"sentences per batch (default {STATELESS_BATCH_SIZE}; {STATEFUL_BATCH_SIZE} "
                   "with --stateful)")
    p.add_argument("--max-tokens-per-batch", type=positive_int, default=None,
                   help="cap on rows x longest sentence per batch (default "
                   f"{STATELESS_MAX_TOKENS} when --batch-size is not given either)")
    p.add_argument("--precision", choices=PRECISION_CHOICES, default="fp32",
                   help=PRECISION_HELP + "; the output is float32 either way")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="the LSTM recurrence's implementation: auto (default: Triton on CUDA when "
                   "installed, else PyTorch, its gates compiled under bf16 on a CPU), cpu, "
                   "cpu+compile (the gates compiled by torch.compile), triton or triton+graphs (CUDA graphs at inference)")
    p.add_argument("--stateful", action="store_true",
                   help="carry LSTM state from batch to batch (row r of batch i = line i*B + r), "
                   "as the original implementations did")
    p.add_argument("--pool", choices=["mean"], default=None,
                   help="mean over tokens: one vector per line ((3, 2P) with --all)")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with an error naming the line (strict), or replace bad bytes")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="embed only lines i with i %% N == K (0-based K; 'env': RANK/WORLD_SIZE from "
                   "torchrun); join the shard files with `elmo embed-merge`")
    p.add_argument("--no-sentence-index", "--forget-sentences", dest="no_sentence_index",
                   action="store_true",
                   help="omit the sentence_to_index dataset (keeps memory flat on huge inputs)")
    add_device_args(p)
    add_quiet_args(p)
    _add_allennlp_args(p)
    p.set_defaults(func=run)

    m = sub.add_parser("embed-merge", help="join `elmo embed --shard` outputs into one file",
                       description="Join the shard files of one `elmo embed --shard K/N` run into "
                       "OUTPUT, the datasets an unsharded run writes (equal to float32 rounding).")
    m.add_argument("output", help="the joined HDF5 file to write")
    m.add_argument("shards", nargs="+", help="the N shard files, in any order")
    m.add_argument("--link", action="store_true",
                   help="write an index of external links to the shards instead of copying")
    m.set_defaults(func=run_merge)


def load_model(args, stateful: bool = False) -> BiLM:
    """The model named by --options-file/--weight-file or --model (default: the embedded one)."""
    if (args.options_file is None) != (args.weight_file is None):
        raise ElmoError("--options-file and --weight-file go together")
    if args.options_file and args.model:
        raise ElmoError("give either --model or --options-file/--weight-file, not both")
    if args.options_file:
        return BiLM.from_published(args.options_file, args.weight_file, stateful=stateful)
    return BiLM.from_pretrained(args.model or "default", stateful=stateful)


def _add_allennlp_args(p) -> None:
    """The flags of AllenNLP's ``allennlp elmo``, with its meaning (see docs/migrating.md)."""
    g = p.add_argument_group("AllenNLP's `allennlp elmo` flags")
    g.add_argument("--cuda-device", type=int, default=None, metavar="N",
                   help="GPU N, or -1 for the CPU (instead of --device)")
    g.add_argument("--use-sentence-keys", action="store_true",
                   help="name each dataset by its sentence (the stripped line) instead of its line "
                   "index; no sentence_to_index (blank, repeated or '/'-holding lines are errors)")
    g.add_argument("--include-sentence-indices", action="store_true",
                   help="write the sentence_to_index dataset (already the default; older AllenNLP "
                   "versions needed this flag)")
    g.add_argument("--allennlp", action="store_true",
                   help="AllenNLP's defaults, for its numbers: batches of 64 lines in file order with "
                   "the LSTM state carried from batch to batch (--stateful), and a blank line is an "
                   "error; as torchelmo.integrations.allennlp.ElmoEmbedder.embed_file")
    g.add_argument("--vocab-path", metavar="FILE",
                   help="tokens (one per line) whose char-CNN embeddings are computed once up front; "
                   "the output is the same")
    g.add_argument("--file-friendly-logging", action="store_true",
                   help="log lines instead of a progress bar (as -q)")


def _allennlp_flags(args) -> None:
    """Fold ``--cuda-device`` into ``--device``, ``--allennlp`` into AllenNLP's defaults, and check
    the sentence-index flags."""
    if args.allennlp:
        args.stateful = True
        if args.batch_size is None:
            args.batch_size = ALLENNLP_BATCH_SIZE
    if args.file_friendly_logging:
        args.quiet = max(getattr(args, "quiet", 0) or 0, 1)
    if args.cuda_device is not None:
        if args.device != "auto":
            raise ElmoError("give either --device or --cuda-device, not both")
        args.device = str(resolve_cuda_device(args.cuda_device, "--cuda-device"))
    if args.include_sentence_indices and args.no_sentence_index:
        raise ElmoError("--include-sentence-indices contradicts --forget-sentences/--no-sentence-index")
    if args.include_sentence_indices and args.use_sentence_keys:
        raise ElmoError("--include-sentence-indices cannot be used with --use-sentence-keys "
                        "(the datasets are named by their sentences)")


ALLENNLP_BATCH_SIZE = 64   # allennlp elmo's --batch-size default


def _read_vocab(path: str) -> list[str]:
    """``--vocab-path``: one token per line (AllenNLP's vocabulary file; blank lines skipped)."""
    from ..io.text import read_lines
    return [t for line in read_lines(path) for t in line.tokens[:1]]


def model_name(args) -> str:
    """What the model was loaded from, as recorded in the output file."""
    if args.options_file:
        return f"{args.options_file} + {args.weight_file}"
    return str(args.model or "default")


def run(args) -> int:
    """``elmo embed``: load the model, embed INPUT into OUTPUT, print a one-line summary."""
    _allennlp_flags(args)
    if args.output == "-":
        raise ElmoError("OUTPUT -: an HDF5 file cannot be written to standard output; give a file name")
    device = apply_device_args(args)
    shard = parse_shard(args.shard) if args.shard else None
    with Interrupts():   # from the model's load on: SIGTERM ends in one line, as Ctrl-C does
        model = load_model(args, stateful=args.stateful)
        if args.vocab_path:
            model.cache_token_embeddings(_read_vocab(args.vocab_path))
    model = model.to(device)
    model.precision = args.precision
    model.backend = args.backend
    # Compiling pays only on large inputs (backend auto); stdin counts as large.
    model.long_run = args.input == "-" or not os.path.isfile(args.input) or \
        os.path.getsize(args.input) >= COMPILE_MIN_INPUT_BYTES
    with Interrupts(), warnings.catch_warnings():
        warnings.simplefilter("always", ElmoWarning)
        warnings.showwarning = _show_warning
        s = embed_file(model, args.input, args.output, args.layers, pool=args.pool,
                       batch_size=args.batch_size, max_tokens_per_batch=args.max_tokens_per_batch,
                       errors=args.errors, shard=shard, sentence_index=not args.no_sentence_index,
                       progress=show_progress(args), model_name=model_name(args),
                       keys="sentence" if args.use_sentence_keys else "index",
                       blank_lines="error" if args.allennlp else "warn")
        mark_done()   # OUTPUT is complete and in place
        if s.sentences == 0:
            warn(f"{args.input}: no lines to embed; {s.output} holds no sentences", ElmoWarning)
    if show_summary(args):
        rate = s.tokens / max(s.seconds, 1e-9)
        print(f"elmo embed: {s.sentences} lines ({s.tokens} tokens, {len(s.blank)} blank) -> "
              f"{s.output} in {s.seconds:.1f}s ({rate:,.0f} tokens/s)", file=sys.stderr)
    return 0


def run_merge(args) -> int:
    out = merge_shards(args.shards, args.output, link=args.link)
    mark_done()
    print(f"elmo embed-merge: {len(args.shards)} shards -> {out}", file=sys.stderr)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # Through tqdm, so that a warning does not break the progress bar's line.
    from tqdm import tqdm
    tqdm.write(f"elmo embed: warning: {message}", file=sys.stderr)

