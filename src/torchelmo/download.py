"""Cached downloads: a file given by URL is fetched once, checked, and trusted only once checked.

A cache entry is ``KEY-NAME`` plus ``KEY-NAME.sha256``, the digest of the bytes that passed the
checks. Both are written through temporary files; the record first, so an entry never has a
record it does not match. On each use the file is hashed and compared with the record (or with
the digest the caller pins); an entry without its record (a kill between the two renames, an
older cache) is checked again before it is used.

Checks before anything is cached: the byte count equals the Content-Length the server sent; the
pinned SHA-256 when there is one; otherwise the content itself (``verify``, or by the file's
suffix: an ``.hdf5``/``.h5`` file must open and every dataset read in full, a ``.json`` file
must parse). Redirects are followed to http(s) URLs only.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .errors import ElmoError
from .fileio import atomic_path

Verify = Callable[[Path], None]   # raises ElmoError when the file is not what it should be


def cache_dir() -> Path:
    return Path(os.environ.get("ELMO_CACHE", Path.home() / ".cache" / "elmo"))


def offline_mode() -> bool:
    """Whether ``ELMO_OFFLINE`` is set (to anything but empty or 0): the cache only, no network."""
    return os.environ.get("ELMO_OFFLINE", "") not in ("", "0")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_content(path: Path, source: str) -> None:
    """The default ``verify``: an HDF5 file opens and every dataset reads; a JSON file parses."""
    suffix = Path(urllib.parse.urlparse(source).path).suffix.lower()
    if suffix in (".hdf5", ".h5"):
        import h5py

        def read(name, obj) -> None:
            if isinstance(obj, h5py.Dataset):
                obj[()]

        try:
            with h5py.File(path, "r") as f:
                f.visititems(read)
        except (OSError, RuntimeError, ValueError) as e:
            raise ElmoError(f"{source}: the download is not a complete HDF5 file "
                            f"({' '.join(str(e).split())[:120]})") from None
    elif suffix == ".json":
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


def _fetch(url: str, tmp: Path, name: str, progress: bool) -> None:
    """Download ``url`` into ``tmp``; a body shorter or longer than its Content-Length is an error."""
    from tqdm.auto import tqdm

    opener = urllib.request.build_opener(_HttpOnlyRedirects)
    with opener.open(url, timeout=60) as resp:
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        got = 0
        with open(tmp, "wb") as out, tqdm(total=expected, unit="B", unit_scale=True, desc=name,
                                           disable=not progress or not sys.stderr.isatty()) as bar:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
                got += len(chunk)
                bar.update(len(chunk))
    if expected is not None and got != expected:
        raise ElmoError(f"{url}: download cut short: got {got:,} of {expected:,} bytes; nothing was cached")


def _usable(target: Path, digest_file: Path, sha256: str | None, verify: Verify, source: str) -> bool:
    """Whether a cached entry can be used: its digest matches, or (without a record) it passes
    the checks again, and is then recorded."""
    recorded = digest_file.read_text().strip() if digest_file.is_file() else None
    want = sha256 or recorded
    if want is not None:
        return _sha256(target) == want
    try:
        verify(target)
    except ElmoError:
        return False
    with atomic_path(digest_file) as tmp:
        tmp.write_text(_sha256(target) + "\n")
    return True


def cached_path(url_or_path: str | Path, sha256: str | None = None, cache: str | Path | None = None,
                offline: bool | None = None, progress: bool = True, verify: Verify | None = None) -> Path:
    """A local path for a file given as a path or an http(s)/file URL.

    URLs are downloaded once into the cache directory (``$ELMO_CACHE`` or ``~/.cache/elmo``) and
    checked as the module docstring says (``verify`` replaces the check by suffix). With
    ``offline`` (or ``ELMO_OFFLINE=1``) only the cache is used.
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
    verify = verify or (lambda path: check_content(path, s))
    offline = offline_mode() if offline is None else offline
    root = Path(cache) if cache is not None else cache_dir()
    key = hashlib.sha256(s.encode()).hexdigest()[:16]
    target = root / f"{key}-{Path(parsed.path).name or 'download'}"
    digest_file = target.with_name(target.name + ".sha256")
    if target.is_file():
        if _usable(target, digest_file, sha256, verify, s):
            return target
        if offline:
            raise ElmoError(f"{target}: cached copy of {s} fails its checks and offline mode is on")
        target.unlink()
        digest_file.unlink(missing_ok=True)
    if offline:
        raise ElmoError(f"{s}: not in the cache {root} and offline mode is on (ELMO_OFFLINE)")
    try:
        with atomic_path(target) as tmp:
            _fetch(s, tmp, target.name, progress)
            got = _sha256(tmp)
            if sha256 is not None and got != sha256:
                raise ElmoError(f"{s}: checksum mismatch (got sha256 {got}, expected {sha256}); nothing was cached")
            if sha256 is None:
                verify(tmp)
            with atomic_path(digest_file) as dtmp:
                dtmp.write_text(got + "\n")
    except (OSError, http.client.HTTPException) as e:  # URLError, HTTPError, timeouts, cut connections
        raise ElmoError(f"{s}: download failed ({' '.join(str(e).split())[:160]})") from None
    return target
