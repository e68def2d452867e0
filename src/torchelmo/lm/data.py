"""Training batches of the biLM: what each direction reads, and the two batching schemes.

The sentences come from a :class:`~torchelmo.lm.corpus.Corpus`; targets are ids of a
:class:`~torchelmo.lm.vocab.Vocabulary`.

What the two LMs read, per sentence ``w1 .. wn`` (as bilm-tf)::

    forward   inputs  <S>  w1 .. wn      targets  w1 .. wn </S>
    backward  inputs  </S> wn .. w1      targets  wn .. w1 <S>

so both directions make ``n + 1`` predictions per sentence (the ``<eos>`` count of word-level
LM papers). Inputs are characters (any token works); targets are vocabulary ids, ``<UNK>`` for
tokens outside the vocabulary.

Batching
    :class:`StreamBatcher` is the original's truncated BPTT: each of B rows is a continuous
    stream of sentences cut into windows of ``unroll`` (20) steps; the LSTM state carries from a
    window to the next. Because each sentence contributes the same number of steps to both
    directions, a row's forward and backward windows cover the same sentences, and the backward
    state carries along the backward stream (each sentence reversed, as bilm-tf).
    :class:`SentenceBatcher` gives batches of whole sentences (zero initial state), bucketed by
    length, sized in sentences or in tokens.

Distributed training
    Every rank runs the same (cheap) global batching logic over the same sentence order and
    materialises only its own rows: stream rows ``[r B / W, (r + 1) B / W)``, or every W-th
    sentence of a global sentence batch. A run's data therefore does not depend on the number
    of ranks, only on the global batch: 2 ranks x 8 rows see exactly what 1 rank x 16 rows sees.
"""


from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ..errors import ElmoError
from ..io.text import length_batches
from ..model.bilm import lm_sequences
from ..model.chars import MAX_CHARS, word_to_char_ids
from ..model.encoder import plan_tokens
from ..runtime import copy_to
from .corpus import Corpus, CorpusPosition
from .vocab import Vocabulary


# ------------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """One batch for both LMs (B rows of this rank, T steps).

    ``char_ids (U, 50)`` are the distinct input tokens, ``token_index (2, B, T)`` points into
    them ([0] forward inputs, [1] backward inputs, -1 at padding); ``targets (2, B, T)`` are
    vocabulary ids (-1 at padding); ``lengths (B,)`` the steps of each row (the same in both
    directions). ``n_targets`` is this rank's number of targets per direction; ``global_targets``
    the whole global batch's (all ranks). ``groups``: the ``(length, count)`` runs of characters
    per token over ``char_ids``, which are in ascending order of length (the encoder then needs
    no device sort; see :func:`torchelmo.model.encoder.plan_tokens`).
    """

    char_ids: torch.Tensor
    token_index: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor
    n_targets: int
    global_targets: int
    groups: list[tuple[int, int]] | None = None

    def to(self, device: torch.device | str) -> Batch:
        return Batch(copy_to(self.char_ids, device), copy_to(self.token_index, device),
                     copy_to(self.targets, device), copy_to(self.lengths, device),
                     self.n_targets, self.global_targets, self.groups)


def make_batch(rows: Sequence[tuple[list[str], list[int], list[str], list[int]]], vocab_ids_T: int | None,
               global_targets: int) -> Batch:
    """Rows of ``(fwd inputs, fwd targets, bwd inputs, bwd targets)`` -> :class:`Batch`."""
    B = len(rows)
    T = vocab_ids_T if vocab_ids_T is not None else max((len(r[0]) for r in rows), default=0)
    T = max(T, 1)
    index = torch.full((2, B, T), -1, dtype=torch.long)
    targets = torch.full((2, B, T), -1, dtype=torch.long)
    lengths = torch.zeros(B, dtype=torch.long)
    uniq: dict[str, int] = {}
    for b, (fi, ft, bi, bt) in enumerate(rows):
        n = len(fi)
        lengths[b] = n
        if n == 0:
            continue
        index[0, b, :n] = torch.tensor([uniq.setdefault(t, len(uniq)) for t in fi])
        index[1, b, :n] = torch.tensor([uniq.setdefault(t, len(uniq)) for t in bi])
        targets[0, b, :n] = torch.tensor(ft)
        targets[1, b, :n] = torch.tensor(bt)
    if not uniq:
        return Batch(torch.zeros(0, MAX_CHARS, dtype=torch.long), index, targets, lengths, 0, global_targets, [])
    plan = plan_tokens(torch.tensor([word_to_char_ids(t) for t in uniq], dtype=torch.long))
    index = torch.where(index >= 0, plan.inverse[index.clamp(min=0)], -1)   # into the sorted rows
    return Batch(plan.unique, index, targets, lengths, int(lengths.sum()), global_targets, plan.groups)


def sentence_rows(sent: Sequence[str], vocab: Vocabulary) -> tuple[list[str], list[int], list[str], list[int]]:
    """The two LMs' inputs and targets for one sentence: each direction's view (see
    :func:`torchelmo.model.bilm.lm_sequences`) without its last token, and its vocabulary ids from the second on."""
    fwd, bwd = lm_sequences(sent)
    return fwd[:-1], vocab.ids(fwd[1:]), bwd[:-1], vocab.ids(bwd[1:])


def sentences_batch(sentences: Sequence[Sequence[str]], vocab: Vocabulary) -> Batch:
    """A zero-state batch of whole sentences (for scoring)."""
    rows = [sentence_rows(list(s), vocab) for s in sentences]
    n = sum(len(r[0]) for r in rows)
    return make_batch(rows, None, n)


def rank_rows(batch_size: int, rank: int, world_size: int) -> range:
    if batch_size % world_size:
        raise ElmoError(f"batch size {batch_size} is not divisible by the number of ranks {world_size}")
    per = batch_size // world_size
    return range(rank * per, (rank + 1) * per)


class StreamBatcher:
    """Truncated-BPTT windows: ``batch_size`` continuous streams (global rows), ``unroll`` steps.

    Training (``contiguous=False``): all rows pull their next sentence from one shuffled stream,
    in row order (as bilm-tf), forever or for ``epochs``. Evaluation (``contiguous=True``): row g
    reads the g-th contiguous slice of the corpus in file order, so that every row's context is
    real preceding text; it ends when every row is exhausted (the last windows are shorter).

    Iterating yields :class:`Batch` objects for this rank's rows; :meth:`state_dict` /
    :meth:`load_state_dict` save and restore the exact position.
    """

    def __init__(self, corpus: Corpus, vocab: Vocabulary, batch_size: int, unroll: int = 20,
                 rank: int = 0, world_size: int = 1, epochs: int | None = None,
                 contiguous: bool = False) -> None:
        if batch_size < 1 or unroll < 1:
            raise ElmoError(f"batch size and unroll steps must be positive (got {batch_size}, {unroll})")
        self.corpus, self.vocab = corpus, vocab
        self.batch_size, self.unroll = batch_size, unroll
        self.rows = rank_rows(batch_size, rank, world_size)
        self.epochs = epochs
        self.contiguous = contiguous
        self.position = CorpusPosition()     # of the shared stream (training)
        self.current: list[list[str] | None] = [None] * batch_size   # each row's sentence
        self.consumed = [0] * batch_size     # steps of it already used
        self.exhausted = False
        self._iters: list[Iterator] | None = None
        self._remaining: list[int] = []
        # sentence_rows of each own row's current sentence (keyed by the sentence object), made
        # once per sentence rather than once per window it spans
        self._views: dict[int, tuple[list[str], tuple]] = {}

    @property
    def epoch(self) -> int:
        return self.position.epoch

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.contiguous:
            raise ElmoError("contiguous (evaluation) streams cannot be checkpointed")
        return {"position": self.position.asdict(), "current": list(self.current),
                "consumed": list(self.consumed), "exhausted": self.exhausted,
                "corpus": self.corpus.fingerprint()}

    def load_state_dict(self, state: dict, new_data: bool = False, where: str = "checkpoint") -> None:
        """``new_data``: the corpus files changed since ``state`` was saved; the stream starts the
        next epoch on them (the rows finish the sentences they hold)."""
        self.position = CorpusPosition(**state["position"])
        if new_data:
            self.position = CorpusPosition(epoch=self.position.epoch + 1)
        else:
            self.corpus.check_fingerprint(state.get("corpus"), where)
        self.current, self.consumed = list(state["current"]), list(state["consumed"])
        self.exhausted = state["exhausted"]
        self._iters = None
        self._views = {}

    # -- sources ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        if not self.contiguous:
            self._iters = [self.corpus.sentences(self.position, self.epochs)]
            return
        # Pass 1 counts the sentences, pass 2 notes where each row's slice starts.
        n = sum(1 for _ in self.corpus.sentences(epochs=1))
        bounds = [g * n // self.batch_size for g in range(self.batch_size + 1)]
        starts: list[CorpusPosition] = []
        pos, i = CorpusPosition(), 0
        for g in range(self.batch_size):
            if bounds[g] == 0:
                starts.append(CorpusPosition())
        it = self.corpus.sentences(epochs=1)
        while len(starts) < self.batch_size:
            _, pos = next(it)
            i += 1
            while len(starts) < self.batch_size and bounds[len(starts)] == i:
                starts.append(pos)
        self._iters = [self.corpus.sentences(starts[g], epochs=1) for g in range(self.batch_size)]
        self._remaining = [bounds[g + 1] - bounds[g] for g in range(self.batch_size)]

    def _next_sentence(self, g: int) -> list[str] | None:
        assert self._iters is not None
        if self.contiguous:
            if self._remaining[g] == 0:
                return None
            self._remaining[g] -= 1
            return next(self._iters[g])[0]
        try:
            sent, self.position = next(self._iters[0])
        except StopIteration:
            self.exhausted = True
            return None
        return sent

    # -- windows ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._iters is None:
            self._setup()
        if self.exhausted and not self.contiguous and all(c is None for c in self.current):
            raise StopIteration
        rows, total = {}, 0
        own = set(self.rows)
        for g in range(self.batch_size):
            fi: list[str] = []
            ft: list[int] = []
            bi: list[str] = []
            bt: list[int] = []
            while len(fi) < self.unroll:
                if self.current[g] is None:
                    if self.exhausted and not self.contiguous:
                        break
                    self.current[g] = self._next_sentence(g)
                    self.consumed[g] = 0
                    if self.current[g] is None:
                        break
                sent = self.current[g]
                k, need = self.consumed[g], self.unroll - len(fi)
                take = min(need, len(sent) + 1 - k)
                if g in own:
                    view = self._views.get(g)
                    if view is None or view[0] is not sent:
                        view = self._views[g] = (sent, sentence_rows(sent, self.vocab))
                    f_in, f_t, b_in, b_t = view[1]
                    fi += f_in[k:k + take]
                    ft += f_t[k:k + take]
                    bi += b_in[k:k + take]
                    bt += b_t[k:k + take]
                else:
                    fi += [""] * take  # only the count matters for other ranks' rows
                self.consumed[g] = k + take
                if self.consumed[g] == len(sent) + 1:
                    self.current[g] = None
                    self._views.pop(g, None)
            total += len(fi)
            if g in own:
                rows[g] = (fi, ft, bi, bt)
        if total == 0:
            raise StopIteration
        return make_batch([rows[g] for g in self.rows], self.unroll, total)


class SentenceBatcher:
    """Batches of whole sentences, bucketed by length.

    A pool of ``pool_size`` sentences is sorted by length and cut into global batches of
    ``batch_size`` sentences or of at most ``batch_tokens`` (padded) tokens; the batches of a pool
    are shuffled (``shuffle``). Rank r takes sentences r, r + W, ... of each global batch.
    """

    def __init__(self, corpus: Corpus, vocab: Vocabulary, batch_size: int | None = None,
                 batch_tokens: int | None = None, rank: int = 0, world_size: int = 1,
                 epochs: int | None = None, pool_size: int = 10_000, shuffle: bool = True,
                 seed: int = 0) -> None:
        if (batch_size is None) == (batch_tokens is None):
            raise ElmoError("give exactly one of batch_size (sentences) and batch_tokens")
        if batch_size is not None and batch_size < world_size:
            raise ElmoError(f"batch size {batch_size} is smaller than the number of ranks {world_size}")
        if batch_tokens is not None and batch_tokens < 1:
            raise ElmoError(f"batch tokens must be positive, got {batch_tokens}")
        self.corpus, self.vocab = corpus, vocab
        self.batch_size, self.batch_tokens = batch_size, batch_tokens
        self.rank, self.world_size = rank, world_size
        self.epochs, self.pool_size, self.shuffle, self.seed = epochs, pool_size, shuffle, seed
        self.pool_start = CorpusPosition()   # where the current pool was read from
        self.pool_no = 0
        self.batch_no = 0                    # next batch of the current pool
        self.position = CorpusPosition()     # after the current pool
        self._pool: list[list[list[str]]] | None = None

    @property
    def epoch(self) -> int:
        return self.pool_start.epoch

    def state_dict(self) -> dict:
        return {"pool_start": self.pool_start.asdict(), "pool_no": self.pool_no, "batch_no": self.batch_no,
                "corpus": self.corpus.fingerprint()}

    def load_state_dict(self, state: dict, new_data: bool = False, where: str = "checkpoint") -> None:
        """``new_data``: as :meth:`StreamBatcher.load_state_dict`; a new pool starts the next epoch."""
        self.pool_start = CorpusPosition(**state["pool_start"])
        self.pool_no, self.batch_no = state["pool_no"], state["batch_no"]
        if new_data:
            self.pool_start = CorpusPosition(epoch=self.pool_start.epoch + 1)
            self.pool_no, self.batch_no = self.pool_no + 1, 0
        else:
            self.corpus.check_fingerprint(state.get("corpus"), where)
        self._pool = None
        self._fill(self.pool_start)

    def _fill(self, start: CorpusPosition) -> None:
        sents, pos = [], start
        for s, pos in self.corpus.sentences(start, self.epochs):  # noqa: B007  (pos: where the pool ends)
            sents.append(s)
            if len(sents) == self.pool_size:
                break
        self.position = pos
        if not sents:
            self._pool = []
            return
        # Shortest first; the token cap counts targets (n + 1 per sentence) and leaves every rank a row.
        groups = length_batches([len(s) + 1 for s in sents], self.batch_size, self.batch_tokens,
                                descending=False, min_rows=self.world_size)
        batches = [[sents[i] for i in g] for g in groups]
        if len(batches) > 1 and len(batches[-1]) < self.world_size:
            batches[-2].extend(batches.pop())
        if self.shuffle:
            random.Random(f"{self.seed}/pool/{self.pool_no}").shuffle(batches)
        self._pool = batches

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._pool is None:
            self._fill(self.pool_start)
        assert self._pool is not None
        while self.batch_no >= len(self._pool):
            if not self._pool:
                raise StopIteration
            self.pool_start = self.position
            self.pool_no += 1
            self.batch_no = 0
            self._fill(self.pool_start)
            if not self._pool:
                raise StopIteration
        sents = self._pool[self.batch_no]
        self.batch_no += 1
        if len(sents) < self.world_size:
            raise ElmoError(f"corpus {self.corpus.name}: a batch of {len(sents)} sentences cannot be "
                            f"split over {self.world_size} ranks (corpus too small)")
        mine = sents[self.rank::self.world_size]
        total = sum(len(s) + 1 for s in sents)
        return make_batch([sentence_rows(s, self.vocab) for s in mine], None, total)
