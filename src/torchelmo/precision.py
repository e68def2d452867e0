"""Precision modes: one option for the Python API, ``elmo embed`` and ``elmo train``.

* ``fp32`` (default): IEEE fp32 everywhere (TF32 off, also for cuDNN's convolutions): equal to
  the CPU path to ~1e-6.
* ``tf32``: matmuls and convolutions may use TF32 tensor cores (CUDA; on CPU it is fp32).
* ``bf16``: matmuls and convolutions run under bfloat16 autocast and the fused recurrence rounds
  its matmul operands to bfloat16; cell state, gates and accumulation stay fp32. On CPU the
  recurrence stays fp32 and the rest runs under CPU autocast.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .errors import ElmoError

PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(value: str, what: str = "precision") -> str:
    if value not in PRECISIONS:
        raise ElmoError(f"{what}: must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


@contextlib.contextmanager
def precision_context(precision: str, device: torch.device) -> Iterator[None]:
    """Set the matmul/convolution precision for the code inside, and restore it after."""
    check_precision(precision)
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
            stack.callback(_restore_tf32, saved)
        if precision == "bf16":
            stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        yield


def _restore_tf32(saved: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
