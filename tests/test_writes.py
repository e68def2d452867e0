"""Writes: every output whole or not at all, on a full disk too; temporary files of killed runs
swept, and never a live writer's (docs/reliability.md)."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import torch

from conftest import base_config
from helpers import ENV, one_line_error, write_lines
from torchelmo.cli import main as cli_main
from torchelmo.errors import ElmoError
from torchelmo.train import CHECKPOINT_NAME, train


@pytest.mark.core
def test_full_disk_in_embed_is_one_line_error_and_leaves_nothing(tmp_path, small_disk, capsys):
    inp = write_lines(tmp_path / "in.txt", 400)   # about 4 MB of --all output from the default model
    out = small_disk / "out.h5"
    line = one_line_error(capsys, ["embed", inp, out, "--all", "--quiet"], str(out), "No space left on device")
    assert "nothing was written" in line
    assert list(small_disk.iterdir()) == []
    shards = [tmp_path / f"s{k}.h5" for k in range(2)]
    for k, shard in enumerate(shards):
        assert cli_main(["embed", str(inp), str(shard), "--all", "--quiet", "--shard", f"{k}/2"]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["embed-merge", out, *shards], str(out), "No space left on device")
    assert list(small_disk.iterdir()) == []


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, fixture_corpus, small_disk,
                                                                    capsys):
    data, vocab = fixture_corpus
    train(base_config(tmp_path, data, vocab, max_steps=2, checkpoint_every=1), log=lambda s: None)
    run = small_disk / "run"
    shutil.copytree(tmp_path / "run", run, ignore=shutil.ignore_patterns("model", "best", "published"))
    before = (run / CHECKPOINT_NAME).read_bytes()
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))
    assert cli_main(["train", "--out", str(run), "--resume", "--max-steps", "4", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()   # the run's log lines, then the error
    assert "Traceback" not in "".join(err)
    assert err[-1].startswith(f"elmo train: error: {run / CHECKPOINT_NAME}: cannot write the checkpoint")
    assert "No space left on device" in err[-1]
    assert (run / CHECKPOINT_NAME).read_bytes() == before
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.core
def test_later_runs_remove_stale_temp_files_of_their_own_naming(tmp_path):
    from torchelmo.embed import embed_file
    from torchelmo.io.fileio import _host
    from torchelmo.train.checkpoint import save_checkpoint
    out = tmp_path / "out.h5"
    dead = tmp_path / f".out.h5.{_host()}.{_dead_pid()}.abc123.tmp"
    live = tmp_path / f".out.h5.{_host()}.{os.getpid()}.abc123.tmp"
    other_host = tmp_path / f".out.h5.elsewhere.{_dead_pid()}.abc123.tmp"
    legacy_old, legacy_new = tmp_path / ".out.h5.k2j4h5g6.tmp", tmp_path / ".out.h5.a1b2c3d4.tmp"
    unrelated = tmp_path / ".other.h5.k2j4h5g6.tmp"
    for p in (dead, live, other_host, legacy_old, legacy_new, unrelated):
        p.write_bytes(b"x" * 100)
    os.utime(legacy_old, (time.time() - 7200, time.time() - 7200))
    os.utime(unrelated, (time.time() - 7200, time.time() - 7200))
    from torchelmo import BiLM
    embed_file(BiLM.from_pretrained("default"), write_lines(tmp_path / "in.txt", 3), out, "top")
    left = {p.name for p in tmp_path.iterdir()}
    assert dead.name not in left and legacy_old.name not in left
    assert {live.name, other_host.name, legacy_new.name, unrelated.name, "out.h5"} <= left
    stale_ckpt = tmp_path / f".{CHECKPOINT_NAME}.{_host()}.{_dead_pid()}.zz.tmp"
    stale_ckpt.write_bytes(b"x")
    save_checkpoint({"x": torch.zeros(1)}, tmp_path)
    assert not stale_ckpt.exists()


def test_embed_file_holds_one_batch_of_outputs_not_a_window(tmp_path, fixture_model, monkeypatch):
    # Peak memory must not grow with the window (10,000 lines): each batch is written as it ends
    # (one batch is in flight while the previous one is written).
    import torchelmo.embed.engine as engine
    from torchelmo.embed import embed_file
    from torchelmo.embed.writer import GuardedH5
    counts = {"made": 0, "written": 0, "most_pending": 0}
    real_batch, real_write = engine.start_batch, GuardedH5.write

    def batch(model, sentences, *a, **k):
        counts["most_pending"] = max(counts["most_pending"], counts["made"] - counts["written"])
        out = real_batch(model, sentences, *a, **k)
        counts["made"] += len(sentences)
        return out

    def write(self, name, arr):
        counts["written"] += 1
        real_write(self, name, arr)

    monkeypatch.setattr(engine, "start_batch", batch)
    monkeypatch.setattr(GuardedH5, "write", write)
    embed_file(fixture_model, write_lines(tmp_path / "in.txt", 300), tmp_path / "o.h5", "top", batch_size=16)
    assert counts["written"] == 300 and counts["most_pending"] <= 16


# The stale-temp sweep: a live writer holds its temporary file's lock.
_WRITER = """
import os, sys
import torchelmo.io.fileio as fileio
os.getpid = lambda: int(sys.argv[2])   # as seen from another PID namespace: this PID is not running here
with fileio.atomic_path(sys.argv[1]) as tmp:
    tmp.write_text("from the other namespace")
    print(tmp.name, flush=True)
    sys.stdin.readline()
print("done", flush=True)
"""


@pytest.mark.core
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer's lock is Linux's (elsewhere: host + PID)")
def test_the_sweep_spares_a_live_writer_whose_pid_looks_dead(tmp_path):
    from torchelmo.io.fileio import atomic_path
    out = tmp_path / "out.txt"
    dead = _dead_pid()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), str(dead)], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    theirs = tmp_path / writer.stdout.readline().strip()
    assert f".{dead}." in theirs.name and theirs.is_file(), writer.stderr.read()
    with atomic_path(out) as tmp:   # a write of the same name sweeps
        tmp.write_text("ours")
    assert theirs.is_file()        # host + PID alone would have called it stale
    writer.stdin.write("\n")
    writer.stdin.flush()
    assert writer.stdout.readline().strip() == "done" and writer.wait(timeout=60) == 0, writer.stderr.read()
    assert out.read_text() == "from the other namespace"
    # A writer killed before its rename: the lock went with it, and the next write removes its file.
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), str(dead)], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    theirs = tmp_path / writer.stdout.readline().strip()
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=60)
    assert theirs.is_file()
    with atomic_path(out) as tmp:
        tmp.write_text("ours")
    assert not theirs.exists() and out.read_text() == "ours"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# The writer's lock, to the rename.
@pytest.mark.core
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


# A full disk under `elmo embed`, simulated: writes fail once a quota is used, or from the close on.
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


@pytest.mark.core
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
    inp = write_lines(tmp_path / "in.txt", 400)
    with pytest.raises(ElmoError, match=f"^{out}: cannot write: No space left on device; nothing was written$"):
        embed_file(tiny_model, inp, out, "all", batch_size=8)
    assert disks[0].failures == 1                        # the guard stopped writing at the first
    assert started["at_full"] is not None and started["at_full"] < 10   # full early: 50 batches in all
    assert started["batches"] - started["at_full"] <= 1, started
    assert not out.exists() and not _temporaries(tmp_path)


@pytest.mark.core
def test_a_write_that_fails_in_the_closing_flush_leaves_no_output(tmp_path, tiny_model, monkeypatch):
    # h5-close-error-unchecked. HDF5 writes its metadata when the file closes: a disk that fills
    # then fails the run as any other write does, and the damaged file is never renamed into place.

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
        embed_file(tiny_model, write_lines(tmp_path / "in.txt", 20), out, "all")
    assert disks[0].failures >= 1                        # the close did write, and failed
    assert out.read_bytes() == b"the previous output" and not _temporaries(tmp_path)
    monkeypatch.undo()
    embed_file(tiny_model, write_lines(tmp_path / "in.txt", 20), out, "all")   # the same run, disk not full
    with h5py.File(out, "r") as f:
        assert len(f) == 21


# The same full disk, without root, for what test_reliability.py's tmpfs tests hold where they run.
@pytest.mark.core
def test_a_simulated_full_disk_in_embed_merge_leaves_nothing(tmp_path, tiny_model, monkeypatch):
    from torchelmo.embed import embed_file, merge_shards
    inp = write_lines(tmp_path / "in.txt", 200)
    shards = [tmp_path / f"s{k}.h5" for k in range(2)]
    for k, shard in enumerate(shards):
        embed_file(tiny_model, inp, shard, "all", shard=(k, 2))
    disks = _small_disk(monkeypatch, 32 * 1024)
    out = tmp_path / "merged.h5"
    with pytest.raises(ElmoError, match=f"^{out}: cannot write: No space left on device; nothing was written$"):
        merge_shards(shards, out)
    assert disks[0].failures == 1 and not out.exists() and not _temporaries(tmp_path)


@pytest.mark.core
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



def test_a_watcher_never_sees_a_partial_output(tmp_path):
    # The output appears whole or not at all: a reader polling the name while a 32 MiB file is
    # written and installed sees no size but the final one (a copy into place would show others).
    import threading

    from torchelmo.io.fileio import atomic_path
    data = os.urandom(1 << 25)
    target = tmp_path / "out.bin"
    for previous in (None, b"old output"):
        if previous is not None:
            target.write_bytes(previous)
        seen, done = set(), threading.Event()

        def watch(seen=seen, done=done):
            while not done.is_set():
                try:
                    seen.add(os.stat(target).st_size)
                except FileNotFoundError:
                    seen.add(None)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for _ in range(3):
                with atomic_path(target) as tmp:
                    tmp.write_bytes(data)
        finally:
            done.set()
            watcher.join()
        allowed = {len(data), None if previous is None else len(previous)}
        assert seen <= allowed and len(data) in seen, sorted(s for s in seen if s is not None)[:5]
        target.unlink()
