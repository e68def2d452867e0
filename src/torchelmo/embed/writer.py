"""The HDF5 file `elmo embed` writes, guarded: no crash on a failed write, no lost signal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..io.fileio import GuardedWriter, write_error
from ..signals import Interrupts


class GuardedH5:
    """The HDF5 file being written. h5py is only ever called inside ``interrupts.critical()`` (a
    signal there would be swallowed) and through a :class:`GuardedWriter`: a write error, a full
    disk above all, becomes a one-line error instead of a crash inside HDF5."""

    def __init__(self, tmp: Path, output_path: Path, interrupts: Interrupts) -> None:
        self.output_path, self.interrupts = output_path, interrupts
        self.writer = GuardedWriter(tmp)
        self.file = None

    def __enter__(self) -> GuardedH5:
        # h5py's import too: a signal inside an extension's initialisation can leave it half
        # loaded, or make the interpreter exit by SIGINT whatever status the command returns.
        with self.interrupts.critical():
            import h5py
            self.file = h5py.File(self.writer, "w")
        self.check()
        return self

    def check(self) -> None:
        if self.writer.error is not None:
            raise write_error(self.output_path, self.writer.error)

    def write(self, name: str, arr: np.ndarray) -> None:
        with self.interrupts.critical():
            self.file.create_dataset(name, data=arr, dtype="float32")
        self.check()

    def run(self, write: Callable[[Any], object]) -> None:
        """``write(file)``: any other h5py writes (the index, attributes)."""
        with self.interrupts.critical():
            write(self.file)
        self.check()

    def __exit__(self, *exc) -> bool:
        try:
            with self.interrupts.critical():
                if self.file is not None:
                    self.file.close()
        finally:
            self.writer.close()
        if exc[0] is None:
            self.check()   # the close flushes: the last chance for a write to fail
        return False
