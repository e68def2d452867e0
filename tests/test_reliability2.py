"""Reliability, round two: downloads checked as the caller loads them, with a deadline
and a size limit; the stale-temp sweep judged by the writer's lock; the tracebacks that were
left; messages and documented figures. The server, the tiny published model and the helpers are
those of ``test_reliability.py``.
"""

import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import test_reliability as R
from torchelmo.errors import ElmoError

server = R.server   # the fixture: a server on 127.0.0.1 with routes
_cache_files, _dead_pid, _lines, _tiny_published, one_line_error = (
    R._cache_files, R._dead_pid, R._lines, R._tiny_published, R.one_line_error)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------------------
# Downloads: the check of what the caller loads, the record, a deadline and a size limit.
# ------------------------------------------------------------------------------------------------
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please log in</body></html>\n"


def test_a_download_gets_the_check_of_what_the_caller_loads_whatever_its_url(tmp_path, server, monkeypatch):
    from torchelmo import BiLM
    from torchelmo.io.download import cached_path
    base, routes = server
    options, weights = _tiny_published(tmp_path)
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
    _, weights = _tiny_published(tmp_path)
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

    httpd, url = R.serve(Handler)
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


# ------------------------------------------------------------------------------------------------
# The stale-temp sweep: a live writer holds its temporary file's lock.
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# Messages and documented figures.
# ------------------------------------------------------------------------------------------------
class _System:
    """Unpickling this would call ``os.system`` (posix.system): never run, since refused."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_holding_os_system_is_refused_by_name(tmp_path):
    from torchelmo.train.checkpoint import load_checkpoint
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"model": {"x": _System(marker)}}, path)
    with pytest.raises(ElmoError, match=r"refused: holds Python objects \((posix|nt)\.system\)"):
        load_checkpoint(path)
    assert not marker.exists()


def _ewt_dev_sentences(n: int) -> list[str]:
    """The first ``n`` sentences of UD English EWT dev, tokens joined by spaces."""
    from conftest import shared_path
    sents, cur = [], []
    for line in shared_path("data", "pos", "ud-english-ewt", "en_ewt-ud-dev.conllu").open(encoding="utf-8"):
        cols = line.rstrip("\n").split("\t")
        if len(cols) == 10 and cols[0].isdigit():
            cur.append(cols[1])
        elif not line.strip() and cur:
            sents.append(" ".join(cur))
            cur = []
            if len(sents) == n:
                break
    return sents


# docs/reliability.md, "Tolerances": what sharding (or another batch shape) may change, promised.
PROMISED = dict(atol=1e-5, rtol=1e-5)


def test_shard_and_merge_of_the_default_model_within_the_promised_tolerance(tmp_path, one_thread):
    # The measurement of docs/reliability.md: 300 EWT dev sentences, the default model, one
    # thread, 2 shards merged against the unsharded file.
    from torchelmo import BiLM
    from torchelmo.embed import embed_file, merge_shards
    src = tmp_path / "ewt300.txt"
    src.write_text("".join(s + "\n" for s in _ewt_dev_sentences(300)), encoding="utf-8")
    model = BiLM.from_pretrained("default")
    embed_file(model, src, tmp_path / "whole.h5", "all")
    shards = [tmp_path / f"s{k}.h5" for k in range(2)]
    for k, shard in enumerate(shards):
        embed_file(model, src, shard, "all", shard=(k, 2))
    merge_shards(shards, tmp_path / "merged.h5")
    worst = 0.0
    with h5py.File(tmp_path / "whole.h5", "r") as a, h5py.File(tmp_path / "merged.h5", "r") as b:
        assert list(a) == list(b) and len(a) == 301
        for k in a:
            if k != "sentence_to_index":
                np.testing.assert_allclose(b[k][()], a[k][()], **PROMISED, err_msg=k)
                worst = max(worst, float(np.abs(b[k][()] - a[k][()]).max()))
    assert worst < 1e-5, worst   # measured 2.4e-6 on one thread (docs/reliability.md)


# ------------------------------------------------------------------------------------------------
# Tracebacks that were left: each is now one line naming the thing.
# ------------------------------------------------------------------------------------------------
LONG = "a" * 300   # one path component over the 255 bytes a file name can have


def _model_commands(name: str, tmp: Path) -> list[list]:
    inp = _lines(tmp / "in.txt", 2)
    vocab = tmp / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\nthe\nquick\n")
    return [["info", name], ["embed", inp, tmp / "o.h5", "--top", "--quiet", "--model", name],
            ["export", name, tmp / "o.pt"], ["perplexity", name, inp], ["average", name, "-o", tmp / "avg"],
            ["probe", "tag", inp, inp, "--column", "0", "--model", name, "--out", tmp / "probe"],
            ["train", "--init-from", name, "--train", inp, "--vocab", vocab, "--out", tmp / "run",
             "--max-steps", "1", "--no-progress"]]


@pytest.mark.parametrize("name, says", [(LONG, "a path component of 300 bytes, longer than the 255"),
                                        ("x/" + "b" * 256, "a path component of 256 bytes"),
                                        ("my\nmodel", "my\\nmodel: no such")])
def test_a_model_name_no_file_can_have_is_one_line_in_every_command(tmp_path, capsys, name, says):
    for argv in _model_commands(name, tmp_path):
        one_line_error(capsys, argv, says)
    assert not (tmp_path / "run").exists() and not (tmp_path / "avg").exists()


def test_other_paths_no_file_can_have_are_one_line(tmp_path, capsys):
    inp = _lines(tmp_path / "in.txt", 2)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\nthe\n")
    for argv in (["embed", tmp_path / LONG, tmp_path / "o.h5", "--top", "--quiet"],
                 ["embed", inp, tmp_path / LONG, "--top", "--quiet"],
                 ["vocab", tmp_path / LONG, "-o", tmp_path / "v.txt"], ["vocab", inp, "-o", tmp_path / LONG],
                 ["train", "--train", inp, "--vocab", vocab, "--out", tmp_path / LONG, "--max-steps", "1", "--no-progress"],
                 ["train", "--train", tmp_path / LONG, "--vocab", vocab, "--out", tmp_path / "r", "--max-steps", "1",
                  "--no-progress"],
                 ["average", "default", "-o", tmp_path / LONG]):
        line = one_line_error(capsys, argv, "aaaaaaaaaa")
        assert "a path component of 300 bytes" in line or "(File name too long)" in line, line
    with pytest.raises(ElmoError, match="holds a NUL character"):
        from torchelmo import BiLM
        BiLM.from_pretrained("de\0fault")


def test_average_and_perplexity_check_their_destination_before_any_work(tmp_path, capsys, monkeypatch):
    import torchelmo.lm.model as lm
    import torchelmo.train.average as average
    monkeypatch.setattr(average, "load_lm", lambda *a: pytest.fail("loaded a model before checking -o"))
    monkeypatch.setattr(lm.LanguageModel, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("loaded the LM before checking --json")))
    afile = tmp_path / "afile"
    afile.write_text("x")
    inp = _lines(tmp_path / "in.txt", 2)
    one_line_error(capsys, ["average", "m1", "m2", "-o", afile / "out"], str(afile / "out"), "cannot write",
                   "is not a directory")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", afile / "r.json"], str(afile / "r.json"),
                   "cannot write", "is not a directory")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path], str(tmp_path), "is a directory")
    # A forbidden place (root may write anywhere: the refusal is simulated) and a read-only one.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: Path(p) != tmp_path and real_access(p, mode, **k))
    one_line_error(capsys, ["average", "m1", "-o", tmp_path / "avg"], str(tmp_path / "avg"), "Permission denied")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path / "r.json"], "Permission denied")
    monkeypatch.setattr(os, "access", real_access)
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, p):
            self.f_flag = real_statvfs(p).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    one_line_error(capsys, ["average", "m1", "-o", tmp_path / "avg"], "Read-only file system")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path / "r.json"], "Read-only file system")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "in.txt"]


def test_a_missing_weights_file_is_found_before_the_model_is_allocated(tmp_path, capsys, monkeypatch):
    import shutil

    from torchelmo import BiLM
    from torchelmo.lm.model import LanguageModel
    from torchelmo.model.registry import default_model_dir
    # A config within the size bounds that would take gigabytes, with no weights beside it.
    big = tmp_path / "big"
    big.mkdir()
    cfg = json_load(default_model_dir() / "config.json")
    cfg["lstm"]["dim"], cfg["lstm"]["projection_dim"] = 8192, 1024   # 0.3e9 parameters: 1.2 GB
    (big / "config.json").write_text(json_dump(cfg))
    lm_dir = tmp_path / "lm"
    shutil.copytree(big, lm_dir)
    from torchelmo.lm.model import LM_FORMAT
    (lm_dir / "training.json").write_text(json_dump({"format": LM_FORMAT, "softmax": {"kind": "full"}}))
    (lm_dir / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n")
    monkeypatch.setattr(BiLM, "__init__", lambda *a, **k: pytest.fail("allocated before finding the weights"))
    with pytest.raises(ElmoError, match=r"big/model.safetensors: missing"):
        BiLM.from_pretrained(big)
    one_line_error(capsys, ["info", big], "model.safetensors: missing")
    one_line_error(capsys, ["embed", _lines(tmp_path / "in.txt", 2), tmp_path / "o.h5", "--top", "--quiet",
                            "--model", big], "model.safetensors: missing")
    monkeypatch.setattr(LanguageModel, "__init__", lambda *a, **k: pytest.fail("allocated the LM first"))
    with pytest.raises(ElmoError, match=r"lm/model.safetensors: missing"):
        LanguageModel.from_pretrained(lm_dir)
    with pytest.raises(ElmoError, match=r"nope.hdf5: file not found"):
        BiLM.from_published(big / "config.json", tmp_path / "nope.hdf5")


def json_load(path: Path):
    import json
    return json.loads(Path(path).read_text())


def json_dump(obj) -> str:
    import json
    return json.dumps(obj, indent=2)


def test_python_api_rejects_none_and_empty_batches_in_one_line(tmp_path):
    from torchelmo import BiLM, batch_to_ids
    from torchelmo.integrations.allennlp import Elmo, ElmoEmbedder
    with pytest.raises(ElmoError, match="batch_to_ids: sentence 1 is NoneType, expected a list of tokens"):
        batch_to_ids([["a"], None])
    bilm = BiLM.from_pretrained("default")
    emb = ElmoEmbedder(model="default")
    with pytest.raises(ElmoError, match="ElmoEmbedder: sentence 0 is NoneType"):
        emb.embed_sentence(None)
    with pytest.raises(ElmoError, match="embed_sentences: expected an iterable of sentences"):
        list(emb.embed_sentences(None))
    with pytest.raises(ElmoError, match="ElmoEmbedder: sentence 1 is NoneType"):
        list(emb.embed_sentences([["a"], None]))
    elmo = Elmo(None, None, 2, module=bilm, dropout=0.0)
    out = elmo(batch_to_ids([[]]))   # a batch of one empty sentence, as BiLM alone takes it
    assert [tuple(r.shape) for r in out["elmo_representations"]] == [(1, 0, bilm.output_dim)] * 2
    assert tuple(out["mask"].shape) == (1, 0)
    out = elmo(batch_to_ids([["a", "b"], []]))
    assert tuple(out["elmo_representations"][0].shape) == (2, 2, bilm.output_dim)
    opts, weights = R._tiny_published(tmp_path)
    for n in (1.5, -1, True):   # 0 is allowed (no mixes), as in AllenNLP
        with pytest.raises(ElmoError, match=f"num_output_representations must be a non-negative integer, got {n!r}"):
            Elmo(opts, weights, n)
        with pytest.raises(ElmoError, match="num_output_representations must be a non-negative integer"):
            Elmo(None, None, n, module=bilm)


def test_embed_file_of_a_stream_is_one_line_on_bad_utf8_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import io
    import tempfile

    from torchelmo.integrations.allennlp import ElmoEmbedder
    tmpdir = tmp_path / "system-tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    emb = ElmoEmbedder(model="default")
    emb.embed_file(io.StringIO("a b\nc d\n"), tmp_path / "ok.h5")
    with h5py.File(tmp_path / "ok.h5", "r") as f:
        assert f["1"].shape[1] == 2
    for stream in (io.BytesIO(b"a b\n\xff\xfe c\n"),
                   io.TextIOWrapper(io.BytesIO(b"a b\n\xff\xfe c\n"), encoding="utf-8")):
        with pytest.raises(ElmoError, match=r"input_file: not UTF-8 text near line \d \(invalid start byte\)"):
            emb.embed_file(stream, tmp_path / "bad.h5")
    with pytest.raises(ElmoError, match="is a directory"):
        emb.embed_file(io.StringIO("a b\n"), tmp_path)
    assert list(tmpdir.iterdir()) == [] and not (tmp_path / "bad.h5").exists()


# A signal that arrives while h5py is inside its C code, calling back into Python to write: the
# moment a KeyboardInterrupt would be swallowed ("Exception ignored") and the run would finish as
# if nothing happened. Sent from inside that callback, so the moment is hit every time.
SIGNAL_INSIDE_H5PY = """
import os, signal, sys
import h5py
from torchelmo.io import fileio
from torchelmo.cli import entry
sig, phase, at = getattr(signal, sys.argv[1]), sys.argv[2], int(sys.argv[3])
state = {"armed": phase == "writing", "calls": 0}
write, close = fileio.GuardedWriter.write, h5py.File.close
def write_and_signal(self, data):
    if state["armed"]:
        state["calls"] += 1
        if state["calls"] == at:
            os.kill(os.getpid(), sig)
    return write(self, data)
def arm_then_close(self):
    state["armed"] = True             # the close flushes HDF5's metadata through write()
    return close(self)
fileio.GuardedWriter.write = write_and_signal
h5py.File.close = arm_then_close
sys.argv = ["elmo"] + sys.argv[4:]
entry()
"""


@pytest.mark.parametrize("sig, phase, at", [("SIGINT", "writing", 1), ("SIGINT", "writing", 40),
                                            ("SIGINT", "closing", 1), ("SIGINT", "closing", 20),
                                            ("SIGTERM", "closing", 5)])
def test_a_signal_inside_h5pys_own_writes_is_never_lost(tmp_path, sig, phase, at):
    inp = _lines(tmp_path / "in.txt", 300)
    out = tmp_path / "out.h5"
    script = tmp_path / "run.py"
    script.write_text(SIGNAL_INSIDE_H5PY, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), sig, phase, str(at), "embed", str(inp), str(out),
                           "--all", "--quiet", "--batch-size", "16"], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == "elmo embed: interrupted", proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "run.py"]   # no output, no temporary


def test_resume_drops_the_metrics_logged_after_the_checkpoint(tmp_path):
    # Killed after step 40 was logged but with its last checkpoint at step 25: steps 30 and 40 are
    # trained again, so their lines go; a line cut short by the kill goes too.
    from torchelmo.train.metrics import METRICS_NAME, MetricsLog
    path = tmp_path / METRICS_NAME
    entries = [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.5}, {"step": 20, "valid_ppl_mean": 90.0},
               {"step": 30, "loss": 4.2}, {"step": 40, "valid_ppl_mean": 80.0}]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + '{"step": 41, "lo', encoding="utf-8")
    log = MetricsLog(tmp_path, resumed_at=25)
    assert log.last_valid == {"step": 20, "valid_ppl_mean": 90.0}
    log.record({"step": 30, "loss": 4.25})
    log.close()
    assert [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] == \
        entries[:3] + [{"step": 30, "loss": 4.25}]
    MetricsLog(tmp_path, resumed_at=None).close()    # a new run starts an empty log
    assert path.read_text(encoding="utf-8") == ""


def test_a_rerun_with_the_same_settings_is_bitwise_identical(tmp_path):
    from torchelmo.cli import main
    inp = _lines(tmp_path / "in.txt", 120)
    for name in ("a.h5", "b.h5"):
        assert main(["embed", str(inp), str(tmp_path / name), "--all", "--model", "default", "--threads", "1",
                     "--batch-size", "32", "-q"]) == 0
    with h5py.File(tmp_path / "a.h5", "r") as a, h5py.File(tmp_path / "b.h5", "r") as b:
        assert sorted(a.keys()) == sorted(b.keys()) and len(a.keys()) == 121   # 120 lines + the index
        for key in a:
            x, y = a[key][...], b[key][...]
            assert x.dtype == y.dtype and x.shape == y.shape, key
            if x.dtype == object:                       # sentence_to_index: its text
                assert x.tolist() == y.tolist(), key
            else:
                assert x.dtype == np.float32 and x.tobytes() == y.tobytes(), key
        assert dict(a.attrs) == dict(b.attrs)


def test_a_model_larger_than_the_memory_left_is_refused_before_allocation(tmp_path, monkeypatch, capsys):
    from torchelmo import BiLM, runtime
    from torchelmo.model.config import ElmoConfig
    model = BiLM.from_pretrained("default")
    model.save_pretrained(tmp_path / "m")
    need = 4 * model.config.num_parameters()
    free = runtime.available_memory()
    assert free is None or free > need
    monkeypatch.setattr(runtime, "available_memory", lambda: need - 1)
    message = f"a biLM of {need // 4:,} parameters needs 0.0 GiB for its parameters, more than the 0.0 GiB"
    allocated = []
    with monkeypatch.context() as m:
        m.setattr(torch.nn.Embedding, "__init__", lambda *a, **k: allocated.append(1))
        for load in (lambda: BiLM.from_pretrained(tmp_path / "m"),
                     lambda: BiLM(ElmoConfig.from_json_file(tmp_path / "m" / "config.json"))):
            with pytest.raises(ElmoError, match=message):
                load()
    assert allocated == []
    one_line_error(capsys, ["embed", _lines(tmp_path / "in.txt", 3), tmp_path / "out.h5", "--all",
                            "--model", tmp_path / "m"], message)
    monkeypatch.setattr(runtime, "available_memory", lambda: need)
    assert BiLM.from_pretrained(tmp_path / "m").config == model.config


def test_every_small_json_file_is_read_with_one_line_errors(tmp_path, capsys):
    # Options files, LM descriptions, train configs, probe results and ELMoForManyLangs configs
    # share one reader: missing, not UTF-8, not JSON or not an object is one line naming the file
    # (the LM description and the train config used to raise a bare UnicodeDecodeError).
    from torchelmo import ElmoConfig
    from torchelmo.integrations.manylangs.files import _read_json as manylangs_config
    from torchelmo.io.fileio import read_json
    from torchelmo.lm.model import EXTRA_CONFIG_NAME, read_lm_meta
    from torchelmo.probe.report import load_results

    bad = {"latin1.json": b'{"name": "caf\xe9"}', "cut.json": b'{"lstm": ', "list.json": b"[1, 2]"}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    want = {"latin1.json": "latin1.json: not UTF-8 text (byte 13)", "cut.json": "cut.json: not valid JSON (line 1",
            "list.json": "list.json: a train config must be a JSON object, got an array"}
    for name, msg in want.items():
        with pytest.raises(ElmoError, match=re.escape(msg)):
            read_json(tmp_path / name, "train config")
        one_line_error(capsys, ["train", "--config", tmp_path / name, "--out", tmp_path / "run"], name)
    with pytest.raises(ElmoError, match="absent.json: no such options file"):
        ElmoConfig.from_json_file(tmp_path / "absent.json")
    with pytest.raises(ElmoError, match="latin1.json: not UTF-8 text"):
        ElmoConfig.from_json_file(tmp_path / "latin1.json")
    with pytest.raises(ElmoError, match="list.json: a probe results file must be a JSON object, got an array"):
        load_results(tmp_path / "list.json")
    with pytest.raises(ElmoError, match="cut.json: not valid JSON"):
        manylangs_config(tmp_path / "cut.json")
    model = tmp_path / "lm"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / EXTRA_CONFIG_NAME).write_bytes(b"\xff\xfe{}")
    with pytest.raises(ElmoError, match=f"{EXTRA_CONFIG_NAME}: not UTF-8 text"):
        read_lm_meta(model)
