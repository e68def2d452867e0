"""Hostile and damaged files: no code runs from a checkpoint, options or weights file, and
each bad one ends in one line naming the file and what is wrong (docs/reliability.md)."""

import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from helpers import one_line_error, tiny_published, write_lines
from torchelmo.errors import ElmoError
from torchelmo.train import CHECKPOINT_NAME


# Checkpoints: no code runs from one; foreign ones are one-line errors.
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


# Options and weights: strict types, bounds, finite numbers.
def _options(**lstm):
    from torchelmo import preset
    opts = preset("tiny").to_options()
    opts["lstm"].update(lstm)
    return opts


# A training run's own files, read as untrusted input on resume: one line for each damage, and the
# run as it was (nothing rewritten).
def _ckpt_field(name, value):
    def damage(run):
        ckpt = torch.load(run / CHECKPOINT_NAME, weights_only=False)
        ckpt[name] = value
        torch.save(ckpt, run / CHECKPOINT_NAME)
    return damage


def _metrics(text: bytes):
    def damage(run):
        lines = (run / "metrics.jsonl").read_bytes()
        (run / "metrics.jsonl").write_bytes(text + lines)
    return damage


def _replace_with(name, kind):
    def damage(run):
        p = run / name
        if p.is_dir():
            import shutil
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
        p.mkdir() if kind == "dir" else p.write_text("x")
    return damage


@pytest.mark.parametrize("damage, parts", [
    (_metrics(b'{"step": "x"}\n'), ["metrics.jsonl:1", "whole-number step"]),
    (_metrics(b'{"step": null}\n'), ["metrics.jsonl:1", "whole-number step"]),
    (_metrics(b'{"step": true}\n'), ["metrics.jsonl:1", "whole-number step"]),
    (_metrics(b'\xff\xfe{"step": 1}\n'), ["metrics.jsonl:1", "not a line of JSON"]),
    (_metrics(b'[1, 2]\n'), ["metrics.jsonl:1", "whole-number step"]),
    (_replace_with("metrics.jsonl", "dir"), ["metrics.jsonl", "not a regular file"]),
    (_replace_with("checkpoints", "file"), ["checkpoints", "not a directory"]),
    (_ckpt_field("step", -5), ["step is -5", "whole number"]),
    (_ckpt_field("step", 10**18), ["step is 1000000000000000000"]),
    (_ckpt_field("step", "3"), ["step is '3'"]),
    (_ckpt_field("lr_scale", float("nan")), ["lr_scale is nan"]),
    (_ckpt_field("best", -1.0), ["best is -1.0"]),
    (_ckpt_field("rng", [{"torch": "x", "python": ()}]), ["rng is malformed"]),
    (_ckpt_field("rng", [{"torch": torch.zeros(3, dtype=torch.uint8), "python": (3, (1, 2), None)}]),
     ["generator state does not load"]),
    (_ckpt_field("lstm_state", [("a", "b")]), ["lstm_state is malformed"]),
    (_ckpt_field("world_size", 0), ["world_size is 0"]),
])
def test_tampered_run_files_are_one_line_refusals_on_resume(tmp_path, tiny_run, capsys, damage, parts):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    damage(run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "train.lock"}
    one_line_error(capsys, ["train", "--out", run, "--resume", "--max-steps", "4", "--no-progress"], *parts)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "train.lock"}
    assert after == before


def test_a_metrics_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path, tiny_run):
    import json
    import shutil

    from torchelmo.cli import main as cli_main
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "lo')                           # the last line, half written
    assert cli_main(["train", "--out", str(run), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 4


@pytest.mark.core
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


@pytest.mark.core
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
                            write_lines(tmp_path / "in.txt", 2), tmp_path / "o.h5", "--top"], str(bad), "not UTF-8")
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.core
@pytest.mark.parametrize("damage, msg", [
    ("nan", "dataset 'CNN_proj/b_proj' holds 1 non-finite value"),
    ("inf", "dataset 'CNN_proj/b_proj' holds 1 non-finite value"),
    ("string", "dataset 'CNN_proj/b_proj' has dtype object, expected floating point"),
    ("complex", "dataset 'CNN_proj/b_proj' has dtype complex64, expected floating point"),
    ("truncated", "damaged or truncated HDF5 file"),
])
def test_damaged_published_weights_are_one_line_errors(tmp_path, damage, msg):

    from torchelmo import BiLM
    options, weights = tiny_published(tmp_path)
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


@pytest.mark.core
def test_non_finite_native_weights_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    from torchelmo import BiLM, preset
    BiLM(preset("tiny")).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["encoder.proj.bias"][0] = float("nan")
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ElmoError, match="tensor 'encoder.proj.bias' holds 1 non-finite value"):
        BiLM.from_pretrained(tmp_path)


# Messages and documented figures.
class _System:
    """Unpickling this would call ``os.system`` (posix.system): never run, since refused."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.core
def test_a_checkpoint_holding_os_system_is_refused_by_name(tmp_path):
    from torchelmo.train.checkpoint import load_checkpoint
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"model": {"x": _System(marker)}}, path)
    with pytest.raises(ElmoError, match=r"refused: holds Python objects \((posix|nt)\.system\)"):
        load_checkpoint(path)
    assert not marker.exists()


_BOUNDED_READ = """
import sys
from torchelmo import BiLM, ElmoConfig, ElmoError
from torchelmo.model.manylangs.files import _read_text
from torchelmo.lm.vocab import Vocabulary
from torchelmo.train import TrainConfig
from torchelmo.io.fileio import read_json
kind, path = sys.argv[1], sys.argv[2]
readers = {"options": ElmoConfig.from_json_file, "native config": lambda p: BiLM.from_pretrained(p.rsplit("/", 1)[0]),
           "train config": lambda p: read_json(p, "train config"), "vocabulary": Vocabulary.from_file,
           "char.dic": lambda p: _read_text(__import__("pathlib").Path(p))}
try:
    readers[kind](path)
except ElmoError as e:
    print(str(e))
    sys.exit(3)
"""


@pytest.mark.core
@pytest.mark.parametrize("kind, name", [("options", "options.json"), ("native config", "config.json"),
                                        ("train config", "train.json"), ("vocabulary", "vocab.txt"),
                                        ("char.dic", "char.dic")])
@pytest.mark.parametrize("shape", ["sparse 64 GiB", "/dev/zero", "FIFO", "directory"])
def test_every_small_file_is_read_with_bounds(tmp_path, kind, name, shape):
    # Each file the library parses is a regular file of bounded size, refused at once otherwise
    # (these used to end in a MemoryError traceback, or hang on a FIFO until killed).
    import subprocess
    import sys
    import time

    from helpers import ENV
    d = tmp_path / "model"
    d.mkdir()
    if kind == "native config":
        (d / "model.safetensors").write_bytes(b"")    # the config is read first
    path = d / name
    if shape == "sparse 64 GiB":
        with open(path, "wb") as f:
            f.truncate(64 * 2**30)
        want = "bytes, over the"
    elif shape == "/dev/zero":
        path.symlink_to("/dev/zero")
        want = "a character device, not a regular file"
    elif shape == "FIFO":
        os.mkfifo(path)
        want = "a FIFO, not a regular file"
    else:
        path.mkdir()
        want = "a directory, not a regular file"
    t = time.monotonic()
    run = subprocess.run([sys.executable, "-c", _BOUNDED_READ, kind, str(path)], env=ENV, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 3, (run.returncode, run.stderr[-1500:])
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and want in lines[0], lines
    assert time.monotonic() - t < 30


@pytest.mark.core
def test_every_small_json_file_is_read_with_one_line_errors(tmp_path, capsys):
    # Options files, LM descriptions, train configs, probe results and ELMoForManyLangs configs
    # share one reader: missing, not UTF-8, not JSON or not an object is one line naming the file
    # (the LM description and the train config used to raise a bare UnicodeDecodeError).
    from torchelmo import ElmoConfig
    from torchelmo.io.fileio import read_json
    from torchelmo.lm.model import EXTRA_CONFIG_NAME, read_lm_meta
    from torchelmo.model.manylangs.files import _read_json as manylangs_config
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

