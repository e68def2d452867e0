"""Readers for tagged sentences: CoNLL-U (UD treebanks: UPOS or XPOS, or the dependency tree),
two-column CoNLL (WNUT-17) and any token-per-line file with a tag column.

The taggers' readers return :class:`TaggedSentence` lists, the tree reader :class:`DepSentence`.
Malformed input raises :class:`~torchelmo.errors.ElmoError` naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ElmoError


@dataclass
class TaggedSentence:
    tokens: list[str]
    tags: list[str]
    line: int = 0  # 1-based line where the sentence starts (for messages)
    doc: str = ""  # the document it belongs to ("" where the file does not say)


_SENT_NUMBER = re.compile(r"[-_.]\d+$")   # a sent_id's sentence number: weblog-...-0001


def _open_lines(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ElmoError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _conllu_words(path: Path, lines: list[str], limit: int | None):
    """Sentences of a CoNLL-U file as ``(words, doc)``: the words as ``(line number, 10 columns)``,
    syntactic words only; the document, the last ``# newdoc id`` before the sentence, else its
    ``# sent_id`` without the trailing sentence number, else "".

    Multi-word token ranges (``1-2``) are skipped, their parts kept, and empty nodes (``8.1``,
    enhanced graphs only) skipped, as UD's word counts do. Word ids must run 1, 2, ...
    """
    words: list[tuple[int, list[str]]] = []
    n_out = 0
    newdoc: str | None = None
    sent_id = ""

    def doc() -> str:
        return newdoc if newdoc is not None else _SENT_NUMBER.sub("", sent_id)
    for i, line in enumerate(lines, 1):
        if limit is not None and n_out >= limit:
            return
        if not line.strip():
            if words:
                yield words, doc()
                n_out += 1
            words, sent_id = [], ""
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "newdoc id":
                newdoc = value.strip()
            elif key.strip() == "sent_id":
                sent_id = value.strip()
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise ElmoError(f"{path}:{i}: expected 10 tab-separated CoNLL-U columns, got {len(cols)}")
        wid = cols[0]
        if "-" in wid or "." in wid:
            continue
        if not wid.isdigit():
            raise ElmoError(f"{path}:{i}: bad word id {wid!r}")
        if int(wid) != len(words) + 1:
            raise ElmoError(f"{path}:{i}: word id {wid} out of sequence (expected {len(words) + 1}); "
                            "missing blank line between sentences?")
        if not cols[1]:
            raise ElmoError(f"{path}:{i}: word {wid} has no form")
        words.append((i, cols))
    if words and (limit is None or n_out < limit):
        yield words, doc()


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
    for words, doc in _conllu_words(path, lines, limit):
        for i, cols in words:
            if cols[col] in ("", "_"):
                raise ElmoError(f"{path}:{i}: word {cols[0]} has no {tagset.upper()}")
        out.append(TaggedSentence([c[1] for _, c in words], [c[col] for _, c in words], words[0][0], doc))
    if not out:
        raise ElmoError(f"{path}: no sentences found")
    return out


@dataclass
class DepSentence:
    """A sentence with its basic dependency tree: ``heads[i]`` is the 1-based index of word i's
    head (0 = ROOT), ``rels[i]`` its relation (DEPREL as written, e.g. ``nmod:poss``)."""

    tokens: list[str]
    heads: list[int]
    rels: list[str]
    line: int = 0
    doc: str = ""


def read_conllu_trees(path: str | Path, limit: int | None = None) -> list[DepSentence]:
    """Sentences of a CoNLL-U file with HEAD (column 7) and DEPREL (column 8) of every syntactic
    word (the words :func:`read_conllu` reads, so features extracted for one serve the other).

    A head must be 0 (ROOT) or a word of the sentence other than the word itself.
    """
    path, lines = _open_lines(path)
    out: list[DepSentence] = []
    for words, doc in _conllu_words(path, lines, limit):
        n = len(words)
        heads, rels = [], []
        for i, cols in words:
            head, rel = cols[6], cols[7]
            if not head.isdigit() or int(head) > n or int(head) == int(cols[0]):
                raise ElmoError(f"{path}:{i}: word {cols[0]} has head {head!r}; expected 0 (ROOT) "
                                f"or another word of the sentence (1..{n})")
            if rel in ("", "_"):
                raise ElmoError(f"{path}:{i}: word {cols[0]} has no DEPREL")
            heads.append(int(head))
            rels.append(rel)
        out.append(DepSentence([c[1] for _, c in words], heads, rels, words[0][0], doc))
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


def read_columns(path: str | Path, tag_column: int, token_column: int = 0,
                 limit: int | None = None) -> list[TaggedSentence]:
    """Any CoNLL-style token-per-line file: whitespace-separated columns, a blank line between
    sentences, lines starting with ``#`` skipped; token and tag from the 0-based columns given.

    Every token line must have as many columns as the first one (a shifted column is an error,
    not a silently wrong tag). Lines starting with ``-DOCSTART-`` (CoNLL-2003's document marks)
    are skipped.
    """
    if tag_column < 0 or token_column < 0:
        raise ElmoError(f"columns are 0-based and not negative (token {token_column}, tag {tag_column})")
    if tag_column == token_column:
        raise ElmoError(f"the tag column and the token column are both {tag_column}")
    path, lines = _open_lines(path)
    need = max(tag_column, token_column) + 1
    width = None
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
        cols = line.split()
        if cols[0] == "-DOCSTART-":
            continue
        if width is None:
            if len(cols) < need:
                raise ElmoError(f"{path}:{i}: {len(cols)} column(s), but --column {tag_column} and "
                                f"--token-column {token_column} need at least {need}")
            width = len(cols)
        elif len(cols) != width:
            raise ElmoError(f"{path}:{i}: {len(cols)} column(s), the file's first token line has {width}")
        if not tokens:
            start = i
        tokens.append(cols[token_column])
        tags.append(cols[tag_column])
    else:
        flush()
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
