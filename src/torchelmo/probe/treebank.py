"""Reader for the Penn Treebank WSJ sample as NLTK ships it (``treebank.zip``).

The zip holds ``treebank/combined/wsj_NNNN.mrg``: bracketed trees, one or more per file, whose
leaves are ``(TAG word)``. A sentence is its leaves in order, empty elements (``-NONE-``: traces,
null complementisers) removed, as the tagged WSJ that POS taggers are scored on. The split is by
file number (:data:`SPLITS`), so no document is in two splits.

PTB escape codes (``-LRB-``, ``\\`\\```, ``''`` ...) are turned back into the characters they stand
for by default: a biLM trained on plain text has read ``(`` and ``"``, never the codes. The tags
are the treebank's (``-LRB-``, ``\\`\\``` stay as tags).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from ..errors import ElmoError
from .conll import TaggedSentence

# Inclusive file-number ranges of the WSJ sample (wsj_0001 .. wsj_0199).
SPLITS = {"train": (1, 159), "dev": (160, 179), "test": (180, 199)}

PTB_CODES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
             "``": '"', "''": '"', "`": "'"}

_NAME = re.compile(r"(?:.*/)?wsj_(\d{4})\.mrg$")
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_trees(text: str, where: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """``(first line, leaves)`` of every tree in ``text``, in order; leaves are ``(word, tag)``,
    ``-NONE-`` leaves dropped.

    ``where`` names the source in error messages (``WHERE:LINE: ...``). A tree left with no
    leaves (only empty elements) is skipped.
    """
    trees: list[tuple[int, list[tuple[str, str]]]] = []
    toks = [(m.group(), i) for i, line in enumerate(text.splitlines(), 1) for m in _TOKEN.finditer(line)]
    # One frame per open bracket: [label, has_child_node, word]; a leaf is a labelled frame with a word.
    stack: list[list] = []
    leaves: list[tuple[str, str]] = []
    start = k = 0
    while k < len(toks):
        tok, line = toks[k]
        k += 1
        if tok == "(":
            if stack and stack[-1][2] is not None:
                raise ElmoError(f"{where}:{line}: node ({stack[-1][0]} {stack[-1][2]} ...) mixes words "
                                "and brackets; a leaf is (TAG word)")
            if not stack:
                start = line
            label = ""
            if k < len(toks) and toks[k][0] not in "()":
                label = toks[k][0]
                k += 1
            if stack:
                stack[-1][1] = True
            stack.append([label, False, None])
        elif tok == ")":
            if not stack:
                raise ElmoError(f"{where}:{line}: ')' closes no bracket")
            label, has_child, word = stack.pop()
            if word is None and not has_child:
                raise ElmoError(f"{where}:{line}: empty bracket ({label})")
            if word is not None and label != "-NONE-":
                leaves.append((word, label))
            if not stack:
                if leaves:
                    trees.append((start, leaves))
                leaves = []
        else:
            if not stack:
                raise ElmoError(f"{where}:{line}: text {tok!r} outside a tree")
            frame = stack[-1]
            if not frame[0]:
                raise ElmoError(f"{where}:{line}: word {tok!r} has no tag")
            if frame[1] or frame[2] is not None:
                raise ElmoError(f"{where}:{line}: node ({frame[0]} ...) mixes words and brackets "
                                f"at {tok!r}; a leaf is (TAG word)")
            frame[2] = tok
    if stack:
        raise ElmoError(f"{where}:{toks[-1][1]}: end of file inside a tree ({len(stack)} bracket(s) "
                        "not closed)")
    return trees


def read_treebank(path: str | Path, split: str | None = None, unescape: bool = True,
                  limit: int | None = None) -> list[TaggedSentence]:
    """Sentences (words, PTB tags) of NLTK's ``treebank.zip``, files in name order.

    ``split``: ``"train"``, ``"dev"`` or ``"test"`` (:data:`SPLITS`), or None for every file.
    ``unescape``: turn the PTB codes into characters (:data:`PTB_CODES`). ``limit``: stop after
    that many sentences. ``TaggedSentence.line`` is the tree's first line in its file.
    """
    path = Path(path)
    if split is not None and split not in SPLITS:
        raise ElmoError(f"treebank split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not path.is_file():
        raise ElmoError(f"{path}: no such file")
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ElmoError(f"{path}: not a zip file") from None
    out: list[TaggedSentence] = []
    with z:
        files = sorted((int(m.group(1)), name) for name in z.namelist() if (m := _NAME.match(name)))
        if not files:
            raise ElmoError(f"{path}: no wsj_NNNN.mrg files in the zip")
        lo, hi = SPLITS[split] if split else (0, 9999)
        for num, name in files:
            if not lo <= num <= hi:
                continue
            try:
                text = z.read(name).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ElmoError(f"{path}:{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            for line, leaves in parse_trees(text, f"{path}:{name}"):
                words = [PTB_CODES.get(w, w) if unescape else w for w, _ in leaves]
                out.append(TaggedSentence(words, [t for _, t in leaves], line, name))
                if limit is not None and len(out) >= limit:
                    return out
    if not out:
        raise ElmoError(f"{path}: no sentences in split {split!r}" if split else f"{path}: no sentences")
    return out

