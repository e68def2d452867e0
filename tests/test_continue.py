"""Continuing a run whose checkpoints are lost, from a model it saved (``--continue-from``): the
saved model's weights, step, schedule and data position; a fresh optimizer warmed up again; and
from there exact resumes as before (docs/training.md)."""

import json
import math
import shutil

import pytest
import torch

from conftest import base_config
from helpers import one_line_error
from torchelmo.errors import ElmoError
from torchelmo.lm.model import LanguageModel
from torchelmo.train import train
from torchelmo.train.checkpoint import CHECKPOINT_NAME, CONTINUE_KEY
from torchelmo.train.config import REWARM_STEPS

KW = dict(softmax="sampled", num_samples=20, dropout=0.1, lr_schedule="cosine", max_steps=8, eval_every=4,
          checkpoint_every=4, keep_checkpoints=3)


@pytest.fixture(scope="module")
def lost_run(tmp_path_factory, fixture_corpus):
    """An 8-step run validating every 4 steps: its best/ model and the checkpoint of that step."""
    data, vocab = fixture_corpus
    tmp = tmp_path_factory.mktemp("lost")
    train(base_config(tmp, data, vocab, valid=[str(data)], **KW), log=lambda s: None)
    return tmp / "run"


def _best(run):
    meta = json.loads((run / "best" / "training.json").read_text())
    return meta["train"]["steps"], meta["train"][CONTINUE_KEY]


def test_a_saved_model_records_the_step_schedule_and_data_position_of_its_checkpoint(lost_run):
    step, point = _best(lost_run)
    ckpt = torch.load(lost_run / "checkpoints" / f"step-{step:08d}.pt", weights_only=False)
    assert point["progress"]["step"] == ckpt["step"] == step
    assert point["progress"]["tokens_seen"] == ckpt["tokens_seen"]
    assert point["progress"]["best"] == ckpt["best"] and point["progress"]["last_valid_step"] == step
    assert json.loads(json.dumps(ckpt["data"])) == point["data"]   # the same data position
    assert point["config"]["lr_schedule"] == "cosine" and point["config"]["max_steps"] == 8
    final = json.loads((lost_run / "model" / "training.json").read_text())["train"][CONTINUE_KEY]
    assert final["progress"]["step"] == 8


def test_continuing_takes_the_weights_and_position_then_resumes_exactly(tmp_path, lost_run, fixture_corpus):
    data, vocab = fixture_corpus
    step, _ = _best(lost_run)
    kw = {**KW, "valid": [str(data)], "max_steps": 12, "continue_from": str(lost_run / "best")}
    logs = []
    # Straight on from the saved model to step 12 ...
    train(base_config(tmp_path / "straight", data, vocab, **kw), log=logs.append)
    assert any(f"continued from {lost_run / 'best'} at step {step}, inexactly" in m for m in logs)
    run = tmp_path / "straight" / "run"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0] == {"step": step, "continued_from": str(lost_run / "best")}
    first = metrics[1]
    assert first["step"] == step + 2 and first["tokens"] > json.loads(
        (lost_run / "best" / "training.json").read_text())["train"][CONTINUE_KEY]["progress"]["tokens_seen"]
    # ... the lr warmed up again from the continued step: 2 of REWARM_STEPS of the schedule's
    cfg = base_config(tmp_path, data, vocab, **kw)
    assert first["lr"] == pytest.approx(cfg.learning_rate * cfg.lr_factor(step + 1) * (step + 2 - step) / REWARM_STEPS)
    assert cfg.lr_factor(step + 1, step) < cfg.lr_factor(step + 1) / 100
    assert cfg.lr_factor(step + REWARM_STEPS, step) == cfg.lr_factor(step + REWARM_STEPS)
    kept = torch.load(run / "checkpoints" / f"step-{step + 4:08d}.pt", weights_only=False)
    assert kept["rewarm_from"] == step
    # ... and in chunks: continued to step+4 (its checkpoint carries the re-warm), then resumed.
    train(base_config(tmp_path / "chunked", data, vocab, **{**kw, "max_steps": step + 4}), log=lambda s: None)
    chunked = tmp_path / "chunked" / "run"
    start = LanguageModel.from_pretrained(lost_run / "best").state_dict()
    ckpt = torch.load(chunked / CHECKPOINT_NAME, weights_only=False)
    assert ckpt["rewarm_from"] == step and ckpt["step"] == step + 4
    assert any(not torch.equal(ckpt["model"][k], start[k]) for k in start)   # it trained on from there
    resumed = {**kw, "continue_from": None, "resume": True}
    train(base_config(tmp_path / "chunked", data, vocab, **resumed), log=lambda s: None)
    a = LanguageModel.from_pretrained(run / "model").state_dict()
    b = LanguageModel.from_pretrained(chunked / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_model_stored_in_fp16_continues(tmp_path, lost_run, fixture_corpus):
    # The form a run's milestone is kept in a repository: half the size, each weight rounded.
    data, vocab = fixture_corpus
    step, _ = _best(lost_run)
    src = lost_run / "best"
    meta = json.loads((src / "training.json").read_text())
    half = LanguageModel.from_pretrained(src).save_pretrained(tmp_path / "half", extra={"train": meta["train"]},
                                                             dtype="float16")
    logs = []
    train(base_config(tmp_path, data, vocab, **{**KW, "valid": [str(data)], "max_steps": step + 2, "continue_from": str(half)}),
          log=logs.append)
    assert any(f"at step {step}, inexactly" in m for m in logs)
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step + 2


def test_what_cannot_be_continued_is_refused_in_one_line(tmp_path, lost_run, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    args = ["train", "--train", data, "--valid", data, "--vocab", vocab, "--model", "tiny", "--batch-size", "4", "--unroll", "5",
            "--softmax", "sampled", "--num-samples", "20", "--dropout", "0.1", "--lr-schedule", "cosine",
            "--max-steps", "12", "--eval-every", "4", "--checkpoint-every", "4", "--keep-checkpoints", "3",
            "--log-every", "2", "--threads", "1", "--no-progress"]
    best = lost_run / "best"
    # not a model a run saved (the published/ folder of the same run, its checkpoints), or one
    # saved without the record (by an earlier version)
    one_line_error(capsys, [*args, "--out", tmp_path / "a", "--continue-from", lost_run / "published"],
                   "--continue-from", "not a model a training run saved")
    one_line_error(capsys, [*args, "--out", tmp_path / "a", "--continue-from", lost_run / "checkpoints"],
                   "--continue-from", "not a model a training run saved", "no config.json")
    plain = tmp_path / "plain"
    shutil.copytree(best, plain)
    meta = json.loads((plain / "training.json").read_text())
    del meta["train"][CONTINUE_KEY]
    (plain / "training.json").write_text(json.dumps(meta))
    one_line_error(capsys, [*args, "--out", tmp_path / "a", "--continue-from", plain], "no 'continue' record")
    one_line_error(capsys, [*args, "--out", tmp_path / "b", "--continue-from", tmp_path / "none"],
                   "no such model directory")
    # another setting than the run's
    one_line_error(capsys, [*args, "--out", tmp_path / "c", "--continue-from", best, "--lr", "0.5"],
                   "other settings", "lr (None -> 0.5)")
    # a run that has its checkpoint: --resume alone continues it exactly
    run = tmp_path / "d"
    shutil.copytree(lost_run, run)
    one_line_error(capsys, [*args, "--out", run, "--resume", "--continue-from", best],
                   "holds a checkpoint (step 8)", "--resume alone")
    # another vocabulary
    other = tmp_path / "vocab.txt"
    lines = vocab.read_text().splitlines()
    other.write_text("\n".join([*lines[:3], lines[4], lines[3], *lines[5:]]) + "\n")
    i = args.index("--vocab")
    changed = [*args[:i + 1], other, *args[i + 2:]]
    one_line_error(capsys, [*changed, "--out", tmp_path / "e", "--continue-from", best], "other settings", "vocab")
    # the same vocabulary file, but the saved model's own has two words swapped
    swapped = tmp_path / "swapped"
    shutil.copytree(best, swapped)
    shutil.copy(other, swapped / "vocab.txt")
    one_line_error(capsys, [*args, "--out", tmp_path / "g", "--continue-from", swapped], "its vocabulary",
                   "reordered")
    # a damaged record
    damaged = tmp_path / "damaged"
    shutil.copytree(best, damaged)
    meta = json.loads((damaged / "training.json").read_text())
    meta["train"][CONTINUE_KEY]["progress"]["step"] = -5
    (damaged / "training.json").write_text(json.dumps(meta))
    one_line_error(capsys, [*args, "--out", tmp_path / "f", "--continue-from", damaged], "step", "malformed")
    assert not any((tmp_path / x / CHECKPOINT_NAME).exists() for x in "abcefg")


def test_the_continue_record_needs_no_infinity(lost_run):
    # best/ is written after an improving validation; model/ of a run without validation has no
    # best perplexity: stored as null, read back as infinity.
    from torchelmo.train.checkpoint import Progress, continuation

    class Batcher:
        def state_dict(self):
            return {"position": 0}

    cfg = base_config(lost_run.parent, "x", "y")
    point = continuation(cfg, Progress(step=3), Batcher())
    assert point["progress"]["best"] is None
    assert json.loads(json.dumps(point, allow_nan=False))["progress"]["step"] == 3
    assert math.isinf(Progress().best)
    with pytest.raises(ElmoError):
        from torchelmo.train.checkpoint import continue_point
        continue_point(lost_run / "nothing-here", cfg, None)


def test_continuing_keeps_the_recorded_last_validation(tmp_path, lost_run, fixture_corpus):
    # A model saved between validations continues knowing when the last one ran (not at its own
    # step), so that the continued run validates at the end as the original would have.
    from torchelmo.train.checkpoint import continue_point

    data, vocab = fixture_corpus
    cfg = base_config(tmp_path, data, vocab, valid=[str(data)], **KW)
    src = tmp_path / "between"
    shutil.copytree(lost_run / "model", src)
    meta = json.loads((src / "training.json").read_text())
    progress = meta["train"][CONTINUE_KEY]["progress"]
    assert progress["step"] == 8
    progress.update(last_valid_step=4, best=None)
    (src / "training.json").write_text(json.dumps(meta))
    got, _ = continue_point(src, cfg, LanguageModel.from_pretrained(lost_run / "model"))
    assert (got.step, got.last_valid_step, got.rewarm_from) == (8, 4, 8) and math.isinf(got.best)
    progress["last_valid_step"] = 9      # a validation after the model's own step: damaged
    (src / "training.json").write_text(json.dumps(meta))
    with pytest.raises(ElmoError, match="last_valid_step of its progress malformed"):
        continue_point(src, cfg, LanguageModel.from_pretrained(lost_run / "model"))
