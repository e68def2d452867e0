"""WSD data: Raganato et al.'s (2017) unified format, its gold keys, and WordNet's ``index.sense``.

Malformed input raises :class:`~torchelmo.errors.ElmoError` naming the file and the line. Files may be
gzipped (``.gz``).
"""

from __future__ import annotations

import gzip
import io
import xml.parsers.expat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import ElmoError

POS_LETTER = {"NOUN": "n", "VERB": "v", "ADJ": "a", "ADV": "r"}
SS_TYPE = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}  # 5 = adjective satellite


@dataclass
class WsdInstance:
    id: str
    sentence: int
    start: int
    end: int          # exclusive
    lemma: str
    pos: str          # n, v, a, r
    keys: list[str] = field(default_factory=list)


@dataclass
class WsdCorpus:
    path: Path
    sentences: list[list[str]]
    instances: list[WsdInstance]
    documents: list[str] = field(default_factory=list)   # each sentence's <text id>, "" outside one

    @property
    def spans(self) -> list[tuple[int, int, int]]:
        return [(i.sentence, i.start, i.end) for i in self.instances]

    def subset(self, keep: Callable[[WsdInstance], bool]) -> np.ndarray:
        return np.array([j for j, i in enumerate(self.instances) if keep(i)], dtype=np.int64)


def _open_binary(path: Path) -> BinaryIO:
    # Binary: expat decodes the XML itself; the key and index readers wrap it as UTF-8 text.
    if not path.is_file():
        raise ElmoError(f"{path}: no such file")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def key_lemma_pos(key: str) -> tuple[str, str]:
    """``'bank%1:14:00::'`` -> ``('bank', 'n')``."""
    lemma, _, rest = key.partition("%")
    if not lemma or not rest or rest[0] not in SS_TYPE:
        raise ElmoError(f"bad WordNet sense key {key!r}")
    return lemma.lower(), SS_TYPE[rest[0]]


def read_gold_keys(path: str | Path) -> dict[str, list[str]]:
    path = Path(path)
    out: dict[str, list[str]] = {}
    with _open_binary(path) as f:
        for i, line in enumerate(io.TextIOWrapper(f, encoding="utf-8"), 1):
            cols = line.split()
            if not cols:
                continue
            if len(cols) < 2:
                raise ElmoError(f"{path}:{i}: expected 'instance_id sense_key [sense_key ...]'")
            for k in cols[1:]:
                if "%" not in k:
                    raise ElmoError(f"{path}:{i}: {k!r} is not a WordNet sense key")
            if cols[0] in out:
                raise ElmoError(f"{path}:{i}: instance {cols[0]} listed twice")
            out[cols[0]] = cols[1:]
    return out


class _StopParsing(Exception):
    """Raised from an expat handler to end a ``limit``-ed read early."""


def _sibling_key_path(xml_path: Path) -> Path:
    """``x.data.xml[.gz]`` -> ``x.gold.key.txt[.gz]``; a gzipped corpus may have a plain key file."""
    name = xml_path.name.replace(".data.xml", ".gold.key.txt")
    key_path = xml_path.with_name(name)
    if not key_path.is_file() and name.endswith(".gz"):
        key_path = xml_path.with_name(name[:-3])
    return key_path


def read_raganato(xml_path: str | Path, key_path: str | Path | None = None,
                  limit: int | None = None) -> WsdCorpus:
    """A corpus in the unified format (``*.data.xml[.gz]`` + ``*.gold.key.txt[.gz]``).

    ``key_path`` defaults to the sibling ``.gold.key.txt`` file. ``limit``: first N sentences.
    Tokens are the ``<wf>``/``<instance>`` texts split at spaces and underscores.
    """
    xml_path = Path(xml_path)
    key_path = _sibling_key_path(xml_path) if key_path is None else key_path
    gold = read_gold_keys(key_path)
    sentences: list[list[str]] = []
    instances: list[WsdInstance] = []
    documents: list[str] = []
    state = {"tokens": None, "el": None, "attrs": None, "text": [], "doc": ""}
    p = xml.parsers.expat.ParserCreate()

    def bad(msg: str) -> ElmoError:
        return ElmoError(f"{xml_path}:{p.CurrentLineNumber}: {msg}")

    def start(tag, attrs):
        if tag == "text":
            state["doc"] = attrs.get("id", "")
        elif tag == "sentence":
            state["tokens"] = []
        elif tag in ("wf", "instance"):
            if state["tokens"] is None:
                raise bad(f"<{tag}> outside a <sentence>")
            state["el"], state["attrs"], state["text"] = tag, attrs, []

    def end(tag):
        if tag in ("wf", "instance"):
            text = "".join(state["text"]).strip()
            if not text:
                raise bad(f"<{tag}> without text")
            tokens = state["tokens"]
            parts = text.replace("_", " ").split() or [text]
            if tag == "instance":
                a = state["attrs"]
                iid, lemma, pos = a.get("id"), a.get("lemma"), a.get("pos")
                if not iid or not lemma or pos is None:
                    raise bad("<instance> lacks id, lemma or pos")
                if pos not in POS_LETTER:
                    raise bad(f"instance {iid}: pos {pos!r} is not one of {', '.join(POS_LETTER)}")
                if iid not in gold:
                    raise bad(f"instance {iid} has no gold key in {key_path}")
                instances.append(WsdInstance(iid, len(sentences), len(tokens), len(tokens) + len(parts),
                                             lemma.lower(), POS_LETTER[pos], gold[iid]))
            tokens.extend(parts)
            state["el"] = None
        elif tag == "sentence":
            if state["tokens"]:
                sentences.append(state["tokens"])
                documents.append(state["doc"])
            state["tokens"] = None
            if limit is not None and len(sentences) >= limit:
                raise _StopParsing

    def chars(data):
        if state["el"] is not None:
            state["text"].append(data)

    p.StartElementHandler, p.EndElementHandler, p.CharacterDataHandler = start, end, chars
    with _open_binary(xml_path) as f:
        try:
            p.ParseFile(f)
        except _StopParsing:
            pass
        except xml.parsers.expat.ExpatError as e:
            raise ElmoError(f"{xml_path}:{e.lineno}: malformed XML ({xml.parsers.expat.errors.messages[e.code]})") from None
        except (OSError, EOFError) as e:
            raise ElmoError(f"{xml_path}: cannot read ({e})") from None
    if not instances:
        raise ElmoError(f"{xml_path}: no <instance> elements found")
    if limit is None and len(gold) != len(instances):
        seen = {i.id for i in instances}
        extra = next(k for k in gold if k not in seen)
        raise ElmoError(f"{key_path}: {len(gold) - len(instances)} key(s) for instances not in "
                        f"{xml_path} (e.g. {extra})")
    return WsdCorpus(xml_path, sentences, instances, documents)


def read_sense_index(path: str | Path) -> dict[tuple[str, str], str]:
    """WordNet ``index.sense``: ``(lemma, pos) -> first sense key`` (sense number 1)."""
    path = Path(path)
    first: dict[tuple[str, str], str] = {}
    with _open_binary(path) as f:
        for i, line in enumerate(io.TextIOWrapper(f, encoding="utf-8"), 1):
            cols = line.split()
            if not cols:
                continue
            if len(cols) != 4 or not cols[2].isdigit():
                raise ElmoError(f"{path}:{i}: expected 'sense_key offset sense_number tag_cnt'")
            try:
                lp = key_lemma_pos(cols[0])
            except ElmoError as e:
                raise ElmoError(f"{path}:{i}: {e}") from None
            if cols[2] == "1":
                first.setdefault(lp, cols[0])
    if not first:
        raise ElmoError(f"{path}: no senses with sense number 1")
    return first
