"""``allennlp.modules.elmo.Elmo`` and ``allennlp.modules.token_embedders.ElmoTokenEmbedder``: a
published biLM and learned scalar mixes of its layers (AllenNLP's attributes, arguments and
state dict keys), built on :class:`torchelmo.Elmo`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...model.bilm import BiLM
from ...model.layout import bilm_layout
from ...model.mix import Elmo as _Elmo
from .embedder import DEFAULT_MODEL
from .mix import ScalarMix
from .modules import _ElmoBiLm
from .state_dict import _BILM_ROOTS, _accept_allennlp_keys, _allennlp_dict, _refresh_caches


class Elmo(_Elmo):
    """``allennlp.modules.elmo.Elmo``: a published biLM (``options_file`` + ``weight_file``, paths or
    URLs) and ``num_output_representations`` learned scalar mixes of its layers.

    ``forward(inputs, word_inputs=None)`` returns ``{"elmo_representations": [(B, T, 2P)] * N,
    "mask": (B, T)}``. ``module``: an already built :class:`~torchelmo.BiLM` (or ``_ElmoBiLm``)
    instead of the two files. ``do_layer_norm``, ``dropout``, ``vocab_to_cache``,
    ``keep_sentence_boundaries`` and ``scalar_mix_parameters`` (fixed, untrained mix weights
    before the softmax) mean what they mean in AllenNLP (see :class:`torchelmo.Elmo`).

    AllenNLP's attributes: ``scalar_mix_0``, ``scalar_mix_1``, ... (:class:`ScalarMix`, AllenNLP's
    parameter layout; ``scalar_mixes`` lists them), ``_elmo_lstm`` (an :class:`_ElmoBiLm` over the
    same biLM, ``self.bilm``: ``elmo._elmo_lstm._elmo_lstm.reset_states()`` works), ``_dropout``
    and ``_scalar_mixes``. ``load_state_dict`` takes AllenNLP's keys too, and
    ``allennlp_state_dict()`` gives them (see :mod:`.state_dict`).
    """

    def __init__(self, options_file: str | None, weight_file: str | None, num_output_representations: int,
                 requires_grad: bool = False, do_layer_norm: bool = False, dropout: float = 0.5,
                 vocab_to_cache: Sequence[str] | None = None, keep_sentence_boundaries: bool = False,
                 scalar_mix_parameters: Sequence[float] | None = None, module: BiLM | None = None,
                 *, stateful: bool = True) -> None:
        _Elmo.check_num_outputs(num_output_representations)      # before any file is read
        if module is not None:
            if options_file is not None or weight_file is not None:
                raise ElmoError("Elmo: give either module or options_file/weight_file, not both")
            if isinstance(module, _ElmoBiLm):
                module = module.bilm
            if not isinstance(module, BiLM):
                raise ElmoError(f"Elmo: module must be a torchelmo BiLM, got {type(module).__name__}")
            bilm = module
        else:
            if options_file is None or weight_file is None:
                raise ElmoError("Elmo: options_file and weight_file are required (or module)")
            bilm = BiLM.from_published(options_file, weight_file, stateful=stateful)
        super().__init__(bilm, num_output_representations, dropout=dropout, requires_grad=requires_grad,
                         do_layer_norm=do_layer_norm, keep_sentence_boundaries=keep_sentence_boundaries,
                         scalar_mix_parameters=scalar_mix_parameters, vocab_to_cache=vocab_to_cache)
        # AllenNLP's layout for the mixes: attributes scalar_mix_k (ScalarMix below), in place of
        # torchelmo's ModuleList scalar_mixes (which the scalar_mixes property now lists).
        del self._modules["scalar_mixes"]
        self._num_mixes = num_output_representations
        for k in range(num_output_representations):
            self.add_module(f"scalar_mix_{k}", ScalarMix(bilm.num_layers, do_layer_norm, scalar_mix_parameters,
                                                         trainable=scalar_mix_parameters is None))
        self.register_load_state_dict_post_hook(_refresh_caches)

    @property
    def scalar_mixes(self) -> list[ScalarMix]:
        """The mixes, ``scalar_mix_0`` ... (torchelmo's name for them)."""
        return [getattr(self, f"scalar_mix_{k}") for k in range(self._num_mixes)]

    _scalar_mixes = scalar_mixes                     # AllenNLP's name
    _dropout = property(lambda self: self.dropout)   # AllenNLP's name

    @property
    def _elmo_lstm(self) -> _ElmoBiLm:
        view = self.__dict__.get("_elmo_lstm_view")
        if view is None or view.bilm is not self.bilm:
            view = self.__dict__["_elmo_lstm_view"] = _ElmoBiLm._over(self)
        return view

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_elmo_lstm_view", None)            # a view, rebuilt on use (it refers back to self)
        return state

    def allennlp_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The state dict of AllenNLP's ``Elmo`` with these weights (see :mod:`.state_dict`):
        ``_elmo_lstm.*`` from the biLM, ``scalar_mix_k.*``, and with ``vocab_to_cache``
        ``_elmo_lstm._word_embedding.weight`` (row 0, padding, zeros)."""
        out = _allennlp_dict(bilm_layout(self.bilm), "_elmo_lstm.")
        if self._vocab_char_ids is not None:
            with torch.no_grad():
                table = self.bilm.encoder.encode_tokens(self._vocab_char_ids)
                table[0] = 0.0
            out["_elmo_lstm._word_embedding.weight"] = table
        for k, v in self.state_dict(keep_vars=False).items():
            if k.startswith("scalar_mix_"):
                out[k] = v.detach().clone()
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # This drop-in's earlier layout (and torchelmo.Elmo's): scalar_mixes.k.* -> scalar_mix_k.*
        old = prefix + "scalar_mixes."
        for key in [k for k in state_dict if k.startswith(old)]:
            k, rest = key[len(old):].split(".", 1)
            state_dict[f"{prefix}scalar_mix_{k}.{rest}"] = state_dict.pop(key)
        _accept_allennlp_keys(self, state_dict, prefix, "_elmo_lstm.", _BILM_ROOTS.__contains__, "bilm.",
                              bilm_layout(self.bilm), self.bilm, missing_keys, error_msgs,
                              drop=("_word_embedding.weight",))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)



class ElmoTokenEmbedder(nn.Module):
    """``allennlp.modules.token_embedders.ElmoTokenEmbedder``: one ELMo mix, as a token embedder.

    ``forward(elmo_tokens, word_inputs=None)`` returns ``(B, T, dim)``: ``Elmo(...,
    num_output_representations=1)``'s representation (``self._elmo``), projected by the
    ``Linear`` ``self._projection`` to ``projection_dim`` when that is given. Without files it
    loads AllenNLP's default, the original published model. Loads AllenNLP's keys
    (``_elmo._elmo_lstm.*``, ``_elmo.scalar_mix_0.*``, ``_projection.*``);
    ``allennlp_state_dict()`` gives them.
    """

    def __init__(self, options_file: str | None = None, weight_file: str | None = None,
                 do_layer_norm: bool = False, dropout: float = 0.5, requires_grad: bool = False,
                 projection_dim: int | None = None, vocab_to_cache: Sequence[str] | None = None,
                 scalar_mix_parameters: Sequence[float] | None = None, *, stateful: bool = True) -> None:
        super().__init__()
        module = None
        if options_file is None and weight_file is None:
            module = BiLM.from_pretrained(DEFAULT_MODEL, stateful=stateful)
        elif options_file is None or weight_file is None:
            raise ElmoError("ElmoTokenEmbedder: options_file and weight_file go together")
        self._elmo = Elmo(options_file, weight_file, 1, requires_grad=requires_grad, do_layer_norm=do_layer_norm,
                          dropout=dropout, vocab_to_cache=vocab_to_cache,
                          scalar_mix_parameters=scalar_mix_parameters, module=module, stateful=stateful)
        if projection_dim is not None and (isinstance(projection_dim, bool) or not isinstance(projection_dim, int)
                                           or projection_dim < 0):
            raise ElmoError(f"ElmoTokenEmbedder: projection_dim must be a positive integer or None, "
                            f"got {projection_dim!r}")
        if projection_dim:
            self._projection = nn.Linear(self._elmo.get_output_dim(), projection_dim)
            self.output_dim = projection_dim
        else:
            self._projection = None
            self.output_dim = self._elmo.get_output_dim()

    def get_output_dim(self) -> int:
        return self.output_dim

    def forward(self, elmo_tokens: torch.Tensor | None, word_inputs: torch.Tensor | None = None) -> torch.Tensor:
        reps = self._elmo(elmo_tokens, word_inputs)["elmo_representations"][0]
        return reps if self._projection is None else self._projection(reps)

    def allennlp_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        out = OrderedDict(("_elmo." + k, v) for k, v in self._elmo.allennlp_state_dict().items())
        if self._projection is not None:
            for k, v in self._projection.state_dict().items():
                out["_projection." + k] = v.detach().clone()
        return out
