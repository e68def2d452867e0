"""``allennlp.modules.elmo``'s lower-level modules over a torchelmo :class:`~torchelmo.BiLM`:
``_ElmoCharacterEncoder`` (the char-CNN token embedding), ``_ElmoBiLm`` (all layers, ``<S>`` and
``</S>`` kept) and ``_ElmoLstmState`` (its ``_elmo_lstm``: AllenNLP's view of the carried LSTM state).

Both modules load AllenNLP-keyed state dicts and give them back (:mod:`.state_dict`).
"""

from __future__ import annotations

import contextlib
import types
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...model import weights
from ...model.bilm import BiLM, add_sentence_boundaries
from ...model.config import ElmoConfig
from ...model.encoder import CharCNNEncoder
from ...model.layout import bilm_layout, encoder_layout
from ...model.mix import Elmo as _Elmo
from .state_dict import _BILM_ROOTS, _accept_allennlp_keys, _allennlp_dict, _is_encoder_root, _refresh_caches


class _ElmoCharacterEncoder(nn.Module):
    """``allennlp.modules.elmo._ElmoCharacterEncoder``: the context-free token embedding
    (char-CNN, highway, projection) of a published biLM.

    ``forward(inputs)`` takes char ids ``(B, T, 50)`` and returns ``{"token_embedding":
    (B, T + 2, P), "mask": (B, T + 2)}``, ``<S>`` and ``</S>`` added around each sentence (zeros
    at padded positions). Loads AllenNLP's keys (``_char_embedding_weights``, ``char_conv_i.*``,
    ``_highways._layers.k.*``, ``_projection.*``); ``allennlp_state_dict()`` gives them.
    """

    def __init__(self, options_file: str | None, weight_file: str | None, requires_grad: bool = False,
                 *, module: CharCNNEncoder | None = None) -> None:
        super().__init__()
        if module is None:
            if options_file is None or weight_file is None:
                raise ElmoError("_ElmoCharacterEncoder: options_file and weight_file are required")
            config = ElmoConfig.from_json_file(weights.cached_path(options_file, kind="json"))
            module = CharCNNEncoder(config)
            # The published loader reads what the model it is given has: here no LSTM layers.
            shell = types.SimpleNamespace(config=config, encoder=module, layers=[])
            weights.load_published_weights(shell, weights.cached_path(weight_file, kind="hdf5"))
            module.requires_grad_(requires_grad)
        self.encoder = module
        self.output_dim = module.config.projection_dim
        self.__dict__["_bilm"] = None                    # set when a view of a BiLM's encoder
        self.register_load_state_dict_post_hook(_refresh_caches)

    @classmethod
    def _over(cls, bilm: BiLM) -> _ElmoCharacterEncoder:
        view = cls(None, None, module=bilm.encoder)
        view.__dict__["_bilm"] = bilm
        return view

    def get_output_dim(self) -> int:
        return self.output_dim

    def forward(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg = self.encoder.config
        if inputs.dim() != 3 or inputs.shape[-1] != cfg.max_characters_per_token:
            raise ElmoError(f"_ElmoCharacterEncoder: expected char ids of shape (batch, tokens, "
                            f"{cfg.max_characters_per_token}), got {tuple(inputs.shape)}")
        device = self.encoder.proj.weight.device
        inputs = inputs.to(device)
        lengths = ((inputs > 0).sum(-1) > 0).sum(1)
        ids = add_sentence_boundaries(inputs, lengths)
        mask = torch.arange(ids.shape[1], device=device).unsqueeze(0) < (lengths + 2).unsqueeze(1)
        bilm = self.__dict__["_bilm"]
        with bilm.precision_scope() if bilm is not None else contextlib.nullcontext():
            precision = bilm.resolved_precision().name if bilm is not None else None
            emb = self.encoder(ids, precision=precision).to(self.encoder.proj.weight.dtype)
        return {"token_embedding": emb, "mask": mask}

    def allennlp_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """This module's parameters under AllenNLP's names (see :mod:`.state_dict`)."""
        return _allennlp_dict(encoder_layout(self.encoder))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        _accept_allennlp_keys(self, state_dict, prefix, "", _is_encoder_root, "encoder.",
                              encoder_layout(self.encoder), self.encoder, missing_keys, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


class _ElmoLstmState:
    """``_ElmoBiLm._elmo_lstm``: AllenNLP's ``ElmoLstm`` as far as its carried state goes.

    ``reset_states()`` forgets it; ``_states`` is it in AllenNLP's layout, ``(h, c)`` with ``h``
    ``(num_layers, B, 2P)`` and ``c`` ``(num_layers, B, 2D)``, forward then backward in the last
    dim, or None before the first batch (assigning None resets, a pair sets it).
    """

    def __init__(self, bilm: BiLM) -> None:
        self._bilm = bilm

    num_layers = property(lambda self: self._bilm.config.n_layers)
    input_size = property(lambda self: self._bilm.config.projection_dim)
    hidden_size = property(lambda self: self._bilm.config.projection_dim)
    cell_size = property(lambda self: self._bilm.config.lstm_dim)
    stateful = property(lambda self: self._bilm.stateful)

    def reset_states(self) -> None:
        self._bilm.reset_states()

    @property
    def _states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        state = self._bilm._state
        if state is None:
            return None
        h = torch.stack([torch.cat([h[0], h[1]], -1) for _, h in state])
        c = torch.stack([torch.cat([c[0], c[1]], -1) for c, _ in state])
        return h, c

    @_states.setter
    def _states(self, value: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        if value is None:
            self._bilm.reset_states()
            return
        h, c = value
        L, P, D = self.num_layers, self.hidden_size, self.cell_size
        if h.dim() != 3 or c.dim() != 3 or h.shape[0] != L or c.shape[0] != L or h.shape[1] != c.shape[1] \
                or h.shape[2] != 2 * P or c.shape[2] != 2 * D:
            raise ElmoError(f"_states: expected (h (L, B, 2P), c (L, B, 2D)) with L={L}, P={P}, D={D}, "
                            f"got {tuple(h.shape)} and {tuple(c.shape)}")
        self._bilm._state = [(torch.stack(c[k].detach().split(D, -1)), torch.stack(h[k].detach().split(P, -1)))
                             for k in range(L)]


def _lookup_char_ids(holder, inputs, word_inputs: torch.Tensor | None) -> torch.Tensor:
    """Char ids from char ids or cached word ids: the drop-in Elmo's rules (those of
    :meth:`torchelmo.Elmo.forward`), on any ``holder`` with ``bilm`` and ``_vocab_char_ids``."""
    return _Elmo._char_ids(holder, inputs, word_inputs)


class _ElmoBiLm(nn.Module):
    """``allennlp.modules.elmo._ElmoBiLm``: a published biLM's layers, sentence boundaries kept.

    ``forward(inputs, word_inputs=None)`` returns ``{"activations": [(B, T + 2, 2P)] * num_layers,
    "mask": (B, T + 2)}``: E0 (the token embedding, duplicated ``[e; e]``) then each LSTM layer,
    ``<S>`` and ``</S>`` in. ``num_layers``: n_layers + 1. ``_token_embedder`` is its
    :class:`_ElmoCharacterEncoder`, ``_elmo_lstm`` its LSTM's carried state
    (:class:`_ElmoLstmState`: ``reset_states()``, ``_states``); ``bilm`` the torchelmo
    :class:`~torchelmo.BiLM` that runs it all. Carries the state like AllenNLP's (``stateful``).
    """

    def __init__(self, options_file: str | None, weight_file: str | None, requires_grad: bool = False,
                 vocab_to_cache: Sequence[str] | None = None, *, module: BiLM | None = None,
                 stateful: bool = True) -> None:
        super().__init__()
        if module is None:
            if options_file is None or weight_file is None:
                raise ElmoError("_ElmoBiLm: options_file and weight_file are required")
            module = BiLM.from_published(options_file, weight_file, stateful=stateful)
            module.requires_grad_(requires_grad)
        self.bilm = module
        self.register_buffer("_vocab_char_ids", None, persistent=False)   # (V, 50): follows .to()
        self.__dict__["_owner"] = None                  # the drop-in Elmo this is a view of
        self.register_load_state_dict_post_hook(_refresh_caches)
        if vocab_to_cache:
            self.create_cached_cnn_embeddings(vocab_to_cache)

    @classmethod
    def _over(cls, owner: _Elmo) -> _ElmoBiLm:
        view = cls(None, None, module=owner.bilm)
        view.__dict__["_owner"] = owner
        return view

    def _holder(self):
        return self.__dict__["_owner"] or self

    @property
    def num_layers(self) -> int:
        return self.bilm.num_layers

    @property
    def _token_embedder(self) -> _ElmoCharacterEncoder:
        view = self.__dict__.get("_token_embedder_view")
        if view is None or view.encoder is not self.bilm.encoder:
            view = self.__dict__["_token_embedder_view"] = _ElmoCharacterEncoder._over(self.bilm)
        return view

    @property
    def _elmo_lstm(self) -> _ElmoLstmState:
        return _ElmoLstmState(self.bilm)

    def get_output_dim(self) -> int:
        return self.bilm.output_dim

    def create_cached_cnn_embeddings(self, tokens: Sequence[str]) -> None:
        """Word ids index ``tokens`` from now on (0: padding); their token embeddings are precomputed."""
        _Elmo.cache_vocab(self._holder(), tokens)

    def forward(self, inputs: torch.Tensor | None, word_inputs: torch.Tensor | None = None) -> dict:
        char_ids = _lookup_char_ids(self._holder(), inputs, word_inputs)
        if char_ids.dim() != 3:
            raise ElmoError(f"_ElmoBiLm: char ids must be (batch, tokens, 50), got {tuple(char_ids.shape)}")
        out = self.bilm(char_ids, keep_sentence_boundaries=True)
        return {"activations": out.layers, "mask": out.mask}

    def allennlp_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """This module's parameters under AllenNLP's names (see :mod:`.state_dict`)."""
        return _allennlp_dict(bilm_layout(self.bilm))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        _accept_allennlp_keys(self, state_dict, prefix, "", _BILM_ROOTS.__contains__, "bilm.",
                              bilm_layout(self.bilm), self.bilm, missing_keys, error_msgs,
                              drop=("_word_embedding.weight",))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
