"""Text files in, HDF5 out, in AllenNLP's ``elmo`` layout.

Input: UTF-8 text, one whitespace-tokenised sentence per line. Output, one float32 dataset per
input line, named by its 0-based line index ``str(i)``::

    --all       (3, n_tokens, 2P)     E0, E1, E2
    --top       (n_tokens, 2P)        the last layer
    --average   (n_tokens, 2P)        the mean of the layers (a uniform scalar mix)
    --pool mean                       masked mean over the tokens: (3, 2P) or (2P,)

plus ``sentence_to_index``: a (1,) string dataset holding the JSON map {stripped line: "i"}
(a repeated sentence maps to its last index; keys are ordered by index). A blank line gives a
zero-length dataset (``(3, 0, 2P)``, ``(0, 2P)``; ``(0,)`` when pooled) and a warning. With
``keys="sentence"`` (AllenNLP's ``--use-sentence-keys``) datasets are named by the stripped line
instead, and there is no ``sentence_to_index``. Root attributes ``elmo_layers``, ``elmo_pool``,
``elmo_n_lines`` (and ``elmo_shard`` in shard files), ``elmo_model`` (the name or path it was
loaded from, when given) and ``elmo_model_options`` (its shapes, as JSON) record what produced
the file; AllenNLP's readers ignore attributes.

Sharding. ``shard=(k, n)`` embeds the lines with ``i % n == k`` (round-robin: no counting pass,
balanced lengths); dataset names stay global. :func:`merge_shards` (``elmo embed-merge``) joins
the shard files into one file, or into a small index file of external links to them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ElmoError, warn
from ..io.fileio import atomic_path
from ..io.text import Line, LineReader, count_lines, read_lines
from ..model.bilm import BiLM
from ..runtime import bounded_heap
from ..signals import Interrupts
from .engine import (
    WINDOW_LINES,
    ElmoWarning,
    OnBatch,
    check_modes,
    iter_embed_indexed,
    start,
)
from .writer import GuardedH5

# h5py and tqdm are imported where used: `import torchelmo.embed` (and `elmo --help`) stays light.

INDEX_DATASET = "sentence_to_index"
ATTR_LAYERS, ATTR_POOL, ATTR_LINES, ATTR_SHARD = "elmo_layers", "elmo_pool", "elmo_n_lines", "elmo_shard"
ATTR_MODEL, ATTR_OPTIONS = "elmo_model", "elmo_model_options"
KEY_MODES = ("index", "sentence")
BLANK_WARNINGS = 5                # blank lines named one by one; the rest are counted
UTF8_HINT = "; fix the file or use --errors replace"   # appended to torchelmo.io.text's invalid-UTF-8 error


def check_shard(shard: tuple[int, int] | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and n >= 1 and 0 <= k < n):
        raise ElmoError(f"shard must be (k, n) with 0 <= k < n, got {shard!r}")
    return k, n


@dataclass
class EmbedOptions:
    """What to compute for a file and how to read and batch it (the keyword arguments of
    :func:`iter_embed_file` and :func:`embed_file`); checked when made."""

    layers: str = "all"                       # "all", "top" or "average"
    pool: str | None = None                   # None or "mean"
    batch_size: int | None = None             # None: the engine's default for the model
    max_tokens_per_batch: int | None = None
    errors: str = "strict"                    # invalid UTF-8: "strict" (an error) or "replace"
    shard: tuple[int, int] | None = None      # (k, n): only the lines with index % n == k
    window_lines: int = WINDOW_LINES
    blank_lines: str = "warn"                 # "warn": a zero-length dataset; "error": AllenNLP's rule

    def __post_init__(self) -> None:
        check_modes(self.layers, self.pool)
        self.shard = check_shard(self.shard)
        if self.blank_lines not in ("warn", "error"):
            raise ElmoError(f"blank_lines must be 'warn' or 'error', got {self.blank_lines!r}")

    def lines(self, path: str | Path) -> LineReader:
        """The lines of ``path`` this run embeds (its shard's); ``lines_read`` counts them all."""
        return read_lines(path, errors=self.errors, shard=self.shard, hint=UTF8_HINT)


class BlankLineError(ElmoError):
    """A blank input line where blank lines are errors (AllenNLP's rule)."""


class _BlankLines:
    """Warns about blank lines: the first few by name, then a count at the end; or, with
    ``error``, stops at the first (as AllenNLP's ``elmo`` command did)."""

    def __init__(self, error: bool = False) -> None:
        self.count, self.error = 0, error

    def __call__(self, index: int) -> None:
        if self.error:
            raise BlankLineError(f"line {index + 1} is blank: AllenNLP's elmo command rejects blank lines "
                            "(remove them, or embed without AllenNLP's rules to get zero-length datasets)")
        self.count += 1
        if self.count <= BLANK_WARNINGS:
            warn(f"line {index + 1} (dataset '{index}') is blank: writing a zero-length dataset", ElmoWarning)

    def finish(self) -> None:
        if self.count > BLANK_WARNINGS:
            warn(f"{self.count} blank lines in all ({self.count - BLANK_WARNINGS} not named above); each "
                 "got a zero-length dataset", ElmoWarning)


def _iter_lines(model: BiLM, lines: Iterable[Line], options: EmbedOptions, on_batch: OnBatch | None,
                in_order: bool = True) -> Iterator[tuple[Line, np.ndarray]]:
    """Each line read, with its array (in input order unless ``in_order=False``: then as each
    batch is computed); blank lines are warned about."""
    if options.shard is not None and options.shard[1] > 1 and model.stateful:
        raise ElmoError("stateful mode cannot be sharded: each batch's output depends on every "
                        "batch before it")
    batching = start(model, options.batch_size, options.max_tokens_per_batch, options.window_lines)
    pending: dict[int, Line] = {}

    def items() -> Iterator[tuple[int, list[str]]]:
        for line in lines:
            pending[line.index] = line
            yield line.index, line.tokens

    blank = _BlankLines(options.blank_lines == "error")
    for i, arr in iter_embed_indexed(model, items(), options.layers, options.pool, batching,
                                     on_batch, blank, in_order):
        yield pending.pop(i), arr
    blank.finish()


def iter_embed_file(model: BiLM, path: str | Path, layers: str = "all", *, pool: str | None = None,
                    batch_size: int | None = None, max_tokens_per_batch: int | None = None,
                    errors: str = "strict", shard: tuple[int, int] | None = None,
                    window_lines: int = WINDOW_LINES, on_batch: OnBatch | None = None,
                    ) -> Iterator[tuple[int, np.ndarray]]:
    """Embed a text file line by line: yields ``(line index, array)`` in input order, arrays
    shaped as in :func:`torchelmo.embed.iter_embed` (``(L, n, 2P)``, ``(n, 2P)``, pooled ``(L, 2P)``,
    ``(2P,)``).

    Blank lines give zero-length arrays and an :class:`ElmoWarning` naming them.
    """
    options = EmbedOptions(layers=layers, pool=pool, batch_size=batch_size, errors=errors, shard=shard,
                           max_tokens_per_batch=max_tokens_per_batch, window_lines=window_lines)
    for line, arr in _iter_lines(model, options.lines(path), options, on_batch):
        yield line.index, arr


@dataclass
class EmbedSummary:
    output: Path
    lines: int            # lines in the input (all shards)
    sentences: int        # datasets written (this shard's lines)
    tokens: int
    blank: list[int] = field(default_factory=list)
    seconds: float = 0.0


def embed_file(model: BiLM, input_path: str | Path, output_path: str | Path, layers: str = "all", *,
               pool: str | None = None, batch_size: int | None = None,
               max_tokens_per_batch: int | None = None, errors: str = "strict",
               shard: tuple[int, int] | None = None, sentence_index: bool = True,
               window_lines: int = WINDOW_LINES, progress: bool = False, keys: str = "index",
               model_name: str | None = None, blank_lines: str = "warn") -> EmbedSummary:
    """Embed ``input_path`` into the HDF5 file ``output_path`` (layout: see the module docstring).

    The file is written under a temporary name beside ``output_path`` and renamed when complete:
    a failed or interrupted run leaves no ``output_path``. ``sentence_index=False`` skips the
    ``sentence_to_index`` dataset (the only part whose memory grows with the input).
    ``progress``: a tqdm bar on stderr (sentences/s, tokens/s, ETA when the line count is known).
    ``keys="sentence"`` names each dataset by its stripped line (AllenNLP's ``--use-sentence-keys``;
    no ``sentence_to_index``); a blank or repeated line, or one holding "/", is then an error.
    ``model_name``: recorded as the ``elmo_model`` attribute. ``blank_lines="error"``: a blank line
    stops the run (AllenNLP's rule) instead of getting a zero-length dataset and a warning.
    """
    options = EmbedOptions(layers=layers, pool=pool, batch_size=batch_size, errors=errors, shard=shard,
                           max_tokens_per_batch=max_tokens_per_batch, window_lines=window_lines,
                           blank_lines=blank_lines)
    if keys not in KEY_MODES:
        raise ElmoError(f"keys must be 'index' or 'sentence', got {keys!r}")
    if keys == "sentence" and options.shard is not None and options.shard[1] > 1:
        raise ElmoError("sentence keys cannot be sharded (embed-merge joins datasets named by line index)")
    output_path = Path(output_path)
    if str(input_path) != "-" and Path(input_path).resolve() == output_path.resolve():
        raise ElmoError(f"{output_path}: output would overwrite the input")
    lines = options.lines(input_path)
    bounded_heap()
    t0 = time.perf_counter()
    bar = _progress_bar(input_path, options.shard) if progress else None
    summary = EmbedSummary(output_path, 0, 0, 0)
    index: dict[str, int] = {}

    def on_batch(n_sent: int, n_tok: int) -> None:
        summary.tokens += n_tok
        if bar is not None:
            bar.update(n_sent)
            dt = time.perf_counter() - t0
            bar.set_postfix_str(f"{summary.tokens / max(dt, 1e-9):,.0f} tok/s", refresh=False)

    seen: set[str] = set()

    def read() -> Iterator[Line]:
        # Names and the index are settled as lines are read, in input order (datasets are
        # written as batches finish, which is not input order).
        for line in lines:
            if keys == "sentence":
                _check_sentence_key(line, seen)
            elif sentence_index:
                index.pop(line.text, None)   # keep keys in index order: a repeat moves to the end
                index[line.text] = line.index
            yield line

    try:
        with Interrupts() as interrupts, atomic_path(output_path) as tmp, GuardedH5(tmp, output_path, interrupts) as out:
            # Arrays are filed as their batch finishes: no window of outputs is held in memory.
            for line, arr in _iter_lines(model, read(), options, on_batch, in_order=False):
                out.write(line.text if keys == "sentence" else str(line.index), arr)
                summary.sentences += 1
                if not line.tokens:
                    summary.blank.append(line.index)
                    if bar is not None and not model.stateful:   # stateful batches count their blanks
                        bar.update(1)
            summary.lines = lines.lines_read
            summary.blank.sort()
            options_json = json.dumps(model.config.to_options())
            out.run(lambda f: (_write_index(f, index if sentence_index and keys == "index" else None),
                               _write_attrs(f, options.layers, options.pool, summary.lines, options.shard),
                               _write_model_attrs(f, model_name, options_json)))
    finally:
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _check_sentence_key(line: Line, seen: set[str]) -> None:
    # h5py reads "/" as a group separator and "." as the file's root.
    if not line.text or "/" in line.text or line.text == ".":
        raise ElmoError(f"line {line.index + 1}: {'a blank line' if not line.text else repr(line.text)} "
                        "cannot be a dataset name (sentence keys); use line-index keys")
    if line.text in seen:
        raise ElmoError(f"line {line.index + 1}: repeats an earlier sentence, which sentence keys "
                        "cannot hold twice; use line-index keys")
    seen.add(line.text)


def _write_model_attrs(f, name: str | None, options_json: str | None) -> None:
    """Which model produced the file (``elmo_model``) and its shapes (``elmo_model_options``)."""
    if name is not None:
        f.attrs[ATTR_MODEL] = name
    if options_json is not None:
        f.attrs[ATTR_OPTIONS] = options_json


def _write_index(f, index: dict[str, int] | None) -> None:
    """``sentence_to_index``: ``(1,)`` string dataset, the JSON map {sentence: "i"} in ``index``'s order."""
    import h5py
    if index is None:
        return
    text = json.dumps({s: str(i) for s, i in index.items()})
    f.create_dataset(INDEX_DATASET, (1,), dtype=h5py.string_dtype(), data=[text])


def _write_attrs(f, layers: str, pool: str | None, n_lines: int, shard: tuple[int, int] | None) -> None:
    """The root attributes that let ``embed-merge`` check its shards (readers ignore them)."""
    f.attrs[ATTR_LAYERS] = layers
    f.attrs[ATTR_POOL] = pool or "none"
    f.attrs[ATTR_LINES] = n_lines
    if shard is not None:
        f.attrs[ATTR_SHARD] = f"{shard[0]}/{shard[1]}"


def _progress_bar(input_path: str | Path, shard: tuple[int, int] | None):
    from tqdm import tqdm
    total = count_lines(input_path)
    if total is not None and shard is not None:
        k, n = shard
        total = len(range(k, total, n))
    return tqdm(total=total, unit=" sent", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


# ------------------------------------------------------------------------------------------------
# Shards.
# ------------------------------------------------------------------------------------------------
def parse_shard(spec: str) -> tuple[int, int]:
    """``"K/N"`` (0-based K), or ``"env"``: RANK / WORLD_SIZE as torchrun sets them."""
    if spec == "env":
        try:
            return check_shard((int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))
        except KeyError as e:
            raise ElmoError(f"--shard env: environment variable {e.args[0]} is not set "
                            "(run under torchrun, or give K/N)") from None
        except ValueError:
            raise ElmoError("--shard env: RANK / WORLD_SIZE are not integers") from None
    try:
        k, n = (int(p) for p in spec.split("/"))
    except ValueError:
        raise ElmoError(f"--shard: expected K/N (e.g. 0/4) or 'env', got {spec!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise ElmoError(f"--shard {spec}: need 0 <= K < N")
    return k, n


@dataclass
class _Shard:
    path: str | Path
    file: Any             # the open h5py.File
    k: int
    run: tuple[int, int, str, str]   # (n, lines, layers, pool): equal for the shards of one run


def _open_shards(shard_paths: Sequence[str | Path], opened: list) -> list[_Shard]:
    """Open the shard files (appending each to ``opened``, for the caller to close) and check
    that they are shards 0 .. n-1 of one run."""
    import h5py
    for p in shard_paths:
        try:
            opened.append(h5py.File(p, "r"))
        except OSError as e:
            raise ElmoError(f"{p}: cannot open as HDF5 ({e})") from None
    shards = []
    for p, f in zip(shard_paths, opened):
        missing = [a for a in (ATTR_SHARD, ATTR_LINES, ATTR_LAYERS, ATTR_POOL) if a not in f.attrs]
        if missing:
            raise ElmoError(f"{p}: not an elmo embed shard (no {missing[0]} attribute)")
        k, n = parse_shard(str(f.attrs[ATTR_SHARD]))
        shards.append(_Shard(p, f, k, (n, int(f.attrs[ATTR_LINES]), str(f.attrs[ATTR_LAYERS]),
                                       str(f.attrs[ATTR_POOL]))))
    first = shards[0]
    for s in shards:
        if s.run != first.run:
            raise ElmoError(f"{s.path}: shard of a different run (n, lines, layers, pool = {s.run}; "
                            f"{first.path} has {first.run})")
    n = first.run[0]
    ks = sorted(s.k for s in shards)
    if ks != list(range(n)):
        dup = sorted({k for k in ks if ks.count(k) > 1})
        absent = sorted(set(range(n)) - set(ks))
        raise ElmoError(f"embed-merge: need shards 0..{n - 1} once each"
                        + (f"; missing {absent}" if absent else "") + (f"; repeated {dup}" if dup else ""))
    return shards


def _locate(shards: list[_Shard], n_lines: int, has_index: bool) -> tuple[list[int], dict[str, int]]:
    """Which shard holds each line (every line exactly once), and the merged sentence index."""
    where: dict[int, int] = {}
    index: dict[int, str] = {}
    for s, shard in enumerate(shards):
        for name in shard.file:
            if name == INDEX_DATASET:
                continue
            if not name.isdigit() or int(name) >= n_lines:
                raise ElmoError(f"{shard.path}: unexpected dataset {name!r}")
            if int(name) in where:
                raise ElmoError(f"{shard.path}: dataset {name!r} is also in {shards[where[int(name)]].path}")
            where[int(name)] = s
        if has_index:
            for sentence, i in json.loads(shard.file[INDEX_DATASET][0]).items():
                index[int(i)] = sentence
    if len(where) != n_lines:
        absent = sorted(set(range(n_lines)) - set(where))[:5]
        raise ElmoError(f"embed-merge: the shards hold {len(where)} of {n_lines} lines "
                        f"(missing e.g. {absent})")
    # A sentence repeated across shards maps to its last index, as in one run.
    merged: dict[str, int] = {}
    for i in sorted(index):
        merged.pop(index[i], None)
        merged[index[i]] = i
    return [where[i] for i in range(n_lines)], merged


def merge_shards(shard_paths: Sequence[str | Path], output_path: str | Path, *,
                 link: bool = False) -> Path:
    """Join shard files (from ``embed_file(..., shard=(k, n))``) into one file at ``output_path``.

    Checks that the shards are k = 0 .. n-1 of one run (same n, line count, layers and pooling)
    and together hold every line exactly once. Datasets are copied in index order, so the result
    holds what an unsharded run writes, equal to float32 rounding (each shard batches its lines
    with other batch mates). ``link=True`` writes a small index file instead:
    an external link per dataset (plain h5py follows them; the shard files must stay beside it)
    plus the merged ``sentence_to_index``.
    """
    import h5py

    if not shard_paths:
        raise ElmoError("embed-merge: no shard files given")
    output_path = Path(output_path)
    opened: list = []
    try:
        shards = _open_shards(shard_paths, opened)
        _, n_lines, layers, pool = shards[0].run
        has_index = all(INDEX_DATASET in s.file for s in shards)
        where, index = _locate(shards, n_lines, has_index)
        with Interrupts() as interrupts, atomic_path(output_path) as tmp, \
                GuardedH5(tmp, output_path, interrupts) as out:
            for i, s in enumerate(where):
                src, name = shards[s], str(i)
                if link:
                    rel = os.path.relpath(Path(src.path).resolve(), output_path.resolve().parent)
                    out.run(lambda f, name=name, rel=rel: f.__setitem__(name, h5py.ExternalLink(rel, "/" + name)))
                else:
                    out.run(lambda f, src=src, name=name: src.file.copy(src.file[name], f, name))
            first = shards[0].file.attrs
            out.run(lambda f: (_write_index(f, index if has_index else None),
                               _write_attrs(f, layers, pool, n_lines, None),
                               _write_model_attrs(f, first.get(ATTR_MODEL), first.get(ATTR_OPTIONS))))
    finally:
        for f in opened:
            f.close()
    return output_path
