"""An ELMoForManyLangs model as a torchelmo :class:`~torchelmo.BiLM`: its token encoder, torchelmo's
LSTM stacks, its weights mapped through AllenNLP's conversions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...model.bilm import BiLM, BiLMOutput
from ...model.encoder import CharCNNEncoder
from ..allennlp.state_dict import _encoder_layout, _Entry, _lstm_entries, _same
from .config import ManyLangsConfig, _section, model_config
from .files import (
    BUNDLED_CONFIGS,
    CHAR_DIC,
    CONFIG_NAME,
    ENCODER_PKL,
    TOKEN_EMBEDDER_PKL,
    WORD_DIC,
    _read_json,
    load_state_dict,
    read_lexicon,
    resolve_config_path,
)
from .vocab import CHAR_SPECIALS, WORD_SPECIALS, ManyLangsVocab


class ManyLangsTokenEncoder(CharCNNEncoder):
    """ELMoForManyLangs' token embedder: ``projection([word embedding; char-CNN + highway])``.

    The char-CNN and highways are :class:`~torchelmo.model.encoder.CharCNNEncoder`'s (theirs are
    AllenNLP's: max over positions, then the activation; relu in the highways whatever
    ``activation`` says); ``proj`` takes ``word_dim + n_filters`` inputs, the word embedding first.
    """

    def __init__(self, config: ManyLangsConfig, pad_id: int) -> None:
        super().__init__(config)
        self.pad_id = pad_id     # their <pad>: what fills a token's row after its characters
        self.word_embed = nn.Embedding(config.n_words, config.word_dim) if config.word_dim else None
        self.proj = nn.Linear(config.word_dim + config.n_filters, config.projection_dim)

    def char_features(self, ids: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` char ids -> ``(N, n_filters)``: char-CNN, activation, highways (no projection)."""
        h = self._act(self._conv_max(ids))
        for hw in self.highways:
            h = hw(h)
        return h

    def forward(self, word_ids: torch.Tensor | None, char_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """``word_ids (B, T)`` (None without a word embedding), ``char_ids (B, T, C)`` -> ``(B, T, P)``.

        Every position is encoded, padding included (the caller masks); a batch's distinct
        character rows go through the char-CNN once each."""
        B, T, C = char_ids.shape
        uniq, inverse = torch.unique(char_ids.reshape(-1, C), dim=0, return_inverse=True)
        feats = self.char_features(uniq)[inverse].view(B, T, -1)
        if self.word_embed is not None:
            feats = torch.cat([self.word_embed(word_ids), feats], dim=-1)
        return self.proj(feats)


def _token_key(allen_key: str) -> str:
    """AllenNLP's char-CNN key (``_encoder_layout``) -> ELMoForManyLangs' ``ConvTokenEmbedder`` key."""
    if allen_key == "_char_embedding_weights":
        return "char_emb_layer.embedding.weight"
    if allen_key.startswith("char_conv_"):
        i, part = allen_key[len("char_conv_"):].split(".", 1)
        return f"convolutions.{i}.{part}"
    return allen_key[1:]    # _highways._layers.k.*, _projection.*: the same names without the '_'


def _unsupported(name: str):
    def method(*args, **kw):
        raise ElmoError(f"ManyLangsBiLM.{name}: not available for an ELMoForManyLangs model (its own lexicons "
                        f"and word embedding have no place in torchelmo's formats); load one with "
                        f"ManyLangsBiLM.from_dir")
    return method


class ManyLangsBiLM(BiLM):
    """An ELMoForManyLangs model as a :class:`~torchelmo.BiLM`: its token encoder
    (:class:`ManyLangsTokenEncoder`), torchelmo's LSTM stacks, and its lexicons (``vocab``).

    ``stateful`` defaults to True, as their ``ElmobiLm``: row r of a batch starts from the state
    row r of the previous batch ended with; :meth:`reset_states` forgets it.
    """

    def __init__(self, config: ManyLangsConfig, vocab: ManyLangsVocab, stateful: bool = True, **kw) -> None:
        super().__init__(config, stateful=stateful, **kw)
        # BiLM built a CharCNNEncoder: ours replaces it (the same char-CNN, a wider projection).
        self.encoder = ManyLangsTokenEncoder(config, vocab.char_pad)
        self.vocab = vocab

    @classmethod
    def from_dir(cls, model_dir: str | Path, **kw) -> ManyLangsBiLM:
        """Load an ELMoForManyLangs model directory; ``kw``: :class:`~torchelmo.BiLM`'s options
        (``stateful``, ``precision``, ``backend``). Nothing pickled is run."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ElmoError(f"{model_dir}: not a directory (an ELMoForManyLangs model directory holds "
                            f"{CONFIG_NAME}, {CHAR_DIC}, {WORD_DIC}, {TOKEN_EMBEDDER_PKL} and {ENCODER_PKL})")
        top = model_dir / CONFIG_NAME
        config_path = _read_json(top).get("config_path")
        if not isinstance(config_path, str):
            raise ElmoError(f"{top}: config_path must name the model config, got {config_path!r}")
        where = resolve_config_path(model_dir, config_path)
        raw = BUNDLED_CONFIGS[where] if isinstance(where, str) else _read_json(where)
        source = f"{where} (elmoformanylangs' own config)" if isinstance(where, str) else str(where)
        tok = _section(raw, "token_embedder", source, ("word_dim", "max_characters_per_token"))
        chars = read_lexicon(model_dir / CHAR_DIC, CHAR_SPECIALS)
        words = read_lexicon(model_dir / WORD_DIC, WORD_SPECIALS) if tok["word_dim"] else None
        config = model_config(raw, source, len(chars), len(words) if words else 0)
        # Both files are read before the model is allocated.
        states = {name: load_state_dict(model_dir / name) for name in (TOKEN_EMBEDDER_PKL, ENCODER_PKL)}
        model = cls(config, ManyLangsVocab(chars, words, config.max_characters_per_token), **kw)
        model.load_manylangs_state(states[TOKEN_EMBEDDER_PKL], states[ENCODER_PKL],
                                   sources=(model_dir / TOKEN_EMBEDDER_PKL, model_dir / ENCODER_PKL))
        return model.eval()

    def manylangs_layout(self) -> tuple[list[_Entry], list[_Entry]]:
        """The entries of their ``token_embedder.pkl`` and ``encoder.pkl`` (their keys, their
        shapes): AllenNLP's conversions (:mod:`torchelmo.integrations.allennlp.state_dict`) under their names."""
        token = [e._replace(key=_token_key(e.key)) for e in _encoder_layout(self.encoder, "", "encoder.")]
        if self.encoder.word_embed is not None:
            token.insert(0, _same("word_emb_layer.embedding.weight", self.encoder.word_embed.weight,
                                  "encoder.word_embed.weight"))
        encoder = [e._replace(key=e.key.removeprefix("_elmo_lstm."))
                   for l, layer in enumerate(self.layers) for d in range(2) for e in _lstm_entries(layer, l, d)]
        return token, encoder

    @torch.no_grad()
    def load_manylangs_state(self, token_embedder: dict[str, Any], encoder: dict[str, Any],
                             sources: tuple[str | Path, str | Path] = (TOKEN_EMBEDDER_PKL, ENCODER_PKL)) -> None:
        """Load their two state dicts (``sources`` name them in errors); as strict as their
        ``load_state_dict``: every key, no other, the shapes the config and lexicons give."""
        work = {name: t.detach().clone() for name, t in self.state_dict().items()}
        for state, entries, source in zip((token_embedder, encoder), self.manylangs_layout(), sources):
            unexpected = sorted(set(state) - {e.key for e in entries}, key=str)
            if unexpected:
                more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
                raise ElmoError(f"{source}: unexpected parameter {unexpected[0]!r}{more} for this model config")
            for e in entries:
                t = state.get(e.key)
                if t is None:
                    raise ElmoError(f"{source}: missing parameter {e.key!r}")
                if not torch.is_tensor(t) or not t.is_floating_point():
                    kind = f"a tensor of dtype {t.dtype}" if torch.is_tensor(t) else f"a {type(t).__name__}"
                    raise ElmoError(f"{source}: parameter {e.key!r} is {kind}, not floating point")
                if tuple(t.shape) != e.shape:
                    raise ElmoError(f"{source}: parameter {e.key!r} has shape {tuple(t.shape)}; the model config "
                                    f"and lexicons give {e.shape}")
                e.put(work, t)
        self.load_state_dict(work)
        self.reset_states()

    def forward(self, word_ids: torch.Tensor | None, char_ids: torch.Tensor,  # type: ignore[override]
                lengths: torch.Tensor) -> BiLMOutput:
        """Parameters: ``word_ids (B, T)`` (None for a model without word embeddings), ``char_ids
        (B, T, C)`` and ``lengths (B,)`` from :meth:`ManyLangsVocab.batch`, ``<bos>``/``<eos>``
        included (they are tokens of its lexicons here).

        Returns :class:`~torchelmo.BiLMOutput`: layers ``(B, T, 2P)``, ``[e; e]`` then
        ``[fwd_k; bwd_k]``, zeros past each row's length, and the mask.
        """
        C = self.config.max_characters_per_token
        if char_ids.dim() != 3 or char_ids.shape[-1] != C or char_ids.shape[0] == 0:
            raise ElmoError(f"ManyLangsBiLM: expected char ids of shape (batch, tokens, {C}), got "
                            f"{tuple(char_ids.shape)}")
        _check_ids(char_ids, self.config.n_characters, "char")
        if (word_ids is None) != (self.encoder.word_embed is None):
            raise ElmoError("ManyLangsBiLM: word ids are " + ("missing" if word_ids is None else "given") +
                            " for a model " + ("with" if word_ids is None else "without") + " word embeddings")
        if word_ids is not None:
            if word_ids.shape != char_ids.shape[:2]:
                raise ElmoError(f"ManyLangsBiLM: word ids {tuple(word_ids.shape)} and char ids "
                                f"{tuple(char_ids.shape)} disagree")
            _check_ids(word_ids, self.config.n_words, "word")
            word_ids = word_ids.to(self.device)
        device = self.device
        char_ids, lengths = char_ids.to(device), lengths.to(device)
        mask = torch.arange(char_ids.shape[1], device=device).unsqueeze(0) < lengths.unsqueeze(1)
        with self.precision_scope():
            e = self.encoder(word_ids, char_ids).to(self.encoder.proj.weight.dtype)
            layers = self.contextualise(e, lengths)
        m = mask.unsqueeze(-1).to(e.dtype)
        return BiLMOutput([layer * m for layer in layers], mask)

    embed_sentences = _unsupported("embed_sentences")
    run_tokens = _unsupported("run_tokens")
    cache_token_embeddings = _unsupported("cache_token_embeddings")
    save_pretrained = _unsupported("save_pretrained")
    export_published = _unsupported("export_published")
    from_published = classmethod(_unsupported("from_published"))
    from_pretrained = classmethod(_unsupported("from_pretrained"))


def _check_ids(ids: torch.Tensor, n: int, what: str) -> None:
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ElmoError(f"ManyLangsBiLM: {what} ids must be integers, got dtype {ids.dtype}")
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < n):
        raise ElmoError(f"ManyLangsBiLM: {what} ids must be in 0..{n - 1}, got values in "
                        f"{int(ids.min())}..{int(ids.max())}")
