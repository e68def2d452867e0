"""Cached downloads: a file given by URL is fetched once, checked, and trusted only once checked.

A cache entry is ``KEY-NAME`` plus ``KEY-NAME.sha256``, the digest of the bytes that passed the
checks. Both are written through temporary files, the record first, so a kill between the two
renames leaves a record without its file (harmless: the next use fetches the file), never a file
without its record.

Trust on use:

- With a digest pinned by the caller (the registry's, or ``sha256=``), the file is hashed and
  compared with that digest; the record plays no part.
- Otherwise the file is hashed and compared with its record.
- A file without its record (written by an older version, or its record deleted) is never
  trusted on its content alone: a well-formed but altered file would pass any content check. It
  is fetched again (and checked as a new download); offline it is an error that says so.

The record detects damage (a truncated or altered file); it is no defence against someone who
can write the cache directory, who could rewrite both. Pinned digests are.

Checks before anything is cached, in order:

- the download ends within ``deadline`` seconds in all (``$ELMO_DOWNLOAD_DEADLINE``, default
  3600), whatever the server does (a server trickling a byte at a time is cut off), and holds at
  most ``max_bytes`` (``$ELMO_DOWNLOAD_MAX_BYTES``, default 2 GiB): a larger Content-Length is
  refused before the body is read, and a body that grows past the limit is cut off;
- the byte count equals the Content-Length the server sent;
- the body is not empty and not an HTML page (an error or login page served with status 200);
- the pinned SHA-256 when there is one; otherwise the content, as the caller will load it:
  ``verify`` (the caller's own load, e.g. the registry's check of every dataset the options ask
  for), else ``kind`` (``"hdf5"``: the file opens and every dataset reads in full; ``"json"``: it
  parses). Only a caller that says neither gets a guess: from the URL's suffix (``.hdf5``/``.h5``,
  ``.json``), else from the content (the HDF5 signature).

Redirects are followed to http(s) URLs only.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..errors import ElmoError
from .fileio import atomic_path

Verify = Callable[[Path], None]   # raises ElmoError when the file is not what it should be

DEFAULT_DEADLINE = 3600.0          # seconds for one download, all of it
DEFAULT_MAX_BYTES = 2 << 30        # the largest published file is about 0.4 GB
READ_TIMEOUT = 60.0                # seconds without a byte before a connection counts as dead
KINDS = ("hdf5", "json")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def cache_dir() -> Path:
    return Path(os.environ.get("ELMO_CACHE", Path.home() / ".cache" / "elmo"))


def offline_mode() -> bool:
    """Whether ``ELMO_OFFLINE`` is set (to anything but empty or 0): the cache only, no network."""
    return os.environ.get("ELMO_OFFLINE", "") not in ("", "0")


def _env_number(name: str, default: float, cast=float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        value = None
    if value is None or not value > 0 or value != value or value == float("inf"):
        raise ElmoError(f"{name}={raw!r}: expected a positive number")
    return value


def download_deadline() -> float:
    """Seconds a download may take in all: ``$ELMO_DOWNLOAD_DEADLINE`` or 3600."""
    return _env_number("ELMO_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE)


def download_max_bytes() -> int:
    """The largest download accepted: ``$ELMO_DOWNLOAD_MAX_BYTES`` or 2 GiB."""
    return int(_env_number("ELMO_DOWNLOAD_MAX_BYTES", DEFAULT_MAX_BYTES, int))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _suffix_kind(source: str) -> str | None:
    suffix = Path(urllib.parse.urlparse(source).path).suffix.lower()
    return {".hdf5": "hdf5", ".h5": "hdf5", ".json": "json"}.get(suffix)


def _head(path: Path, n: int = 512) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def check_markup(path: Path, source: str) -> None:
    """Refuse an empty body or an HTML page: what a server sends as an error or login page with
    status 200 is never a model file."""
    head = _head(path).lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if not head:
        raise ElmoError(f"{source}: the download is empty; nothing was cached")
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        raise ElmoError(f"{source}: the server sent an HTML page, not the file; nothing was cached")


def check_content(path: Path, source: str, kind: str | None = None) -> None:
    """The content check of ``kind`` (``"hdf5"``: opens, every dataset reads; ``"json"``: parses).
    Without one: the URL's suffix, else the HDF5 signature, decides; a file of no known kind
    passes. An HDF5 file's datasets are sized from their declarations before any is read: more
    than twice the file's bytes (plus 1 MiB) means compressed or unwritten data that would unfold
    in memory (weights are stored as they are), and is refused."""
    if kind is not None and kind not in KINDS:
        raise ElmoError(f"cached_path: kind must be one of {', '.join(KINDS)} or None, got {kind!r}")
    kind = kind or _suffix_kind(source) or ("hdf5" if _head(path, 8) == HDF5_SIGNATURE else None)
    if kind == "hdf5":
        import h5py

        datasets: list = []

        def collect(name, obj) -> None:
            if isinstance(obj, h5py.Dataset):
                datasets.append(obj)

        declared, allowed = 0, 2 * path.stat().st_size + 2**20
        try:
            with h5py.File(path, "r") as f:
                f.visititems(collect)
                declared = sum(int(d.size) * d.dtype.itemsize for d in datasets)
                if declared <= allowed:
                    for d in datasets:
                        d[()]
        except (OSError, RuntimeError, ValueError) as e:
            raise ElmoError(f"{source}: the download is not a complete HDF5 file "
                            f"({' '.join(str(e).split())[:120]})") from None
        if declared > allowed:
            raise ElmoError(f"{source}: the download declares {declared:,} bytes of data in a file of "
                            f"{path.stat().st_size:,} (compressed or unwritten datasets); refused before reading them")
    elif kind == "json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ElmoError(f"{source}: the download is not valid JSON ({e})") from None


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def http_error_302(self, req, fp, code, msg, headers):
        target = urllib.parse.urljoin(req.full_url, headers.get("Location") or headers.get("URI") or "")
        scheme = urllib.parse.urlparse(target).scheme.lower()
        if scheme not in ("http", "https"):
            raise ElmoError(f"{req.full_url}: refused a redirect to {target!r} (only http and https "
                            "are followed)")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Watchdog:
    """Ends a download at its deadline: every connection it opens is recorded, and when the time
    is up their sockets are shut down, which ends any read or write blocked on them."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.expired = seconds, False
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            for conn in self._conns:
                _shut(conn)

    def track(self, http_class):
        watch = self

        class Tracked(http_class):
            def connect(self) -> None:
                with watch._lock:
                    watch._conns.append(self)
                super().connect()
                with watch._lock:
                    if watch.expired:
                        _shut(self)

        return Tracked

    def handlers(self) -> list:
        watch = self

        class HTTP(urllib.request.HTTPHandler):
            def do_open(self, http_class, req, **kw):
                return super().do_open(watch.track(http_class), req, **kw)

        class HTTPS(urllib.request.HTTPSHandler):
            def do_open(self, http_class, req, **kw):
                return super().do_open(watch.track(http_class), req, **kw)

        return [HTTP(), HTTPS()]


def _shut(conn) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _fetch(url: str, tmp: Path, name: str, progress: bool, deadline: float, max_bytes: int) -> None:
    """Download ``url`` into ``tmp`` within ``deadline`` seconds and ``max_bytes``; a body shorter
    or longer than its Content-Length is an error."""
    from tqdm.auto import tqdm

    with _Watchdog(deadline) as watch:
        opener = urllib.request.build_opener(_HttpOnlyRedirects, *watch.handlers())
        try:
            with opener.open(url, timeout=min(READ_TIMEOUT, deadline)) as resp:
                length = resp.headers.get("Content-Length")
                expected = int(length) if length and length.isdigit() else None
                if expected is not None and expected > max_bytes:
                    raise ElmoError(f"{url}: the server announces {expected:,} bytes, over the limit of "
                                    f"{max_bytes:,} (ELMO_DOWNLOAD_MAX_BYTES); nothing was downloaded")
                got = 0
                with open(tmp, "wb") as out, tqdm(total=expected, unit="B", unit_scale=True, desc=name,
                                                   disable=not progress or not sys.stderr.isatty()) as bar:
                    for chunk in iter(lambda: resp.read1(1 << 20), b""):
                        got += len(chunk)
                        if got > max_bytes:
                            raise ElmoError(f"{url}: cut off at {max_bytes:,} bytes, the limit "
                                            "(ELMO_DOWNLOAD_MAX_BYTES); nothing was cached")
                        out.write(chunk)
                        bar.update(len(chunk))
                        if watch.expired:
                            break
        except (OSError, http.client.HTTPException):
            if not watch.expired:
                raise
        if watch.expired:
            raise ElmoError(f"{url}: the download did not finish within its deadline of {deadline:g} s "
                            "(ELMO_DOWNLOAD_DEADLINE); nothing was cached")
    if expected is not None and got != expected:
        raise ElmoError(f"{url}: download cut short: got {got:,} of {expected:,} bytes; nothing was cached")


def _usable(target: Path, digest_file: Path, sha256: str | None) -> bool:
    """Whether a cached entry can be used: it matches the pinned digest, or else its record. An
    entry without a record is not trusted on its content alone (see the module docstring)."""
    want = sha256 or (digest_file.read_text().strip() if digest_file.is_file() else None)
    return want is not None and _sha256(target) == want


def _entry(url: str, cache: str | Path | None) -> tuple[Path, Path]:
    """A URL's cache entry: the file and its digest record."""
    root = Path(cache) if cache is not None else cache_dir()
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = root / f"{key}-{Path(urllib.parse.urlparse(url).path).name or 'download'}"
    return target, target.with_name(target.name + ".sha256")


def seed_cache(url: str, local_file: str | Path, sha256: str | None = None, cache: str | Path | None = None,
               verify: Verify | None = None, kind: str | None = None) -> Path:
    """Put ``local_file`` into the cache as the download of ``url``, checked as a download would be
    (the pinned ``sha256``, else ``verify`` or ``kind``): a machine without network, or code that
    names a model only by its URL (flair's named ELMo models), then finds it there, offline too.
    Each file is checked alone: for a published model's pair, ``BiLM.seed_published`` checks that
    the weights fit the options before caching either."""
    src = Path(local_file)
    if not src.is_file():
        raise ElmoError(f"{src}: file not found")
    if urllib.parse.urlparse(url).scheme not in ("http", "https"):
        raise ElmoError(f"{url}: not an http(s) URL")
    check_markup(src, str(src))
    got = _sha256(src)
    if sha256 is not None and got != sha256:
        raise ElmoError(f"{src}: checksum mismatch for {url} (got sha256 {got}, expected {sha256})")
    if sha256 is None:
        (verify or (lambda path: check_content(path, url, kind)))(src)
    target, digest_file = _entry(url, cache)
    with atomic_path(digest_file) as dtmp:
        dtmp.write_text(got + "\n")
    with atomic_path(target) as tmp:
        shutil.copyfile(src, tmp)
    return target


def cached_path(url_or_path: str | Path, sha256: str | None = None, cache: str | Path | None = None,
                offline: bool | None = None, progress: bool = True, verify: Verify | None = None,
                kind: str | None = None, deadline: float | None = None,
                max_bytes: int | None = None) -> Path:
    """A local path for a file given as a path or an http(s)/file URL.

    URLs are downloaded once into the cache directory (``$ELMO_CACHE`` or ``~/.cache/elmo``) and
    checked as the module docstring says: ``verify`` (the caller's load of the file) or ``kind``
    (``"hdf5"``, ``"json"``: what the caller will load) decide the content check; ``deadline``
    (seconds, all of the download) and ``max_bytes`` default to ``$ELMO_DOWNLOAD_DEADLINE`` (3600)
    and ``$ELMO_DOWNLOAD_MAX_BYTES`` (2 GiB). With ``offline`` (or ``ELMO_OFFLINE=1``) only the
    cache is used.
    """
    s = str(url_or_path)
    parsed = urllib.parse.urlparse(s)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and sys.platform == "win32"):
        p = Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else Path(s)
        if not p.exists():
            raise ElmoError(f"{p}: file not found")
        return p
    if parsed.scheme not in ("http", "https"):
        raise ElmoError(f"{s}: unsupported URL scheme {parsed.scheme!r}")
    if kind is not None and kind not in KINDS:
        raise ElmoError(f"cached_path: kind must be one of {', '.join(KINDS)} or None, got {kind!r}")
    deadline = download_deadline() if deadline is None else float(deadline)
    max_bytes = download_max_bytes() if max_bytes is None else int(max_bytes)
    if not deadline > 0 or max_bytes < 1:
        raise ElmoError(f"cached_path: deadline and max_bytes must be positive, got {deadline!r}, {max_bytes!r}")
    offline = offline_mode() if offline is None else offline
    target, digest_file = _entry(s, cache)
    if target.is_file():
        if _usable(target, digest_file, sha256):
            return target
        if offline:
            why = "fails its checks" if sha256 or digest_file.is_file() else \
                "has no digest record, so it cannot be trusted (go online once to fetch it again)"
            raise ElmoError(f"{target}: cached copy of {s} {why} and offline mode is on")
        target.unlink()
        digest_file.unlink(missing_ok=True)
    if offline:
        raise ElmoError(f"{s}: not in the cache {target.parent} and offline mode is on (ELMO_OFFLINE)")
    try:
        with atomic_path(target) as tmp:
            _fetch(s, tmp, target.name, progress, deadline, max_bytes)
            check_markup(tmp, s)
            got = _sha256(tmp)
            if sha256 is not None and got != sha256:
                raise ElmoError(f"{s}: checksum mismatch (got sha256 {got}, expected {sha256}); nothing was cached")
            if sha256 is None:
                (verify or (lambda path: check_content(path, s, kind)))(tmp)
            with atomic_path(digest_file) as dtmp:
                dtmp.write_text(got + "\n")
    except (OSError, http.client.HTTPException) as e:  # URLError, HTTPError, timeouts, cut connections
        raise ElmoError(f"{s}: download failed ({' '.join(str(e).split())[:160]})") from None
    return target
