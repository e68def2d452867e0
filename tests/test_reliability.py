"""Reliability and safety: what a hostile, broken or cut-off input, a full disk or a signal does.

Every case ends in a one-line error (or "interrupted"), never in executed code, a raw traceback,
silently wrong numbers or a partial output file.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torchelmo.cli import main as cli_main
from torchelmo.errors import ElmoError
from torchelmo.train import CHECKPOINT_NAME, train

from conftest import base_config

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
    w = tmp_path / "w.hdf5"
    fixture_model.export_published(tmp_path, "m")
    one_line_error(capsys, ["embed", "--options-file", bad, "--weight-file", tmp_path / "m_weights.hdf5",
                            tmp_path / "in.txt", tmp_path / "o.h5", "--top"], str(bad), "not UTF-8")
    assert not w.exists()


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
    one_line_error(capsys, base + ["--out", tmp_path / "r", "--config", listed], str(listed), "got a list")
    for field, value, msg in (("max_steps", "10", "max_steps must be an integer"),
                              ("dropout", True, "dropout must be a finite number"),
                              ("bf16", "false", "bf16 must be true or false"),
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
