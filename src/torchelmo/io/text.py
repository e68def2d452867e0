"""Sentence files: UTF-8 text, one whitespace-tokenised sentence per line.

Every command that reads text (``elmo embed``, ``elmo vocab``, ``elmo train``, ``elmo perplexity``,
the probes' corpora) reads it through :func:`read_lines`, so they share one policy:

* invalid UTF-8 is an :class:`~torchelmo.errors.ElmoError` naming the file, line and byte
  (``errors="replace"`` turns bad bytes into U+FFFD instead);
* a UTF-8 byte-order mark at the very start of a file is dropped (editors on Windows write one;
  kept, it would glue itself to the first token);
* a line's tokens are ``str.split()`` of it: any run of whitespace separates tokens;
* lines are read one at a time, never the whole file.

:func:`length_batches` groups sentences of similar length, the one bucketing rule of embedding,
probing and sentence-batched training.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ElmoError
from .fileio import check_path_name

BOM = b"\xef\xbb\xbf"


@dataclass
class Line:
    index: int          # 0-based line number in the file
    text: str           # the line, surrounding whitespace stripped
    tokens: list[str]   # text.split(); empty for a blank line
    end: int            # byte offset just after the line (where reading can resume)


class LineReader:
    """Iterate over the :class:`Line` objects of a file (``"-"``: stdin).

    Parameters
    ----------
    path : the file.
    errors : ``"strict"`` or ``"replace"`` (invalid UTF-8).
    start : byte offset to start at (the ``end`` of an earlier line); 0 is the start of the file.
    first_index : the index of the line at ``start``.
    shard : ``(k, n)``: only lines with ``index % n == k`` are decoded and yielded.
    skip_blank : do not yield blank lines (they still count in ``lines_read``).
    hint : appended to the invalid-UTF-8 message (how the caller can get past it).
    what : what the file is, for the message when it cannot be opened.

    ``lines_read`` is the number of lines read so far from ``start`` (all shards).
    """

    def __init__(self, path: str | Path, *, errors: str = "strict", start: int = 0,
                 first_index: int = 0, shard: tuple[int, int] | None = None,
                 skip_blank: bool = False, hint: str = "", what: str = "input") -> None:
        if errors not in ("strict", "replace"):
            raise ElmoError(f"errors must be 'strict' or 'replace', got {errors!r}")
        self.path, self.errors, self.start, self.first_index = path, errors, start, first_index
        self.shard, self.skip_blank, self.hint, self.what = shard or (0, 1), skip_blank, hint, what
        self.name = "<stdin>" if str(path) == "-" else str(path)
        self.lines_read = 0

    def __iter__(self) -> Iterator[Line]:
        stdin = str(self.path) == "-"
        try:
            f = sys.stdin.buffer if stdin else open(self.path, "rb")
        except OSError as e:
            raise ElmoError(f"{self.name}: cannot read {self.what} ({e.strerror})") from None
        k, n = self.shard
        try:
            if self.start:
                f.seek(self.start)
            pos = self.start
            i = self.first_index - 1
            for raw in f:
                i += 1
                pos += len(raw)
                self.lines_read += 1
                if i % n != k:
                    continue
                if pos == len(raw) and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                try:
                    text = raw.decode("utf-8", errors=self.errors)
                except UnicodeDecodeError as e:
                    raise ElmoError(f"{self.name}: line {i + 1}: invalid UTF-8 (byte 0x{raw[e.start]:02x} "
                                    f"at column {e.start + 1}){self.hint}") from None
                tokens = text.split()
                if tokens or not self.skip_blank:
                    yield Line(i, text.strip(), tokens, pos)
        finally:
            if not stdin:
                f.close()


def read_lines(path: str | Path, **kw) -> LineReader:
    """The lines of a sentence file: see :class:`LineReader` for the options."""
    return LineReader(path, **kw)


def read_sentences(paths: Sequence[str | Path], what: str = "corpus file") -> Iterator[list[str]]:
    """The non-blank sentences (token lists) of several files, in order."""
    for path in paths:
        for line in read_lines(path, skip_blank=True, what=what):
            yield line.tokens


def count_lines(path: str | Path) -> int | None:
    """Number of lines of a regular file (a final line without newline counts), or None."""
    check_path_name(path)
    if str(path) == "-" or not Path(path).is_file():
        return None
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def length_batches(lengths: Sequence[int], max_rows: int | None = None, max_tokens: int | None = None,
                   *, descending: bool = True, min_rows: int = 1) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches of similar length.

    The items are sorted by length (stable: ties keep their order), longest first unless
    ``descending=False``, and cut greedily: a batch is closed when it holds ``max_rows`` items or
    when one more item would make ``rows x longest`` exceed ``max_tokens`` (that cap applies only
    once a batch has ``min_rows`` items, so an item longer than the cap goes alone).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=descending)
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if cur and ((max_rows is not None and len(cur) >= max_rows) or (
                max_tokens is not None and len(cur) >= min_rows and width * (len(cur) + 1) > max_tokens)):
            out.append(cur)
            cur, width = [], lengths[i]
        cur.append(i)
        longest = width
    if cur:
        out.append(cur)
    return out
