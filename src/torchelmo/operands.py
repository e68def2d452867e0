"""bfloat16 matmul operands for CPU inference: weights cast once and cached, fp32 everywhere else.

Under ``--precision bf16`` on a CPU with AMX, oneDNN's bf16 math mode takes fp32 tensors and
converts both operands on every call, the weights included: at the recurrence's shapes that
conversion costs about what the bf16 multiply saves. Inference (no autograd) therefore multiplies
bfloat16 tensors: each weight is cast once (:func:`bf16_cached`, refreshed when the weight is
replaced or changed in place) and the activation is cast per call. The product comes back in
bfloat16 (the matmul accumulates in fp32 and rounds its result); biases, gates, cell state,
clips and every elementwise step stay fp32. Training keeps the math mode (its weights change
every step).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .precision import active_precision, cpu_bf16_support


def bf16_operands(device_type: str, dtype: torch.dtype) -> bool:
    """Whether inference on ``device_type`` for a model of ``dtype`` multiplies bf16 tensors here:
    inside a bf16 scope, on a CPU with AMX, for an fp32 model, without autograd."""
    p = active_precision()
    return (p is not None and p.name == "bf16" and device_type == "cpu" and dtype == torch.float32
            and not torch.is_grad_enabled() and cpu_bf16_support() == "amx")


# module -> {name: (sources, their versions, the bf16 tensor)}. Beside the modules, not on them,
# so that pickling or copying a model never carries the cache; it costs half the cached weights'
# memory again, and goes with its module.
_CACHE: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def bf16_cache(owner: nn.Module) -> dict:
    """The cached bf16 tensors of ``owner``, by name (empty before its first bf16 inference)."""
    return {name: entry[2] for name, entry in _CACHE.get(owner, {}).items()}


def bf16_cached(owner: nn.Module, name: str, sources: tuple[torch.Tensor, ...],
                make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` in bfloat16, cached for ``owner`` under ``name``; remade only when a source
    tensor was replaced or changed in place (the entry holds its sources, so a replaced tensor's
    memory cannot return under the same address and version)."""
    cache = _CACHE.setdefault(owner, {})
    entry = cache.get(name)
    if entry is None or len(entry[0]) != len(sources) or any(
            a.data_ptr() != b.data_ptr() or a._version != v for a, b, v in zip(entry[0], sources, entry[1])):
        with torch.no_grad():
            entry = cache[name] = (tuple(t.detach() for t in sources), tuple(t._version for t in sources),
                                   make().detach().to(torch.bfloat16))
    return entry[2]


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``, on bf16 operands where :func:`bf16_operands` says so (the bias added in fp32)."""
    if not bf16_operands(x.device.type, x.dtype):
        return layer(x)
    w = bf16_cached(layer, "weight", (layer.weight,), lambda: layer.weight)
    y = F.linear(x.to(torch.bfloat16), w)
    y = y.float()   # then add in place: a mixed-type add would cast into a fresh temporary first
    return y if layer.bias is None else y.add_(layer.bias)
