"""Which implementation runs the LSTM recurrence: one named setting, ``BiLM.backend``.

* ``cpu``: the PyTorch paths of :mod:`torchelmo.numerics.lstm` (any device), eager.
* ``cpu+compile``: the same, and at inference each step's gate epilogue runs as one loop that
  ``torch.compile`` generates (:mod:`torchelmo.numerics.epilogue`; it needs a C++ compiler, and the first
  batch of a layer's shape in a process compiles: seconds, cached on disk across processes); in
  bf16 training, each step's gates forward and backward as two such loops.
* ``triton``: the fused Triton recurrence (:mod:`torchelmo.numerics.fused`), for CUDA (on a CPU it needs
  Triton's interpreter, ``TRITON_INTERPRET=1``: slow, for tests).
* ``triton+graphs``: the same, and at inference each layer replays as a CUDA graph
  (:mod:`torchelmo.numerics.graphs`); with autograd or autocast on, it runs as ``triton``.
* ``auto``: ``triton`` on CUDA when Triton is installed; on a CPU, ``cpu+compile`` where the
  model computes on bf16 operands (``bf16`` precision on a CPU: there the epilogue costs more
  than the matmuls), its layers have at least ``COMPILE_MIN_CELLS`` cells, a C++ compiler is
  found and the work ahead pays for compiling (seconds per process, a warm cache included):
  in training, and where the model's :attr:`~torchelmo.BiLM.long_run` says so (``elmo train``'s
  validations, ``elmo embed`` of inputs of ``COMPILE_MIN_INPUT_BYTES`` or more); else ``cpu``.
  Eager and compiled differ by about one bf16 rounding of a gate.

Whatever is asked, a layer too large for the fused kernels' 32-bit offsets runs ``cpu``. The
setting's default is ``auto``, or ``TORCHELMO_BACKEND`` when set (read once, at first use).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from ..errors import ElmoError
from .compiled import compiler_found

BACKENDS = ("auto", "cpu", "cpu+compile", "triton", "triton+graphs")
# Below this many cells per direction the epilogue is a small part of a step, and not worth a compile.
COMPILE_MIN_CELLS = 256


def check_backend(value: str, what: str = "backend") -> str:
    if value not in BACKENDS:
        raise ElmoError(f"{what}: must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value


@functools.lru_cache(maxsize=1)
def default_backend() -> str:
    """``TORCHELMO_BACKEND`` if set, else ``auto``."""
    return check_backend(os.environ.get("TORCHELMO_BACKEND", "auto"), "TORCHELMO_BACKEND")


@functools.lru_cache(maxsize=1)
def triton_installed() -> bool:
    # Looked up, not imported: importing Triton is slow, and only the path that runs it should.
    return importlib.util.find_spec("triton") is not None


# Where compiling the CPU's bf16 loops pays, measured on an AMD EPYC (AVX512-BF16), one thread,
# published shapes with random weights: the first batch of a process compiles for 4.5 s (small)
# to 12.5 s (original) with inductor's cache warm, after which the compiled loops save 38 and
# 100 us a word: about 120,000 words (some 700 KB of text) before compiling has paid.
COMPILE_MIN_INPUT_BYTES = 1 << 20


def fused_fits(T: int, B: int, D: int) -> bool:
    """Whether a layer's buffers (the largest is ``(2, T, B, 4D)``) fit the fused kernels' 32-bit
    offsets; larger ones take the ``cpu`` path."""
    return 2 * T * B * 4 * D < 2**31


def resolve_backend(name: str | None, device_type: str, T: int, B: int, D: int, precision: str = "fp32",
                    long_run: bool = False) -> str:
    """The path that runs a layer of ``D`` cells over ``B`` rows and ``T`` steps on ``device_type``
    in ``precision`` (the kernel precision, ``fp32``, ``tf32`` or ``bf16``): ``cpu``,
    ``cpu+compile``, ``triton`` or ``triton+graphs`` (``name=None``: :func:`default_backend`).
    ``long_run``: enough work lies ahead to pay for compiling (training, or a large input), which
    ``auto`` needs before it compiles."""
    name = default_backend() if name is None else check_backend(name)
    if name == "auto":
        if device_type == "cuda" and triton_installed() and fused_fits(T, B, D):
            return "triton"
        bf16_cpu = device_type == "cpu" and precision == "bf16"
        return "cpu+compile" if bf16_cpu and long_run and D >= COMPILE_MIN_CELLS and compiler_found() else "cpu"
    if name.startswith("cpu"):
        if name == "cpu+compile" and not compiler_found():
            raise ElmoError("backend cpu+compile: no C++ compiler found (torch.compile's CPU code needs one: "
                            "install g++ or set CXX); use backend cpu or auto")
        return name
    if not fused_fits(T, B, D):
        return "cpu"
    if not triton_installed():
        raise ElmoError(f"backend {name}: Triton is not installed (it comes with the CUDA builds of "
                        "PyTorch); use backend cpu or auto")
    return name


def support_line() -> str:
    """One line on what ``auto`` runs here (``elmo info``)."""
    cuda = "triton on CUDA" if triton_installed() else "cpu on CUDA (Triton not installed)"
    if compiler_found():
        cpu = (f"cpu+compile under bf16 in training and long runs, for layers of {COMPILE_MIN_CELLS}+ "
               "cells (a C++ compiler is found), else cpu")
    else:
        cpu = "cpu (no C++ compiler found, so no cpu+compile)"
    return f"backend auto: {cuda}; on the CPU {cpu}"
