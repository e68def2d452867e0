"""Where and how the model runs, for every command: ``--device``, ``--threads`` and ``--quiet``.

One set of rules for all commands that run the model (embed, probe, perplexity, train):

* ``--device auto`` (the default) is CUDA when there is a GPU, else the CPU; ``cuda`` without an
  index is this process's GPU (``LOCAL_RANK`` under torchrun); a bad or unavailable device is a
  one-line :class:`~torchelmo.errors.ElmoError` naming the option.
* ``--threads N`` sets torch's CPU threads (N >= 1; default: torch's choice).
* ``-q/--quiet`` hides progress bars but keeps the one-line summary; ``-qq``/``--silent`` hides that
  too (warnings and errors still show).

Messages printed while a progress bar is live go through :func:`bar_safe_output`, so they never
land on the bar's line.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

import torch

from .errors import ElmoError

DEVICE_HELP = "auto (default: CUDA when available, else cpu), cpu, cuda or cuda:N"
THREADS_HELP = ("CPU threads for torch (default: the CPUs this process may use: its affinity, capped by "
                "its cgroup's CPU quota)")


def resolve_device(spec: str | None = "auto", option: str = "--device",
                   local_rank: int | None = None) -> torch.device:
    """The ``torch.device`` for ``spec``; a bad one is an :class:`ElmoError` naming ``option``."""
    spec = "auto" if spec is None else str(spec).strip()
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise ElmoError(f"{option}: unknown device {spec!r} (choose {DEVICE_HELP})") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ElmoError(f"{option} {spec}: MPS is not available on this machine")
        return device
    if device.type != "cuda":
        raise ElmoError(f"{option}: unsupported device {spec!r} (choose {DEVICE_HELP})")
    if not torch.cuda.is_available():
        if torch.version.cuda:   # a CUDA build: the machine has no GPU it can use
            raise ElmoError(f"{option} {spec}: no CUDA GPU is usable on this machine (torch is built for CUDA "
                            f"{torch.version.cuda}, but finds no device or driver); use --device cpu")
        raise ElmoError(f"{option} {spec}: this torch is a CPU-only build "
                        "(use --device cpu, or install a CUDA build of torch)")
    n = torch.cuda.device_count()
    if device.index is None:   # one GPU per torchrun rank
        return torch.device("cuda", local_rank % n)
    if device.index >= n:
        raise ElmoError(f"{option} {spec}: there {'is' if n == 1 else 'are'} only {n} CUDA device(s)")
    return device


def resolve_cuda_device(value: int | str | torch.device, option: str) -> torch.device:
    """AllenNLP's ``cuda_device``: -1 is the CPU, N >= 0 GPU N (anything not an int is a device
    spec for :func:`resolve_device`); errors name ``option``."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < -1:
            raise ElmoError(f"{option} must be -1 (CPU) or a GPU number, got {value}")
        return resolve_device("cpu" if value == -1 else f"cuda:{value}", option)
    return resolve_device(str(value), option)


def _cgroups(proc: str) -> list[tuple[str, str, str]]:
    """``(hierarchy, controllers, path)`` of each line of ``/proc/self/cgroup`` (v2: ``("0", "",
    path)``), or none where it cannot be read."""
    try:
        with open(proc, encoding="ascii", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        out.append((hierarchy, controllers, path))
    return out


def cpu_quota(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> float | None:
    """The CPUs this process's cgroup lets it use (v2 ``cpu.max``: quota / period; v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), or None where no quota is set. A container
    limited to one CPU on a 16-core host looks like 16 cores to torch."""
    for hierarchy, controllers, path in _cgroups(proc):
        try:
            if hierarchy == "0" and controllers == "":
                with open(root + path.rstrip("/") + "/cpu.max", encoding="ascii") as f:
                    quota, period = f.read(64).split()[:2]
                if quota != "max":
                    return int(quota) / int(period)
            elif "cpu" in controllers.split(","):
                base = root + "/" + controllers + path.rstrip("/")
                quota = int(open(base + "/cpu.cfs_quota_us", encoding="ascii").read(64))
                period = int(open(base + "/cpu.cfs_period_us", encoding="ascii").read(64))
                if quota > 0:
                    return quota / period
        except (OSError, ValueError):
            continue
    return None


def default_threads() -> int:
    """The threads torch gets unless told: the CPUs this process may run on (its affinity),
    capped by its cgroup's CPU quota, and never more than torch's own default (the physical
    cores)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    if quota is not None:
        n = min(n, max(1, int(quota)))
    return max(1, min(n, torch.get_num_threads()))


def set_threads(n: int | None, option: str = "--threads") -> None:
    """``torch.set_num_threads(n)``; None: :func:`default_threads`."""
    if n is None:
        n = default_threads()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ElmoError(f"{option} must be a positive integer, got {n!r}")
    torch.set_num_threads(n)


def add_device_args(p, suppress: bool = False) -> None:
    """``--device`` and ``--threads`` on parser (or group) ``p``. ``suppress``: absent flags stay
    out of the namespace (for commands whose config file supplies the defaults)."""
    S = argparse.SUPPRESS
    p.add_argument("--device", default=S if suppress else "auto", help=DEVICE_HELP)
    p.add_argument("--threads", type=int, default=S if suppress else None, help=THREADS_HELP)


def apply_device_args(args) -> torch.device:
    """Check ``args.device``/``args.threads``, set the threads, return the device."""
    set_threads(getattr(args, "threads", None))
    return resolve_device(getattr(args, "device", "auto"))


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_quiet_args(p) -> None:
    """``-q/--quiet`` (count) and ``--silent`` (= ``-qq``) into ``args.quiet``."""
    p.add_argument("-q", "--quiet", action="count", default=0,
                   help="no progress bar (the one-line summary remains); twice (-qq): no summary either")
    p.add_argument("--silent", dest="quiet", action="store_const", const=2,
                   help="print nothing but warnings and errors (same as -qq)")


def show_progress(args) -> bool:
    return not getattr(args, "quiet", 0)


def show_summary(args) -> bool:
    return getattr(args, "quiet", 0) < 2


def write(line: str, file=None) -> None:
    """Print one line without breaking a live progress bar (tqdm clears and redraws it)."""
    from tqdm import tqdm
    tqdm.write(line, file=file or sys.stderr)


class _BarSafeHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            write(self.format(record))
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def bar_safe_output(prefix: str = "elmo") -> Iterator[None]:
    """Route Python warnings and the root logger's console output through :func:`write` while
    active (with no handler configured, WARNING and above, which Python would print anyway)."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        name = "warning" if issubclass(category, UserWarning) else category.__name__
        write(f"{prefix}: {name}: {message}")

    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                and getattr(h, "stream", None) in (sys.stdout, sys.stderr)]
    handler = _BarSafeHandler(min((h.level for h in consoles), default=logging.WARNING))
    if consoles and consoles[0].formatter is not None:
        handler.setFormatter(consoles[0].formatter)
    old = warnings.showwarning
    warnings.showwarning = show
    for h in consoles:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for h in consoles:
            root.addHandler(h)
        warnings.showwarning = old


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(64).strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _cgroup_room(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's memory cgroup allows beyond what it uses (v2 ``memory.max`` minus
    ``memory.current``, or v1's limit minus usage), or None where no limit is set."""
    for hierarchy, controllers, path in _cgroups(proc):
        if hierarchy == "0" and controllers == "":                 # cgroup v2
            base = root + path.rstrip("/")
            limit, used = _read_int(base + "/memory.max"), _read_int(base + "/memory.current")
        elif "memory" in controllers.split(","):                   # cgroup v1
            base = root + "/memory" + path.rstrip("/")
            limit = _read_int(base + "/memory.limit_in_bytes")
            used = _read_int(base + "/memory.usage_in_bytes")
            if limit is not None and limit >= 1 << 60:             # v1 says "no limit" with a huge number
                limit = None
        else:
            continue
        if limit is not None:
            return max(0, limit - (used or 0))
    return None


def _rlimit_room(which: str, status_field: str) -> int | None:
    """Bytes a resource limit (``RLIMIT_AS``, ``RLIMIT_DATA``) leaves this process beyond what it
    maps now (``/proc/self/status``'s VmSize, VmData), or None where unlimited."""
    try:
        import resource
        soft, _ = resource.getrlimit(getattr(resource, which))
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(status_field + ":"):
                    used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(0, soft - used)


def memory_room() -> tuple[int, str] | None:
    """The least memory this process may still take, and which limit sets it: the machine's
    available memory, the memory cgroup's limit (as containers and systemd set it, which the
    kernel enforces by killing the process), or the address-space and data-size limits
    (``ulimit -v``, ``ulimit -d``, which make an allocation fail). None where none is known."""
    rooms = [(available_memory(), "of memory available on this machine"),
             (_cgroup_room(), "left under this process's memory cgroup limit"),
             (_rlimit_room("RLIMIT_AS", "VmSize"), "left under the address-space limit (ulimit -v)"),
             (_rlimit_room("RLIMIT_DATA", "VmData"), "left under the data-size limit (ulimit -d)")]
    known = [(room, what) for room, what in rooms if room is not None]
    return min(known) if known else None


def check_allocation(nbytes: int, what: str) -> None:
    """A one-line error, before anything is allocated, when ``nbytes`` is more than this process
    may take (:func:`memory_room`: the least of the machine's available memory, its cgroup's
    limit and its resource limits): a mistyped size in a config would otherwise allocate until
    the allocation fails with a traceback, or the kernel kills the process without a word."""
    room = memory_room()
    if room is not None and nbytes > room[0]:
        raise ElmoError(f"{what} needs {nbytes / 2**30:.1f} GiB for its parameters, more than the "
                        f"{room[0] / 2**30:.1f} GiB {room[1]}")


# glibc's mallopt parameters. Above the mmap threshold (32 MB at most) a block is a fresh mapping
# whose pages fault in on first touch, again on every allocation: on this project's 2-core
# machines a fault costs microseconds, and a batch's temporaries are many MB.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4


def _mallopt(*settings: tuple[int, int]) -> bool:
    """Set glibc's malloc parameters (Linux with glibc; elsewhere a no-op returning False)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        return all(libc.mallopt(param, value) == 1 for param, value in settings)
    except (OSError, AttributeError):   # not glibc
        return False


def keep_heap() -> bool:
    """The heap policy of training: every allocation from glibc's heap, and what is freed kept.

    A training step allocates the same large temporaries every step (the softmax's logits alone
    are tens of MB); mapped afresh, they faulted in again every step, up to a quarter of a bf16
    training step here (side by side: 2-31% faster, run to run). From the heap they are reused,
    and in a loop of similar steps the heap stays near one step's peak."""
    return _mallopt((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))


def bounded_heap() -> bool:
    """The heap policy of streaming inference (``elmo embed``): blocks up to 4 MB from the heap,
    larger ones mapped; at most 1 MB of free heap kept.

    Left to itself, glibc raises its mmap threshold each time a large block is freed, and then
    rarely gives the heap's free space back: peak memory crept up window after window. Fixed
    thresholds stop that. At the 128 KB default mmap threshold every batch buffer was mapped
    afresh; up to 4 MB from the heap was about 10% faster at the same flat peak, while higher
    thresholds let peak memory grow with the input again."""
    return _mallopt((M_MMAP_THRESHOLD, 4 * 2**20), (M_TRIM_THRESHOLD, 2**20))


def copy_to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a host tensor goes to a CUDA device from pinned memory, without
    blocking the host."""
    if torch.device(device).type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), for records of where a run ran."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
