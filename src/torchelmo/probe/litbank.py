"""LitBank (CoNLL-2012 coreference of 100 novel openings): its reader and the split by novel."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import ElmoError


class Mention(NamedTuple):
    sentence: int  # sentence index within the document
    start: int     # first token
    end: int       # one past the last token (a mention never crosses a sentence boundary)
    entity: int    # the chain's id within the document


@dataclass
class CorefDocument:
    name: str
    sentences: list[list[str]]
    mentions: list[Mention]  # in document order: (sentence, start, end, entity)

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for s in self.sentences)


_PART = re.compile(r"\((\d+)\)|\((\d+)|(\d+)\)")
_NONE = {"", "_", "-"}


def _columns(line: str) -> list[str]:
    # LitBank is tab-separated with an empty last column where there is no mention; other
    # CoNLL-2012 files align columns with spaces (and always write "-" there).
    return line.split("\t") if "\t" in line else line.split()


def read_litbank_file(path: str | Path) -> CorefDocument:
    """One CoNLL-2012 document: column 4 the token, the last column the coreference chains.

    A cell holds ``|``-separated parts ``(N`` (a mention of entity N opens), ``N)`` (the latest
    open mention of N closes), ``(N)`` (a one-token mention); ``_``, ``-`` or empty for none.
    Parts are applied left to right, so ``N)|(N`` closes one mention and opens the next.
    """
    path = Path(path)
    sentences: list[list[str]] = []
    mentions: list[Mention] = []
    current: list[str] = []
    open_: dict[int, list[tuple[int, int]]] = {}  # entity -> stack of (token, line) it opened at
    state = "before"  # -> "in" at #begin document -> "after" at #end document

    def fail(ln: int, what: str) -> ElmoError:
        return ElmoError(f"{path}:{ln}: {what}")

    def end_sentence(ln: int) -> None:
        for e, stack in open_.items():
            if stack:
                raise fail(stack[-1][1], f"the mention of entity {e} opened here is not closed before "
                                         f"the end of its sentence (line {ln})")
        if current:
            sentences.append(current.copy())
            current.clear()

    with open(path, encoding="utf-8") as f:
        for ln, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if line.startswith("#begin document"):
                if state != "before":
                    raise fail(ln, "a second '#begin document' (one document per file)")
                state = "in"
                continue
            if line.startswith("#end document"):
                if state != "in":
                    raise fail(ln, "'#end document' without '#begin document'")
                end_sentence(ln)
                state = "after"
                continue
            if not line.strip():
                if state == "in":
                    end_sentence(ln)
                continue
            if state != "in":
                raise fail(ln, "a token line outside '#begin document' ... '#end document'")
            cols = _columns(line)
            if len(cols) < 5:
                raise fail(ln, f"expected at least 5 columns (token in column 4, chains in the last), "
                               f"got {len(cols)}")
            token, cell = cols[3], cols[-1].strip()
            if not token or token != token.strip() or " " in token:
                raise fail(ln, f"bad token {token!r} (empty or with spaces)")
            t = len(current)
            current.append(token)
            if cell in _NONE:
                continue
            for part in cell.split("|"):
                m = _PART.fullmatch(part)
                if m is None:
                    raise fail(ln, f"bad coreference part {part!r} in {cell!r} "
                                   "(expected '(N', 'N)' or '(N)')")
                one, opens, closes = m.groups()
                s = len(sentences)
                if one is not None:
                    mentions.append(Mention(s, t, t + 1, int(one)))
                elif opens is not None:
                    open_.setdefault(int(opens), []).append((t, ln))
                else:
                    stack = open_.get(int(closes))
                    if not stack:
                        raise fail(ln, f"'{part}' closes entity {closes}, which has no open mention")
                    start, _ = stack.pop()
                    mentions.append(Mention(s, start, t + 1, int(closes)))
    if state == "before":
        raise ElmoError(f"{path}: no '#begin document' line")
    if state == "in":
        raise ElmoError(f"{path}: no '#end document' line")
    return CorefDocument(path.name.removesuffix(".conll"), sentences, sorted(mentions))


def read_litbank(folder: str | Path, pattern: str = "*.conll") -> list[CorefDocument]:
    """Every ``*.conll`` file of ``folder``, one document each, sorted by file name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ElmoError(f"{folder}: no such folder (LitBank's coref/conll files)")
    files = sorted(folder.glob(pattern), key=lambda p: p.name)
    if not files:
        raise ElmoError(f"{folder}: no {pattern} files")
    return [read_litbank_file(p) for p in files]


# -- the split by novel --------------------------------------------------------------------------

def part_sizes(n: int, sizes: Sequence[int]) -> list[int]:
    """``n`` split in proportion to ``sizes`` (largest remainders); with ``n >= len(sizes)`` no
    part is left empty (a missing one borrows from the largest)."""
    total = sum(sizes)
    if total <= 0 or any(s < 0 for s in sizes):
        raise ElmoError(f"split: sizes must be non-negative with a positive sum, got {list(sizes)}")
    exact = [n * s / total for s in sizes]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda k: (-(exact[k] - out[k]), k))
    for k in by_remainder[:n - sum(out)]:
        out[k] += 1
    if n >= len(sizes):
        for k in range(len(sizes)):
            if out[k] == 0:
                out[max(range(len(out)), key=lambda q: (out[q], -q))] -= 1
                out[k] = 1
    return out


def split_documents(docs: Sequence[CorefDocument], seed: int = 0, sizes: Sequence[int] = (70, 10, 20)
                    ) -> tuple[list[CorefDocument], list[CorefDocument], list[CorefDocument]]:
    """(train, dev, test) by novel: the names sorted, ``random.Random(seed).shuffle``d, cut in
    that order into parts of ``sizes`` (scaled in proportion for another number of documents).
    Each part is returned sorted by name."""
    by_name = {d.name: d for d in docs}
    if len(by_name) != len(docs):
        raise ElmoError("split: two documents share a name")
    names = sorted(by_name)
    random.Random(seed).shuffle(names)
    parts, a = [], 0
    for k in part_sizes(len(names), sizes):
        parts.append([by_name[n] for n in sorted(names[a:a + k])])
        a += k
    return tuple(parts)  # type: ignore[return-value]
