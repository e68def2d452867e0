"""An ELMoForManyLangs model as a torchelmo :class:`~torchelmo.BiLM`: its token encoder, torchelmo's
LSTM stacks, its weights mapped through AllenNLP's conversions."""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...io.fileio import atomic_path, write_error
from .. import folders
from ..bilm import BiLM, BiLMOutput
from ..encoder import CharCNNEncoder
from ..layout import Entry, encoder_layout, lstm_entries, same
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
    """AllenNLP's char-CNN key (``encoder_layout``) -> ELMoForManyLangs' ``ConvTokenEmbedder`` key."""
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

    takes_char_ids = False

    def __init__(self, config: ManyLangsConfig, vocab: ManyLangsVocab, stateful: bool = True,
                 files: tuple[dict[str, Any], str, dict[str, Any]] | None = None, **kw) -> None:
        super().__init__(config, stateful=stateful, **kw)
        # BiLM built a CharCNNEncoder: ours replaces it (the same char-CNN, a wider projection).
        self.encoder = ManyLangsTokenEncoder(config, vocab.char_pad)
        self.vocab = vocab
        # Their config.json, the name of the model config it points to, and that model config:
        # what save_pretrained writes back.
        self.files = files

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
        files = (_read_json(top), where if isinstance(where, str) else where.name, raw)
        model = cls(config, ManyLangsVocab(chars, words, config.max_characters_per_token), files=files, **kw)
        model.load_manylangs_state(states[TOKEN_EMBEDDER_PKL], states[ENCODER_PKL],
                                   sources=(model_dir / TOKEN_EMBEDDER_PKL, model_dir / ENCODER_PKL))
        return model.eval()

    def description(self) -> dict[str, Any]:
        """Everything but the weights, as plain data (their config files and both lexicons): what
        :meth:`from_description` rebuilds the model from, e.g. inside a saved flair model whose
        state dict holds the weights."""
        if self.files is None:
            raise ElmoError("ManyLangsBiLM.description: this model was not read from a directory, so "
                            "its model config is unknown; load one with ManyLangsBiLM.from_dir")
        top, config_name, raw = self.files
        return {"format": "elmoformanylangs", "config": top, "config_name": config_name, "model_config": raw,
                "chars": dict(self.vocab.chars), "words": None if self.vocab.words is None else dict(self.vocab.words)}

    @classmethod
    def from_description(cls, d: dict[str, Any], source: str = "description", **kw) -> ManyLangsBiLM:
        """A model of :meth:`description`'s shapes and lexicons, its weights as initialised (load
        them from a state dict); ``kw``: :class:`~torchelmo.BiLM`'s options."""
        if not isinstance(d, dict) or d.get("format") != "elmoformanylangs":
            raise ElmoError(f"{source}: not the description of an ELMoForManyLangs model")
        try:
            raw, chars, words = d["model_config"], d["chars"], d["words"]
            config = model_config(raw, source, len(chars), len(words) if words else 0)
            vocab = ManyLangsVocab(dict(chars), None if words is None else dict(words), config.max_characters_per_token)
            return cls(config, vocab, files=(d["config"], d["config_name"], raw), **kw)
        except (KeyError, TypeError, ValueError) as e:
            raise ElmoError(f"{source}: a damaged ELMoForManyLangs description ({type(e).__name__}: {e})") from None

    def manylangs_layout(self) -> tuple[list[Entry], list[Entry]]:
        """The entries of their ``token_embedder.pkl`` and ``encoder.pkl`` (their keys, their
        shapes): AllenNLP's conversions (:mod:`torchelmo.model.layout`) under their names."""
        token = [e._replace(key=_token_key(e.key)) for e in encoder_layout(self.encoder, "", "encoder.")]
        if self.encoder.word_embed is not None:
            token.insert(0, same("word_emb_layer.embedding.weight", self.encoder.word_embed.weight,
                                  "encoder.word_embed.weight"))
        encoder = [e._replace(key=e.key.removeprefix("_elmo_lstm."))
                   for l, layer in enumerate(self.layers) for d in range(2) for e in lstm_entries(layer, l, d)]
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

    def embed_sentences(self, sentences: list[list[str]], keep_sentence_boundaries: bool = False) -> BiLMOutput:
        """Tokens in, layers out, as :meth:`BiLM.embed_sentences <torchelmo.BiLM.embed_sentences>`:
        ``(B, T, 2P)`` each (``T + 2`` with ``<bos>``/``<eos>`` kept), zeros past each row, and
        the mask; the ids come from this model's lexicons."""
        if not sentences:
            raise ElmoError("ManyLangsBiLM: empty batch (no sentences)")
        out = self(*self.vocab.batch([self.vocab.sentence(s) for s in sentences]))
        if keep_sentence_boundaries:
            return out
        lengths = torch.tensor([len(s) for s in sentences], device=out.mask.device)
        T = int(lengths.max())
        mask = torch.arange(T, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
        m = mask.unsqueeze(-1).to(out.layers[0].dtype)
        return BiLMOutput([layer[:, 1:T + 1] * m for layer in out.layers], mask)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kw) -> ManyLangsBiLM:  # type: ignore[override]
        """:meth:`from_dir`: this class reads only ELMoForManyLangs directories."""
        return cls.from_dir(name_or_path, **kw)

    def save_pretrained(self, out_dir: str | Path, **_) -> Path:  # type: ignore[override]
        """Write the model as an ELMoForManyLangs directory (the layout it came in, which their
        ``Embedder`` and :meth:`from_dir` read): ``config.json``, the model config it names,
        both lexicons and both ``.pkl`` state dicts (tensors only)."""
        if self.files is None:
            raise ElmoError("ManyLangsBiLM.save_pretrained: this model was not read from a directory, so "
                            "its model config is unknown; load one with ManyLangsBiLM.from_dir")
        top, config_name, raw = self.files
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(out, e) from None
        token, encoder = self.manylangs_layout()
        with torch.no_grad():
            for name, entries in ((TOKEN_EMBEDDER_PKL, token), (ENCODER_PKL, encoder)):
                data = io.BytesIO()   # serialised in memory: a full disk fails one Python write
                torch.save(OrderedDict((e.key, e.get().cpu()) for e in entries), data)
                with atomic_path(out / name) as tmp:
                    tmp.write_bytes(data.getvalue())
        lexicons = [(CHAR_DIC, self.vocab.chars)] + ([(WORD_DIC, self.vocab.words)] if self.vocab.words else [])
        for name, lexicon in lexicons:
            with atomic_path(out / name) as tmp:
                tmp.write_text("".join(f"{token}\t{i}\n" for token, i in lexicon.items()), encoding="utf-8")
        for name, data in ((config_name, raw), (CONFIG_NAME, {**top, "config_path": config_name})):
            with atomic_path(out / name) as tmp:
                tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return out

    run_tokens = _unsupported("run_tokens")
    cache_token_embeddings = _unsupported("cache_token_embeddings")
    export_published = _unsupported("export_published")
    from_published = classmethod(_unsupported("from_published"))


def _is_manylangs(path: Path) -> bool:
    return all((path / name).exists() for name in (TOKEN_EMBEDDER_PKL, ENCODER_PKL))


def _load(cls: type[BiLM], path: Path, **kw) -> BiLM:
    """Through ``BiLM.from_pretrained``: stateless unless ``stateful`` is given, as every model
    there (their ``Embedder`` carries the state: :mod:`torchelmo.integrations.manylangs`)."""
    if not issubclass(ManyLangsBiLM, cls):
        raise ElmoError(f"{path}: an ELMoForManyLangs model, which {cls.__name__} cannot hold")
    kw.setdefault("stateful", False)
    return ManyLangsBiLM.from_dir(path, **kw)


# Before the native layout: both have a config.json.
folders.register(folders.Layout(
    "ELMoForManyLangs", f"{CONFIG_NAME} + {CHAR_DIC} + {TOKEN_EMBEDDER_PKL} + {ENCODER_PKL}", order=0,
    matches=_is_manylangs, load=_load))


def _check_ids(ids: torch.Tensor, n: int, what: str) -> None:
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ElmoError(f"ManyLangsBiLM: {what} ids must be integers, got dtype {ids.dtype}")
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < n):
        raise ElmoError(f"ManyLangsBiLM: {what} ids must be in 0..{n - 1}, got values in "
                        f"{int(ids.min())}..{int(ids.max())}")
