"""A training corpus: files or globs of sentences, streamed and shuffled with an exact position.

Files ("shards") are read line by line, never whole: each shard is read in blocks of
``block_lines`` lines and each block is shuffled, the shard order is shuffled every epoch.
Blank lines are skipped. Every shuffle is seeded by ``(seed, epoch, shard, block)``, so a
:class:`CorpusPosition` (epoch, shard, block byte offset, index in block) is enough to resume
exactly where a run stopped.
"""

from __future__ import annotations

import glob
import hashlib
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ElmoError, warn
from ..io.fileio import check_path_name
from ..io.text import read_lines
from ..model.chars import MAX_CHARS

MAX_TOKEN_BYTES = MAX_CHARS - 2  # longer tokens are truncated in their character ids


def expand_files(patterns: Sequence[str | Path]) -> list[Path]:
    """Files named or matched by glob patterns, in order (each pattern's matches sorted)."""
    if isinstance(patterns, (str, Path)):
        patterns = [patterns]
    out: list[Path] = []
    for pat in patterns:
        s = os.path.expanduser(str(pat))
        check_path_name(s)
        matches = sorted(glob.glob(s, recursive=True)) if glob.has_magic(s) else [s]
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            if not glob.has_magic(s) and Path(s).exists():
                raise ElmoError(f"{s}: not a file")
            raise ElmoError(f"{s}: no such file" if not glob.has_magic(s) else f"{s}: matches no files")
        for f in files:
            if f not in out:
                out.append(f)
    return out


@dataclass
class CorpusPosition:
    """Where the next sentence comes from: shard ``order[shard]`` of ``epoch``, the block that
    starts at byte ``offset`` (line ``line0``), item ``index`` of that block's shuffled order."""

    epoch: int = 0
    shard: int = 0
    block: int = 0
    offset: int = 0
    line0: int = 0
    index: int = 0

    def asdict(self) -> dict:
        return asdict(self)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, computed once per process for a given size and modification time."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


class Corpus:
    """Sentences (token lists) of files or globs, streamed and shuffled per shard.

    ``shuffle=False`` reads the files in the order given, lines in file order.
    """

    def __init__(self, patterns: Sequence[str | Path], shuffle: bool = True, seed: int = 0,
                 block_lines: int = 1_000_000) -> None:
        self.files = expand_files(patterns)
        self.shuffle = shuffle
        self.seed = seed
        self.block_lines = block_lines
        self.name = " ".join(str(f) for f in self.files)

    def fingerprint(self) -> list[list]:
        """``[name, bytes, sha256]`` of each file, in order: what a saved position is valid for.
        Names without folders, so a moved corpus still resumes; the digest sees an edit that keeps
        every size (each file is read once per process, a second per GB; see :func:`file_digest`)."""
        return [[f.name, f.stat().st_size, file_digest(f)] for f in self.files]

    def check_fingerprint(self, saved: list | None, where: str) -> None:
        """Refuse a position saved on other files (``saved=None``: nothing was recorded). A
        fingerprint saved as ``[name, bytes]`` (before digests were recorded) is checked on those."""
        if saved is None:
            return
        current = self.fingerprint()
        saved = [list(x) for x in saved]
        if [x[:len(s)] for x, s in zip(current, saved)] == saved and len(saved) == len(current):
            return
        now = {x[0]: x[1:] for x in current}
        was = {x[0]: x[1:] for x in saved}

        def change(n: str) -> str | None:
            (b0, *d0), (b1, *d1) = was[n], now[n]
            if b0 != b1:
                return f"{n} {b0:,} -> {b1:,} bytes"
            return f"{n} content changed (same size)" if d0 and d0 != d1[:len(d0)] else None
        diff = ([f"{n} added" for n in now if n not in was] + [f"{n} removed" for n in was if n not in now]
                + [c for n in now if n in was and (c := change(n))])
        raise ElmoError(f"{where}: the training files changed since this position was saved "
                        f"({', '.join(diff[:3]) or 'order changed'}{', ...' if len(diff) > 3 else ''}); "
                        "resume with --new-data to start a new epoch on the current files")

    def _shard_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.files)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def sentences(self, start: CorpusPosition | None = None, epochs: int | None = None
                  ) -> Iterator[tuple[list[str], CorpusPosition]]:
        """Yield ``(tokens, position of the next sentence)``; ``epochs=None`` cycles forever."""
        pos = CorpusPosition(**asdict(start)) if start is not None else CorpusPosition()
        while epochs is None or pos.epoch < epochs:
            order = self._shard_order(pos.epoch)
            produced = pos.shard > 0 or pos.block > 0 or pos.index > 0
            while pos.shard < len(order):
                shard = order[pos.shard]
                while True:
                    sents, end, last = self._read_block(pos, shard)
                    for i in range(pos.index, len(sents)):
                        produced = True
                        nxt = CorpusPosition(pos.epoch, pos.shard, pos.block, pos.offset, pos.line0, i + 1)
                        if i + 1 == len(sents):  # point past the block: resume never rereads it
                            nxt = CorpusPosition(pos.epoch, pos.shard, pos.block + 1, end, last, 0)
                        yield sents[i], nxt
                    if not sents:
                        break  # end of shard
                    pos = CorpusPosition(pos.epoch, pos.shard, pos.block + 1, end, last, 0)
                pos = CorpusPosition(pos.epoch, pos.shard + 1, 0, 0, 0, 0)
            if not produced:
                raise ElmoError(f"corpus {self.name}: no sentences (all files empty or blank)")
            pos = CorpusPosition(pos.epoch + 1, 0, 0, 0, 0, 0)

    def _read_block(self, pos: CorpusPosition, shard: int) -> tuple[list[list[str]], int, int]:
        # Blocks made only of blank lines are skipped here so that an empty list means end of shard.
        while True:
            sents, end, last = self._block_lines(pos, shard)
            if sents or end == pos.offset:
                return sents, end, last
            pos = CorpusPosition(pos.epoch, pos.shard, pos.block, end, last, 0)

    def _block_lines(self, pos: CorpusPosition, shard: int) -> tuple[list[list[str]], int, int]:
        path = self.files[shard]
        sents: list[list[str]] = []
        end, n = pos.offset, pos.line0
        for line in read_lines(path, start=pos.offset, first_index=pos.line0, what="corpus file"):
            end, n = line.end, n + 1
            if line.tokens:
                _check_long_tokens(path, n, line.tokens)
                sents.append(line.tokens)
            if n - pos.line0 == self.block_lines:
                break
        if sents and self.shuffle:
            random.Random(f"{self.seed}/{pos.epoch}/{shard}/{pos.block}").shuffle(sents)
        return sents, end, n


_warned_files: set[str] = set()


def _check_long_tokens(path: Path, line: int, toks: list[str]) -> None:
    if str(path) in _warned_files:
        return
    for t in toks:
        if len(t) > MAX_TOKEN_BYTES // 4 and len(t.encode("utf-8")) > MAX_TOKEN_BYTES:
            _warned_files.add(str(path))
            warn(f"{path}: line {line}: token of {len(t.encode('utf-8'))} bytes; its characters are "
                 f"truncated to {MAX_TOKEN_BYTES} bytes as in the original (its target id is unaffected); "
                 "further such tokens in this file are not reported")
            return

