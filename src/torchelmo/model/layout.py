"""AllenNLP's PyTorch parameter layout of an ELMo biLM (which ELMoForManyLangs' models use too),
as entries that read and write a torchelmo model: per AllenNLP key, its shape there and the
conversion both ways. The table of keys and the conversions, following AllenNLP's documented
reading of the published HDF5 file, are in :mod:`torchelmo.integrations.allennlp.state_dict`,
whose modules load and give state dicts in this layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..numerics.lstm import FORGET_BIAS
from .encoder import CharCNNEncoder


class Entry(NamedTuple):
    key: str                                          # AllenNLP's name
    shape: tuple[int, ...]                            # its shape there
    get: Callable[[], torch.Tensor]                   # the model's value, in AllenNLP's layout
    put: Callable[[dict[str, torch.Tensor], torch.Tensor], None]   # AllenNLP value -> native copies


def swap_gates(t: torch.Tensor, D: int) -> torch.Tensor:
    """Gate blocks 1 and 2 (D rows each) exchanged: i, j, f, o <-> i, f, j, o (its own inverse)."""
    return torch.cat([t[:D], t[2 * D:3 * D], t[D:2 * D], t[3 * D:]])


def same(key: str, param: torch.Tensor, name: str) -> Entry:
    def put(work, t):
        work[name].copy_(t)
    return Entry(key, tuple(param.shape), lambda: param.detach().clone(), put)


def highway(key: str, param: torch.Tensor, name: str, n: int) -> Entry:
    # [transform; carry] <-> [transform; -carry]: the same operation both ways.
    def flip(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:n], -t[n:]])

    def put(work, t):
        work[name].copy_(flip(t))
    return Entry(key, tuple(param.shape), lambda: flip(param.detach()), put)


def encoder_layout(encoder: CharCNNEncoder, base: str = "", native: str = "") -> list[Entry]:
    """The char-CNN's entries: AllenNLP keys under ``base``, torchelmo's under ``native``."""
    n = encoder.config.n_filters
    entries = [same(base + "_char_embedding_weights", encoder.char_embed.weight, native + "char_embed.weight")]
    for i, conv in enumerate(encoder.convs):
        entries.append(same(f"{base}char_conv_{i}.weight", conv.weight, f"{native}convs.{i}.weight"))
        entries.append(same(f"{base}char_conv_{i}.bias", conv.bias, f"{native}convs.{i}.bias"))
    for k, hw in enumerate(encoder.highways):
        for part in ("weight", "bias"):
            entries.append(highway(f"{base}_highways._layers.{k}.{part}", getattr(hw.proj, part),
                                    f"{native}highways.{k}.proj.{part}", n))
    entries.append(same(base + "_projection.weight", encoder.proj.weight, native + "proj.weight"))
    entries.append(same(base + "_projection.bias", encoder.proj.bias, native + "proj.bias"))
    return entries


def lstm_entries(layer, l: int, d: int) -> list[Entry]:
    """One direction ``d`` of LSTM layer ``l``: AllenNLP's ``LstmCellWithProjection``."""
    D = layer.lstm_dim
    base = f"_elmo_lstm.{('forward', 'backward')[d]}_layer_{l}."

    def matrix(key: str, attr: str) -> Entry:       # torchelmo (in, 4D) i,j,f,o <-> AllenNLP (4D, in) i,f,j,o
        param = getattr(layer, attr)

        def put(work, t):
            work[f"layers.{l}.{attr}"][d].copy_(swap_gates(t, D).T)
        return Entry(base + key, (4 * D, param.shape[1]),
                      lambda: swap_gates(param[d].detach().T, D).contiguous(), put)

    def get_bias():
        b = layer.bias[d].detach().clone()
        b[2 * D:3 * D] += FORGET_BIAS
        return swap_gates(b, D)

    def put_bias(work, t):
        b = swap_gates(t, D).clone()
        b[2 * D:3 * D] -= FORGET_BIAS
        work[f"layers.{l}.bias"][d].copy_(b)

    def put_projection(work, t):
        work[f"layers.{l}.w_p"][d].copy_(t.T)

    return [matrix("input_linearity.weight", "w_x"),
            matrix("state_linearity.weight", "w_h"),
            Entry(base + "state_linearity.bias", (4 * D,), get_bias, put_bias),
            Entry(base + "state_projection.weight", (layer.projection_dim, D),
                   lambda: layer.w_p[d].detach().T.contiguous(), put_projection)]


def bilm_layout(bilm) -> list[Entry]:
    """Every entry of ``_ElmoBiLm``'s state dict (torchelmo names relative to the BiLM)."""
    entries = encoder_layout(bilm.encoder, "_token_embedder.", "encoder.")
    for l, layer in enumerate(bilm.layers):
        for d in range(2):
            entries += lstm_entries(layer, l, d)
    return entries
