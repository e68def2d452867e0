"""Reliability, round three: the tests that kill the mutants the earlier ones let live.

``scripts/mutations.py`` breaks the promises of docs/reliability.md one at a time, each in a
scratch copy, and runs the tests named for it; each test here was written for a mutant that
survived those (its id in the test's comment), and fails on it:

- a temporary file that its writer replaced (as safetensors does) keeps the writer's lock until
  its rename (``atomic-no-relock``);
- a signal while the interpreter shuts down changes no exit status (``signals-not-ignored-at-exit``);
- a pinned digest outranks a record that someone rewrote with the file (``pin-ignored-on-use``);
- the download size limit holds to the byte without a Content-Length (``size-limit-doubled``);
- a write that fails in the closing flush leaves no output (``h5-close-error-unchecked``).

A disk that fills after a quota of bytes, or when the file closes, stands in for a full one, so
the full-disk tests run without root. With it, the promises that ``test_reliability.py`` holds
on a 2 MiB tmpfs (which only root can mount; elsewhere those tests skip) are held everywhere too:
a full disk stops ``elmo embed`` at once (``h5-write-error-unchecked``, ``guarded-writer-reraises``),
leaves nothing from ``embed-merge`` (``merge-written-in-place``) and keeps the previous checkpoint
(``checkpoint-saved-in-place``, ``checkpoint-write-error-ignored``).

The server, the tiny published model and the helpers are those of ``test_reliability.py``.
"""

import errno
import hashlib
import http.server
import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_reliability as R
import test_reliability2 as R2
from torchelmo.errors import ElmoError

server = R.server   # the fixture: a server on 127.0.0.1 with routes
_cache_files, _dead_pid, _lines, _tiny_published = R._cache_files, R._dead_pid, R._lines, R._tiny_published

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# ------------------------------------------------------------------------------------------------
# The writer's lock, to the rename.
# ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer's lock is Linux's (elsewhere: host + PID)")
def test_the_writers_lock_covers_a_temporary_file_the_writer_replaced(tmp_path, monkeypatch):
    # atomic-no-relock. safetensors writes a file of its own and renames it over the temporary
    # one: the lock taken on the first file does not cover the second, so the writer must take it
    # again before the rename. At that moment a sweep by a writer in another PID namespace (to
    # which our PID looks dead) must spare the file.
    from torchelmo.io import fileio
    out = tmp_path / "model.safetensors"
    swept = []
    real_replace = os.replace

    def sweep_then_replace(src, dst, *a, **k):
        if Path(dst) == out:   # the rename into place: the sweep runs the instant before
            swept.append(fileio._stale(Path(src), _dead_pid()))
        return real_replace(src, dst, *a, **k)

    with fileio.atomic_path(out) as tmp:
        own = tmp.with_name(tmp.name + ".own")
        own.write_bytes(b"the writer's own file")
        os.replace(own, tmp)   # what safetensors.torch.save_file does
        monkeypatch.setattr(os, "replace", sweep_then_replace)
    monkeypatch.undo()
    assert swept == [False]                              # the lock held: not taken for stale
    assert out.read_bytes() == b"the writer's own file" and not _temporaries(tmp_path)


# ------------------------------------------------------------------------------------------------
# Signals while the interpreter shuts down.
# ------------------------------------------------------------------------------------------------
# The installed `elmo` (torchelmo.cli:entry) runs a real command, then the interpreter exits; a
# handler registered with atexit runs during that shutdown and sends the signal there, every time.
SIGNAL_AT_EXIT = """
import atexit, os, signal, sys
from torchelmo.cli import entry
sig = getattr(signal, sys.argv[1])
atexit.register(lambda: os.kill(os.getpid(), sig))
sys.argv = ["elmo", "info", "--list"]
entry()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_interpreter_shuts_down_changes_no_status(sig):
    # signals-not-ignored-at-exit. Once the command has returned its status, a Ctrl-C or SIGTERM
    # can no longer change it: no death by signal, no traceback from an exit handler.
    proc = subprocess.run([sys.executable, "-c", SIGNAL_AT_EXIT, sig], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stderr == "" and "small" in proc.stdout


# ------------------------------------------------------------------------------------------------
# Downloads: a pin against a rewritten record; the size limit to the byte.
# ------------------------------------------------------------------------------------------------
def test_a_pinned_digest_outranks_a_rewritten_record(tmp_path, server):
    # pin-ignored-on-use. Someone who can write the cache replaces a file and rewrites its record
    # to match: the record cannot tell, the pinned digest must.
    from torchelmo.io.download import cached_path
    base, routes = server
    _, weights = _tiny_published(tmp_path)
    good = weights.read_bytes()
    bad = R2._tampered(weights)
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

    httpd, url = R.serve(Handler)
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


# ------------------------------------------------------------------------------------------------
# A full disk under `elmo embed`, simulated: writes fail once a quota is used, or from the close on.
# ------------------------------------------------------------------------------------------------
class _Disk:
    """The file under a GuardedWriter, on a disk that is full after ``quota`` bytes (or, with
    ``quota=None``, once ``fill()`` is called): each write after that fails with ENOSPC, as a
    real full disk's does."""

    def __init__(self, file, quota: int | None, on_full) -> None:
        self.file, self.quota, self.on_full, self.written, self.failures = file, quota, on_full, 0, 0

    def fill(self) -> None:
        self.quota = self.written

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if self.quota is not None and self.written + n > self.quota:
            if not self.failures:
                self.on_full()
            self.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.written += n
        return self.file.write(data)

    def __getattr__(self, name):   # seek, tell, read, truncate, flush, close
        return getattr(self.file, name)


def _small_disk(monkeypatch, quota: int | None, on_full=lambda: None, module: str = "torchelmo.embed.writer"
                ) -> list[_Disk]:
    """Every GuardedWriter that ``module`` opens (the embed writer's, or the checkpoint's) sits on
    a :class:`_Disk`; returns them."""
    import importlib

    from torchelmo.io.fileio import GuardedWriter
    disks = []

    class OnSmallDisk(GuardedWriter):
        def __init__(self, path) -> None:
            super().__init__(path)
            self.file = _Disk(self.file, quota, on_full)
            disks.append(self.file)

    monkeypatch.setattr(importlib.import_module(module), "GuardedWriter", OnSmallDisk)
    return disks


@pytest.fixture(scope="module")
def tiny_model():
    import torch

    from torchelmo import BiLM, preset
    torch.manual_seed(0)
    return BiLM(preset("tiny")).eval()


def test_a_full_disk_stops_embedding_at_once(tmp_path, tiny_model, monkeypatch):
    # h5-write-error-unchecked. The first failed write ends the run: a one-line error, no OUTPUT,
    # no temporary file, and no more batches computed than the one already in flight.
    import torchelmo.embed.engine as engine
    from torchelmo.embed import embed_file
    started = {"batches": 0, "at_full": None}
    real = engine.start_batch

    def counted(*a, **k):
        started["batches"] += 1
        return real(*a, **k)

    monkeypatch.setattr(engine, "start_batch", counted)
    disks = _small_disk(monkeypatch, 64 * 1024, lambda: started.update(at_full=started["batches"]))
    out = tmp_path / "out.h5"
    inp = _lines(tmp_path / "in.txt", 400)
    with pytest.raises(ElmoError, match=f"^{out}: cannot write: No space left on device; nothing was written$"):
        embed_file(tiny_model, inp, out, "all", batch_size=8)
    assert disks[0].failures == 1                        # the guard stopped writing at the first
    assert started["at_full"] is not None and started["at_full"] < 10   # full early: 50 batches in all
    assert started["batches"] - started["at_full"] <= 1, started
    assert not out.exists() and not _temporaries(tmp_path)


def test_a_write_that_fails_in_the_closing_flush_leaves_no_output(tmp_path, tiny_model, monkeypatch):
    # h5-close-error-unchecked. HDF5 writes its metadata when the file closes: a disk that fills
    # then fails the run as any other write does, and the damaged file is never renamed into place.
    import h5py

    from torchelmo.embed import embed_file
    disks = _small_disk(monkeypatch, None)
    real_close = h5py.File.close

    def fill_then_close(f):
        for disk in disks:
            disk.fill()
        return real_close(f)

    monkeypatch.setattr(h5py.File, "close", fill_then_close)
    out = tmp_path / "out.h5"
    out.write_bytes(b"the previous output")
    with pytest.raises(ElmoError, match=f"^{out}: cannot write: No space left on device; nothing was written$"):
        embed_file(tiny_model, _lines(tmp_path / "in.txt", 20), out, "all")
    assert disks[0].failures >= 1                        # the close did write, and failed
    assert out.read_bytes() == b"the previous output" and not _temporaries(tmp_path)
    monkeypatch.undo()
    embed_file(tiny_model, _lines(tmp_path / "in.txt", 20), out, "all")   # the same run, disk not full
    with h5py.File(out, "r") as f:
        assert len(f) == 21


# The same full disk, without root, for what test_reliability.py's tmpfs tests hold where they run.
def test_a_simulated_full_disk_in_embed_merge_leaves_nothing(tmp_path, tiny_model, monkeypatch):
    from torchelmo.embed import embed_file, merge_shards
    inp = _lines(tmp_path / "in.txt", 200)
    shards = [tmp_path / f"s{k}.h5" for k in range(2)]
    for k, shard in enumerate(shards):
        embed_file(tiny_model, inp, shard, "all", shard=(k, 2))
    disks = _small_disk(monkeypatch, 32 * 1024)
    out = tmp_path / "merged.h5"
    with pytest.raises(ElmoError, match=f"^{out}: cannot write: No space left on device; nothing was written$"):
        merge_shards(shards, out)
    assert disks[0].failures == 1 and not out.exists() and not _temporaries(tmp_path)


def test_a_simulated_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import torch

    from torchelmo.train.checkpoint import CHECKPOINT_NAME, save_checkpoint
    save_checkpoint({"step": 1, "model": {"w": torch.ones(50_000)}}, tmp_path)
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()
    disks = _small_disk(monkeypatch, 64 * 1024, module="torchelmo.train.checkpoint")
    with pytest.raises(ElmoError, match=f"^{tmp_path / CHECKPOINT_NAME}: cannot write the checkpoint, the previous "
                                        "one is kept: No space left on device; nothing was written$"):
        save_checkpoint({"step": 2, "model": {"w": torch.zeros(50_000)}}, tmp_path)
    assert disks[0].failures == 1
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before and not _temporaries(tmp_path)


def test_every_mutation_of_the_recorded_run_still_applies():
    # scripts/mutations.py refuses a snippet that is not in the code exactly once; this keeps its
    # list, and so the recorded run, in step with the code between runs.
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("mutations", root / "scripts" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutations"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["mutations"]
    assert len(module.MUTATIONS) >= 40 and len({m.id for m in module.MUTATIONS}) == len(module.MUTATIONS)
    for m in module.MUTATIONS:
        assert (root / m.file).read_text(encoding="utf-8").count(m.find) == 1, m.id
        assert m.selection and all((root / s.split("::")[0]).is_file() for s in m.selection), m.id
