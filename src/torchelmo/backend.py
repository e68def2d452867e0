"""Which implementation runs the LSTM recurrence: one named setting, ``BiLM.backend``.

* ``cpu``: the PyTorch paths of :mod:`torchelmo.lstm` (any device; the only one on a CPU).
* ``triton``: the fused Triton recurrence (:mod:`torchelmo.fused`), for CUDA (on a CPU it needs
  Triton's interpreter, ``TRITON_INTERPRET=1``: slow, for tests).
* ``triton+graphs``: the same, and at inference each layer replays as a CUDA graph
  (:mod:`torchelmo.graphs`); with autograd or autocast on, it runs as ``triton``.
* ``auto``: ``triton`` on CUDA when Triton is installed, else ``cpu``.

Whatever is asked, a layer too large for the fused kernels' 32-bit offsets runs ``cpu``. The
setting's default is ``auto``, or ``TORCHELMO_BACKEND`` when set (read once, at first use).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from .errors import ElmoError

BACKENDS = ("auto", "cpu", "triton", "triton+graphs")


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


def fused_fits(T: int, B: int, D: int) -> bool:
    """Whether a layer's buffers (the largest is ``(2, T, B, 4D)``) fit the fused kernels' 32-bit
    offsets; larger ones take the ``cpu`` path."""
    return 2 * T * B * 4 * D < 2**31


def resolve_backend(name: str | None, device_type: str, T: int, B: int, D: int) -> str:
    """The path that runs a layer of ``D`` cells over ``B`` rows and ``T`` steps on ``device_type``:
    ``cpu``, ``triton`` or ``triton+graphs`` (``name=None``: :func:`default_backend`)."""
    name = default_backend() if name is None else check_backend(name)
    if not fused_fits(T, B, D) or name == "cpu":
        return "cpu"
    if name == "auto":
        return "triton" if device_type == "cuda" and triton_installed() else "cpu"
    if not triton_installed():
        raise ElmoError(f"backend {name}: Triton is not installed (it comes with the CUDA builds of "
                        "PyTorch); use backend cpu or auto")
    return name
