"""The LM's output vocabulary (the bilm-tf ``vocab.txt`` format) and ``elmo vocab``."""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import ElmoError
from ..io.fileio import atomic_path, open_regular
from ..io.text import read_sentences
from ..model.chars import BOS_TOKEN, EOS_TOKEN
from .corpus import expand_files

UNK_TOKEN = "<UNK>"
VOCAB_FILE_CAP = 4 * 2**30   # the 1B Word Benchmark's vocabulary is 7 MB
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


class Vocabulary:
    """Output vocabulary of the LM: ``<S>``, ``</S>``, ``<UNK>`` (ids 0, 1, 2), then the rest,
    most frequent first (the sampled softmax's log-uniform sampler relies on that order)."""

    bos, eos, unk = 0, 1, 2

    def __init__(self, tokens: Sequence[str], counts: Sequence[int] | None = None,
                 source: str = "vocabulary") -> None:
        tokens = list(tokens)
        if tuple(tokens[:3]) != SPECIAL_TOKENS:
            raise ElmoError(f"{source}: the first three entries must be <S>, </S>, <UNK> "
                            f"(got {', '.join(map(repr, tokens[:3])) or 'nothing'}); build the "
                            "vocabulary with `elmo vocab` or add those lines at the top")
        index: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in index:
                raise ElmoError(f"{source}: line {i + 1}: duplicate token {t!r} "
                                f"(first on line {index[t] + 1})")
            index[t] = i
        self.tokens = tokens
        self.index = index
        self.counts = list(counts) if counts is not None else None

    def __len__(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 of the tokens in order (not of the file: counts and line endings aside, the
        same vocabulary has the same digest); a checkpoint records it, and resume compares."""
        return hashlib.sha256("\n".join(self.tokens).encode("utf-8", "surrogatepass")).hexdigest()

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        return self.index.get(token, self.unk)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        get, unk = self.index.get, self.unk
        return [get(t, unk) for t in tokens]

    # -- files -----------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> Vocabulary:
        """One token per line (the bilm-tf format); an optional second column is a count."""
        path = Path(path)
        # a regular file (a FIFO or a device refused at once), read as a stream: vocabularies of
        # millions of words are fine, a sparse file of many GB is not
        f = open(open_regular(path, "vocabulary", VOCAB_FILE_CAP), encoding="utf-8")
        tokens, counts = [], []
        with f:
            try:
                for n, line in enumerate(f, 1):
                    parts = line.rstrip("\r\n").split()
                    if not parts:
                        raise ElmoError(f"{path}: line {n}: blank line in vocabulary")
                    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
                        raise ElmoError(f"{path}: line {n}: expected 'token' or 'token count', "
                                        f"got {line.strip()[:60]!r}")
                    tokens.append(parts[0])
                    counts.append(int(parts[1]) if len(parts) == 2 else None)
            except UnicodeDecodeError as e:
                raise ElmoError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not tokens:
            raise ElmoError(f"{path}: empty vocabulary file")
        have_counts = all(c is not None for c in counts[3:]) and len(tokens) > 3
        return cls(tokens, [c or 0 for c in counts] if have_counts else None, source=str(path))

    def save(self, path: str | Path, with_counts: bool = False) -> Path:
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for i, t in enumerate(self.tokens):
                if with_counts and self.counts is not None:
                    f.write(f"{t}\t{self.counts[i]}\n")
                else:
                    f.write(t + "\n")
        return path

    @classmethod
    def build(cls, files: Sequence[str | Path], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """Count a corpus (streamed) and keep tokens seen ``min_count`` times, most frequent first
        (ties alphabetically); ``max_size`` counts the three special tokens."""
        if max_size is not None and max_size < 3:
            raise ElmoError(f"vocabulary max size must be at least 3 (the special tokens), got {max_size}")
        counter: Counter[str] = Counter()
        n_sent = 0
        for toks in read_sentences(expand_files(files)):
            counter.update(toks)
            n_sent += 1
        if n_sent == 0:
            raise ElmoError(f"corpus {' '.join(map(str, files))}: no sentences (all files empty or blank)")
        n_eos = n_sent
        for t in SPECIAL_TOKENS:
            counter.pop(t, None)
        items = sorted(((t, c) for t, c in counter.items() if c >= min_count), key=lambda x: (-x[1], x[0]))
        if max_size is not None:
            items = items[: max_size - 3]
        unk = sum(counter.values()) - sum(c for _, c in items)
        tokens = list(SPECIAL_TOKENS) + [t for t, _ in items]
        counts = [n_sent, n_eos, unk] + [c for _, c in items]
        return cls(tokens, counts)
