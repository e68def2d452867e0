"""Precision: one option for the Python API, ``elmo embed`` and ``elmo train``, resolved once into
a :class:`Precision`. Its name (``fp32``, ``tf32``, ``bf16``) is passed as an argument to every
component that multiplies (the char-CNN, highway, projections, recurrence, softmax); what only
torch's switches can set (CUDA's TF32 and bf16 autocast) one context applies (:meth:`Precision.scope`).

* ``fp32`` (default): IEEE fp32 everywhere (no TF32, no reduced-precision CPU matmuls): equal to
  the reference paths to ~1e-6.
* ``tf32``: matmuls and convolutions may use TF32 tensor cores (CUDA; on a CPU it is fp32).
* ``bf16``: matrix products take bfloat16 operands and accumulate in fp32; parameters, cell
  state, gates, clips and every elementwise step stay fp32.

  - On a CPU, the char-CNN, highway, token projection and both LSTM stacks multiply bfloat16
    tensors, forward and backward (:mod:`torchelmo.numerics.operands`: weights cast once at inference,
    once per pass in training; products rounded to bfloat16), and so does the softmax's training
    loss (full, sampled, adaptive); scoring a whole vocabulary stays fp32. No process-wide switch
    is set, so threads running models of different precisions do not disturb each other. The
    model stays fp32 (in training: fp32 master weights and optimizer state). Each LSTM
    step's gates run as one compiled loop whose sigmoid and tanh are rational functions, exact
    to 5e-7 (the backend ``auto`` picks, :mod:`torchelmo.numerics.epilogue`). The numbers are the same on
    every CPU; the speed is not: bf16 matmuls are several times fp32's where the CPU has bfloat16
    units (AMX tiles, or AVX512-BF16 dot products), and slower than fp32 where it has neither
    (:func:`cpu_bf16_support`).
  - On CUDA, bfloat16 autocast for the char-CNN and projections, and bfloat16 operands in the
    fused recurrence's kernels.
* ``auto``: bf16 on a CPU with bfloat16 units (AMX or AVX512-BF16), fp32 everywhere else (also
  on CUDA, until a GPU run has measured the reduced precisions).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import ElmoError, warn

PRECISIONS = ("fp32", "tf32", "bf16")
CHOICES = (*PRECISIONS, "auto")
PRECISION_HELP = ("fp32 (default, exact), tf32 (CUDA), bf16 (bfloat16 matmul operands, fp32 "
                  "accumulation and state), or auto (bf16 on a CPU with bfloat16 units, else fp32)")

# oneDNN's ISA ceilings below which it has no bf16 instructions, and below which it has no AMX
# (ONEDNN_MAX_CPU_ISA lowers what oneDNN uses; it is also how the benchmarks emulate older CPUs).
_NO_BF16_ISAS = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
_NO_AMX_ISAS = _NO_BF16_ISAS | {"AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16"}


def check_precision(value: str, what: str = "precision") -> str:
    if value not in CHOICES:
        raise ElmoError(f"{what}: must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


@functools.lru_cache(maxsize=1)
def cpu_bf16_support() -> str:
    """What this CPU offers bfloat16 matmuls, as oneDNN will use it: ``"amx"`` (AMX-BF16 tiles),
    ``"avx512_bf16"`` (dot-product instructions, no AMX) or ``"none"``. With either of the first
    two, bf16 matmuls run several times faster than fp32's (docs/benchmarks.md, measured on both
    kinds); with ``"none"`` bf16 is emulated and slower than fp32. (An AMX machine with oneDNN
    capped at ``AVX512_CORE_BF16`` does not show a real AVX512-BF16 CPU's speed.)"""
    flags = _cpu_flags()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if "amx_bf16" in flags and isa not in _NO_AMX_ISAS and _amx_usable():
        return "amx"
    if "avx512_bf16" in flags and isa not in _NO_BF16_ISAS:
        return "avx512_bf16"
    return "none"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _amx_usable() -> bool:
    # The kernel must grant the process AMX state; PyTorch asks for it and reports the answer.
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    return bool(init()) if init is not None else True


def support_line() -> str:
    """One line on this machine's reduced-precision support (``elmo info``)."""
    kind = cpu_bf16_support()
    what = {"amx": "AMX-BF16: bf16 is faster than fp32 here; --precision auto picks bf16",
            "avx512_bf16": "AVX512-BF16 (no AMX): bf16 is faster than fp32 here; --precision auto picks bf16",
            "none": "no bf16 units: bf16 is emulated here, slower than fp32; --precision auto picks fp32"}[kind]
    line = f"precision: CPU {what}"
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        line += f"; CUDA {name} (bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'})"
    return line


@dataclass(frozen=True)
class Precision:
    """A precision resolved for a device: what the model's code inside :meth:`scope` runs with."""

    name: str                   # fp32 | tf32 | bf16, never auto
    device_type: str            # cpu | cuda | ...

    @property
    def kernel(self) -> str:
        """The fused CUDA recurrence's matmul operands: fp32, tf32 or bf16."""
        return self.name

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bfloat16 autocast on CUDA under bf16; none on a CPU (its bf16 runs in fp32 tensors)."""
        return torch.bfloat16 if self.name == "bf16" and self.device_type == "cuda" else None

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """What only torch's switches can set, set for the code inside and restored after: on
        CUDA, TF32 (a process-wide switch: threads sharing a GPU share it) and bf16 autocast (per
        thread). Nothing on a CPU: there the precision travels as an argument."""
        with contextlib.ExitStack() as stack:
            if self.device_type == "cuda":
                saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.name == "tf32"
                stack.callback(_restore_tf32, saved)
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device_type, dtype=self.autocast_dtype))
            yield


def resolve_precision(name: str, device: torch.device | str) -> Precision:
    """``name`` (one of :data:`CHOICES`) for ``device``; ``auto`` becomes what is fastest there
    without leaving the accuracy the library documents (bf16 on a CPU with bfloat16 units, else
    fp32)."""
    check_precision(name)
    device_type = torch.device(device).type
    if name == "auto":
        name = "bf16" if device_type == "cpu" and cpu_bf16_support() != "none" else "fp32"
    elif name == "bf16" and device_type == "cpu" and cpu_bf16_support() == "none":
        _warn_slow_bf16()
    return Precision(name, device_type)


@functools.lru_cache(maxsize=1)
def _warn_slow_bf16() -> None:
    warn("precision bf16: this CPU has no bfloat16 units, so its bf16 matmuls are emulated, "
         "slower than --precision fp32 (auto picks fp32 here)", PrecisionWarning)


class PrecisionWarning(UserWarning):
    """A precision was asked for that this machine runs slower than fp32."""


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """``resolve_precision(precision, device).scope()``: for code outside the model (benchmarks)."""
    return resolve_precision(precision, device).scope()


def _restore_tf32(saved: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

