"""bfloat16 matmul operands on the CPU: the model's big products on bf16 tensors, fp32 elsewhere.

Under ``--precision bf16`` on a CPU, oneDNN's bf16 math mode takes fp32 tensors and
converts both operands on every call, the weights included, and its backward products gain
nothing: at the model's shapes that conversion costs about what the bf16 multiply saves. The
char-CNN, the highway, the token projection and the recurrence therefore multiply bfloat16
tensors:

* at inference (:func:`bf16_operands`), each weight is cast once (:func:`bf16_cached`, refreshed
  when the weight is replaced or changed in place, an optimizer's step included);
* in training (:func:`bf16_training`), each weight is cast once per forward pass, through
  autograd, so that its gradient (computed on bf16 operands too) reaches the fp32 master weight.

Activations are cast per call. A product comes back in bfloat16 (the matmul accumulates in fp32
and rounds its result); biases, gates, cell state, clips and every elementwise step stay fp32.
The softmax's training loss goes through :func:`linear` (full, adaptive) and :func:`affine`
(sampled) too; log-probabilities of the whole vocabulary stay fp32. The precision arrives as an
argument (a resolved name: ``fp32``, ``tf32``, ``bf16``); no process-wide switch is read or set.

oneDNN compiles a kernel for each new shape of a bf16 product (about 4 ms each here) and keeps
the latest 1024. The model's row counts (distinct tokens, a length group's windows, a cluster's
targets) change from batch to batch, so nearly every step compiled dozens of kernels, and their
long-lived allocations, made among a step's temporaries, fragmented the heap so that it grew by
tens of MB a step, every page faulted in afresh. :func:`mm` and :func:`linear` therefore pad the
rows with zeros up to :func:`padded_rows`: a few sizes recur, at most 1/16 more work.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook


def _bf16_cpu(precision: str | None, device_type: str, dtype: torch.dtype) -> bool:
    # On every CPU, so that bf16 gives the same numbers everywhere (fast where the CPU has
    # bfloat16 units; auto picks bf16 only there).
    return precision == "bf16" and device_type == "cpu" and dtype == torch.float32


def bf16_operands(precision: str | None, device_type: str, dtype: torch.dtype) -> bool:
    """Whether inference at ``precision`` (a resolved name: ``fp32``, ``tf32``, ``bf16``; None:
    fp32) on ``device_type`` for a model of ``dtype`` multiplies bf16 tensors (weights cached):
    bf16, on a CPU, for an fp32 model, without autograd."""
    return not torch.is_grad_enabled() and _bf16_cpu(precision, device_type, dtype)


def bf16_training(precision: str | None, device_type: str, dtype: torch.dtype) -> bool:
    """Whether a forward pass with autograd multiplies bf16 tensors (weights cast per pass): as
    :func:`bf16_operands`, with autograd."""
    return torch.is_grad_enabled() and _bf16_cpu(precision, device_type, dtype)


# module -> {name: (sources, their versions, the bf16 tensor)}. Beside the modules, not on them,
# so that pickling or copying a model never carries the cache; it costs half the cached weights'
# memory again, and goes with its module.
_CACHE: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()
# The storages of the weights that some cache holds a cast of: what an optimizer step must mark.
_CAST_STORAGES: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def _mark_stepped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    # PyTorch's fused optimizers change weights in place without bumping their version counters:
    # bump those of the weights this optimizer holds that a cache has cast, so that only those
    # casts are remade (a version bump changes no value).
    if not _CAST_STORAGES:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.data_ptr() in _CAST_STORAGES:
                torch.autograd.graph.increment_version(p)


register_optimizer_step_post_hook(_mark_stepped)


def bf16_cache(owner: nn.Module) -> dict:
    """The cached bf16 tensors of ``owner``, by name (empty before its first bf16 inference)."""
    return {name: entry[2] for name, entry in _CACHE.get(owner, {}).items()}


def bf16_cached(owner: nn.Module, name: str, sources: tuple[torch.Tensor, ...],
                make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` in bfloat16, cached for ``owner`` under ``name``; remade when a source tensor was
    replaced or changed in place (an optimizer's step included, fused or not). The entry holds its
    sources, so a replaced tensor's memory cannot return under the same address and version."""
    cache = _CACHE.setdefault(owner, {})
    entry = cache.get(name)
    if entry is None or len(entry[0]) != len(sources) or any(
            a.data_ptr() != b.data_ptr() or a._version != v for a, b, v in zip(entry[0], sources, entry[1])):
        with torch.no_grad():
            held = tuple(t.detach() for t in sources)
            entry = cache[name] = (held, tuple(t._version for t in sources), make().detach().to(torch.bfloat16))
        for t in held:
            _CAST_STORAGES[t.data_ptr()] = t
    return entry[2]


def padded_rows(m: int) -> int:
    """``m`` rounded up to one of 16 sizes per power of two: ``m`` itself up to 32, then multiples
    of 2, 4, 8, ... (at most 1/16 more)."""
    step = 1 << max(0, m.bit_length() - 5)
    return -(-m // step) * step


def _pad_rows(a: torch.Tensor) -> torch.Tensor:
    m = a.shape[0]
    return a if padded_rows(m) == m else F.pad(a, (0, 0, 0, padded_rows(m) - m))


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``a`` (M, K) and ``b`` (K, N); on bf16 CPU tensors with ``a``'s rows padded to
    :func:`padded_rows` (the product's shape recurs, and its compiled kernel with it)."""
    if a.dtype != torch.bfloat16 or a.device.type != "cpu":
        return torch.mm(a, b)
    return torch.mm(_pad_rows(a), b)[: a.shape[0]]


def linear(layer: nn.Module, x: torch.Tensor, precision: str | None = None) -> torch.Tensor:
    """``F.linear(x, layer.weight, layer.bias)`` (an ``nn.Linear``, or any module with those two
    attributes), on bf16 operands where :func:`bf16_operands` or :func:`bf16_training` says so for
    ``precision`` (the bias added in fp32)."""
    w = _bf16_weight(layer, x, precision)
    if w is None:
        return F.linear(x, layer.weight, layer.bias)
    y = _times(x, w).float()   # then add in place: a mixed-type add would cast into a fresh temporary first
    return y if layer.bias is None else y.add_(layer.bias)


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, precision: str | None
           ) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a weight made per call (a sampled softmax's rows): on
    bf16 operands where ``precision`` is bf16 on a CPU (cast per call, through autograd)."""
    if not _bf16_cpu(precision, x.device.type, x.dtype):
        return F.linear(x, weight, bias)
    y = _times(x, weight.to(torch.bfloat16)).float()
    return y if bias is None else y.add_(bias)


def product(layer: nn.Module, x: torch.Tensor, precision: str | None) -> torch.Tensor | None:
    """:func:`linear` before its bias, ``x W^T`` ``(..., out)`` in bfloat16 (for a fused loop to
    add the bias to), where the operands are bf16; None where they are not."""
    w = _bf16_weight(layer, x, precision)
    return None if w is None else _times(x, w)


def _bf16_weight(layer: nn.Module, x: torch.Tensor, precision: str | None) -> torch.Tensor | None:
    if bf16_operands(precision, x.device.type, x.dtype):
        return bf16_cached(layer, "weight", (layer.weight,), lambda: layer.weight)
    if bf16_training(precision, x.device.type, x.dtype):
        return layer.weight.to(torch.bfloat16)
    return None


def _times(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)                # (M, in)
    return F.linear(_pad_rows(rows), w)[: rows.shape[0]].view(*x.shape[:-1], -1)
