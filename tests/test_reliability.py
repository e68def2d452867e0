"""Reliability and safety: what a hostile, broken or cut-off input, a full disk or a signal does.

Every case ends in a one-line error (or "interrupted"), never in executed code, a raw traceback,
silently wrong numbers or a partial output file.
"""

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import base_config
from torchelmo.cli import main as cli_main
from torchelmo.errors import ElmoError
from torchelmo.train import CHECKPOINT_NAME, train

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(capsys, argv, *parts):
    """Run the CLI, expecting exit 1 and a single stderr line holding every one of ``parts``."""
    assert cli_main([str(a) for a in argv]) == 1, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for part in parts:
        assert part in err[0], (part, err[0])
    return err[0]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, fixture_corpus):
    """A finished three-step run of the tiny model, with validation."""
    data, vocab = fixture_corpus
    tmp = tmp_path_factory.mktemp("run")
    cfg = base_config(tmp, data, vocab, max_steps=3, valid=[str(data)], eval_every=3, checkpoint_every=3)
    train(cfg, log=lambda s: None)
    return tmp / "run"


# ------------------------------------------------------------------------------------------------
# Checkpoints: no code runs from one; foreign ones are one-line errors.
# ------------------------------------------------------------------------------------------------
class _Planted:
    """Unpickling this calls ``Path.touch`` on the marker: the stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_runs_code_is_refused_on_every_load_path(tmp_path, tiny_run, capsys):
    ckpt = torch.load(tiny_run / CHECKPOINT_NAME, weights_only=True)
    marker = tmp_path / "code-ran"
    run = tmp_path / "evil-run"
    run.mkdir()
    ckpt["model"]["extra"] = _Planted(marker)
    torch.save(ckpt, run / CHECKPOINT_NAME)
    evil = run / CHECKPOINT_NAME
    for argv in (["train", "--out", run, "--resume", "--max-steps", "4", "--no-progress"],
                 ["average", evil, "-o", tmp_path / "avg"]):
        one_line_error(capsys, argv, str(evil), "refused")
    from torchelmo.train.checkpoint import load_checkpoint, load_lm
    for load in (load_checkpoint, load_lm):
        with pytest.raises(ElmoError, match="refused"):
            load(evil)
    assert not marker.exists()


def test_foreign_checkpoints_are_one_line_errors(tmp_path, tiny_run, capsys):
    good = torch.load(tiny_run / CHECKPOINT_NAME, weights_only=True)
    cases = {
        "a list": ([1, 2, 3], "not an elmo training checkpoint"),
        "missing keys": ({k: v for k, v in good.items() if k != "optimizer"}, "missing optimizer"),
        "wrong shapes": ({**good, "model": {k: v[..., :1] if v.dim() else v for k, v in good["model"].items()}},
                         "does not fit"),
    }
    for name, (content, msg) in cases.items():
        run = tmp_path / name.replace(" ", "-")
        run.mkdir()
        torch.save(content, run / CHECKPOINT_NAME)
        one_line_error(capsys, ["train", "--out", run, "--resume", "--max-steps", "4", "--no-progress"],
                       str(run / CHECKPOINT_NAME), msg)
    adir = tmp_path / "dir-run"
    (adir / CHECKPOINT_NAME).mkdir(parents=True)
    one_line_error(capsys, ["train", "--out", adir, "--resume", "--max-steps", "4", "--no-progress"],
                   "is a directory")
    one_line_error(capsys, ["average", adir / CHECKPOINT_NAME, "-o", tmp_path / "avg"], "not a native model")


# ------------------------------------------------------------------------------------------------
# Metrics.
# ------------------------------------------------------------------------------------------------
def test_resuming_a_finished_run_adds_no_metrics_line(tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = (run / "metrics.jsonl").read_text()
    assert sum("valid_ppl_mean" in ln for ln in before.splitlines()) == 1
    assert cli_main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert (run / "metrics.jsonl").read_text() == before


# ------------------------------------------------------------------------------------------------
# Options and weights: strict types, bounds, finite numbers.
# ------------------------------------------------------------------------------------------------
def _options(**lstm):
    from torchelmo import preset
    opts = preset("tiny").to_options()
    opts["lstm"].update(lstm)
    return opts


@pytest.mark.parametrize("change, msg", [
    ({"use_skip_connections": "false"}, "lstm.use_skip_connections must be true or false"),
    ({"dim": 64.9}, "lstm.dim must be an integer"),
    ({"n_layers": True}, "lstm.n_layers must be an integer"),
    ({"cell_clip": -3.0}, "lstm.cell_clip must be a positive finite number"),
    ({"cell_clip": float("nan")}, "lstm.cell_clip must be a positive finite number"),
    ({"proj_clip": "3"}, "lstm.proj_clip must be a number"),
    ({"dim": 10**12}, "lstm.dim must be in 1..65,536"),
])
def test_options_are_not_coerced_or_unbounded(change, msg):
    from torchelmo import ElmoConfig
    with pytest.raises(ElmoError, match=f"^opts.json: option {msg}"):
        ElmoConfig.from_options(_options(**change), "opts.json")


def test_options_bound_the_model_size_and_filters():
    from torchelmo import ElmoConfig
    opts = _options()
    opts["char_cnn"]["n_highway"] = 10**9
    with pytest.raises(ElmoError, match="char_cnn.n_highway must be in 0..64"):
        ElmoConfig.from_options(opts, "o")
    opts = _options(dim=65_536, projection_dim=65_536)
    with pytest.raises(ElmoError, match="parameters, more than"):
        ElmoConfig.from_options(opts, "o")
    opts = _options()
    opts["char_cnn"]["filters"] = [[1, 4.0]]
    with pytest.raises(ElmoError, match="filters entry"):
        ElmoConfig.from_options(opts, "o")


def test_options_file_not_utf8(tmp_path, capsys, fixture_model):
    bad = tmp_path / "options.json"
    bad.write_bytes(b'{"lstm": "\xff"}')
    fixture_model.export_published(tmp_path, "m")
    one_line_error(capsys, ["embed", "--options-file", bad, "--weight-file", tmp_path / "m_weights.hdf5",
                            _lines(tmp_path / "in.txt", 2), tmp_path / "o.h5", "--top"], str(bad), "not UTF-8")
    assert not (tmp_path / "o.h5").exists()


def _tiny_published(tmp_path):
    from torchelmo import BiLM, preset
    return BiLM(preset("tiny")).export_published(tmp_path, "tiny")


@pytest.mark.parametrize("damage, msg", [
    ("nan", "dataset 'CNN_proj/b_proj' holds 1 non-finite value"),
    ("inf", "dataset 'CNN_proj/b_proj' holds 1 non-finite value"),
    ("string", "dataset 'CNN_proj/b_proj' has dtype object, expected floating point"),
    ("complex", "dataset 'CNN_proj/b_proj' has dtype complex64, expected floating point"),
    ("truncated", "damaged or truncated HDF5 file"),
])
def test_damaged_published_weights_are_one_line_errors(tmp_path, damage, msg):
    import h5py
    import numpy as np

    from torchelmo import BiLM
    options, weights = _tiny_published(tmp_path)
    if damage == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) * 2 // 3])
    else:
        with h5py.File(weights, "r+") as f:
            a = f["CNN_proj/b_proj"][...]
            del f["CNN_proj/b_proj"]
            if damage in ("nan", "inf"):
                a[3] = float(damage)
                f["CNN_proj/b_proj"] = a
            elif damage == "string":
                f.create_dataset("CNN_proj/b_proj", data=np.array(["x"] * len(a), dtype=object),
                                 dtype=h5py.string_dtype())
            else:
                f["CNN_proj/b_proj"] = a.astype(np.complex64)
    with pytest.raises(ElmoError, match=msg) as e:
        BiLM.from_published(options, weights)
    assert "\n" not in str(e.value) and str(weights) in str(e.value)


def test_non_finite_native_weights_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    from torchelmo import BiLM, preset
    BiLM(preset("tiny")).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["encoder.proj.bias"][0] = float("nan")
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ElmoError, match="tensor 'encoder.proj.bias' holds 1 non-finite value"):
        BiLM.from_pretrained(tmp_path)


def test_python_api_rejects_bad_input(fixture_model):
    from torchelmo import Elmo, batch_to_ids
    from torchelmo.embed import embed_sentences
    with pytest.raises(ElmoError, match="sentences must be an iterable"):
        embed_sentences(fixture_model, None)
    with pytest.raises(ElmoError, match="sentence 1 is NoneType"):
        embed_sentences(fixture_model, [["a"], None])
    ids = batch_to_ids([["a", "b"]])
    with pytest.raises(ElmoError, match="must be integers"):
        fixture_model(ids.float())
    for bad in (ids + 1000, -ids):
        with pytest.raises(ElmoError, match=r"char ids must be in 0\.\.261"):
            fixture_model(bad)
    with pytest.raises(ElmoError, match=r"dropout must be in \[0, 1\)"):
        Elmo(fixture_model, dropout=2.0)
    with pytest.raises(ElmoError, match="initial scalars must be finite"):
        Elmo(fixture_model, scalar_mix_parameters=[0.0, float("nan"), 0.0])


def test_train_config_types_and_paths(tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    base = ["train", "--train", data, "--vocab", vocab, "--model", "tiny", "--max-steps", "1", "--no-progress"]
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    one_line_error(capsys, base + ["--out", tmp_path / "r", "--config", listed], str(listed), "must be a JSON object, got an array")
    for field, value, msg in (("max_steps", "10", "max_steps must be an integer"),
                              ("dropout", True, "dropout must be a finite number"),
                              ("variational_dropout", "false", "variational_dropout must be true or false"),
                              ("valid", [1], "valid must be a list of strings")):
        cfg = tmp_path / f"{field}.json"
        cfg.write_text(json.dumps({field: value}))
        one_line_error(capsys, ["train", "--train", data, "--vocab", vocab, "--out", tmp_path / "r",
                                "--config", cfg], msg)
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(capsys, base + ["--out", afile], "is a file")
    one_line_error(capsys, ["average", ROOT / "src" / "torchelmo" / "default_model", "-o", afile], "is a file")
    assert afile.read_text() == "x"


# ------------------------------------------------------------------------------------------------
def serve(handler) -> tuple[http.server.ThreadingHTTPServer, str]:
    """``handler`` served on 127.0.0.1 by daemon threads: the server (to shut down) and its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


# Downloads, from a server on 127.0.0.1.
# ------------------------------------------------------------------------------------------------
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
    _, weights = _tiny_published(tmp_path)
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
    _, weights = _tiny_published(tmp_path)
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


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/w.hdf5"])
def test_redirects_to_other_schemes_are_refused(tmp_path, server, location):
    from torchelmo.io.download import cached_path
    base, routes = server
    routes["/w.hdf5"] = (302, {"Location": location}, b"")
    with pytest.raises(ElmoError, match="refused a redirect"):
        cached_path(f"{base}/w.hdf5", cache=tmp_path / "cache", progress=False)
    assert _cache_files(tmp_path / "cache") == []


# ------------------------------------------------------------------------------------------------
# Writing: a full disk, a read-only or wrong place, temp files of killed runs.
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (mounting needs root; elsewhere the test is skipped, saying so)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a full disk is simulated with a small tmpfs, which only root can mount")
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _lines(path: Path, n: int) -> Path:
    words = "the quick brown fox jumps over the lazy dog again and again".split()
    path.write_text("".join(" ".join(words[: 3 + i % 9]) + "\n" for i in range(n)))
    return path


def test_full_disk_in_embed_is_one_line_error_and_leaves_nothing(tmp_path, small_disk, capsys):
    inp = _lines(tmp_path / "in.txt", 400)   # about 4 MB of --all output from the default model
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


def test_read_only_place_and_directory_output_fail_before_any_work(tmp_path, small_disk, capsys, monkeypatch):
    import torchelmo.embed.engine as engine
    inp = _lines(tmp_path / "in.txt", 5)
    monkeypatch.setattr(engine, "start_batch", lambda *a, **k: pytest.fail("embedded before checking OUTPUT"))
    one_line_error(capsys, ["embed", inp, tmp_path, "--top", "--quiet"], str(tmp_path), "is a directory")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    one_line_error(capsys, ["embed", inp, small_disk / "o.h5", "--top", "--quiet"], "Read-only file system")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


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
    embed_file(BiLM.from_pretrained("default"), _lines(tmp_path / "in.txt", 3), out, "top")
    left = {p.name for p in tmp_path.iterdir()}
    assert dead.name not in left and legacy_old.name not in left
    assert {live.name, other_host.name, legacy_new.name, unrelated.name, "out.h5"} <= left
    stale_ckpt = tmp_path / f".{CHECKPOINT_NAME}.{_host()}.{_dead_pid()}.zz.tmp"
    stale_ckpt.write_bytes(b"x")
    save_checkpoint({"x": torch.zeros(1)}, tmp_path)
    assert not stale_ckpt.exists()


# ------------------------------------------------------------------------------------------------
# Signals: real ones, at moments spread over an embed's writing.
# ------------------------------------------------------------------------------------------------
def test_ctrl_c_during_start_up_ends_interrupted(tmp_path):
    # While torch and the model load, before any output exists.
    inp = _lines(tmp_path / "in.txt", 50)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    interrupted = 0
    for delay in (0.3, 0.7, 1.2):
        out = tmp_path / f"o-{delay}.h5"
        proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "embed", str(inp), str(out), "--top",
                                 "--quiet"], env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        if proc.returncode == 0:   # this machine started and finished faster than the delay
            continue
        assert proc.returncode == 130, (delay, proc.returncode, err)
        assert err.strip().splitlines() == ["elmo embed: interrupted"], err
        assert not out.exists()
        interrupted += 1
    assert interrupted >= 2


def test_ctrl_c_and_sigterm_in_embed_always_end_interrupted(tmp_path):
    inp = _lines(tmp_path / "in.txt", 6000)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cases = [(signal.SIGINT, 0.0), (signal.SIGINT, 0.15), (signal.SIGINT, 0.4), (signal.SIGTERM, 0.25)]
    for sig, delay in cases:
        out = tmp_path / f"out-{sig}-{delay}.h5"
        proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "embed", str(inp), str(out), "--all",
                                 "--quiet", "--threads", "1", "--batch-size", "16"],
                                env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(f".{out.name}.") for p in tmp_path.iterdir()):   # writing began
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 130, (sig, delay, proc.returncode, err)
        assert err.strip().splitlines()[-1] == "elmo embed: interrupted", err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("argv, statuses", [(["info", "--list"], [141]), (["info"], [141]),
                                            (["--help"], [0, 141])])   # argparse may drop it itself
def test_output_to_a_closed_pipe_ends_quietly(argv, statuses):
    # The reader is gone before the first write (`| head -1` that has its line), so every
    # write fails: deterministic, where a real `head` races the writer.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "torchelmo.cli", *argv]
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode in statuses and err == "", (proc.returncode, err)
    # stderr into the same closed pipe (`2>&1 | head`): nothing is left over to fail at exit.
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=w, stderr=w)
    finally:
        os.close(w)
    assert proc.wait(timeout=120) in statuses


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
    embed_file(fixture_model, _lines(tmp_path / "in.txt", 300), tmp_path / "o.h5", "top", batch_size=16)
    assert counts["written"] == 300 and counts["most_pending"] <= 16


def test_unpinned_registry_weights_are_checked_against_their_options(tmp_path, server, monkeypatch):
    import h5py

    from torchelmo import BiLM
    from torchelmo.model import registry as R
    from torchelmo.model import weights as W
    base, routes = server
    options, weights = _tiny_published(tmp_path)
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
