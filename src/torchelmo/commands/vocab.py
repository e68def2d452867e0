"""``elmo vocab``: a vocabulary file from a corpus (:class:`torchelmo.lm.vocab.Vocabulary`)."""

from __future__ import annotations

import sys

from ..lm.vocab import Vocabulary


def _run_vocab(args) -> int:
    vocab = Vocabulary.build(args.corpus, min_count=args.min_count, max_size=args.max_size)
    vocab.save(args.output, with_counts=args.counts)
    counts = vocab.counts or []
    total = sum(counts[1:]) if counts else 0
    covered = total - (counts[2] if counts else 0)
    print(f"{args.output}: {len(vocab):,} entries (incl. <S> </S> <UNK>); the vocabulary covers "
          f"{covered / max(1, total):.2%} of {total:,} target tokens", file=sys.stderr)
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("vocab", help="build a vocabulary file from a corpus")
    p.add_argument("corpus", nargs="+", help="files or globs, one sentence per line")
    p.add_argument("-o", "--output", required=True, help="vocabulary file to write")
    p.add_argument("--min-count", type=int, default=1, help="keep tokens seen at least this often")
    p.add_argument("--max-size", type=int, default=None, help="at most this many entries (specials included)")
    p.add_argument("--counts", action="store_true", help="write 'token<TAB>count' lines")
    p.set_defaults(func=_run_vocab)
