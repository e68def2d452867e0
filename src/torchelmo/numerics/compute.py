"""How a model computes: its precision (:mod:`torchelmo.numerics.precision`) and the backend of its
recurrence (:mod:`torchelmo.numerics.backend`), with whether the work ahead pays for compiling
(``long_run``): settings the model carries, resolved where its device is known and applied in one
scope."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .backend import check_backend
from .precision import Precision, check_precision, resolve_precision


class ComputeSettings:
    """A mixin for a module whose ``device`` property says where it runs: :attr:`precision`,
    :attr:`backend` and :meth:`precision_scope`. Call :meth:`_init_compute` in ``__init__``."""

    device: torch.device

    def _init_compute(self, precision: str, backend: str | None) -> None:
        self._resolved: Precision | None = None
        self.precision = precision   # settable at any time
        self.backend = backend       # None: the backend module's default; settable at any time
        # Enough work lies ahead to pay for compiling loops: backend auto may compile (see
        # torchelmo.numerics.backend). Set by elmo train and by elmo embed for large inputs.
        self.long_run = False

    @property
    def precision(self) -> str:
        """``fp32``, ``tf32``, ``bf16`` or ``auto`` (see :mod:`torchelmo.numerics.precision`)."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        self._precision = check_precision(value)
        self._resolved = None

    @property
    def backend(self) -> str | None:
        """Which implementation runs the recurrence: ``auto``, ``cpu``, ``cpu+compile``, ``triton``,
        ``triton+graphs`` (see :mod:`torchelmo.numerics.backend`), or None for its default."""
        return self._backend

    @backend.setter
    def backend(self, value: str | None) -> None:
        self._backend = None if value is None else check_backend(value)

    def resolved_precision(self) -> Precision:
        """:attr:`precision` resolved for the model's current device (once per device)."""
        device = self.device
        if self._resolved is None or self._resolved.device_type != device.type:
            self._resolved = resolve_precision(self._precision, device)
        return self._resolved

    @contextlib.contextmanager
    def precision_scope(self) -> Iterator[Precision]:
        """The one place torch's switches for the model's precision are set (CUDA's TF32 and
        autocast; none on a CPU, where the precision's name is passed to each component): a
        biLM's ``forward`` and ``run_tokens`` and the language model's loss run inside it. A
        nested entry sets the same switches again, which changes nothing."""
        precision = self.resolved_precision()
        with precision.scope():
            yield precision
