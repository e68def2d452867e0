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
