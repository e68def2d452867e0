"""Downloads, from a server on 127.0.0.1: checked before they are cached and when they are used,
with a deadline and a size limit, never cut short or redirected into the cache (docs/reliability.md)."""

import hashlib
import http.server
import threading
import time
from pathlib import Path

import h5py
import pytest
import torch

from helpers import tiny_published
from torchelmo.errors import ElmoError

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


def serve(handler) -> tuple[http.server.ThreadingHTTPServer, str]:
    """``handler`` served on 127.0.0.1 by daemon threads: the server (to shut down) and its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


# Downloads, from a server on 127.0.0.1.
@pytest.fixture
def server():
    """``(base_url, routes)``: ``routes[path] = (status, headers, body)``; a Content-Length
    header given in ``headers`` is sent as is (a lie, to cut a download short)."""
    routes: dict[str, tuple[int, dict, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, headers, body = routes.get(self.path, (404, {}, b""))
            self.send_response(status)
            headers = {"Content-Length": str(len(body)), **headers}
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd, url = serve(Handler)
    yield url, routes
    httpd.shutdown()
    httpd.server_close()


def _cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_a_cut_off_download_is_never_cached(tmp_path, server):
    from torchelmo.io.download import cached_path
    base, routes = server
    _, weights = tiny_published(tmp_path)
    body = weights.read_bytes()
    routes["/w.hdf5"] = (200, {"Content-Length": str(len(body))}, body[: len(body) // 2])
    cache = tmp_path / "cache"
    with pytest.raises(ElmoError, match=f"cut short: got {len(body) // 2:,} of {len(body):,} bytes"):
        cached_path(f"{base}/w.hdf5", cache=cache, progress=False)
    assert _cache_files(cache) == []
    # Cut at the length the server announces: only the content check can tell.
    routes["/w.hdf5"] = (200, {}, body[: len(body) // 2])
    with pytest.raises(ElmoError, match="not a complete HDF5 file"):
        cached_path(f"{base}/w.hdf5", cache=cache, progress=False)
    assert _cache_files(cache) == []
    routes["/w.hdf5"] = (200, {}, body)
    path = cached_path(f"{base}/w.hdf5", cache=cache, progress=False)
    assert path.read_bytes() == body and _cache_files(cache) == [path.name, path.name + ".sha256"]


def test_cache_entries_are_checked_on_use(tmp_path, server):
    from torchelmo.io.download import cached_path
    base, routes = server
    _, weights = tiny_published(tmp_path)
    body = weights.read_bytes()
    routes["/w.hdf5"] = (200, {}, body)
    cache = tmp_path / "cache"
    path = cached_path(f"{base}/w.hdf5", cache=cache, progress=False)
    record = path.with_name(path.name + ".sha256")
    path.write_bytes(body[:100])                      # damaged after caching: fetched again
    assert cached_path(f"{base}/w.hdf5", cache=cache, progress=False).read_bytes() == body
    record.unlink()
    path.write_bytes(body[:100])                      # no record: checked, found bad, fetched again
    assert cached_path(f"{base}/w.hdf5", cache=cache, progress=False).read_bytes() == body
    assert record.is_file()
    with pytest.raises(ElmoError, match="fails its checks and offline mode is on"):
        path.write_bytes(body[:100])
        cached_path(f"{base}/w.hdf5", cache=cache, progress=False, offline=True)
    with pytest.raises(ElmoError, match="checksum mismatch"):
        cached_path(f"{base}/w.hdf5", sha256="0" * 64, cache=tmp_path / "c2", progress=False)
    assert _cache_files(tmp_path / "c2") == []


def test_a_change_past_the_first_mib_of_a_cached_file_is_caught(tmp_path, server):
    # The checks cover the whole file: a digest of a prefix would pass every fixture under 1 MiB.
    import hashlib

    import h5py
    import numpy as np

    from torchelmo.io.download import cached_path
    base, routes = server
    src = tmp_path / "big.hdf5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(800_000, dtype=np.float32)             # 3.2 MB
    body = src.read_bytes()
    assert len(body) > 3 * 2**20
    routes["/big.hdf5"] = (200, {}, body)
    cache = tmp_path / "cache"
    path = cached_path(f"{base}/big.hdf5", cache=cache, progress=False, kind="hdf5")
    data = bytearray(path.read_bytes())
    data[-4096] ^= 0xFF                                            # one byte, past 3 MiB, same size
    path.write_bytes(bytes(data))
    with pytest.raises(ElmoError, match="fails its checks and offline mode is on"):
        cached_path(f"{base}/big.hdf5", cache=cache, progress=False, offline=True, kind="hdf5")
    pinned = hashlib.sha256(bytes(data)).hexdigest()               # the digest of the tampered copy
    with pytest.raises(ElmoError, match="checksum mismatch"):
        cached_path(f"{base}/big.hdf5", sha256=pinned, cache=tmp_path / "c2", progress=False, kind="hdf5")


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/w.hdf5"])
def test_redirects_to_other_schemes_are_refused(tmp_path, server, location):
    from torchelmo.io.download import cached_path
    base, routes = server
    routes["/w.hdf5"] = (302, {"Location": location}, b"")
    with pytest.raises(ElmoError, match="refused a redirect"):
        cached_path(f"{base}/w.hdf5", cache=tmp_path / "cache", progress=False)
    assert _cache_files(tmp_path / "cache") == []


def test_unpinned_registry_weights_are_checked_against_their_options(tmp_path, server, monkeypatch):
    import h5py

    from torchelmo import BiLM
    from torchelmo.model import registry as R
    from torchelmo.model import weights as W
    base, routes = server
    options, weights = tiny_published(tmp_path)
    good = weights.read_bytes()
    with h5py.File(weights, "r+") as f:   # a complete HDF5 file, one dataset short
        del f["CNN_proj/b_proj"]
    routes["/o.json"] = (200, {}, options.read_bytes())
    routes["/w.hdf5"] = (200, {}, weights.read_bytes())
    name = "2x1024_128_2048cnn_1xhighway"
    monkeypatch.setitem(R.REGISTRY, name, {"options": f"{base}/o.json", "weights": f"{base}/w.hdf5",
                                           "options_sha256": None, "weights_sha256": None})
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ELMO_OFFLINE", raising=False)
    check = lambda config, path: W.load_published_weights(BiLM(config), path)  # noqa: E731  (as BiLM's)
    with pytest.raises(ElmoError, match="missing dataset 'CNN_proj/b_proj'"):
        R.resolve_published("small", check)
    assert not any(p.name.endswith("w.hdf5") for p in (tmp_path / "cache").iterdir())
    routes["/w.hdf5"] = (200, {}, good)
    _, path = R.resolve_published("small", check)
    assert path.read_bytes() == good


# Downloads: the check of what the caller loads, the record, a deadline and a size limit.
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please log in</body></html>\n"


def test_a_download_gets_the_check_of_what_the_caller_loads_whatever_its_url(tmp_path, server, monkeypatch):
    from torchelmo import BiLM
    from torchelmo.io.download import cached_path
    base, routes = server
    options, weights = tiny_published(tmp_path)
    body = weights.read_bytes()
    cache = tmp_path / "cache"
    # URLs without a known suffix: the caller says what it loads.
    routes["/w"] = (200, {}, HTML)
    for kind in (None, "hdf5"):   # HTML is never a model file, whoever asks
        with pytest.raises(ElmoError, match="sent an HTML page, not the file; nothing was cached"):
            cached_path(f"{base}/w", cache=cache, progress=False, kind=kind)
    routes["/w"] = (200, {}, b"")
    with pytest.raises(ElmoError, match="the download is empty"):
        cached_path(f"{base}/w", cache=cache, progress=False)
    routes["/w"] = (200, {}, body[: len(body) // 2])   # honest Content-Length, cut body
    for kind in (None, "hdf5"):   # without a kind, the HDF5 signature tells
        with pytest.raises(ElmoError, match="not a complete HDF5 file"):
            cached_path(f"{base}/w", cache=cache, progress=False, kind=kind)
    routes["/o"] = (200, {}, b'{"lstm": {"dim": ')
    with pytest.raises(ElmoError, match="not valid JSON"):
        cached_path(f"{base}/o", cache=cache, progress=False, kind="json")
    with pytest.raises(ElmoError, match="not a complete HDF5 file"):   # what the caller loads wins over the URL
        routes["/x.json"] = (200, {}, body[:100])
        cached_path(f"{base}/x.json", cache=cache, progress=False, kind="hdf5")
    assert _cache_files(cache) == []
    # BiLM.from_published over such URLs: each file gets the check of how it is loaded.
    routes["/o"] = (200, {}, HTML)
    routes["/w"] = (200, {}, body)
    monkeypatch.setenv("ELMO_CACHE", str(cache))
    monkeypatch.delenv("ELMO_OFFLINE", raising=False)
    with pytest.raises(ElmoError, match="HTML page"):
        BiLM.from_published(f"{base}/o", f"{base}/w")
    routes["/o"] = (200, {}, b'{"lstm": {"dim": ')   # short: only the check of what is loaded sees it
    with pytest.raises(ElmoError, match="not valid JSON"):
        BiLM.from_published(f"{base}/o", f"{base}/w")
    routes["/o"] = (200, {}, options.read_bytes())
    routes["/w"] = (200, {}, body[: len(body) // 2])
    with pytest.raises(ElmoError, match="not a complete HDF5 file"):
        BiLM.from_published(f"{base}/o", f"{base}/w")
    assert [n for n in _cache_files(cache) if n.endswith(("-w", "-w.sha256"))] == []
    routes["/w"] = (200, {}, body)
    assert BiLM.from_published(f"{base}/o", f"{base}/w").config.lstm_dim > 0


def _tampered(weights: Path) -> bytes:
    """The same HDF5 file, well formed, one value changed."""
    with h5py.File(weights, "r+") as f:
        f["CNN_proj/b_proj"][0] = 12345.0
    return weights.read_bytes()


def test_an_entry_without_its_record_is_never_trusted_on_its_content(tmp_path, server):
    from torchelmo.io.download import _sha256, cached_path
    base, routes = server
    _, weights = tiny_published(tmp_path)
    good = weights.read_bytes()
    bad = _tampered(weights)
    routes["/w.hdf5"] = (200, {}, good)
    cache = tmp_path / "cache"
    path = cached_path(f"{base}/w.hdf5", cache=cache, progress=False)
    record = path.with_name(path.name + ".sha256")
    # Replaced by a well-formed file and its record deleted: it would pass any content check.
    path.write_bytes(bad)
    record.unlink()
    with pytest.raises(ElmoError, match="has no digest record, so it cannot be trusted"):
        cached_path(f"{base}/w.hdf5", cache=cache, progress=False, offline=True)
    assert path.read_bytes() == bad and not record.exists()   # not re-recorded
    assert cached_path(f"{base}/w.hdf5", cache=cache, progress=False).read_bytes() == good   # fetched again
    assert record.read_text().strip() == _sha256(path)
    # With a pinned digest, the pin decides, record or not.
    path.write_bytes(bad)
    record.unlink()
    pin = hashlib.sha256(good).hexdigest()
    assert cached_path(f"{base}/w.hdf5", sha256=pin, cache=cache, progress=False).read_bytes() == good
    path.write_bytes(bad)
    with pytest.raises(ElmoError, match="fails its checks and offline mode is on"):
        cached_path(f"{base}/w.hdf5", sha256=pin, cache=cache, progress=False, offline=True)


@pytest.fixture
def slow_server():
    """``(base_url, hits)``: /trickle sends a body a byte at a time (every 0.2 s, never ending);
    /slow-headers sends its status line that way; /big announces 10 GB; /grow sends chunks with no
    Content-Length, for ever."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):
            hits.append(self.path)
            try:
                if self.path == "/slow-headers":
                    for b in b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx":
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(0.2)
                    return
                self.send_response(200)
                if self.path == "/big":
                    self.send_header("Content-Length", str(10 ** 10))
                elif self.path == "/trickle":
                    self.send_header("Content-Length", "100000")
                self.end_headers()
                for _ in range(100000 if self.path != "/big" else 1):
                    self.wfile.write(b"\0" * (65536 if self.path in ("/grow", "/big") else 1))
                    self.wfile.flush()
                    if self.path == "/trickle":
                        time.sleep(0.2)
            except OSError:   # the client hung up
                pass

        def log_message(self, *args):
            pass

    httpd, url = serve(Handler)
    yield url, hits
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("path", ["/trickle", "/slow-headers"])
def test_a_download_ends_within_its_deadline(tmp_path, slow_server, path, monkeypatch):
    # Bytes come faster than any per-read timeout; only a deadline on the whole ends it.
    from torchelmo.io.download import cached_path
    base, _ = slow_server
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    with pytest.raises(ElmoError, match=r"did not finish within its deadline of 1.5 s \(ELMO_DOWNLOAD_DEADLINE\)"):
        cached_path(f"{base}{path}", cache=cache, progress=False, deadline=1.5)
    assert time.monotonic() - t0 < 4
    assert _cache_files(cache) == []
    monkeypatch.setenv("ELMO_DOWNLOAD_DEADLINE", "1")   # the default comes from the environment
    t0 = time.monotonic()
    with pytest.raises(ElmoError, match="deadline of 1 s"):
        cached_path(f"{base}{path}", cache=cache, progress=False)
    assert time.monotonic() - t0 < 3.5
    monkeypatch.setenv("ELMO_DOWNLOAD_DEADLINE", "soon")
    with pytest.raises(ElmoError, match="ELMO_DOWNLOAD_DEADLINE='soon': expected a positive number"):
        cached_path(f"{base}{path}", cache=cache, progress=False)


def test_a_download_has_a_size_limit(tmp_path, slow_server, monkeypatch):
    from torchelmo.io.download import cached_path
    base, _ = slow_server
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    with pytest.raises(ElmoError, match=r"announces 10,000,000,000 bytes, over the limit of 1,048,576 "
                                        r"\(ELMO_DOWNLOAD_MAX_BYTES\); nothing was downloaded"):
        cached_path(f"{base}/big", cache=cache, progress=False, max_bytes=1 << 20)
    with pytest.raises(ElmoError, match="cut off at 1,048,576 bytes, the limit"):
        cached_path(f"{base}/grow", cache=cache, progress=False, max_bytes=1 << 20)
    monkeypatch.setenv("ELMO_DOWNLOAD_MAX_BYTES", "300000")
    with pytest.raises(ElmoError, match="cut off at 300,000 bytes"):
        cached_path(f"{base}/grow", cache=cache, progress=False)
    assert time.monotonic() - t0 < 10
    assert _cache_files(cache) == []


# Downloads: a pin against a rewritten record; the size limit to the byte.
def test_a_pinned_digest_outranks_a_rewritten_record(tmp_path, server):
    # pin-ignored-on-use. Someone who can write the cache replaces a file and rewrites its record
    # to match: the record cannot tell, the pinned digest must.
    from torchelmo.io.download import cached_path
    base, routes = server
    _, weights = tiny_published(tmp_path)
    good = weights.read_bytes()
    bad = _tampered(weights)
    pin = hashlib.sha256(good).hexdigest()
    routes["/w.hdf5"] = (200, {}, good)
    cache = tmp_path / "cache"
    path = cached_path(f"{base}/w.hdf5", sha256=pin, cache=cache, progress=False)
    record = path.with_name(path.name + ".sha256")
    path.write_bytes(bad)
    record.write_text(hashlib.sha256(bad).hexdigest() + "\n")
    with pytest.raises(ElmoError, match="fails its checks and offline mode is on"):
        cached_path(f"{base}/w.hdf5", sha256=pin, cache=cache, progress=False, offline=True)
    assert cached_path(f"{base}/w.hdf5", sha256=pin, cache=cache, progress=False).read_bytes() == good
    assert record.read_text().strip() == pin


@pytest.fixture
def sized_server():
    """``base_url``: ``/N`` sends N zero bytes with no Content-Length, then closes."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"   # the end of the body is the end of the connection

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            try:
                self.wfile.write(b"\0" * int(self.path[1:]))
            except OSError:   # the client hung up at its limit
                pass

        def log_message(self, *args):
            pass

    httpd, url = serve(Handler)
    yield url
    httpd.shutdown()
    httpd.server_close()


def test_the_size_limit_is_exact(tmp_path, sized_server):
    # size-limit-doubled. Without a Content-Length only the count of the body's bytes can hold
    # the limit: max_bytes is accepted, one byte more is cut off and nothing is cached.
    from torchelmo.io.download import cached_path
    limit = 300_000
    cache = tmp_path / "cache"
    with pytest.raises(ElmoError, match="cut off at 300,000 bytes, the limit"):
        cached_path(f"{sized_server}/{limit + 1}", cache=cache, progress=False, max_bytes=limit)
    assert _cache_files(cache) == []
    path = cached_path(f"{sized_server}/{limit}", cache=cache, progress=False, max_bytes=limit)
    assert path.stat().st_size == limit



def test_an_hdf5_bomb_is_refused_before_any_read(tmp_path, server):
    # A small file declaring a huge gzip-chunked dataset that was never written: its fill value
    # would unfold into memory on reading. Refused from the declarations, in one line, and not cached.
    import h5py

    from torchelmo.io.download import cached_path
    base, routes = server
    src = tmp_path / "bomb.hdf5"
    with h5py.File(src, "w") as f:
        f.create_dataset("w", shape=(100_000, 100_000), dtype="float32", chunks=(1000, 1000), compression="gzip")
    routes["/bomb.hdf5"] = (200, {}, src.read_bytes())
    assert src.stat().st_size < 2**20
    with pytest.raises(ElmoError, match=r"declares 40,000,000,000 bytes of data in a file of .*refused") as e:
        cached_path(f"{base}/bomb.hdf5", cache=tmp_path / "cache", progress=False, kind="hdf5")
    assert "\n" not in str(e.value)
    assert [n for n in _cache_files(tmp_path / "cache") if n.endswith(".hdf5")] == []


def test_a_published_pair_is_seeded_together_or_not_at_all(tmp_path, monkeypatch):
    # seed_cache checks each file alone; seed_published checks that the weights fit the options,
    # and a pair seeded apart from two models is named as such when loaded.
    from torchelmo import BiLM, preset
    from torchelmo.io.download import seed_cache
    from torchelmo.model.registry import ALIASES, REGISTRY
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELMO_OFFLINE", "1")
    a = tiny_published(tmp_path / "a")
    b = BiLM(preset("tiny", lstm_dim=32)).export_published(tmp_path / "b", "b")
    with pytest.raises(ElmoError, match="W_0.*has shape"):
        BiLM.seed_published("small", a[0], b[1])
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    small = REGISTRY[ALIASES["small"]]
    seed_cache(small["options"], a[0], kind="json")
    seed_cache(small["weights"], b[1], kind="hdf5")
    with pytest.raises(ElmoError, match="small: its cached options and weights do not fit together.*seed_published"):
        BiLM.from_pretrained("small")
    BiLM.seed_published("small", *a)
    got, want = BiLM.from_pretrained("small"), BiLM.from_published(*a)
    assert all(torch.equal(x, y) for x, y in zip(got.state_dict().values(), want.state_dict().values()))
    with pytest.raises(ElmoError, match="unknown model"):
        BiLM.seed_published("tiny", *a)
