"""Training data: vocabulary, a streamed corpus, and the two batching schemes of the biLM.

Corpus
    Files or globs of pre-tokenised text, one sentence per line (tokens split on whitespace).
    Files ("shards") are read line by line, never whole: each shard is read in blocks of
    ``block_lines`` lines and each block is shuffled, the shard order is shuffled every epoch.
    Blank lines are skipped. Every shuffle is seeded by ``(seed, epoch, shard, block)``, so a
    :class:`CorpusPosition` (epoch, shard, block byte offset, index in block) is enough to
    resume exactly where a run stopped.

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

import glob
import os
import random
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from .chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, word_to_char_ids
from .errors import ElmoError
from .fileio import atomic_path

UNK_TOKEN = "<UNK>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
MAX_TOKEN_BYTES = MAX_CHARS - 2  # longer tokens are truncated in their character ids


# ------------------------------------------------------------------------------------------------
# Vocabulary
# ------------------------------------------------------------------------------------------------
class Vocabulary:
    """Output vocabulary of the LM: ``<S>``, ``</S>``, ``<UNK>`` (ids 0, 1, 2), then the rest,
    most frequent first (the sampled softmax's log-uniform sampler relies on that order)."""

    bos, eos, unk = 0, 1, 2

    def __init__(self, tokens: Sequence[str], counts: Sequence[int] | None = None,
                 source: str = "vocabulary") -> None:
        tokens = list(tokens)
        if tuple(tokens[:3]) != SPECIAL_TOKENS:
            raise ElmoError(f"{source}: the first three entries must be <S>, </S>, <UNK> "
                            f"(got {', '.join(map(repr, tokens[:3])) or 'nothing'}); build the "
                            "vocabulary with `elmo vocab` or add those lines at the top")
        index: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in index:
                raise ElmoError(f"{source}: line {i + 1}: duplicate token {t!r} "
                                f"(first on line {index[t] + 1})")
            index[t] = i
        self.tokens = tokens
        self.index = index
        self.counts = list(counts) if counts is not None else None

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        return self.index.get(token, self.unk)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        get, unk = self.index.get, self.unk
        return [get(t, unk) for t in tokens]

    # -- files -----------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> "Vocabulary":
        """One token per line (the bilm-tf format); an optional second column is a count."""
        path = Path(path)
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            raise ElmoError(f"{path}: cannot read vocabulary ({e.strerror})") from None
        tokens, counts = [], []
        with f:
            try:
                for n, line in enumerate(f, 1):
                    parts = line.rstrip("\r\n").split()
                    if not parts:
                        raise ElmoError(f"{path}: line {n}: blank line in vocabulary")
                    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
                        raise ElmoError(f"{path}: line {n}: expected 'token' or 'token count', "
                                        f"got {line.strip()[:60]!r}")
                    tokens.append(parts[0])
                    counts.append(int(parts[1]) if len(parts) == 2 else None)
            except UnicodeDecodeError as e:
                raise ElmoError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not tokens:
            raise ElmoError(f"{path}: empty vocabulary file")
        have_counts = all(c is not None for c in counts[3:]) and len(tokens) > 3
        return cls(tokens, [c or 0 for c in counts] if have_counts else None, source=str(path))

    def save(self, path: str | Path, with_counts: bool = False) -> Path:
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for i, t in enumerate(self.tokens):
                if with_counts and self.counts is not None:
                    f.write(f"{t}\t{self.counts[i]}\n")
                else:
                    f.write(t + "\n")
        return path

    @classmethod
    def build(cls, files: Sequence[str | Path], min_count: int = 1, max_size: int | None = None,
              progress: bool = False) -> "Vocabulary":
        """Count a corpus (streamed) and keep tokens seen ``min_count`` times, most frequent first
        (ties alphabetically); ``max_size`` counts the three special tokens."""
        if max_size is not None and max_size < 3:
            raise ElmoError(f"vocabulary max size must be at least 3 (the special tokens), got {max_size}")
        counter: Counter[str] = Counter()
        n_sent = 0
        for path in expand_files(files):
            for _, _, toks in _read_lines(path):
                counter.update(toks)
                n_sent += 1
        if n_sent == 0:
            raise ElmoError(f"corpus {' '.join(map(str, files))}: no sentences (all files empty or blank)")
        n_eos = n_sent
        for t in SPECIAL_TOKENS:
            counter.pop(t, None)
        items = sorted(((t, c) for t, c in counter.items() if c >= min_count), key=lambda x: (-x[1], x[0]))
        if max_size is not None:
            items = items[: max_size - 3]
        unk = sum(counter.values()) - sum(c for _, c in items)
        tokens = list(SPECIAL_TOKENS) + [t for t, _ in items]
        counts = [n_sent, n_eos, unk] + [c for _, c in items]
        return cls(tokens, counts)

    def unigram_log_probs(self) -> torch.Tensor:
        """Log-probabilities of a unigram model over the targets (needs counts; add-one smoothed)."""
        if self.counts is None:
            raise ElmoError("vocabulary has no counts (build it with Vocabulary.build)")
        c = torch.tensor(self.counts, dtype=torch.float64) + 1.0
        return (c / c.sum()).log()


# ------------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------------
def expand_files(patterns: Sequence[str | Path]) -> list[Path]:
    """Files named or matched by glob patterns, in order (each pattern's matches sorted)."""
    if isinstance(patterns, (str, Path)):
        patterns = [patterns]
    out: list[Path] = []
    for pat in patterns:
        s = os.path.expanduser(str(pat))
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


def _read_lines(path: Path, offset: int = 0, line0: int = 0, limit: int | None = None
                ) -> Iterator[tuple[int, int, list[str]]]:
    """(line number, byte offset after the line, tokens) of the non-blank lines of a file."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ElmoError(f"{path}: cannot read corpus file ({e.strerror})") from None
    with f:
        f.seek(offset)
        n = line0
        while limit is None or n - line0 < limit:
            raw = f.readline()
            if not raw:
                return
            n += 1
            try:
                toks = raw.decode("utf-8").split()
            except UnicodeDecodeError as e:
                raise ElmoError(f"{path}: line {n}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not toks:
                continue
            _check_long_tokens(path, n, toks)
            yield n, f.tell(), toks


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
        try:
            f = open(path, "rb")
        except OSError as e:
            raise ElmoError(f"{path}: cannot read corpus file ({e.strerror})") from None
        n = pos.line0
        with f:
            f.seek(pos.offset)
            for _ in range(self.block_lines):
                raw = f.readline()
                if not raw:
                    break
                n += 1
                try:
                    toks = raw.decode("utf-8").split()
                except UnicodeDecodeError as e:
                    raise ElmoError(f"{path}: line {n}: not UTF-8 text ({e.reason} at byte {e.start})") from None
                if toks:
                    _check_long_tokens(path, n, toks)
                    sents.append(toks)
            end = f.tell()
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
            warnings.warn(f"{path}: line {line}: token of {len(t.encode('utf-8'))} bytes; its characters "
                          f"are truncated to {MAX_TOKEN_BYTES} bytes as in the original (its target id "
                          "is unaffected); further such tokens in this file are not reported", stacklevel=3)
            return


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
    the whole global batch's (all ranks).
    """

    char_ids: torch.Tensor
    token_index: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor
    n_targets: int
    global_targets: int

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.char_ids.to(device), self.token_index.to(device), self.targets.to(device),
                     self.lengths.to(device), self.n_targets, self.global_targets)


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
    if uniq:
        char_ids = torch.tensor([word_to_char_ids(t) for t in uniq], dtype=torch.long)
    else:
        char_ids = torch.zeros(0, MAX_CHARS, dtype=torch.long)
    return Batch(char_ids, index, targets, lengths, int(lengths.sum()), global_targets)


def sentence_rows(sent: Sequence[str], vocab: Vocabulary) -> tuple[list[str], list[int], list[str], list[int]]:
    """The two LMs' inputs and targets for one sentence (see the module docstring)."""
    ids = vocab.ids(sent)
    return ([BOS_TOKEN, *sent], ids + [vocab.eos],
            [EOS_TOKEN, *reversed(sent)], ids[::-1] + [vocab.bos])


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

    @property
    def epoch(self) -> int:
        return self.position.epoch

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.contiguous:
            raise ElmoError("contiguous (evaluation) streams cannot be checkpointed")
        return {"position": self.position.asdict(), "current": list(self.current),
                "consumed": list(self.consumed), "exhausted": self.exhausted}

    def load_state_dict(self, state: dict) -> None:
        self.position = CorpusPosition(**state["position"])
        self.current, self.consumed = list(state["current"]), list(state["consumed"])
        self.exhausted = state["exhausted"]
        self._iters = None

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
                    f_in, f_t, b_in, b_t = sentence_rows(sent, self.vocab)
                    fi += f_in[k:k + take]
                    ft += f_t[k:k + take]
                    bi += b_in[k:k + take]
                    bt += b_t[k:k + take]
                else:
                    fi += [""] * take  # only the count matters for other ranks' rows
                self.consumed[g] = k + take
                if self.consumed[g] == len(sent) + 1:
                    self.current[g] = None
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
        self._it: Iterator | None = None

    @property
    def epoch(self) -> int:
        return self.pool_start.epoch

    def state_dict(self) -> dict:
        return {"pool_start": self.pool_start.asdict(), "pool_no": self.pool_no, "batch_no": self.batch_no}

    def load_state_dict(self, state: dict) -> None:
        self.pool_start = CorpusPosition(**state["pool_start"])
        self.pool_no, self.batch_no = state["pool_no"], state["batch_no"]
        self._pool, self._it = None, None
        self._fill(self.pool_start)

    def _fill(self, start: CorpusPosition) -> None:
        self._it = self.corpus.sentences(start, self.epochs)
        sents, pos = [], start
        for s, pos in self._it:
            sents.append(s)
            if len(sents) == self.pool_size:
                break
        self.position = pos
        if not sents:
            self._pool = []
            return
        sents.sort(key=len)
        batches: list[list[list[str]]] = []
        cur: list[list[str]] = []
        for s in sents:
            longest = len(s) + 1
            if cur and (len(cur) == self.batch_size or (self.batch_tokens is not None and len(cur) >= self.world_size
                                                      and longest * (len(cur) + 1) > self.batch_tokens)):
                batches.append(cur)
                cur = []
            cur.append(s)
        if cur:
            if len(cur) < self.world_size and batches:
                batches[-1].extend(cur)
            else:
                batches.append(cur)
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
