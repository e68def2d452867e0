"""``allennlp.modules.scalar_mix.ScalarMix`` with AllenNLP's parameter layout: ``scalar_parameters``
a ``ParameterList`` of ``(1,)`` parameters (``scalar_parameters[k].data[0] = x``), ``gamma`` ``(1,)``.

torchelmo's own :class:`torchelmo.ScalarMix` keeps ``scalar_parameters`` as one ``(L,)`` vector;
checkpoints in that layout load into this one too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...model.mix import _masked_layer_norm


class ScalarMix(nn.Module):
    """``allennlp.modules.scalar_mix.ScalarMix``, with AllenNLP's parameters: ``scalar_parameters``
    (an ``nn.ParameterList`` of ``mixture_size`` parameters of shape ``(1,)``, state dict keys
    ``scalar_parameters.0``, ``.1``, ...) and ``gamma`` ``(1,)``;
    ``forward(tensors, mask=None) = gamma * sum_k softmax(s)_k * tensors[k]``.

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
        self.scalar_parameters = nn.ParameterList(
            [nn.Parameter(torch.tensor([float(x)]), requires_grad=trainable) for x in init])
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    @property
    def num_layers(self) -> int:          # torchelmo.ScalarMix's name
        return self.mixture_size

    def _scalars(self) -> torch.Tensor:
        """The ``(L,)`` vector of the scalar parameters (differentiable)."""
        return torch.cat(list(self.scalar_parameters))

    def forward(self, tensors: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        if len(tensors) != self.mixture_size:
            raise ElmoError(f"ScalarMix: {len(tensors)} tensors were passed, built to mix {self.mixture_size}")
        w = torch.softmax(self._scalars(), dim=0).to(tensors[0].dtype)
        if self.do_layer_norm:
            if mask is None:
                raise ElmoError("ScalarMix: do_layer_norm needs the mask")
            tensors = [_masked_layer_norm(t, mask) for t in tensors]
        mixed = sum(w[k] * t for k, t in enumerate(tensors))
        return self.gamma.to(mixed.dtype) * mixed

    def weights(self) -> list[float]:
        """softmax(s) as plain numbers."""
        return torch.softmax(self._scalars().detach(), 0).tolist()

    def gamma_value(self) -> float:
        return float(self.gamma.detach())

    def l2_penalty(self, coef: float = 0.001) -> torch.Tensor:
        """``coef * ||s||^2``, the paper's regulariser pulling the mix towards an average."""
        return coef * (self._scalars() ** 2).sum()

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
