"""Atomic file writes: a crash or kill never leaves a truncated file under the final name.

A file is written as ``.NAME.HOST.PID.RANDOM.tmp`` beside ``NAME`` and renamed when complete. A
process killed before the rename (SIGKILL, power loss) leaves its temporary file behind; the next
write of the same ``NAME`` removes those whose process is gone (same host, PID no longer
running), and files of the older ``.NAME.RANDOM.tmp`` naming untouched for an hour.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import ElmoError

LEGACY_STALE_SECONDS = 3600


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:       # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files that dead writers of ``path`` left beside it; returns them."""
    path = Path(path)
    prefix = f".{path.name}."
    host, removed = _host(), []
    try:
        candidates = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for p in candidates:
        middle = p.name[len(prefix):-len(".tmp")]
        parts = middle.split(".")
        try:
            if len(parts) == 3 and parts[1].isdigit():
                stale = parts[0] == host and not _pid_running(int(parts[1]))
            else:   # the older naming, with no owner recorded: judged by age
                stale = len(parts) == 1 and time.time() - p.stat().st_mtime > LEGACY_STALE_SECONDS
            if stale and p.is_file():
                p.unlink()
                removed.append(p)
        except OSError:   # removed meanwhile, or not ours to remove
            continue
    return removed


def write_error(path: str | Path, e: OSError, what: str = "cannot write") -> ElmoError:
    """The one-line error for a failed write (a full disk, a read-only directory)."""
    reason = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; nothing was written"
    return ElmoError(f"{path}: {what}: {reason}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``,
    on any exception (KeyboardInterrupt included) it is removed. Checked before anything is
    computed: ``path`` is not a directory, and its directory is writable."""
    path = Path(path)
    if path.is_dir():
        raise ElmoError(f"{path}: is a directory; give a file name to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_host()}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise write_error(path, e) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        try:
            # mkstemp makes the file owner-only, and some writers (safetensors) replace the file
            # with their own: give the result the permissions a plain open() would.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)
            with open(tmp_path, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp_path, path)
        except OSError as e:
            raise write_error(path, e) from None
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


class GuardedWriter:
    """A binary file for writers that cannot take a failed write (h5py: after one, HDF5's state
    is broken and closing the file can crash the process). The first ``OSError`` is kept in
    ``error`` and every write, that one included, reports success; the caller checks ``error``
    after each unit of work and abandons the file."""

    def __init__(self, path: str | Path) -> None:
        self.file = open(path, "w+b", buffering=0)
        self.error: OSError | None = None

    def write(self, data) -> int:
        if self.error is None:
            view = memoryview(data).cast("B")
            try:
                while view:
                    view = view[self.file.write(view):]
            except OSError as e:
                self.error = e
        return memoryview(data).nbytes

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self.file.truncate(size)
            except OSError as e:
                self.error = e
        return self.file.tell() if size is None else size

    def __getattr__(self, name):   # read, seek, tell, flush
        return getattr(self.file, name)

    def close(self) -> None:
        self.file.close()
