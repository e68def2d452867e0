"""Tokens -> ids as ELMoForManyLangs makes them: its special tokens and its batches."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...errors import ElmoError

BOS, EOS, OOV, PAD, BOW, EOW = "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"
CHAR_SPECIALS = (BOS, EOS, OOV, PAD, BOW, EOW)
WORD_SPECIALS = (OOV, PAD)       # <bos>/<eos> fall back to <oov> when a word.dic lacks them
# Their loader reads a line with a single field as U+3000: strip() removed that character (and
# any other whitespace) from its own line, leaving the id alone.
ONE_FIELD_TOKEN = "\u3000"
# <bos> is looked up as a character but counted as 5 characters (+ the two markers) where
# ELMoForManyLangs checks that a batch's tokens fit.
MIN_CHARS = len(BOS) + 2


@dataclass
class ManyLangsVocab:
    """Tokens -> ids as ELMoForManyLangs' ``read_list`` and ``create_one_batch`` make them.

    ``chars``/``words``: the ``char.dic``/``word.dic`` lexicons (``words`` None for a model
    without word embeddings); ``max_chars``: the model's ``max_characters_per_token``.
    """

    chars: dict[str, int]
    words: dict[str, int] | None
    max_chars: int

    def __post_init__(self) -> None:
        c = self.chars
        # create_one_batch reads bow_id from '<eow>' and eow_id from '<bow>', so a token's row
        # starts with <eow>'s id and ends with <bow>'s: the models were trained that way.
        self.first, self.last = c[EOW], c[BOW]
        self.char_oov, self.char_pad = c[OOV], c[PAD]
        self._specials = {t: (self.first, c[t], self.last) for t in (BOS, EOS)}
        if self.words is not None:
            self.word_oov, self.word_pad = self.words[OOV], self.words[PAD]

    def digest(self) -> bytes:
        """SHA-256 of both lexicons: what, beside the weights, makes this model's ids."""
        data = json.dumps([sorted(self.chars.items()), sorted((self.words or {}).items()), self.max_chars])
        return hashlib.sha256(data.encode()).digest()

    def sentence(self, tokens: Sequence[str]) -> list[str]:
        """``[<bos>, t1 .. tn, <eos>]`` with each token cut to ``max_chars - 2`` characters
        (read_list: the cut token is also the one the word lexicon looks up)."""
        keep = self.max_chars - 2
        return [BOS, *(t[:keep] for t in tokens), EOS]

    def char_row(self, token: str) -> list[int]:
        """``max_chars`` ids: [<eow>, characters (unknown: <oov>), <bow>, <pad>...]; <bos> and
        <eos> (wherever they occur, a sentence's own tokens included) are one character each."""
        row = self._specials.get(token)
        if row is None:
            get, oov = self.chars.get, self.char_oov
            row = (self.first, *(get(ch, oov) for ch in token), self.last)
        return [*row, *([self.char_pad] * (self.max_chars - len(row)))]

    def batch(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Sentences already wrapped and cut by :meth:`sentence` -> ``word_ids (B, T)`` (None
        without word embeddings), ``char_ids (B, T, max_chars)``, ``lengths (B,)``; padded with
        the ``<pad>`` ids."""
        if not sentences:
            raise ElmoError("ManyLangsVocab.batch: no sentences")
        T = max(len(s) for s in sentences)
        rows: dict[str, list[int]] = {}

        def row(t: str) -> list[int]:
            r = rows.get(t)
            if r is None:
                r = rows[t] = self.char_row(t)
            return r
        pad_row = [self.char_pad] * self.max_chars
        chars = [[row(t) for t in s] + [pad_row] * (T - len(s)) for s in sentences]
        char_ids = torch.tensor(chars, dtype=torch.long).view(len(sentences), T, self.max_chars)
        lengths = torch.tensor([len(s) for s in sentences], dtype=torch.long)
        if self.words is None:
            return None, char_ids, lengths
        get, oov = self.words.get, self.word_oov
        words = [[get(t, oov) for t in s] + [self.word_pad] * (T - len(s)) for s in sentences]
        return torch.tensor(words, dtype=torch.long), char_ids, lengths
