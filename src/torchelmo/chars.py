"""Token -> character ids, in the published mapping.

Ids 0-255 are a token's UTF-8 bytes, then the specials below. At inference every id is shifted
by +1 so that 0 can mark a padded token position; everything in this module returns the shifted
ids (the only ones the model sees). A token is ``[BOW, bytes[:48]..., EOW, PAD, PAD, ...]``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from .errors import ElmoError

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


def batch_to_ids(sentences: Sequence[Sequence[str]]) -> torch.Tensor:
    """Character ids of a batch of tokenised sentences.

    Parameters
    ----------
    sentences : list of B sentences, each a list of tokens (``str``).

    Returns
    -------
    LongTensor of shape ``(B, T, 50)``, T the longest sentence; padded positions are all 0.
    """
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ElmoError("batch_to_ids: expected a list of sentences (lists of tokens)")
    if len(sentences) == 0:
        raise ElmoError("batch_to_ids: empty batch (no sentences)")
    lengths = []
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise ElmoError(f"batch_to_ids: sentence {i} is a str, expected a list of tokens "
                            "(split it first, e.g. line.split())")
        lengths.append(len(s))
    T = max(lengths)
    out = np.zeros((len(sentences), T, MAX_CHARS), np.int64)
    if T:
        try:
            ids = [word_to_char_ids(t) for s in sentences for t in s]
        except (TypeError, AttributeError):  # a token that is not a str (lru_cache may raise either)
            _raise_bad_token(sentences)
            raise
        # One scatter of all tokens' rows: no per-sentence tensor construction.
        rows = np.repeat(np.arange(len(sentences)), lengths)
        cols = np.concatenate([np.arange(n) for n in lengths])
        out[rows, cols] = ids
    return torch.from_numpy(out)


def _raise_bad_token(sentences: Sequence[Sequence[str]]) -> None:
    for i, s in enumerate(sentences):
        for j, tok in enumerate(s):
            if not isinstance(tok, str):
                raise ElmoError(f"batch_to_ids: sentence {i} token {j} is "
                                f"{type(tok).__name__}, expected str")
