"""``elmo embed``: ELMo vectors for a text file, written to HDF5 in AllenNLP's ``elmo`` layout.

Input: UTF-8 text, one whitespace-tokenised sentence per line. Output, one float32 dataset per
input line, named by its 0-based line index ``str(i)``::

    --all       (3, n_tokens, 2P)     E0, E1, E2
    --top       (n_tokens, 2P)        the last layer
    --average   (n_tokens, 2P)        the mean of the layers (a uniform scalar mix)
    --pool mean                       masked mean over the tokens: (3, 2P) or (2P,)

plus ``sentence_to_index``: a (1,) string dataset holding the JSON map {stripped line: "i"}
(a repeated sentence maps to its last index; keys are ordered by index). A blank line gives a
zero-length dataset (``(3, 0, 2P)``, ``(0, 2P)``; ``(0,)`` when pooled) and a warning.

Batching. Stateless (the default), a sentence's vectors do not depend on its batch mates, so the
input is read in windows, each window's sentences are sorted by length and cut into batches of
similar lengths (little padding, large batches), and the results are written in input order.
Memory stays flat: a window is at most ``window_lines`` lines and about ``window_bytes`` of output.
``stateful`` models instead get batches in input order, row r of batch i being line i*B + r,
so the original implementations' carried-state outputs can be reproduced.

Sharding. ``shard=(k, n)`` embeds the lines with ``i % n == k`` (round-robin: no counting pass,
balanced lengths); dataset names stay global. :func:`merge_shards` (``elmo embed-merge``) joins
the shard files into one file, or into a small index file of external links to them.

Python API: :func:`embed_sentences` (a list in, a list of arrays out), :func:`iter_embed` (any
iterable of sentences, streaming), :func:`iter_embed_file`, :func:`embed_file`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from .bilm import BiLM
from .chars import MAX_CHARS, word_to_char_ids
from .errors import ElmoError
from .fileio import atomic_path

LAYER_MODES = ("all", "top", "average")
POOL_MODES = (None, "mean")
INDEX_DATASET = "sentence_to_index"
# Root attributes we add (AllenNLP's readers ignore attributes).
ATTR_LAYERS, ATTR_POOL, ATTR_LINES, ATTR_SHARD = "elmo_layers", "elmo_pool", "elmo_n_lines", "elmo_shard"

STATEFUL_BATCH_SIZE = 64          # AllenNLP's ``elmo`` default, for reproducing stateful outputs
STATELESS_BATCH_SIZE = 256        # rows per batch; big batches keep the recurrent matmuls efficient
STATELESS_MAX_TOKENS = 8192       # rows x longest sentence per batch
WINDOW_LINES = 10_000
WINDOW_BYTES = 256 * 2**20        # output held per window before it is written
BLANK_WARNINGS = 5                # blank lines named one by one; the rest are counted


class ElmoWarning(UserWarning):
    pass


# ------------------------------------------------------------------------------------------------
# One batch through the model.
# ------------------------------------------------------------------------------------------------
def _check_modes(layers: str, pool: str | None) -> None:
    if layers not in LAYER_MODES:
        raise ElmoError(f"layers must be one of {', '.join(LAYER_MODES)}, got {layers!r}")
    if pool not in POOL_MODES:
        raise ElmoError(f"pool must be None or 'mean', got {pool!r}")


def output_shape(model: BiLM, layers: str, pool: str | None, n_tokens: int) -> tuple[int, ...]:
    """Shape of one sentence's dataset."""
    F = model.output_dim
    if pool == "mean":
        if n_tokens == 0:
            return (0,)
        return (model.num_layers, F) if layers == "all" else (F,)
    return (model.num_layers, n_tokens, F) if layers == "all" else (n_tokens, F)


def _char_ids(batch: Sequence[Sequence[str]]) -> torch.Tensor:
    """:func:`elmo.batch_to_ids` for str tokens, built in one numpy scatter (a few times faster)."""
    T = max(len(s) for s in batch)
    out = np.zeros((len(batch), T, MAX_CHARS), np.int64)
    lengths = [len(s) for s in batch]
    if T:
        rows = np.repeat(np.arange(len(batch)), lengths)
        cols = np.concatenate([np.arange(n) for n in lengths])
        out[rows, cols] = [word_to_char_ids(t) for s in batch for t in s]
    return torch.from_numpy(out)


@torch.no_grad()
def _embed_batch(model: BiLM, batch: Sequence[Sequence[str]], layers: str,
                 pool: str | None) -> list[np.ndarray]:
    """Run one batch; returns each sentence's float32 array (see :func:`output_shape`)."""
    ids = _char_ids(batch).to(model.device)
    out = model(ids)
    reps = [t.float() for t in out.layers]                      # mix and pool in float32
    if layers == "all":
        rep = torch.stack(reps, dim=1)                          # (B, L, T, F)
    elif layers == "top":
        rep = reps[-1]                                          # (B, T, F)
    else:
        rep = sum(reps[1:], reps[0]) / len(reps)
    lengths = [len(s) for s in batch]
    if pool == "mean":
        m = out.mask.to(rep.dtype)
        m = m.unsqueeze(1) if layers == "all" else m
        n = torch.tensor(lengths, device=rep.device, dtype=rep.dtype).clamp(min=1)
        n = n.view(-1, 1, 1) if layers == "all" else n.view(-1, 1)
        rep = (rep * m.unsqueeze(-1)).sum(dim=-2) / n
    rep = rep.cpu().numpy()
    results = []
    for b, n_tok in enumerate(lengths):
        if pool == "mean":
            results.append(rep[b] if n_tok else np.zeros((0,), np.float32))
        else:
            results.append(np.ascontiguousarray(rep[b, :, :n_tok] if layers == "all" else rep[b, :n_tok]))
    return results


def _empty(model: BiLM, layers: str, pool: str | None) -> np.ndarray:
    return np.zeros(output_shape(model, layers, pool, 0), np.float32)


# ------------------------------------------------------------------------------------------------
# Batching and windows.
# ------------------------------------------------------------------------------------------------
@dataclass
class Batching:
    """How sentences are grouped into batches (resolved defaults; see :func:`iter_embed`)."""

    batch_size: int
    max_tokens: int | None
    window_lines: int = WINDOW_LINES
    window_bytes: int = WINDOW_BYTES

    @classmethod
    def resolve(cls, stateful: bool, batch_size: int | None, max_tokens_per_batch: int | None,
                window_lines: int = WINDOW_LINES, window_bytes: int = WINDOW_BYTES) -> "Batching":
        for name, v in (("batch_size", batch_size), ("max_tokens_per_batch", max_tokens_per_batch),
                        ("window_lines", window_lines), ("window_bytes", window_bytes)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ElmoError(f"{name} must be a positive integer, got {v!r}")
        if stateful:
            if max_tokens_per_batch is not None:
                raise ElmoError("max_tokens_per_batch cannot be used in stateful mode: stateful "
                                "batches are fixed (row r of batch i is line i*B + r)")
            return cls(batch_size or STATEFUL_BATCH_SIZE, None, window_lines, window_bytes)
        if batch_size is None and max_tokens_per_batch is None:
            return cls(STATELESS_BATCH_SIZE, STATELESS_MAX_TOKENS, window_lines, window_bytes)
        return cls(batch_size or STATELESS_BATCH_SIZE, max_tokens_per_batch, window_lines, window_bytes)


def _length_batches(items: list[tuple[int, list[str]]], batching: Batching) -> Iterator[list[tuple[int, list[str]]]]:
    """Stateless batches of one window: longest first, each batch of similar lengths, at most
    ``batch_size`` rows and ``max_tokens`` padded tokens (a longer sentence goes alone)."""
    items = sorted(items, key=lambda it: -len(it[1]))     # stable: ties keep input order
    batch: list[tuple[int, list[str]]] = []
    for it in items:
        longest = len(batch[0][1]) if batch else len(it[1])
        full = len(batch) >= batching.batch_size or (
            batching.max_tokens is not None and batch and (len(batch) + 1) * longest > batching.max_tokens)
        if full:
            yield batch
            batch = []
        batch.append(it)
    if batch:
        yield batch


class _BlankLines:
    """Warns about blank lines: the first few by name, then a count at the end."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, index: int) -> None:
        self.count += 1
        if self.count <= BLANK_WARNINGS:
            warnings.warn(f"line {index + 1} (dataset '{index}') is blank: writing a zero-length "
                          "dataset", ElmoWarning, stacklevel=3)

    def finish(self) -> None:
        if self.count > BLANK_WARNINGS:
            warnings.warn(f"{self.count} blank lines in all ({self.count - BLANK_WARNINGS} not named "
                          "above); each got a zero-length dataset", ElmoWarning, stacklevel=3)


OnBatch = Callable[[int, int], None]   # (sentences, tokens) just computed


def _iter_embed_indexed(model: BiLM, items: Iterable[tuple[int, list[str]]], layers: str,
                        pool: str | None, batching: Batching, on_batch: OnBatch | None,
                        on_blank: Callable[[int], None] | None) -> Iterator[tuple[int, np.ndarray]]:
    """The engine: ``(index, tokens)`` pairs in, ``(index, array)`` out, in input order."""
    _check_modes(layers, pool)
    empty = _empty(model, layers, pool)

    def run(batch: list[tuple[int, list[str]]]) -> list[np.ndarray]:
        arrays = _embed_batch(model, [toks for _, toks in batch], layers, pool)
        if on_batch is not None:
            on_batch(len(batch), sum(len(toks) for _, toks in batch))
        return arrays

    if model.stateful:
        # Fixed batches in input order, blank lines included (they still advance the state, as
        # an empty sentence does in the originals: the model sees "<S> </S>").
        batch: list[tuple[int, list[str]]] = []
        for it in items:
            batch.append(it)
            if len(batch) == batching.batch_size:
                yield from _finish_stateful(batch, run(batch), empty, on_blank)
                batch = []
        if batch:
            yield from _finish_stateful(batch, run(batch), empty, on_blank)
        return

    per_token = 4 * model.output_dim * (model.num_layers if layers == "all" else 1)
    per_sentence = 4 * model.output_dim * model.num_layers
    window: list[tuple[int, list[str]]] = []
    window_bytes = 0
    for it in items:
        window.append(it)
        window_bytes += per_sentence if pool else per_token * len(it[1])
        if len(window) >= batching.window_lines or window_bytes >= batching.window_bytes:
            yield from _run_window(window, run, batching, empty, on_blank)
            window, window_bytes = [], 0
    if window:
        yield from _run_window(window, run, batching, empty, on_blank)


def _finish_stateful(batch, arrays, empty, on_blank):
    for (i, toks), arr in zip(batch, arrays):
        if not toks:
            if on_blank is not None:
                on_blank(i)
            arr = empty
        yield i, arr


def _run_window(window, run, batching, empty, on_blank):
    done: dict[int, np.ndarray] = {}
    for i, toks in window:
        if not toks:
            done[i] = empty
    for batch in _length_batches([it for it in window if it[1]], batching):
        for (i, _), arr in zip(batch, run(batch)):
            done[i] = arr
    for i, toks in window:
        if not toks and on_blank is not None:
            on_blank(i)
        yield i, done.pop(i)


# ------------------------------------------------------------------------------------------------
# Python API.
# ------------------------------------------------------------------------------------------------
def iter_embed(model: BiLM, sentences: Iterable[Sequence[str]], layers: str = "all", *,
               pool: str | None = None, batch_size: int | None = None,
               max_tokens_per_batch: int | None = None, window_lines: int = WINDOW_LINES,
               on_batch: OnBatch | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Embed an iterable of tokenised sentences, streaming: yields ``(index, array)`` in input order.

    ``layers``: "all" ``(L, n, 2P)``, "top" or "average" ``(n, 2P)``; ``pool="mean"`` averages
    over the tokens. Stateless models batch up to ``batch_size`` rows (default 256) and
    ``max_tokens_per_batch`` padded tokens (default 8192, when neither is given) within windows of
    ``window_lines`` sentences; stateful models take ``batch_size`` (default 64) rows in input order,
    starting from the zero state (the model's carried state is reset first).
    An empty sentence gives a zero-length array, without a warning (see :func:`iter_embed_file`).
    """
    batching = Batching.resolve(model.stateful, batch_size, max_tokens_per_batch, window_lines)
    if model.stateful:
        model.reset_states()

    def items():
        for i, s in enumerate(sentences):
            if isinstance(s, str):
                raise ElmoError(f"sentence {i} is a str, expected a list of tokens (split it first, "
                                "e.g. line.split())")
            s = list(s)
            for j, tok in enumerate(s):
                if not isinstance(tok, str):
                    raise ElmoError(f"sentence {i} token {j} is {type(tok).__name__}, expected str")
            yield i, s

    return _iter_embed_indexed(model, items(), layers, pool, batching, on_batch, None)


def embed_sentences(model: BiLM, sentences: Sequence[Sequence[str]], layers: str = "all", *,
                    pool: str | None = None, batch_size: int | None = None,
                    max_tokens_per_batch: int | None = None) -> list[np.ndarray]:
    """Embed a list of tokenised sentences; returns one float32 array per sentence (shapes as in
    the HDF5 output, see :func:`iter_embed`)."""
    return [arr for _, arr in iter_embed(model, sentences, layers, pool=pool, batch_size=batch_size,
                                         max_tokens_per_batch=max_tokens_per_batch)]


@dataclass
class Line:
    index: int        # 0-based line number = dataset name
    text: str         # the line, surrounding whitespace stripped (the sentence_to_index key)
    tokens: list[str]


def read_lines(path: str | Path, errors: str = "strict", shard: tuple[int, int] | None = None,
               counter: list[int] | None = None) -> Iterator[Line]:
    """The lines of a UTF-8 file (``"-"``: stdin), each split on whitespace.

    ``errors="strict"``: invalid UTF-8 is an :class:`ElmoError` naming the line;
    ``"replace"``: bad bytes become U+FFFD. A UTF-8 byte-order mark at the start is dropped.
    ``shard=(k, n)`` keeps lines with ``index % n == k``. ``counter[0]`` is kept equal to the
    number of lines read so far (all shards' lines).
    """
    if errors not in ("strict", "replace"):
        raise ElmoError(f"errors must be 'strict' or 'replace', got {errors!r}")
    k, n = shard if shard is not None else (0, 1)
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        f = sys.stdin.buffer if str(path) == "-" else open(path, "rb")
    except OSError as e:
        raise ElmoError(f"{name}: cannot read input ({e.strerror})") from None
    try:
        i = -1
        for i, raw in enumerate(f):
            if counter is not None:
                counter[0] = i + 1
            if i % n != k:
                continue
            if i == 0 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as e:
                raise ElmoError(f"{name}: line {i + 1}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at "
                                f"column {e.start + 1}); fix the file or use --errors replace") from None
            text = text.strip()
            yield Line(i, text, text.split())
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def count_lines(path: str | Path) -> int | None:
    """Number of lines of a regular file (a final line without newline counts), or None."""
    if str(path) == "-" or not Path(path).is_file():
        return None
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def iter_embed_file(model: BiLM, path: str | Path, layers: str = "all", *, pool: str | None = None,
                    batch_size: int | None = None, max_tokens_per_batch: int | None = None,
                    errors: str = "strict", shard: tuple[int, int] | None = None,
                    window_lines: int = WINDOW_LINES, on_batch: OnBatch | None = None,
                    ) -> Iterator[tuple[int, np.ndarray]]:
    """Embed a text file line by line: yields ``(line index, array)`` in input order.

    Blank lines give zero-length arrays and an :class:`ElmoWarning` naming them.
    """
    for line, arr in _iter_file(model, path, layers, pool, batch_size, max_tokens_per_batch,
                                errors, shard, window_lines, on_batch, None):
        yield line.index, arr


def _iter_file(model, path, layers, pool, batch_size, max_tokens_per_batch, errors, shard,
               window_lines, on_batch, counter) -> Iterator[tuple[Line, np.ndarray]]:
    _check_modes(layers, pool)
    shard = _check_shard(shard)
    if shard is not None and shard[1] > 1 and model.stateful:
        raise ElmoError("stateful mode cannot be sharded: each batch's output depends on every "
                        "batch before it")
    batching = Batching.resolve(model.stateful, batch_size, max_tokens_per_batch, window_lines)
    if model.stateful:
        model.reset_states()
    lines: dict[int, Line] = {}

    def items():
        for line in read_lines(path, errors, shard, counter):
            lines[line.index] = line
            yield line.index, line.tokens

    blank = _BlankLines()
    for i, arr in _iter_embed_indexed(model, items(), layers, pool, batching, on_batch, blank):
        yield lines.pop(i), arr
    blank.finish()


def _check_shard(shard: tuple[int, int] | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and n >= 1 and 0 <= k < n):
        raise ElmoError(f"shard must be (k, n) with 0 <= k < n, got {shard!r}")
    return k, n


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
               window_lines: int = WINDOW_LINES, progress: bool = False) -> EmbedSummary:
    """Embed ``input_path`` into the HDF5 file ``output_path`` (layout: see the module docstring).

    The file is written under a temporary name beside ``output_path`` and renamed when complete:
    a failed or interrupted run leaves no ``output_path``. ``sentence_index=False`` skips the
    ``sentence_to_index`` dataset (the only part whose memory grows with the input).
    ``progress``: a tqdm bar on stderr (sentences/s, tokens/s, ETA when the line count is known).
    """
    import h5py

    _check_modes(layers, pool)
    shard = _check_shard(shard)
    output_path = Path(output_path)
    if str(input_path) != "-" and Path(input_path).resolve() == output_path.resolve():
        raise ElmoError(f"{output_path}: output would overwrite the input")
    t0 = time.perf_counter()
    bar = _progress_bar(input_path, shard) if progress else None
    counter = [0]
    summary = EmbedSummary(output_path, 0, 0, 0)
    index: dict[str, int] = {}

    def on_batch(n_sent: int, n_tok: int) -> None:
        summary.tokens += n_tok
        if bar is not None:
            bar.update(n_sent)
            dt = time.perf_counter() - t0
            bar.set_postfix_str(f"{summary.tokens / max(dt, 1e-9):,.0f} tok/s", refresh=False)

    try:
        with atomic_path(output_path) as tmp, h5py.File(tmp, "w") as f:
            for line, arr in _iter_file(model, input_path, layers, pool, batch_size,
                                        max_tokens_per_batch, errors, shard, window_lines, on_batch,
                                        counter):
                f.create_dataset(str(line.index), data=arr, dtype="float32")
                summary.sentences += 1
                if not line.tokens:
                    summary.blank.append(line.index)
                    if bar is not None and not model.stateful:
                        bar.update(1)
                if sentence_index:
                    index.pop(line.text, None)   # keep keys in index order: a repeat moves to the end
                    index[line.text] = line.index
            summary.lines = counter[0]
            _write_index(f, index if sentence_index else None)
            f.attrs[ATTR_LAYERS] = layers
            f.attrs[ATTR_POOL] = pool or "none"
            f.attrs[ATTR_LINES] = summary.lines
            if shard is not None:
                f.attrs[ATTR_SHARD] = f"{shard[0]}/{shard[1]}"
    finally:
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _write_index(f, index: dict[str, int] | None) -> None:
    import h5py
    if index is None:
        return
    text = json.dumps({s: str(i) for s, i in index.items()})
    f.create_dataset(INDEX_DATASET, (1,), dtype=h5py.string_dtype(), data=[text])


def _progress_bar(input_path, shard):
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
            return _check_shard((int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))
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


def merge_shards(shard_paths: Sequence[str | Path], output_path: str | Path, *,
                 link: bool = False) -> Path:
    """Join shard files (from ``embed_file(..., shard=(k, n))``) into one file at ``output_path``.

    Checks that the shards are k = 0 .. n-1 of one run (same n, line count, layers and pooling)
    and together hold every line exactly once. Datasets are copied in index order, so the result
    equals the file an unsharded run writes. ``link=True`` writes a small index file instead:
    an external link per dataset (plain h5py follows them; the shard files must stay beside it)
    plus the merged ``sentence_to_index``.
    """
    import h5py

    if not shard_paths:
        raise ElmoError("embed-merge: no shard files given")
    output_path = Path(output_path)
    files = []
    try:
        for p in shard_paths:
            try:
                files.append(h5py.File(p, "r"))
            except OSError as e:
                raise ElmoError(f"{p}: cannot open as HDF5 ({e})") from None
        meta = []
        for p, f in zip(shard_paths, files):
            missing = [a for a in (ATTR_SHARD, ATTR_LINES, ATTR_LAYERS, ATTR_POOL) if a not in f.attrs]
            if missing:
                raise ElmoError(f"{p}: not an elmo embed shard (no {missing[0]} attribute)")
            k, n = parse_shard(str(f.attrs[ATTR_SHARD]))
            meta.append((k, n, int(f.attrs[ATTR_LINES]), str(f.attrs[ATTR_LAYERS]), str(f.attrs[ATTR_POOL])))
        n = meta[0][1]
        for p, m in zip(shard_paths, meta):
            if m[1:] != meta[0][1:]:
                raise ElmoError(f"{p}: shard of a different run (n, lines, layers, pool = {m[1:]}; "
                                f"{shard_paths[0]} has {meta[0][1:]})")
        ks = sorted(m[0] for m in meta)
        if ks != list(range(n)):
            dup = sorted({k for k in ks if ks.count(k) > 1})
            absent = sorted(set(range(n)) - set(ks))
            raise ElmoError(f"embed-merge: need shards 0..{n - 1} once each"
                            + (f"; missing {absent}" if absent else "") + (f"; repeated {dup}" if dup else ""))
        n_lines = meta[0][2]
        where: dict[int, int] = {}
        index: dict[int, str] = {}
        has_index = all(INDEX_DATASET in f for f in files)
        for s, (p, f) in enumerate(zip(shard_paths, files)):
            for name in f:
                if name == INDEX_DATASET:
                    continue
                if not name.isdigit() or int(name) >= n_lines:
                    raise ElmoError(f"{p}: unexpected dataset {name!r}")
                if int(name) in where:
                    raise ElmoError(f"{p}: dataset {name!r} is also in {shard_paths[where[int(name)]]}")
                where[int(name)] = s
            if has_index:
                for sentence, i in json.loads(f[INDEX_DATASET][0]).items():
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
        with atomic_path(output_path) as tmp, h5py.File(tmp, "w") as out:
            for i in range(n_lines):
                src, name = files[where[i]], str(i)
                if link:
                    rel = os.path.relpath(Path(shard_paths[where[i]]).resolve(), output_path.resolve().parent)
                    out[name] = h5py.ExternalLink(rel, "/" + name)
                else:
                    src.copy(src[name], out, name)
            _write_index(out, merged if has_index else None)
            out.attrs[ATTR_LAYERS], out.attrs[ATTR_POOL] = meta[0][3], meta[0][4]
            out.attrs[ATTR_LINES] = n_lines
    finally:
        for f in files:
            f.close()
    return output_path


# ------------------------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------------------------
def add_subcommand(sub) -> None:
    p = sub.add_parser("embed", help="embed a text file (one sentence per line) into HDF5",
                       description="ELMo vectors for every line of INPUT, written to OUTPUT in the "
                       "HDF5 layout of AllenNLP's `elmo` command (a dataset per line, named by its "
                       "0-based index, plus sentence_to_index).")
    p.add_argument("input", help="UTF-8 text, one whitespace-tokenised sentence per line ('-': stdin)")
    p.add_argument("output", help="HDF5 file to write (replaced only when the run completes)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--all", dest="layers", action="store_const", const="all",
                      help="all layers: (3, n_tokens, 2P) per line")
    mode.add_argument("--top", dest="layers", action="store_const", const="top",
                      help="the top layer: (n_tokens, 2P)")
    mode.add_argument("--average", dest="layers", action="store_const", const="average",
                      help="the mean of the layers: (n_tokens, 2P)")
    p.add_argument("--options-file", help="published options.json (with --weight-file)")
    p.add_argument("--weight-file", help="published weights HDF5 (with --options-file)")
    p.add_argument("--model", help="model directory or published name (default: the embedded model)")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"sentences per batch (default {STATELESS_BATCH_SIZE}; {STATEFUL_BATCH_SIZE} "
                   "with --stateful)")
    p.add_argument("--max-tokens-per-batch", type=int, default=None,
                   help="cap on rows x longest sentence per batch (default "
                   f"{STATELESS_MAX_TOKENS} when --batch-size is not given either)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype (output is float32 either way)")
    p.add_argument("--stateful", action="store_true",
                   help="carry LSTM state from batch to batch (row r of batch i = line i*B + r), "
                   "as the original implementations did")
    p.add_argument("--pool", choices=["mean"], default=None,
                   help="mean over tokens: one vector per line ((3, 2P) with --all)")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with an error naming the line (strict), or replace bad bytes")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="embed only lines i with i %% N == K (0-based K; 'env': RANK/WORLD_SIZE from "
                   "torchrun); join the shard files with `elmo embed-merge`")
    p.add_argument("--no-sentence-index", action="store_true",
                   help="omit the sentence_to_index dataset (keeps memory flat on huge inputs)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    m = sub.add_parser("embed-merge", help="join `elmo embed --shard` outputs into one file",
                       description="Join the shard files of one `elmo embed --shard K/N` run into "
                       "OUTPUT, equal to the file an unsharded run writes.")
    m.add_argument("output")
    m.add_argument("shards", nargs="+", help="the N shard files, in any order")
    m.add_argument("--link", action="store_true",
                   help="write an index of external links to the shards instead of copying")
    m.set_defaults(func=run_merge)


def load_model(args, stateful: bool = False) -> BiLM:
    """The model named by --options-file/--weight-file or --model (default: the embedded one)."""
    if (args.options_file is None) != (args.weight_file is None):
        raise ElmoError("--options-file and --weight-file go together")
    if args.options_file and args.model:
        raise ElmoError("give either --model or --options-file/--weight-file, not both")
    if args.options_file:
        return BiLM.from_published(args.options_file, args.weight_file, stateful=stateful)
    return BiLM.from_pretrained(args.model or "default", stateful=stateful)


def _device(spec: str) -> torch.device:
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ElmoError(f"--device: unknown device {spec!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ElmoError("--device cuda: CUDA is not available in this installation")
        if device.index is None and "LOCAL_RANK" in os.environ:   # one GPU per torchrun rank
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def run(args) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ElmoError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    shard = parse_shard(args.shard) if args.shard else None
    device = _device(args.device)
    model = load_model(args, stateful=args.stateful)
    model = model.to(device=device, dtype=torch.bfloat16 if args.dtype == "bfloat16" else torch.float32)
    with _cli_signals(), warnings.catch_warnings():
        warnings.simplefilter("always", ElmoWarning)
        warnings.showwarning = _show_warning
        s = embed_file(model, args.input, args.output, args.layers, pool=args.pool,
                       batch_size=args.batch_size, max_tokens_per_batch=args.max_tokens_per_batch,
                       errors=args.errors, shard=shard, sentence_index=not args.no_sentence_index,
                       progress=not args.quiet)
    if not args.quiet:
        rate = s.tokens / max(s.seconds, 1e-9)
        print(f"elmo embed: {s.sentences} lines ({s.tokens} tokens, {len(s.blank)} blank) -> "
              f"{s.output} in {s.seconds:.1f}s ({rate:,.0f} tokens/s)", file=sys.stderr)
    return 0


def run_merge(args) -> int:
    out = merge_shards(args.shards, args.output, link=args.link)
    print(f"elmo embed-merge: {len(args.shards)} shards -> {out}", file=sys.stderr)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from tqdm import tqdm
    tqdm.write(f"elmo embed: warning: {message}", file=sys.stderr)


class _cli_signals:
    """SIGTERM unwinds like Ctrl-C, so the temporary output is removed (no OUTPUT is left)."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:        # not the main thread
            pass
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False
