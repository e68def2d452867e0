"""AllenNLP's parameter layout <-> torchelmo's: the key mapping behind ``load_state_dict`` and
``allennlp_state_dict()`` of :class:`~torchelmo.integrations.allennlp.Elmo`, ``ElmoTokenEmbedder``, ``_ElmoBiLm``
and ``_ElmoCharacterEncoder``.

Checkpoints with AllenNLP's keys
--------------------------------
Those modules load state dicts in AllenNLP's layout (also when they sit inside a larger model:
the keys are translated under the module's own prefix) as well as their own, and
``allennlp_state_dict()`` gives AllenNLP's layout back. With ``E`` the char embedding size, ``n``
the filters in all, ``D`` the LSTM cell size, ``P`` its projection, ``d`` 0 for
``forward_layer_l`` and 1 for ``backward_layer_l``:

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
``scalar_mix_k.scalar_parameters.i``, ``.gamma``          (1,)         the same names (ScalarMix's layout)
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

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from ...model.layout import Entry

_BILM_ROOTS = ("_token_embedder", "_elmo_lstm", "_word_embedding")


def _is_encoder_root(name: str) -> bool:
    return name in ("_char_embedding_weights", "_highways", "_projection") or name.startswith("char_conv_")


def _accept_allennlp_keys(module: nn.Module, state_dict: dict, prefix: str, allen: str,
                          is_root: Callable[[str], bool], native: str, entries: list[Entry],
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


def _allennlp_dict(entries: list[Entry], base: str = "") -> OrderedDict[str, torch.Tensor]:
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

