"""The batching engine and the Python API: tokenised sentences in, one float32 array each out.

Stateless (the default), a sentence's vectors do not depend on its batch mates (up to float32
rounding, about 3e-6: the batch shape changes the order of additions), so the input is
read in windows, each window's sentences are sorted by length and cut into batches of similar
lengths (little padding, large batches), and the results are given back in input order. Memory
stays flat: a window is at most ``window_lines`` sentences and about ``window_bytes`` of output.
``stateful`` models instead get batches in input order, row r of batch i being sentence i*B + r,
so the original implementations' carried-state outputs can be reproduced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ElmoError
from ..io.text import length_batches
from ..model.bilm import BiLM

LAYER_MODES = ("all", "top", "average")
POOL_MODES = (None, "mean")

STATEFUL_BATCH_SIZE = 64          # AllenNLP's ``elmo`` default, for reproducing stateful outputs
STATELESS_BATCH_SIZE = 256        # rows per batch; big batches keep the recurrent matmuls efficient
STATELESS_MAX_TOKENS = 8192       # rows x longest sentence per batch
WINDOW_LINES = 10_000
WINDOW_BYTES = 256 * 2**20        # output held per window before it is given back

Item = tuple[int, list[str]]            # (index, tokens)
OnBatch = Callable[[int, int], None]    # (sentences, tokens) just computed
OnBlank = Callable[[int], None]         # index of an empty sentence, as its array is given back


class ElmoWarning(UserWarning):
    """A problem in the input that does not stop the run (e.g. a blank line)."""


def check_modes(layers: str, pool: str | None) -> None:
    if layers not in LAYER_MODES:
        raise ElmoError(f"layers must be one of {', '.join(LAYER_MODES)}, got {layers!r}")
    if pool not in POOL_MODES:
        raise ElmoError(f"pool must be None or 'mean', got {pool!r}")


# ------------------------------------------------------------------------------------------------
# One batch through the model.
# ------------------------------------------------------------------------------------------------
def output_shape(model: BiLM, layers: str, pool: str | None, n_tokens: int) -> tuple[int, ...]:
    """Shape of one sentence's array (and HDF5 dataset), with L = ``model.num_layers`` and
    2P = ``model.output_dim``.

    Returns
    -------
    ``(L, n_tokens, 2P)`` for ``layers="all"``, else ``(n_tokens, 2P)``; with ``pool="mean"``
    ``(L, 2P)`` or ``(2P,)``, and ``(0,)`` for an empty sentence.
    """
    F = model.output_dim
    if pool == "mean":
        if n_tokens == 0:
            return (0,)
        return (model.num_layers, F) if layers == "all" else (F,)
    return (model.num_layers, n_tokens, F) if layers == "all" else (n_tokens, F)


@torch.no_grad()
def embed_batch(model: BiLM, sentences: Sequence[Sequence[str]], layers: str,
                pool: str | None) -> list[np.ndarray]:
    """Run one batch through ``model`` as given (no sorting or splitting; a stateful model's
    carried state advances).

    Parameters
    ----------
    model : the biLM, on any device and dtype.
    sentences : B tokenised sentences (lists of ``str``, at least one; an empty one is allowed).
    layers : ``"all"``, ``"top"`` or ``"average"`` (the mean of the L layers).
    pool : None, or ``"mean"``: the mean over each sentence's tokens.

    Returns
    -------
    B float32 numpy arrays, sentence b's shaped as :func:`output_shape` says for its ``n_b``
    tokens: ``(L, n_b, 2P)`` or ``(n_b, 2P)``; pooled ``(L, 2P)`` or ``(2P,)``.
    """
    return start_batch(model, sentences, layers, pool).result()


class PendingBatch:
    """A batch's outputs on their way to the host. On a GPU the copy goes to pinned memory
    without blocking, so the host can launch the next batch before taking these
    (:meth:`result`): the device computes while the host writes."""

    def __init__(self, rep: torch.Tensor, lengths: list[int], pool: str | None, layers: str) -> None:
        self.lengths, self.pool, self.layers = lengths, pool, layers
        self.event = None
        if rep.is_cuda:
            self.host = torch.empty(rep.shape, dtype=rep.dtype, pin_memory=True)
            self.host.copy_(rep, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = rep

    def result(self) -> list[np.ndarray]:
        """The B arrays (see :func:`embed_batch`); waits for the copy."""
        if self.event is not None:
            self.event.synchronize()
        rep = self.host.numpy()
        results = []
        for b, n_tok in enumerate(self.lengths):
            if self.pool == "mean":
                results.append(rep[b] if n_tok else np.zeros((0,), np.float32))
            else:
                results.append(np.ascontiguousarray(rep[b, :, :n_tok] if self.layers == "all" else rep[b, :n_tok]))
        return results


@torch.no_grad()
def start_batch(model: BiLM, sentences: Sequence[Sequence[str]], layers: str,
                pool: str | None) -> PendingBatch:
    """:func:`embed_batch` without waiting for the outputs."""
    check_modes(layers, pool)
    out = model.embed_sentences(sentences)   # the model's own ids (host ids: see BiLM.forward)
    reps = [t.float() for t in out.layers]                      # mix and pool in float32
    if layers == "all":
        rep = torch.stack(reps, dim=1)                          # (B, L, T, 2P)
    elif layers == "top":
        rep = reps[-1]                                          # (B, T, 2P)
    else:
        rep = sum(reps[1:], reps[0]) / len(reps)
    lengths = [len(s) for s in sentences]
    if pool == "mean":
        m = out.mask.to(rep.dtype)                              # (B, T)
        m = m.unsqueeze(1) if layers == "all" else m
        n = torch.tensor(lengths, dtype=rep.dtype).to(rep.device).clamp(min=1)
        n = n.view(-1, 1, 1) if layers == "all" else n.view(-1, 1)
        rep = (rep * m.unsqueeze(-1)).sum(dim=-2) / n           # (B, L, 2P) or (B, 2P)
    return PendingBatch(rep, lengths, pool, layers)


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
                window_lines: int = WINDOW_LINES, window_bytes: int = WINDOW_BYTES) -> Batching:
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

    def batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Stateless batches of one window, as lists of indices into ``lengths`` (the sentences'
        token counts): longest first, similar lengths together, at most ``batch_size`` rows and
        ``max_tokens`` padded tokens each (a longer sentence goes alone)."""
        return length_batches(lengths, self.batch_size, self.max_tokens)


def start(model: BiLM, batch_size: int | None, max_tokens_per_batch: int | None,
          window_lines: int) -> Batching:
    """The batching for ``model``; a stateful model is reset so that a run starts from zero."""
    batching = Batching.resolve(model.stateful, batch_size, max_tokens_per_batch, window_lines)
    if model.stateful:
        model.reset_states()
    return batching


def iter_embed_indexed(model: BiLM, items: Iterable[Item], layers: str, pool: str | None,
                       batching: Batching, on_batch: OnBatch | None = None,
                       on_blank: OnBlank | None = None,
                       in_order: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """The engine: ``(index, tokens)`` pairs in, ``(index, array)`` out, in input order.

    ``on_batch(sentences, tokens)`` follows each batch run; ``on_blank(index)`` precedes each
    empty sentence's zero-length array. ``in_order=False`` gives each batch's arrays back as soon
    as it is computed (a window's blank lines first), so no window of outputs is ever held: for
    writers that file results by index. The batches, and so the numbers, are the same.
    """
    check_modes(layers, pool)
    empty = np.zeros(output_shape(model, layers, pool, 0), np.float32)

    def run(batch: list[Item]) -> Callable[[], list[np.ndarray]]:
        pending = start_batch(model, [toks for _, toks in batch], layers, pool)

        def finish() -> list[np.ndarray]:
            arrays = pending.result()
            if on_batch is not None:
                on_batch(len(batch), sum(len(toks) for _, toks in batch))
            return arrays
        return finish

    if model.stateful:
        # Fixed batches in input order, blank lines included (they still advance the state, as
        # an empty sentence does in the originals: the model sees "<S> </S>").
        batch: list[Item] = []
        for it in items:
            batch.append(it)
            if len(batch) == batching.batch_size:
                yield from _finish_stateful(batch, run(batch)(), empty, on_blank)
                batch = []
        if batch:
            yield from _finish_stateful(batch, run(batch)(), empty, on_blank)
        return

    per_token = 4 * model.output_dim * (model.num_layers if layers == "all" else 1)
    per_sentence = 4 * model.output_dim * model.num_layers
    window: list[Item] = []
    window_bytes = 0
    for it in items:
        window.append(it)
        window_bytes += per_sentence if pool else per_token * len(it[1])
        if len(window) >= batching.window_lines or window_bytes >= batching.window_bytes:
            yield from _run_window(window, run, batching, empty, on_blank, in_order)
            window, window_bytes = [], 0
    if window:
        yield from _run_window(window, run, batching, empty, on_blank, in_order)


def _finish_stateful(batch: list[Item], arrays: list[np.ndarray], empty: np.ndarray,
                     on_blank: OnBlank | None) -> Iterator[tuple[int, np.ndarray]]:
    for (i, toks), arr in zip(batch, arrays):
        if not toks:
            if on_blank is not None:
                on_blank(i)
            arr = empty
        yield i, arr


def _run_window(window: list[Item], run: Callable[[list[Item]], Callable[[], list[np.ndarray]]],
                batching: Batching, empty: np.ndarray, on_blank: OnBlank | None,
                in_order: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    full = [it for it in window if it[1]]       # blank lines need no batch row
    if not in_order:
        for i, toks in window:
            if not toks:
                if on_blank is not None:
                    on_blank(i)
                yield i, empty
        # One batch in flight: batch k + 1 is launched before batch k's arrays are taken and
        # written, so on a GPU the writing overlaps the next batch's compute.
        previous = None
        for rows in batching.batches([len(toks) for _, toks in full]):
            batch = [full[r] for r in rows]
            current = (batch, run(batch))
            if previous is not None:
                yield from zip((i for i, _ in previous[0]), previous[1]())
            previous = current
        if previous is not None:
            yield from zip((i for i, _ in previous[0]), previous[1]())
        return
    done: dict[int, np.ndarray] = {}
    for rows in batching.batches([len(toks) for _, toks in full]):
        batch = [full[r] for r in rows]
        for (i, _), arr in zip(batch, run(batch)()):
            done[i] = arr
    for i, toks in window:
        if toks:
            yield i, done.pop(i)
        else:
            if on_blank is not None:
                on_blank(i)
            yield i, empty


# ------------------------------------------------------------------------------------------------
# Python API.
# ------------------------------------------------------------------------------------------------
def iter_embed(model: BiLM, sentences: Iterable[Sequence[str]], layers: str = "all", *,
               pool: str | None = None, batch_size: int | None = None,
               max_tokens_per_batch: int | None = None, window_lines: int = WINDOW_LINES,
               on_batch: OnBatch | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Embed an iterable of tokenised sentences, streaming: yields ``(index, array)`` in input order.

    Parameters
    ----------
    sentences : any iterable of token lists; read one window at a time.
    layers : "all" gives ``(L, n, 2P)`` arrays, "top" or "average" ``(n, 2P)``.
    pool : ``"mean"`` averages over the tokens: ``(L, 2P)`` or ``(2P,)``.
    batch_size, max_tokens_per_batch, window_lines : stateless models batch up to ``batch_size``
        rows (default 256) and ``max_tokens_per_batch`` padded tokens (default 8192, when neither
        is given) within windows of ``window_lines`` sentences; stateful models take
        ``batch_size`` (default 64) rows in input order, starting from the zero state (the
        model's carried state is reset first).
    on_batch : called with (sentences, tokens) after each batch.

    An empty sentence gives a zero-length array, without a warning (see
    :func:`torchelmo.embed.iter_embed_file`).
    """
    batching = start(model, batch_size, max_tokens_per_batch, window_lines)

    if sentences is None or isinstance(sentences, (str, bytes)) or not hasattr(sentences, "__iter__"):
        raise ElmoError(f"sentences must be an iterable of token lists, got {type(sentences).__name__}")

    def items() -> Iterator[Item]:
        for i, s in enumerate(sentences):
            if s is None or not hasattr(s, "__iter__"):
                raise ElmoError(f"sentence {i} is {type(s).__name__}, expected a list of tokens")
            if isinstance(s, str):
                raise ElmoError(f"sentence {i} is a str, expected a list of tokens (split it first, "
                                "e.g. line.split())")
            s = list(s)
            for j, tok in enumerate(s):
                if not isinstance(tok, str):
                    raise ElmoError(f"sentence {i} token {j} is {type(tok).__name__}, expected str")
            yield i, s

    return iter_embed_indexed(model, items(), layers, pool, batching, on_batch)


def embed_sentences(model: BiLM, sentences: Sequence[Sequence[str]], layers: str = "all", *,
                    pool: str | None = None, batch_size: int | None = None,
                    max_tokens_per_batch: int | None = None) -> list[np.ndarray]:
    """Embed a list of tokenised sentences; returns one float32 array per sentence (shapes as in
    the HDF5 output, see :func:`iter_embed`)."""
    return [arr for _, arr in iter_embed(model, sentences, layers, pool=pool, batch_size=batch_size,
                                         max_tokens_per_batch=max_tokens_per_batch)]
