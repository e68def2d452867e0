"""Token -> character ids, in the published mapping.

Ids 0-255 are a token's UTF-8 bytes, then the specials below. At inference every id is shifted
by +1 so that 0 can mark a padded token position; everything in this module returns the shifted
ids (the only ones the model sees). A token is ``[BOW, bytes[:48]..., EOW, PAD, PAD, ...]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

import numpy as np
import torch

from ..errors import ElmoError

MAX_CHARS = 50  # characters per token, markers included
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
BOS_TOKEN, EOS_TOKEN = "<S>", "</S>"


def _token(chars: list[int]) -> tuple[int, ...]:
    ids = [BOW_CHAR, *chars[: MAX_CHARS - 2], EOW_CHAR]
    ids += [PAD_CHAR] * (MAX_CHARS - len(ids))
    return tuple(i + 1 for i in ids)


BOS_IDS = _token([BOS_CHAR])
EOS_IDS = _token([EOS_CHAR])


@lru_cache(maxsize=2**17)
def word_to_char_ids(word: str) -> tuple[int, ...]:
    """The 50 shifted character ids of one token.

    Any ``str`` works: lone surrogates (which cannot be UTF-8) are encoded with
    ``surrogatepass``, i.e. as the three bytes their code point would take; truncation to
    48 bytes may split a multi-byte character, as in the original.
    """
    if word == BOS_TOKEN:
        return BOS_IDS
    if word == EOS_TOKEN:
        return EOS_IDS
    return _token(list(word.encode("utf-8", errors="surrogatepass")))


def sentence_lengths(sentences: Sequence[Sequence[str]], who: str, allow_empty: bool = False) -> list[int]:
    """The lengths of a batch of tokenised sentences; anything else (a string, ``None``, a batch
    holding one) is an :class:`ElmoError` naming ``who`` and the sentence. The tokens themselves
    are checked where they are read."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise ElmoError(f"{who}: expected a list of sentences (lists of tokens), got {type(sentences).__name__}")
    if len(sentences) == 0 and not allow_empty:
        raise ElmoError(f"{who}: empty batch (no sentences)")
    lengths = []
    for i, s in enumerate(sentences):
        if isinstance(s, (str, bytes)):
            raise ElmoError(f"{who}: sentence {i} is a {type(s).__name__}, expected a list of tokens "
                            "(split it first, e.g. line.split())")
        try:
            lengths.append(len(s))
        except TypeError:
            raise ElmoError(f"{who}: sentence {i} is {type(s).__name__}, expected a list of tokens") from None
    return lengths


def batch_to_ids(sentences: Sequence[Sequence[str]]) -> torch.Tensor:
    """Character ids of a batch of tokenised sentences.

    Parameters
    ----------
    sentences : list of B sentences, each a list of tokens (``str``).

    Returns
    -------
    LongTensor of shape ``(B, T, 50)``, T the longest sentence; padded positions are all 0.
    """
    lengths = sentence_lengths(sentences, "batch_to_ids")
    T = max(lengths)
    out = np.zeros((len(sentences), T, MAX_CHARS), np.int64)
    if T:
        tokens = list(chain.from_iterable(sentences))
        try:
            joined = "\n".join(tokens)
        except TypeError:
            _raise_bad_token(sentences)
            raise
        if joined.count("\n") == len(tokens) - 1:
            ids = _ids_of_joined(joined.encode("utf-8", errors="surrogatepass"), len(tokens))
        else:   # a token holding a newline: the separator is ambiguous, go token by token
            ids = np.array([word_to_char_ids(t) for t in tokens], np.int16)
        # One scatter of all tokens' rows: no per-sentence tensor construction.
        rows = np.repeat(np.arange(len(sentences)), lengths)
        cols = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = ids
    return torch.from_numpy(out)


_SPECIALS = ((BOS_TOKEN.encode(), BOS_IDS), (EOS_TOKEN.encode(), EOS_IDS))


def _ids_of_joined(data: bytes, n: int) -> np.ndarray:
    """``(n, 50)`` shifted ids of n tokens given as one newline-joined UTF-8 buffer: the same
    rows as :func:`word_to_char_ids`, with no per-token Python (newlines never occur inside a
    UTF-8 multi-byte character, so they delimit the tokens' bytes)."""
    m = len(data)
    buf = np.frombuffer(data + bytes(MAX_CHARS), np.uint8)     # zeros after: reads past a token's end stay inside
    ends = np.append(np.flatnonzero(buf[:m] == 10), m)
    starts = np.concatenate([[0], ends[:-1] + 1])
    size = np.minimum(ends - starts, MAX_CHARS - 2)            # bytes kept: at most 48
    k = np.arange(MAX_CHARS - 2)
    inside = k < size[:, None]
    chars = buf[starts[:, None] + k]
    ids = np.full((n, MAX_CHARS), PAD_CHAR + 1, np.int16)      # int16 until the final scatter
    ids[:, 0] = BOW_CHAR + 1
    ids[:, 1:MAX_CHARS - 1] = np.where(inside, chars.astype(np.int16) + 1, np.int16(PAD_CHAR + 1))
    ids[np.arange(n), size + 1] = EOW_CHAR + 1
    for raw, special in _SPECIALS:   # a literal marker is the marker, as in the originals
        L = len(raw)
        hit = (ends - starts) == L
        for j, byte in enumerate(raw):
            hit &= buf[starts + j] == byte
        ids[hit] = special
    return ids


def _raise_bad_token(sentences: Sequence[Sequence[str]]) -> None:
    for i, s in enumerate(sentences):
        for j, tok in enumerate(s):
            if not isinstance(tok, str):
                raise ElmoError(f"batch_to_ids: sentence {i} token {j} is "
                                f"{type(tok).__name__}, expected str")
