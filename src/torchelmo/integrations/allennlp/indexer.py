"""``allennlp.data.token_indexers.elmo_indexer``: ``ELMoCharacterMapper`` (a token -> its 50
character ids) and ``ELMoTokenCharactersIndexer``, without AllenNLP's data classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...errors import ElmoError
from ...model.chars import (
    BOS_CHAR,
    BOS_IDS,
    BOS_TOKEN,
    BOW_CHAR,
    EOS_CHAR,
    EOS_IDS,
    EOS_TOKEN,
    EOW_CHAR,
    MAX_CHARS,
    PAD_CHAR,
    word_to_char_ids,
)


class ELMoCharacterMapper:
    """``ELMoCharacterMapper``: a token -> its 50 character ids (shifted by +1, 0 being padding),
    by :func:`torchelmo.word_to_char_ids`. The class attributes are AllenNLP's (unshifted ids).

    ``tokens_to_add``: special tokens and the character id (0-260, unshifted) each stands for.
    One difference: a lone surrogate in a word is encoded (``surrogatepass``, as everywhere in
    torchelmo) where AllenNLP drops it.
    """

    max_word_length = MAX_CHARS
    beginning_of_sentence_character = BOS_CHAR
    end_of_sentence_character = EOS_CHAR
    beginning_of_word_character = BOW_CHAR
    end_of_word_character = EOW_CHAR
    padding_character = PAD_CHAR
    beginning_of_sentence_characters = [c - 1 for c in BOS_IDS]
    end_of_sentence_characters = [c - 1 for c in EOS_IDS]
    bos_token = BOS_TOKEN
    eos_token = EOS_TOKEN

    def __init__(self, tokens_to_add: dict[str, int] | None = None) -> None:
        self.tokens_to_add = dict(tokens_to_add or {})
        for word, cid in self.tokens_to_add.items():
            if isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid <= PAD_CHAR:
                raise ElmoError(f"ELMoCharacterMapper: tokens_to_add[{word!r}] must be a character id "
                                f"in 0..{PAD_CHAR}, got {cid!r}")

    def convert_word_to_char_ids(self, word: str) -> list[int]:
        if word in self.tokens_to_add:
            ids = [PAD_CHAR] * MAX_CHARS
            ids[:3] = [BOW_CHAR, self.tokens_to_add[word], EOW_CHAR]
            return [c + 1 for c in ids]
        return list(word_to_char_ids(word))

    def __eq__(self, other) -> bool:
        if isinstance(other, ELMoCharacterMapper):
            return self.tokens_to_add == other.tokens_to_add
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _token_text(token) -> str:
    text = token if isinstance(token, str) else getattr(token, "text", None)
    if not isinstance(text, str):
        raise ElmoError(f"ELMoTokenCharactersIndexer: a token must be a str or have a .text str, got {token!r}")
    return text


class ELMoTokenCharactersIndexer:
    """``ELMoTokenCharactersIndexer`` (the ``"elmo_characters"`` indexer), without AllenNLP's
    data classes: tokens are ``str`` (or anything with a ``.text``), ``vocabulary`` is unused.

    ``tokens_to_indices(tokens)["elmo_tokens"]`` is the ``(num_tokens, 50)`` list of char id rows,
    ``batch_to_ids([tokens])[0]``; ``as_padded_tensor_dict`` pads it with all-zero rows.
    """

    def __init__(self, namespace: str = "elmo_characters", tokens_to_add: dict[str, int] | None = None,
                 token_min_padding_length: int = 0) -> None:
        self._namespace = namespace
        self._mapper = ELMoCharacterMapper(tokens_to_add)
        self._token_min_padding_length = token_min_padding_length

    def count_vocab_items(self, token, counter) -> None:
        pass

    def get_empty_token_list(self) -> dict[str, list]:
        return {"elmo_tokens": []}

    def tokens_to_indices(self, tokens: Iterable, vocabulary: Any = None) -> dict[str, list[list[int]]]:
        return {"elmo_tokens": [self._mapper.convert_word_to_char_ids(_token_text(t)) for t in tokens]}

    def get_padding_lengths(self, indexed_tokens: dict[str, list]) -> dict[str, int]:
        return {"elmo_tokens": max(len(indexed_tokens["elmo_tokens"]), self._token_min_padding_length)}

    def as_padded_tensor_dict(self, tokens: dict[str, list], padding_lengths: dict[str, int]
                              ) -> dict[str, torch.Tensor]:
        rows = list(tokens["elmo_tokens"])[:padding_lengths["elmo_tokens"]]
        rows += [[0] * MAX_CHARS] * (padding_lengths["elmo_tokens"] - len(rows))
        return {"elmo_tokens": torch.tensor(rows, dtype=torch.long).reshape(-1, MAX_CHARS)}
