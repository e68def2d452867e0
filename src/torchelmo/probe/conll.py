"""Readers for tagged sentences: CoNLL-U (UD treebanks, UPOS or XPOS) and two-column CoNLL (WNUT-17).

Both return :class:`TaggedSentence` lists. Malformed input raises :class:`~torchelmo.errors.ElmoError`
naming the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ElmoError


@dataclass
class TaggedSentence:
    tokens: list[str]
    tags: list[str]
    line: int = 0  # 1-based line where the sentence starts (for messages)


def _open_lines(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ElmoError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_conllu(path: str | Path, tagset: str = "upos", limit: int | None = None) -> list[TaggedSentence]:
    """Sentences of a CoNLL-U file with their UPOS (column 4) or XPOS (column 5) tags.

    Syntactic words are the units: multi-word token ranges (``1-2``) are skipped, their parts kept,
    and empty nodes (``8.1``, enhanced graphs only) skipped, as UD's word counts do.
    ``limit``: stop after that many sentences.
    """
    col = {"upos": 3, "xpos": 4}.get(tagset.lower())
    if col is None:
        raise ElmoError(f"tagset must be 'upos' or 'xpos', got {tagset!r}")
    path, lines = _open_lines(path)
    out: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0

    def flush():
        nonlocal tokens, tags
        if tokens:
            out.append(TaggedSentence(tokens, tags, start))
        tokens, tags = [], []

    for i, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise ElmoError(f"{path}:{i}: expected 10 tab-separated CoNLL-U columns, got {len(cols)}")
        wid = cols[0]
        if "-" in wid or "." in wid:
            continue
        if not wid.isdigit():
            raise ElmoError(f"{path}:{i}: bad word id {wid!r}")
        if int(wid) != len(tokens) + 1:
            raise ElmoError(f"{path}:{i}: word id {wid} out of sequence (expected {len(tokens) + 1}); "
                            "missing blank line between sentences?")
        form, tag = cols[1], cols[col]
        if not form or tag in ("", "_"):
            raise ElmoError(f"{path}:{i}: word {wid} has no {'form' if not form else tagset.upper()}")
        if not tokens:
            start = i
        tokens.append(form)
        tags.append(tag)
    else:
        flush()
    if not out:
        raise ElmoError(f"{path}: no sentences found")
    return out


def read_conll(path: str | Path, limit: int | None = None) -> list[TaggedSentence]:
    """Two-column ``token<TAB>tag`` files, a blank (or whitespace-only) line between sentences,
    as WNUT-17 ships them (BIO tags such as ``B-location``)."""
    path, lines = _open_lines(path)
    out: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    for i, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            if tokens:
                out.append(TaggedSentence(tokens, tags, start))
            tokens, tags = [], []
            continue
        cols = line.rstrip("\r").split("\t")
        if len(cols) != 2 or not cols[0] or not cols[1].strip():
            raise ElmoError(f"{path}:{i}: expected 'token<TAB>tag', got {line[:60]!r}")
        tag = cols[1].strip()
        if not (tag == "O" or (tag[:2] in ("B-", "I-") and len(tag) > 2)):
            raise ElmoError(f"{path}:{i}: tag {tag!r} is not BIO (O, B-type, I-type)")
        if not tokens:
            start = i
        tokens.append(cols[0])
        tags.append(tag)
    else:
        if tokens:
            out.append(TaggedSentence(tokens, tags, start))
    if not out:
        raise ElmoError(f"{path}: no sentences found")
    return out


def bio_spans(tags: list[str]) -> set[tuple[int, int, str]]:
    """Entities ``(start, end_exclusive, type)`` of a BIO sequence, conlleval-style: an ``I-x``
    that does not continue an ``x`` entity starts a new one."""
    spans = set()
    start, typ = None, None
    for i, t in enumerate(list(tags) + ["O"]):
        if t == "O" or t.startswith("B-") or (t.startswith("I-") and t[2:] != typ):
            if start is not None:
                spans.add((start, i, typ))
            start, typ = (i, t[2:]) if t != "O" else (None, None)
    return spans
