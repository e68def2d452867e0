"""Task-specific combination of the biLM layers.

    ELMo_task(t) = gamma * sum_k softmax(s)_k * E_k(t)

``s`` (one scalar per layer, initialised to 0) and ``gamma`` (initialised to 1) are learned with
the downstream task; ``softmax(s)`` says which layers the task takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from .bilm import BiLM
from .chars import batch_to_ids
from .errors import ElmoError


class ScalarMix(nn.Module):
    def __init__(self, num_layers: int, do_layer_norm: bool = False,
                 initial_scalar_parameters: Sequence[float] | None = None, trainable: bool = True) -> None:
        super().__init__()
        init = list(initial_scalar_parameters) if initial_scalar_parameters is not None else [0.0] * num_layers
        if len(init) != num_layers:
            raise ElmoError(f"ScalarMix: {len(init)} initial scalars for {num_layers} layers")
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.tensor(init, dtype=torch.float32), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def forward(self, layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """``layers``: num_layers tensors ``(B, T, F)``; ``mask (B, T)`` needed for layer norm.
        Returns ``(B, T, F)``."""
        if len(layers) != self.num_layers:
            raise ElmoError(f"ScalarMix: got {len(layers)} layers, built for {self.num_layers}")
        w = torch.softmax(self.scalar_parameters, dim=0).to(layers[0].dtype)
        if self.do_layer_norm:
            if mask is None:
                raise ElmoError("ScalarMix: layer norm needs the mask")
            layers = [_masked_layer_norm(t, mask) for t in layers]
        mixed = sum(wk * t for wk, t in zip(w, layers))
        return self.gamma.to(mixed.dtype) * mixed

    def weights(self) -> list[float]:
        """softmax(s) as plain numbers."""
        return torch.softmax(self.scalar_parameters.detach(), 0).tolist()

    def gamma_value(self) -> float:
        return float(self.gamma.detach())

    def l2_penalty(self, coef: float = 0.001) -> torch.Tensor:
        """``coef * ||s||^2``, the paper's regulariser pulling the mix towards an average."""
        return coef * (self.scalar_parameters ** 2).sum()


def _masked_layer_norm(t: torch.Tensor, mask: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    # Mean and variance over batch, time and features, real tokens only.
    m = mask.unsqueeze(-1).to(t.dtype)
    n = m.sum() * t.shape[-1]
    mean = (t * m).sum() / n
    var = (((t - mean) * m) ** 2).sum() / n
    return (t - mean) / torch.sqrt(var + eps)


class Elmo(nn.Module):
    """A biLM plus ``num_output_representations`` scalar mixes sharing one biLM run.

    ``forward`` takes char ids ``(B, T, 50)`` (or a list of tokenised sentences) and returns
    ``{"elmo_representations": [ (B, T, 2P) ] * N, "mask": (B, T)}``. The biLM is frozen unless
    ``requires_grad=True``; dropout (AllenNLP's 0.5) applies to each mixed output in training mode.
    """

    def __init__(self, bilm: BiLM, num_output_representations: int = 1, dropout: float = 0.5,
                 requires_grad: bool = False, do_layer_norm: bool = False,
                 keep_sentence_boundaries: bool = False,
                 scalar_mix_parameters: Sequence[float] | None = None) -> None:
        super().__init__()
        self.bilm = bilm
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.dropout = nn.Dropout(dropout)
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(bilm.num_layers, do_layer_norm, scalar_mix_parameters,
                      trainable=scalar_mix_parameters is None)
            for _ in range(num_output_representations))
        self.requires_grad_bilm(requires_grad)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "default", *, stateful: bool = False, **kw) -> "Elmo":
        return cls(BiLM.from_pretrained(name_or_path, stateful=stateful), **kw)

    @classmethod
    def from_published(cls, options_file, weight_file, *, stateful: bool = False, **kw) -> "Elmo":
        return cls(BiLM.from_published(options_file, weight_file, stateful=stateful), **kw)

    def requires_grad_bilm(self, flag: bool) -> None:
        self.bilm.requires_grad_(flag)

    def get_output_dim(self) -> int:
        return self.bilm.output_dim

    def forward(self, inputs: torch.Tensor | list[list[str]]) -> dict:
        char_ids = inputs if torch.is_tensor(inputs) else batch_to_ids(inputs).to(self.bilm.device)
        out = self.bilm(char_ids, keep_sentence_boundaries=self.keep_sentence_boundaries)
        reps = [self.dropout(mix(out.layers, out.mask)) for mix in self.scalar_mixes]
        return {"elmo_representations": reps, "mask": out.mask}
