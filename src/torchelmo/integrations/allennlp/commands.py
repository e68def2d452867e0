"""``allennlp.commands.main`` for its ``elmo`` subcommand: ``run.py elmo INPUT OUTPUT --all``
with AllenNLP's flags and defaults, run as AllenNLP ran it (``ElmoEmbedder(options_file,
weight_file, cuda_device).embed_file(...)``), errors raised rather than printed: a blank line is
AllenNLP's :class:`~.checks.ConfigurationError`. torchelmo's own command line is ``elmo embed``
(which takes these flags too, see docs/migrating.md)."""

from __future__ import annotations

import argparse
import sys

from .embedder import DEFAULT_BATCH_SIZE, DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, ElmoEmbedder


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run AllenNLP's commands (here: elmo)")
    sub = parser.add_subparsers(title="Commands", dest="command", required=True)
    p = sub.add_parser("elmo", description="Create word vectors using a pretrained ELMo model.",
                       help="Create word vectors using a pretrained ELMo model.")
    p.add_argument("input_file", help="The path to the input file.")
    p.add_argument("output_file", help="The path to the output file.")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--all", action="store_true", help="Output all three ELMo vectors.")
    group.add_argument("--top", action="store_true", help="Output the top ELMo vector.")
    group.add_argument("--average", action="store_true", help="Output the average of the ELMo vectors.")
    p.add_argument("--vocab-path", help="A path to a vocabulary file (accepted; the output does not depend on it).")
    p.add_argument("--options-file", default=DEFAULT_OPTIONS_FILE, help="The path to the ELMo options file.")
    p.add_argument("--weight-file", default=DEFAULT_WEIGHT_FILE, help="The path to the ELMo weight file.")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="The batch size to use.")
    p.add_argument("--file-friendly-logging", action="store_true", help="Accepted (no progress bar is drawn).")
    p.add_argument("--cuda-device", type=int, default=-1, help="The cuda_device to run on.")
    p.add_argument("--forget-sentences", action="store_true",
                   help="Do not write the sentence_to_index dataset.")
    p.add_argument("--use-sentence-keys", action="store_true",
                   help="Name each dataset by its sentence instead of its line index.")
    p.add_argument("--include-package", action="append", default=[], help="Accepted and ignored.")
    return parser


def main(prog: str | None = None) -> None:
    """Parse ``sys.argv`` as ``allennlp`` did and run the command."""
    args = _parser(prog).parse_args(sys.argv[1:])
    output_format = "all" if args.all else "top" if args.top else "average"
    embedder = ElmoEmbedder(args.options_file, args.weight_file, args.cuda_device)
    embedder.embed_file(args.input_file, args.output_file, output_format, args.batch_size,
                        args.forget_sentences, args.use_sentence_keys)
