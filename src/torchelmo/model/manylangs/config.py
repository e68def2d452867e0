"""The configuration of an ELMoForManyLangs model, as a torchelmo :class:`~torchelmo.ElmoConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ElmoError
from ..config import MAX_DIM, ElmoConfig
from .vocab import BOS, CHAR_SPECIALS, MIN_CHARS

# torchelmo's option names (in ElmoConfig's messages) -> the model config's keys.
_KEY_NAMES = (("char_cnn.embedding.dim", "token_embedder.char_dim"), ("char_cnn.", "token_embedder."),
              ("lstm.", "encoder."), ("option word_dim", "option token_embedder.word_dim"))


@dataclass
class ManyLangsConfig(ElmoConfig):
    """:class:`~torchelmo.ElmoConfig` of an ELMoForManyLangs model: its own character lexicon
    (``n_characters`` entries) and token width, and a word embedding of ``word_dim`` (0: none)
    over ``n_words`` words, concatenated before the char-CNN features."""

    word_dim: int = 0
    n_words: int = 0

    def validate(self, source: str = "config") -> None:
        # Checked first: the parameter count in ElmoConfig.validate uses them.
        for name in ("word_dim", "n_words"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ElmoError(f"{source}: option {name} must be a non-negative integer, got {v!r}")
        if self.word_dim and not self.n_words:
            raise ElmoError(f"{source}: a word embedding of {self.word_dim} needs a word lexicon, got none")
        super().validate(source)

    def _check_characters(self, source: str) -> None:
        n, C = self.n_characters, self.max_characters_per_token
        if isinstance(n, bool) or not isinstance(n, int) or n < len(CHAR_SPECIALS):
            raise ElmoError(f"{source}: the character lexicon must have at least its {len(CHAR_SPECIALS)} special "
                            f"entries, got {n!r}")
        if isinstance(C, bool) or not isinstance(C, int) or not MIN_CHARS <= C <= MAX_DIM:
            raise ElmoError(f"{source}: option char_cnn.max_characters_per_token must be in {MIN_CHARS}..{MAX_DIM} "
                            f"(ELMoForManyLangs counts <bos> as {len(BOS)} characters and the 2 markers), got {C!r}")

    def num_parameters(self) -> int:
        return super().num_parameters() + self.n_words * self.word_dim + self.word_dim * self.projection_dim


def _section(raw: dict[str, Any], name: str, source: str, keys: Sequence[str]) -> dict[str, Any]:
    d = raw.get(name)
    if not isinstance(d, dict):
        raise ElmoError(f"{source}: missing option {name}" if d is None else f"{source}: option {name} must be an object")
    missing = [k for k in keys if k not in d]
    if missing:
        raise ElmoError(f"{source}: missing option {', '.join(f'{name}.{k}' for k in missing)}")
    return d


def _clip(v: Any) -> Any:
    # Their cell clips only when the value is truthy: 0 (or null) means no clipping.
    return None if v is None or (v == 0 and not isinstance(v, bool)) else v


def model_config(raw: dict[str, Any], source: str, n_characters: int, n_words: int) -> ManyLangsConfig:
    """The :class:`ManyLangsConfig` of a model config (``source`` names it in errors), refusing
    what torchelmo cannot run."""
    enc = _section(raw, "encoder", source, ("name", "projection_dim", "dim", "n_layers", "cell_clip", "proj_clip"))
    tok = _section(raw, "token_embedder", source, ("name", "activation", "filters", "n_highway", "word_dim",
                                                   "char_dim", "max_characters_per_token"))
    if str(enc["name"]).lower() != "elmo":
        raise ElmoError(f"{source}: encoder.name is {enc['name']!r}; torchelmo runs the 'elmo' encoder (the "
                        f"ELMo biLM) only")
    if str(tok["name"]).lower() != "cnn":
        raise ElmoError(f"{source}: token_embedder.name is {tok['name']!r}; torchelmo runs the 'cnn' token "
                        f"embedder (the char-CNN) only")
    if tok["char_dim"] == 0 or tok["char_dim"] is None:
        raise ElmoError(f"{source}: token_embedder.char_dim is {tok['char_dim']!r}: a token embedder without "
                        f"characters, which torchelmo (a char-CNN model) cannot run")
    try:
        return ManyLangsConfig(
            lstm_dim=enc["dim"], projection_dim=enc["projection_dim"], n_layers=enc["n_layers"],
            cell_clip=_clip(enc["cell_clip"]), proj_clip=_clip(enc["proj_clip"]),
            use_skip_connections=True,     # their ElmobiLm adds each layer's input after the first
            char_embed_dim=tok["char_dim"], filters=tok["filters"], n_highway=tok["n_highway"],
            activation=tok["activation"], n_characters=n_characters,
            max_characters_per_token=tok["max_characters_per_token"],
            word_dim=tok["word_dim"], n_words=n_words if tok["word_dim"] else 0)
    except ElmoError as e:
        msg = str(e).split(": ", 1)[-1]
        for ours, theirs in _KEY_NAMES:
            msg = msg.replace(ours, theirs)
        raise ElmoError(f"{source}: {msg}") from None
