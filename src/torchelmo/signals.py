"""Ctrl-C (SIGINT) and SIGTERM that always stop a run, and never inside a library call that
would swallow them; and, once a command's result is complete, never undo it.

A KeyboardInterrupt raised while h5py is inside its C code (closing an object, flushing) is
printed as "Exception ignored" and lost: the run goes on to finish as if nothing happened. Within
:class:`Interrupts`, both signals raise KeyboardInterrupt at once, except inside
:meth:`Interrupts.critical`, where they are held until the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    def __init__(self) -> None:
        self.pending: int | None = None
        self._depth = 0
        self._old: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():   # elsewhere signals cannot be set
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        return False

    def _handle(self, signum, frame) -> None:
        if self._depth:
            self.pending = signum
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A section that a signal does not cut: one that arrives is raised when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self.pending is not None:
                self.pending = None
                raise KeyboardInterrupt


# Once a command's result is complete (its output renamed into place), a signal can no longer
# undo it: the command says so here, and the command line then reports success whatever arrives.
_work_done = False


def mark_done() -> None:
    """The running command's result is complete: a Ctrl-C or SIGTERM from now on changes nothing."""
    global _work_done
    _work_done = True


def work_done() -> bool:
    return _work_done


def reset() -> None:
    """A new command starts (the command line calls this)."""
    global _work_done
    _work_done = False


def ignore_from_now() -> None:
    """Ignore SIGINT and SIGTERM for the rest of the process: its exit status is decided."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
