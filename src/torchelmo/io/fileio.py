"""Atomic file writes: a crash or kill never leaves a truncated file under the final name.

A file is written as ``.NAME.HOST.PID.RANDOM.tmp`` beside ``NAME`` and renamed when complete.
For its whole life the writer holds a lock on that temporary file: an open-file-description lock
(``fcntl`` ``F_OFD_SETLK``, Linux), which the kernel drops when the writer's process ends however
it ends, and which, unlike ``flock``, does not collide with the lock HDF5 takes on the same file.

A process killed before the rename (SIGKILL, power loss) leaves its temporary file behind; the
next write of the same ``NAME`` removes it when its writer is gone, judged by a test that a
writer in another PID namespace sharing the volume (containers with the same host name) cannot
fail: the sweep removes a temporary file of this host only if it can take the file's lock itself
(no live writer holds it) and, for writers of older versions that held no lock, the PID in its
name is not running here. Files of other hosts are never touched (their locks may not reach this
machine). Where the lock is unavailable (not Linux, or a file system without it), the rule is the
older one: same host and PID no longer running. Files of the still older ``.NAME.RANDOM.tmp``
naming are removed when untouched for an hour.

:func:`read_json` is the one reader of the small JSON files (options, configs, model
descriptions): every way such a file can be unreadable is a one-line error naming it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ElmoError

LEGACY_STALE_SECONDS = 3600

try:
    import fcntl
except ImportError:   # Windows
    fcntl = None

# struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (and padding); l_len 0 is
# the whole file, and l_pid must be 0 for an open-file-description lock.
_OFD = fcntl is not None and hasattr(fcntl, "F_OFD_SETLK") and sys.maxsize > 2**32


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


def lock_file(fd: int) -> bool | None:
    """Take the writer's lock on an open file, without waiting: True when taken, False when
    another open file holds it, None where such locks are unavailable (then liveness falls back
    to host and PID). The lock lasts until ``fd`` is closed (or its process ends)."""
    if not _OFD:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        return None       # EINVAL, ENOLCK: not on this kernel or file system
    return True


def _stale(p: Path, pid: int) -> bool:
    """Whether the temporary file ``p`` of this host, written by process ``pid``, has no live
    writer; if so it is removed (under its lock, where there is one)."""
    try:
        fd = os.open(p, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:       # gone meanwhile, a link, or not ours to open
        return False
    try:
        if lock_file(fd) is False:   # a live writer holds it, whatever its PID looks like from here
            return False
        if _pid_running(pid):        # a writer of an older version (no lock), or a reused PID
            return False
        p.unlink()
        return True
    finally:
        os.close(fd)


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
                if parts[0] == host and p.is_file() and not p.is_symlink() and _stale(p, int(parts[1])):
                    removed.append(p)
            elif len(parts) == 1 and time.time() - p.stat().st_mtime > LEGACY_STALE_SECONDS and p.is_file():
                # the older naming, with no owner recorded: judged by age
                p.unlink()
                removed.append(p)
        except OSError:   # removed meanwhile, or not ours to remove
            continue
    return removed


NAME_MAX = 255     # bytes in one component of a path (Linux, macOS, Windows: 255)
PATH_MAX = 4096    # bytes in a whole path (Linux)


def check_path_name(name: str | Path, what: str = "") -> None:
    """A one-line error for a name no file can have, before the first ``stat`` of it raises
    ``OSError`` (``ENAMETOOLONG``) or ``ValueError`` (a NUL byte): a component over 255 bytes, or
    a whole path of 4,096 bytes or more. ``what`` prefixes the reason (``"model name"``)."""
    text = str(name)
    shown = text if len(text) <= 80 else f"{text[:40]}...{text[-30:]} ({len(text):,} characters)"
    prefix = f"{what}: " if what else ""
    if "\0" in text:
        raise ElmoError(f"{shown}: {prefix}holds a NUL character, which no file name can")
    try:
        raw = os.fsencode(text)
    except UnicodeError:
        raw = text.encode("utf-8", "surrogatepass")
    longest = max((raw.replace(b"\\", b"/") if os.sep == "\\" else raw).split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise ElmoError(f"{shown}: {prefix}a path component of {len(longest):,} bytes, longer than the "
                        f"{NAME_MAX} a file name can have")
    if len(raw) >= PATH_MAX:
        raise ElmoError(f"{shown}: {prefix}a path of {len(raw):,} bytes, longer than the {PATH_MAX - 1} "
                        "a path can have")


def check_destination(path: str | Path, directory: bool = False) -> None:
    """Check, before any work, that ``path`` can be written: a file (or, ``directory``, a
    directory) not in the way, and the nearest existing directory on its way writable. A one-line
    :class:`ElmoError` naming ``path`` otherwise; nothing is created."""
    check_path_name(path)
    path = Path(path)
    if path.is_dir() and not directory:
        raise ElmoError(f"{path}: is a directory; give a file name to write")
    if path.exists() and not path.is_dir() and directory:
        raise ElmoError(f"{path}: is a file; give a directory to write")
    place = path if path.is_dir() else path.parent
    while not place.exists() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise write_error(path, OSError(errno.ENOTDIR, f"{place} is not a directory"))
    try:
        read_only = bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):   # no statvfs (Windows)
        read_only = False
    if read_only:
        raise write_error(path, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    if not os.access(place, os.W_OK | os.X_OK):
        raise write_error(path, OSError(errno.EACCES, f"{os.strerror(errno.EACCES)} ({place})"))


# What a small file the library parses (options, configs, ELMoForManyLangs' dictionaries) may
# weigh: far above any real one, far below what would exhaust a machine's memory.
SMALL_FILE_CAP = 256 * 2**20
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | Path, what: str, cap: int = SMALL_FILE_CAP) -> int:
    """A read-only descriptor of ``path`` (the caller closes it), which must be a regular file of
    at most ``cap`` bytes: a FIFO, a device or a directory is refused at once (a FIFO is opened
    without waiting for a writer), and so is a file whose size, sparse or not, is over the cap."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ElmoError(f"{path}: no such {what}") from None
    except OSError as e:
        raise ElmoError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise ElmoError(f"{path}: {kind}, not a regular file; a {what} must be one")
        if st.st_size > cap:
            raise ElmoError(f"{path}: {st.st_size:,} bytes, over the {cap:,} a {what} may have")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path: str | Path, what: str, cap: int = SMALL_FILE_CAP) -> bytes:
    """The bytes of a small file the library parses, read in one pass: :func:`open_regular`'s
    checks, and no more than ``cap`` bytes even where the file grows while it is read."""
    fd = open_regular(path, what, cap)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError as e:
        raise ElmoError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise ElmoError(f"{path}: over the {cap:,} bytes a {what} may have")
    return data


def refused_global(e: Exception) -> str | None:
    """The Python object a ``torch.load(..., weights_only=True)`` refused to build (``posix.system``,
    say), from its error, or None where the file failed for another reason (a damaged pickle).
    torch before 2.13 says "Unsupported global: GLOBAL os.system"; 2.13 "unsupported GLOBAL
    posix.system"; others "GLOBAL x.y was not an allowed global"."""
    found = re.search(r"(?i)unsupported (?:global:? )?GLOBAL ([\w.]+)", str(e)) or \
        re.search(r"GLOBAL ([A-Za-z_][\w.]*\.[A-Za-z_]\w*) was not an allowed global", str(e))
    return found.group(1) if found else None


def read_json(path: str | Path, what: str = "JSON file", expect: type | None = dict) -> Any:
    """The JSON value in ``path``; a missing or unreadable file, one that is not a regular file
    or is over :data:`SMALL_FILE_CAP` (:func:`read_small`), bytes that are not UTF-8, text that
    is not JSON, or (``expect``) a value of another type is an :class:`ElmoError` naming the
    file and calling it ``what``."""
    path = Path(path)
    try:
        text = read_small(path, what).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ElmoError(f"{path}: not UTF-8 text (byte {e.start}); a {what} is JSON") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ElmoError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if expect is not None and not isinstance(value, expect):
        got = {dict: "an object", list: "an array", str: "a string", bool: "true or false", int: "a number",
               float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
        want = {dict: "object", list: "array", str: "string"}.get(expect, expect.__name__)
        raise ElmoError(f"{path}: a {what} must be a JSON {want}, got {got}")
    return value


def own_directory(path: str | Path) -> Path:
    """A directory the library owns inside one the user named (a run's ``best/``, a spaCy
    pipeline's model folder), made if missing. A symbolic link found there is removed, not
    written through: what it points to is left alone."""
    path = Path(path)
    try:
        if path.is_symlink():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(path, e) from None
    return path


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
    check_path_name(path)
    path = Path(path)
    if path.is_dir():
        raise ElmoError(f"{path}: is a directory; give a file name to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        fd, tmp_path = _locked_temporary(path)
    except OSError as e:
        raise write_error(path, e) from None
    try:
        yield tmp_path
        try:
            fd = _relock(tmp_path, fd)
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
    finally:
        if fd is not None:
            os.close(fd)


def _locked_temporary(path: Path) -> tuple[int | None, Path]:
    """A new temporary file beside ``path``, open and locked (where locks are unavailable: closed,
    and None for the descriptor, so that nothing holds it open). A sweep may have taken the lock of
    a file just created, between its creation and its locking: then another file is made, and
    this one removed if the sweep did not remove it."""
    for _ in range(100):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_host()}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
        locked = lock_file(fd)
        if locked is None:
            os.close(fd)
            return None, Path(tmp)
        try:
            ours = os.path.samestat(os.fstat(fd), os.stat(tmp))
            if locked and ours:
                return fd, Path(tmp)
            if ours:
                os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(errno.EAGAIN, "cannot create and lock a temporary file beside it")


def _relock(tmp_path: Path, fd: int | None) -> int | None:
    """The lock again, on the file now at ``tmp_path``, if a writer replaced the file (safetensors
    writes its own and renames it over the temporary one): the lock must cover what is renamed."""
    if fd is None:
        return None
    try:
        if os.path.samestat(os.fstat(fd), os.stat(tmp_path)):
            return fd
        new = os.open(tmp_path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return fd          # the rename reports what is wrong
    if lock_file(new) is False:
        os.close(new)
        return fd
    os.close(fd)
    return new


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
