"""AllenNLP's ELMo API on torchelmo, for code written against ``allennlp.modules.elmo`` and
``allennlp.commands.elmo`` (AllenNLP is archived and no longer installs with current PyTorch).

Change the import and keep the code::

    # from allennlp.modules.elmo import Elmo, batch_to_ids
    # from allennlp.commands.elmo import ElmoEmbedder
    from torchelmo.allennlp import Elmo, ElmoEmbedder, batch_to_ids

Same argument names, defaults and outputs. Like AllenNLP's, both classes carry the LSTM state
from one batch to the next (row r of a batch starts where row r of the previous one ended), so a
sentence's vectors depend slightly on what ran before; ``stateful=False`` makes every sentence
start from the zero state, as torchelmo's own API does. See docs/migrating.md.

The names AllenNLP code imports from ``allennlp.modules.elmo`` and its neighbours are here too:
``_ElmoBiLm``, ``_ElmoCharacterEncoder``, ``ScalarMix`` (AllenNLP's parameter layout),
``ElmoTokenEmbedder``, ``ELMoCharacterMapper`` and ``ELMoTokenCharactersIndexer``.

Checkpoints with AllenNLP's keys
--------------------------------
``Elmo``, ``ElmoTokenEmbedder``, ``_ElmoBiLm`` and ``_ElmoCharacterEncoder`` load state dicts in
AllenNLP's layout (also when they sit inside a larger model: the keys are translated under the
module's own prefix) as well as their own, and ``allennlp_state_dict()`` gives AllenNLP's layout
back. With ``E`` the char embedding size, ``n`` the filters in all, ``D`` the LSTM cell size,
``P`` its projection, ``d`` 0 for ``forward_layer_l`` and 1 for ``backward_layer_l``:

========================================================  ===========  =====================================
AllenNLP key (under ``_elmo_lstm.`` in ``Elmo``)           shape        torchelmo parameter (under ``bilm.``)
========================================================  ===========  =====================================
``_token_embedder._char_embedding_weights``               (262, E)     ``encoder.char_embed.weight``
``_token_embedder.char_conv_i.weight`` / ``.bias``        (n_i, E, w)  ``encoder.convs.i.weight`` / ``.bias``
``_token_embedder._highways._layers.k.weight``            (2n, n)      ``encoder.highways.k.proj.weight``,
                                                                       rows ``n:`` negated
``_token_embedder._highways._layers.k.bias``              (2n,)        ``encoder.highways.k.proj.bias``,
                                                                       ``n:`` negated
``_token_embedder._projection.weight`` / ``.bias``        (P, n)       ``encoder.proj.weight`` / ``.bias``
``_elmo_lstm.{forward,backward}_layer_l.``                (4D, P)      ``layers.l.w_x[d]``, transposed,
``input_linearity.weight``                                             gate blocks 1 and 2 swapped
``..._layer_l.state_linearity.weight``                    (4D, P)      ``layers.l.w_h[d]``, the same
``..._layer_l.state_linearity.bias``                      (4D,)        ``layers.l.bias[d]``, blocks 1 and 2
                                                                       swapped, the forget block minus 1
``..._layer_l.state_projection.weight``                   (P, D)       ``layers.l.w_p[d]``, transposed
``_word_embedding.weight`` (``vocab_to_cache`` only)      (V, P)       none: recomputed from the char-CNN
``scalar_mix_k.scalar_parameters.i``, ``.gamma``          (1,)         the same names (this module's layout)
========================================================  ===========  =====================================

These follow AllenNLP's documented conversion of the published HDF5 file (``ElmoLstm.load_weights``
and ``_ElmoCharacterEncoder._load_*``), the file torchelmo reads too (``weights._published_layout``):

* LSTM gates: the HDF5 ``W_0`` columns, like torchelmo's ``w_x``/``w_h``, are in the order
  i, j (the cell input), f, o; AllenNLP's ``LstmCellWithProjection`` rows are i, f, j, o. The
  HDF5 ``B`` (torchelmo's ``bias``) excludes the forget bias of 1.0 that the cell adds;
  AllenNLP folds it into ``state_linearity.bias`` (its cell adds nothing).
* Highway: torchelmo's ``proj`` is ``[transform; carry]`` with ``y = g relu(transform) + (1 - g) x``,
  ``g = sigmoid(carry)`` (the HDF5 layout); AllenNLP's Highway is ``[transform; gate]`` with
  ``y = gate x + (1 - gate) relu(transform)``, so its gate part is the carry part negated.

Older drop-in checkpoints (``scalar_mixes.k.scalar_parameters`` as one vector) load as well. Not
carried: AllenNLP's ``_word_embedding`` (the cached words' char-CNN output, recomputed here, so
a separately fine-tuned word table is not kept) and ``_ElmoCharacterEncoder``'s values at padded
token positions (zeros here, whatever the char-CNN gives for an empty token in AllenNLP; the
mask excludes them in both).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import tempfile
import types
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn

from . import weights
from .bilm import BiLM, add_sentence_boundaries
from .chars import (
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
    batch_to_ids,
    sentence_lengths,
    word_to_char_ids,
)
from .config import ElmoConfig
from .encoder import CharCNNEncoder
from .errors import ElmoError
from .lstm import FORGET_BIAS
from .mix import Elmo as _Elmo
from .mix import _masked_layer_norm
from .runtime import resolve_cuda_device

__all__ = ["DEFAULT_BATCH_SIZE", "ELMoCharacterMapper", "ELMoTokenCharactersIndexer", "Elmo", "ElmoEmbedder",
           "ElmoTokenEmbedder", "ScalarMix", "batch_to_ids"]

DEFAULT_BATCH_SIZE = 64          # AllenNLP's ElmoEmbedder and `allennlp elmo`
DEFAULT_MODEL = "original"       # what ElmoEmbedder() loads: AllenNLP's default, 2x4096_512_2048cnn_2xhighway


# ------------------------------------------------------------------------------------------------
# AllenNLP's parameter layout (see the module docstring's table).
# ------------------------------------------------------------------------------------------------
class _Entry(NamedTuple):
    key: str                                          # AllenNLP's name
    shape: tuple[int, ...]                            # its shape there
    get: Callable[[], torch.Tensor]                   # the model's value, in AllenNLP's layout
    put: Callable[[dict[str, torch.Tensor], torch.Tensor], None]   # AllenNLP value -> native copies


def _swap_gates(t: torch.Tensor, D: int) -> torch.Tensor:
    """Gate blocks 1 and 2 (D rows each) exchanged: i, j, f, o <-> i, f, j, o (its own inverse)."""
    return torch.cat([t[:D], t[2 * D:3 * D], t[D:2 * D], t[3 * D:]])


def _same(key: str, param: torch.Tensor, name: str) -> _Entry:
    def put(work, t):
        work[name].copy_(t)
    return _Entry(key, tuple(param.shape), lambda: param.detach().clone(), put)


def _highway(key: str, param: torch.Tensor, name: str, n: int) -> _Entry:
    # [transform; carry] <-> [transform; -carry]: the same operation both ways.
    def flip(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:n], -t[n:]])

    def put(work, t):
        work[name].copy_(flip(t))
    return _Entry(key, tuple(param.shape), lambda: flip(param.detach()), put)


def _encoder_layout(encoder: CharCNNEncoder, base: str = "", native: str = "") -> list[_Entry]:
    """The char-CNN's entries: AllenNLP keys under ``base``, torchelmo's under ``native``."""
    n = encoder.config.n_filters
    entries = [_same(base + "_char_embedding_weights", encoder.char_embed.weight, native + "char_embed.weight")]
    for i, conv in enumerate(encoder.convs):
        entries.append(_same(f"{base}char_conv_{i}.weight", conv.weight, f"{native}convs.{i}.weight"))
        entries.append(_same(f"{base}char_conv_{i}.bias", conv.bias, f"{native}convs.{i}.bias"))
    for k, hw in enumerate(encoder.highways):
        for part in ("weight", "bias"):
            entries.append(_highway(f"{base}_highways._layers.{k}.{part}", getattr(hw.proj, part),
                                    f"{native}highways.{k}.proj.{part}", n))
    entries.append(_same(base + "_projection.weight", encoder.proj.weight, native + "proj.weight"))
    entries.append(_same(base + "_projection.bias", encoder.proj.bias, native + "proj.bias"))
    return entries


def _lstm_entries(layer, l: int, d: int) -> list[_Entry]:
    """One direction ``d`` of LSTM layer ``l``: AllenNLP's ``LstmCellWithProjection``."""
    D = layer.lstm_dim
    base = f"_elmo_lstm.{('forward', 'backward')[d]}_layer_{l}."

    def matrix(key: str, attr: str) -> _Entry:       # torchelmo (in, 4D) i,j,f,o <-> AllenNLP (4D, in) i,f,j,o
        param = getattr(layer, attr)

        def put(work, t):
            work[f"layers.{l}.{attr}"][d].copy_(_swap_gates(t, D).T)
        return _Entry(base + key, (4 * D, param.shape[1]),
                      lambda: _swap_gates(param[d].detach().T, D).contiguous(), put)

    def get_bias():
        b = layer.bias[d].detach().clone()
        b[2 * D:3 * D] += FORGET_BIAS
        return _swap_gates(b, D)

    def put_bias(work, t):
        b = _swap_gates(t, D).clone()
        b[2 * D:3 * D] -= FORGET_BIAS
        work[f"layers.{l}.bias"][d].copy_(b)

    def put_projection(work, t):
        work[f"layers.{l}.w_p"][d].copy_(t.T)

    return [matrix("input_linearity.weight", "w_x"),
            matrix("state_linearity.weight", "w_h"),
            _Entry(base + "state_linearity.bias", (4 * D,), get_bias, put_bias),
            _Entry(base + "state_projection.weight", (layer.projection_dim, D),
                   lambda: layer.w_p[d].detach().T.contiguous(), put_projection)]


def _bilm_layout(bilm: BiLM) -> list[_Entry]:
    """Every entry of ``_ElmoBiLm``'s state dict (torchelmo names relative to the BiLM)."""
    entries = _encoder_layout(bilm.encoder, "_token_embedder.", "encoder.")
    for l, layer in enumerate(bilm.layers):
        for d in range(2):
            entries += _lstm_entries(layer, l, d)
    return entries


_BILM_ROOTS = ("_token_embedder", "_elmo_lstm", "_word_embedding")


def _is_encoder_root(name: str) -> bool:
    return name in ("_char_embedding_weights", "_highways", "_projection") or name.startswith("char_conv_")


def _accept_allennlp_keys(module: nn.Module, state_dict: dict, prefix: str, allen: str,
                          is_root: Callable[[str], bool], native: str, entries: list[_Entry],
                          native_module: nn.Module, missing_keys: list[str], error_msgs: list[str],
                          drop: Sequence[str] = ()) -> None:
    """Translate, in place, the AllenNLP keys of ``state_dict`` under ``prefix + allen`` (those
    whose first name passes ``is_root``) into ``module``'s own under ``prefix + native``.

    Missing AllenNLP entries go to ``missing_keys`` (their parameters keep their values), a
    wrong shape to ``error_msgs`` (as PyTorch reports its own); unknown keys are left in place,
    for PyTorch to report as unexpected. ``drop``: keys accepted and ignored.
    """
    start = prefix + allen
    found = [k for k in state_dict if k.startswith(start) and is_root(k[len(start):].split(".", 1)[0])]
    if not found:
        return
    what = type(module).__name__
    clash = [k for k in state_dict if k.startswith(prefix + native)]
    if clash:
        error_msgs.append(f"{what}: the state dict mixes AllenNLP's keys ({found[0]!r}) and torchelmo's "
                          f"({clash[0]!r}); give one layout")
        return
    work = {name: t.detach().clone() for name, t in native_module.state_dict().items()}
    for entry in entries:
        key = start + entry.key
        if key not in state_dict:
            missing_keys.append(key)
            continue
        t = state_dict.pop(key)
        if not torch.is_tensor(t) or not t.is_floating_point():
            kind = f"a tensor of dtype {t.dtype}" if torch.is_tensor(t) else type(t).__name__
            error_msgs.append(f"{key!r} is {kind}; expected floating point")
        elif tuple(t.shape) != entry.shape:
            error_msgs.append(f"size mismatch for {key} (AllenNLP layout): copying a param with shape "
                              f"{tuple(t.shape)} from checkpoint, the shape in current model is {entry.shape}")
        else:
            with torch.no_grad():
                entry.put(work, t)
    for key in drop:
        state_dict.pop(start + key, None)
    for name, t in work.items():
        state_dict[prefix + native + name] = t


def _allennlp_dict(entries: list[_Entry], base: str = "") -> OrderedDict[str, torch.Tensor]:
    with torch.no_grad():
        return OrderedDict((base + e.key, e.get()) for e in entries)


def _refresh_caches(module: nn.Module, incompatible_keys: Any = None) -> None:
    """After a load: token embeddings computed from the old weights are dropped, those of a
    cached vocabulary recomputed."""
    encoder = module.bilm.encoder if hasattr(module, "bilm") else module.encoder
    encoder.clear_cache()
    holder = module.__dict__.get("_owner") or module     # an _ElmoBiLm view: its Elmo's vocabulary
    table = getattr(holder, "_vocab_char_ids", None)
    if table is not None:
        encoder.build_cache(table[1:])


# ------------------------------------------------------------------------------------------------
# allennlp.modules.scalar_mix.ScalarMix
# ------------------------------------------------------------------------------------------------
_SEQUENCE_FUNCTIONS = {torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack, torch.vstack}


class _ScalarParameters(nn.ParameterList):
    """AllenNLP's ``scalar_parameters``: a ``ParameterList`` of ``mixture_size`` parameters of
    shape ``(1,)`` (state dict keys ``scalar_parameters.0``, ``.1``, ...; ``[k].data[0] = x``).

    For code written against torchelmo's own :class:`torchelmo.ScalarMix`, where it is one ``(L,)``
    parameter, it also reads as that vector: in torch functions (``torch.softmax(s, 0)``, the
    source of ``Tensor.copy_``), and through ``copy_``, ``tolist``, ``detach``, ``requires_grad``
    and ``grad``.
    """

    def vector(self) -> torch.Tensor:
        """The ``(L,)`` vector of the values (differentiable)."""
        return torch.cat(list(self))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def plain(a):
            if isinstance(a, cls):
                return a.vector()
            if isinstance(a, (list, tuple)):
                return type(a)(plain(x) for x in a)
            return a
        if func in _SEQUENCE_FUNCTIONS and args and isinstance(args[0], cls):
            args = (list(args[0]), *args[1:])          # torch.cat(scalar_parameters): the list's tensors
        return func(*plain(tuple(args)), **{k: plain(v) for k, v in (kwargs or {}).items()})

    def copy_(self, values) -> _ScalarParameters:
        values = torch.as_tensor(values).reshape(-1)
        if len(values) != len(self):
            raise ElmoError(f"ScalarMix: {len(values)} values for {len(self)} scalar parameters")
        with torch.no_grad():
            for k, p in enumerate(self):
                p.copy_(values[k:k + 1])
        return self

    def tolist(self) -> list[float]:
        return [float(p) for p in self]

    def detach(self) -> torch.Tensor:
        return self.vector().detach()

    @property
    def requires_grad(self) -> bool:
        return all(p.requires_grad for p in self)

    @property
    def grad(self) -> torch.Tensor | None:
        if all(p.grad is None for p in self):
            return None
        return torch.cat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self])


class ScalarMix(nn.Module):
    """``allennlp.modules.scalar_mix.ScalarMix``, with AllenNLP's parameters: ``scalar_parameters``
    (``mixture_size`` parameters of shape ``(1,)``, see :class:`_ScalarParameters`) and ``gamma``
    ``(1,)``; ``forward(tensors, mask=None) = gamma * sum_k softmax(s)_k * tensors[k]``.

    ``do_layer_norm``: each tensor is first normalised by the mean and variance of its elements
    at the positions where ``mask`` (required then) is true (eps 1e-12). Also has torchelmo's
    :class:`torchelmo.ScalarMix` methods ``weights()``, ``gamma_value()`` and ``l2_penalty()``.
    """

    def __init__(self, mixture_size: int, do_layer_norm: bool = False,
                 initial_scalar_parameters: Sequence[float] | None = None, trainable: bool = True) -> None:
        super().__init__()
        if isinstance(mixture_size, bool) or not isinstance(mixture_size, int) or mixture_size < 1:
            raise ElmoError(f"ScalarMix: mixture_size must be a positive integer, got {mixture_size!r}")
        init = [0.0] * mixture_size if initial_scalar_parameters is None else list(initial_scalar_parameters)
        if len(init) != mixture_size:
            raise ElmoError(f"ScalarMix: {len(init)} initial scalar parameters for mixture_size {mixture_size}")
        if not all(isinstance(x, numbers.Real) and math.isfinite(x) for x in init):
            raise ElmoError(f"ScalarMix: initial scalar parameters must be finite numbers, got {init}")
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = _ScalarParameters(
            nn.Parameter(torch.tensor([float(x)]), requires_grad=trainable) for x in init)
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    @property
    def num_layers(self) -> int:          # torchelmo.ScalarMix's name
        return self.mixture_size

    def forward(self, tensors: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        if len(tensors) != self.mixture_size:
            raise ElmoError(f"ScalarMix: {len(tensors)} tensors were passed, built to mix {self.mixture_size}")
        w = torch.softmax(self.scalar_parameters.vector(), dim=0).to(tensors[0].dtype)
        if self.do_layer_norm:
            if mask is None:
                raise ElmoError("ScalarMix: do_layer_norm needs the mask")
            tensors = [_masked_layer_norm(t, mask) for t in tensors]
        mixed = sum(w[k] * t for k, t in enumerate(tensors))
        return self.gamma.to(mixed.dtype) * mixed

    def weights(self) -> list[float]:
        """softmax(s) as plain numbers."""
        return torch.softmax(self.scalar_parameters.detach(), 0).tolist()

    def gamma_value(self) -> float:
        return float(self.gamma.detach())

    def l2_penalty(self, coef: float = 0.001) -> torch.Tensor:
        """``coef * ||s||^2``, the paper's regulariser pulling the mix towards an average."""
        return coef * (self.scalar_parameters.vector() ** 2).sum()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # torchelmo.ScalarMix's layout (and this drop-in's before): one (L,) scalar_parameters.
        key = prefix + "scalar_parameters"
        if key in state_dict:
            t = state_dict.pop(key)
            if not torch.is_tensor(t) or tuple(t.shape) != (self.mixture_size,):
                shape = tuple(t.shape) if torch.is_tensor(t) else type(t).__name__
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {shape} from "
                                  f"checkpoint, the mix has {self.mixture_size} scalar parameters")
            else:
                for k in range(self.mixture_size):
                    state_dict[f"{key}.{k}"] = t[k:k + 1]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


# ------------------------------------------------------------------------------------------------
# allennlp.modules.elmo: _ElmoCharacterEncoder, _ElmoBiLm, Elmo
# ------------------------------------------------------------------------------------------------
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
            emb = self.encoder(ids).to(self.encoder.proj.weight.dtype)
        return {"token_embedding": emb, "mask": mask}

    def allennlp_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """This module's parameters under AllenNLP's names (see the module docstring)."""
        return _allennlp_dict(_encoder_layout(self.encoder))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        _accept_allennlp_keys(self, state_dict, prefix, "", _is_encoder_root, "encoder.",
                              _encoder_layout(self.encoder), self.encoder, missing_keys, error_msgs)
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
    def _over(cls, owner: Elmo) -> _ElmoBiLm:
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
        """This module's parameters under AllenNLP's names (see the module docstring)."""
        return _allennlp_dict(_bilm_layout(self.bilm))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        _accept_allennlp_keys(self, state_dict, prefix, "", _BILM_ROOTS.__contains__, "bilm.",
                              _bilm_layout(self.bilm), self.bilm, missing_keys, error_msgs,
                              drop=("_word_embedding.weight",))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


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
    ``allennlp_state_dict()`` gives them (see the module docstring).
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
        """The state dict of AllenNLP's ``Elmo`` with these weights (see the module docstring):
        ``_elmo_lstm.*`` from the biLM, ``scalar_mix_k.*``, and with ``vocab_to_cache``
        ``_elmo_lstm._word_embedding.weight`` (row 0, padding, zeros)."""
        out = _allennlp_dict(_bilm_layout(self.bilm), "_elmo_lstm.")
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
                              _bilm_layout(self.bilm), self.bilm, missing_keys, error_msgs,
                              drop=("_word_embedding.weight",))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


# ------------------------------------------------------------------------------------------------
# allennlp.modules.token_embedders.ElmoTokenEmbedder
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# allennlp.data.token_indexers.elmo_indexer
# ------------------------------------------------------------------------------------------------
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


class ElmoEmbedder:
    """``allennlp.commands.elmo.ElmoEmbedder``: all layers of a biLM as numpy arrays.

    ``ElmoEmbedder()`` loads AllenNLP's default, the original published model (downloaded once
    and cached); ``model=`` takes any name :meth:`BiLM.from_pretrained` takes instead (e.g.
    ``"default"``, the small model shipped in the package, offline). ``cuda_device``: -1 the CPU,
    N GPU N. Arrays are ``(L, n_tokens, 2P)``: ``(3, n, 1024)`` for the published models.
    """

    def __init__(self, options_file: str | None = None, weight_file: str | None = None,
                 cuda_device: int = -1, *, model: str | Path | None = None, stateful: bool = True) -> None:
        if (options_file is None) != (weight_file is None):
            raise ElmoError("ElmoEmbedder: options_file and weight_file go together")
        if options_file is not None and model is not None:
            raise ElmoError("ElmoEmbedder: give either model or options_file/weight_file, not both")
        device = resolve_cuda_device(cuda_device, "cuda_device")
        if options_file is not None:
            self.elmo_bilm = BiLM.from_published(options_file, weight_file, stateful=stateful)
        else:
            name = DEFAULT_MODEL if model is None else model
            self.elmo_bilm = BiLM.from_pretrained(name, stateful=stateful)
        self.elmo_bilm = self.elmo_bilm.to(device).eval()
        self.cuda_device = cuda_device

    def batch_to_embeddings(self, batch: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L, T, 2P)`` activations and the ``(B, T)`` mask of one batch."""
        with torch.no_grad():
            out = self.elmo_bilm(batch_to_ids(batch).to(self.elmo_bilm.device))
        return torch.stack(out.layers, dim=1), out.mask

    def _empty(self) -> np.ndarray:
        return np.zeros((self.elmo_bilm.num_layers, 0, self.elmo_bilm.output_dim), np.float32)

    def embed_sentence(self, sentence: list[str]) -> np.ndarray:
        """One tokenised sentence: ``(L, n_tokens, 2P)``."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: list[list[str]]) -> list[np.ndarray]:
        """One array per sentence of ``batch``, run as one batch (an empty sentence: ``(L, 0, 2P)``)."""
        sentence_lengths(batch, "ElmoEmbedder", allow_empty=True)   # None, a str: one-line errors
        if all(len(s) == 0 for s in batch):          # nothing to run; the carried state is kept
            return [self._empty() for _ in batch]
        acts, mask = self.batch_to_embeddings(batch)
        acts = acts.float().cpu().numpy()
        lengths = mask.sum(1).tolist()
        return [np.ascontiguousarray(acts[i, :, :n]) if n else self._empty()
                for i, n in enumerate(lengths)]

    def embed_sentences(self, sentences: Iterable[list[str]],
                        batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[np.ndarray]:
        """A generator of arrays, in order, running ``batch_size`` sentences at a time."""
        if sentences is None or isinstance(sentences, (str, bytes)):
            raise ElmoError(f"ElmoEmbedder.embed_sentences: expected an iterable of sentences (lists of "
                            f"tokens), got {type(sentences).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"batch_size must be a positive integer, got {batch_size!r}")
        batch: list[list[str]] = []
        for s in sentences:
            batch.append(s)
            if len(batch) == batch_size:
                yield from self.embed_batch(batch)
                batch = []
        if batch:
            yield from self.embed_batch(batch)

    def embed_file(self, input_file: IO | str | Path, output_file_path: str | Path,
                   output_format: str = "all", batch_size: int = DEFAULT_BATCH_SIZE,
                   forget_sentences: bool = False, use_sentence_keys: bool = False) -> None:
        """Embed a file of whitespace-tokenised sentences, one per line, into HDF5 as ``allennlp
        elmo`` did: datasets named by line index (or, ``use_sentence_keys``, by the sentence), plus
        ``sentence_to_index`` unless ``forget_sentences``. ``output_format``: all, top or average.
        ``input_file`` is an open text file (closed afterwards, as AllenNLP does) or a path.
        Batches are ``batch_size`` lines in file order; the carried state starts from zero.
        """
        from .embed.hdf5 import embed_file

        if output_format not in ("all", "top", "average"):
            raise ElmoError(f"output_format must be all, top or average, got {output_format!r}")
        with _input_path(input_file) as path:
            embed_file(self.elmo_bilm, path, output_file_path, output_format,
                       batch_size=batch_size if self.elmo_bilm.stateful else None,
                       sentence_index=not forget_sentences,
                       keys="sentence" if use_sentence_keys else "index")


class _input_path:
    """A path for ``input_file``: its own, or a temporary copy of a stream's text."""

    def __init__(self, input_file: IO | str | Path) -> None:
        self.file, self.tmp = input_file, None

    def __enter__(self) -> str:
        if not hasattr(self.file, "read"):
            return str(self.file)
        name = getattr(self.file, "name", None)
        if isinstance(name, str) and Path(name).is_file() and self.file.tell() == 0:
            return name
        self.tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False)
        n = 1
        try:
            with self.tmp:
                for line in self.file:
                    self.tmp.write(line if isinstance(line, str) else line.decode("utf-8"))
                    n += 1
        except BaseException as e:   # __exit__ will not run: the copy goes here
            Path(self.tmp.name).unlink(missing_ok=True)
            if isinstance(e, UnicodeDecodeError):
                raise ElmoError(f"{name if isinstance(name, str) else 'input_file'}: not UTF-8 text near "
                                f"line {n} ({e.reason})") from None
            raise
        return self.tmp.name

    def __exit__(self, *exc) -> bool:
        if self.tmp is not None:
            Path(self.tmp.name).unlink(missing_ok=True)
        if hasattr(self.file, "close"):
            self.file.close()
        return False
