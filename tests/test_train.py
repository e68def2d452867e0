"""Training: learning on real text, exact resume after SIGKILL, DDP == one process, bad inputs."""

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import base_config, shared_path
from torchelmo.cli import main as cli_main
from torchelmo.errors import ElmoError
from torchelmo.lm.corpus import Corpus
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.vocab import Vocabulary
from torchelmo.train import CHECKPOINT_NAME, TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ptb_slice(tmp_path_factory):
    d = tmp_path_factory.mktemp("ptb")
    ptb = shared_path("data", "lm", "ptb")
    lines = (ptb / "ptb.train.txt").read_text().splitlines()
    (d / "train.txt").write_text("\n".join(lines[:3000]) + "\n")
    (d / "valid.txt").write_text("\n".join((ptb / "ptb.valid.txt").read_text().splitlines()[:300]) + "\n")
    Vocabulary.build([d / "train.txt"], max_size=2000).save(d / "vocab.txt", with_counts=True)
    return d


def unigram_ppl(vocab: Vocabulary, files) -> float:
    # Per direction, a target is a word or one sentence boundary (</S> forward, <S> backward).
    counts = list(vocab.counts)
    counts[0] = 0
    total = sum(counts)
    nll, n = 0.0, 0
    for s, _ in Corpus(files, shuffle=False).sentences(epochs=1):
        for t in vocab.ids(s) + [vocab.eos]:
            nll -= math.log(max(counts[t], 1) / total)
            n += 1
    return math.exp(nll / n)


def test_tiny_run_beats_unigram(tmp_path, ptb_slice):
    cfg = base_config(tmp_path, ptb_slice / "train.txt", ptb_slice / "vocab.txt", valid=[str(ptb_slice / "valid.txt")],
                      batch_size=32, unroll=20, max_steps=250, optimizer="adam", lr=1e-2, dropout=0.0,
                      eval_every=125, log_every=50)
    summary = train(cfg, log=lambda s: None)
    uni = unigram_ppl(Vocabulary.from_file(ptb_slice / "vocab.txt"), [ptb_slice / "valid.txt"])
    v = summary["valid"]
    assert 150 < uni < 250
    # 160k training tokens of a 0.14M-parameter model: about 20% below the unigram model.
    assert v["valid_ppl_forward"] < 0.84 * uni and v["valid_ppl_mean"] < 0.86 * uni
    # Logs: JSONL with train and validation entries; outputs: model dirs + published export.
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [50, 100, 150, 200, 250]
    assert [x["step"] for x in lines if "valid_ppl_mean" in x] == [125, 250]
    run = tmp_path / "run"
    for name in ("model", "best"):
        assert (run / name / "model.safetensors").is_file() and (run / name / "vocab.txt").is_file()
    assert (run / "published" / "elmo_weights.hdf5").is_file()
    # elmo perplexity on the saved model agrees with the run's last validation.
    out = tmp_path / "ppl.json"
    assert cli_main(["perplexity", str(run / "model"), str(ptb_slice / "valid.txt"), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["ppl_forward"] == pytest.approx(v["valid_ppl_forward"], rel=1e-4)
    assert r["tokens"] == 7060 and r["params"] == summary["parameters"]
    # Stream mode counts every token too.
    assert cli_main(["perplexity", str(run / "model"), str(ptb_slice / "valid.txt"), "--mode", "stream",
                     "--batch-size", "4", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["tokens"] == 7060


def _train_cmd(out, data, vocab, steps, extra=()):
    return [sys.executable, "-m", "torchelmo.cli", "train", "--train", str(data), "--vocab", str(vocab),
            "--out", str(out), "--model", "tiny", "--batch-size", "8", "--unroll", "10",
            "--max-steps", str(steps), "--checkpoint-every", "20", "--log-every", "20",
            "--softmax", "sampled", "--num-samples", "300", "--dropout", "0.1", "--threads", "1",
            "--lr-schedule", "cosine", "--warmup-steps", "30", "--no-progress", *extra]


def _params(run):
    from safetensors.torch import load_file
    return load_file(str(Path(run) / "model" / "model.safetensors"))


def _same(a, b, where="") -> None:
    """Every tensor, array and value of two checkpoint trees equal (bitwise for tensors)."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}/{i}")
    else:
        assert a == b, (where, a, b)


def _kill_between_checkpoints(proc, run, after_mtime: int | None) -> None:
    """SIGKILL ``proc`` mid-way between two checkpoints, once it has written one newer than
    ``after_mtime`` (None: any)."""
    try:
        deadline = time.time() + 120
        while not ((run / CHECKPOINT_NAME).is_file()
                   and (after_mtime is None or (run / CHECKPOINT_NAME).stat().st_mtime_ns != after_mtime)):
            assert proc.poll() is None and time.time() < deadline, "the run ended before a new checkpoint"
            time.sleep(0.01)
        time.sleep(0.3)  # mid-way between checkpoints
        assert proc.poll() is None, "the run finished before it could be killed; make it longer"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkill_and_resume_is_exact(tmp_path, ptb_slice):
    # Killed twice, resumed twice: the final checkpoint equals an uninterrupted run's in every
    # tensor (parameters, Adam's moments, the carried LSTM state), the data position, the random
    # generators and the schedule; only the wall-clock time and the output path differ.
    data, vocab = ptb_slice / "train.txt", ptb_slice / "vocab.txt"
    steps = 300
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref = subprocess.run(_train_cmd(tmp_path / "ref", data, vocab, steps), env=env, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    run = tmp_path / "killed"
    _kill_between_checkpoints(subprocess.Popen(_train_cmd(run, data, vocab, steps), env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), run, None)
    assert not (run / "model").exists()
    first = torch.load(run / CHECKPOINT_NAME, weights_only=False)["step"]
    assert 0 < first < steps
    _kill_between_checkpoints(subprocess.Popen(_train_cmd(run, data, vocab, steps, ["--resume"]), env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                              run, (run / CHECKPOINT_NAME).stat().st_mtime_ns)
    second = torch.load(run / CHECKPOINT_NAME, weights_only=False)["step"]
    assert first < second < steps
    res = subprocess.run(_train_cmd(run, data, vocab, steps, ["--resume"]), env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert f"resumed from {run / CHECKPOINT_NAME} at step {second}" in res.stderr
    a, b = _params(tmp_path / "ref"), _params(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ca = torch.load(tmp_path / "ref" / CHECKPOINT_NAME, weights_only=False)
    cb = torch.load(run / CHECKPOINT_NAME, weights_only=False)
    assert ca["step"] == cb["step"] == steps
    for ckpt in (ca, cb):
        ckpt.pop("elapsed")
        ckpt["config"].pop("out_dir")
        ckpt["config"].pop("resume", None)
    _same(ca, cb)
    # The metrics log has each step once.
    steps_logged = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(20, steps + 1, 20))


def test_lr_schedules(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    cos = base_config(tmp_path, data, vocab, max_steps=100, lr_schedule="cosine", warmup_steps=10)
    decay = lambda s: 0.5 * (1 + math.cos(math.pi * s / 100))  # noqa: E731
    assert [cos.lr_factor(s) for s in (0, 4, 9)] == pytest.approx([0.1 * decay(0), 0.5 * decay(4), decay(9)])
    assert cos.lr_factor(50) == pytest.approx(0.5) and cos.lr_factor(100) == pytest.approx(0.0)
    lin = base_config(tmp_path, data, vocab, max_steps=100, lr_schedule="linear")
    assert [lin.lr_factor(s) for s in (0, 25, 100)] == [1.0, 0.75, 0.0]
    assert base_config(tmp_path, data, vocab).lr_factor(5) == 1.0
    # The optimizer really uses it: the logged lr of each step follows the curve.
    cfg = base_config(tmp_path, data, vocab, max_steps=8, log_every=1, optimizer="adam", lr=0.01,
                      lr_schedule="linear", warmup_steps=2)
    train(cfg, log=lambda s: None)
    lrs = [json.loads(x)["lr"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.01 * cfg.lr_factor(s) for s in range(8)])
    with pytest.raises(ElmoError, match="give max_steps"):
        base_config(tmp_path, data, vocab, max_steps=None, epochs=1, lr_schedule="cosine")
    with pytest.raises(ElmoError, match="lr_schedule must be"):
        base_config(tmp_path, data, vocab, lr_schedule="step")


@pytest.mark.parametrize("batching", ["stream", "sentence"])
def test_ddp_two_ranks_equal_one_process(tmp_path, ptb_slice, batching):
    data, vocab = ptb_slice / "train.txt", ptb_slice / "vocab.txt"
    extra = ["--batching", batching, "--dropout", "0", "--max-steps", "8", "--checkpoint-every", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run(_train_cmd(tmp_path / "one", data, vocab, 8, extra), env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *_train_cmd(tmp_path / "two", data, vocab, 8, extra)[1:]]
    two = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 rank(s)" in two.stderr
    a, b = _params(tmp_path / "one"), _params(tmp_path / "two")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=2e-6), (k, (a[k] - b[k]).abs().max())
    la = [json.loads(x)["loss"] for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert la == pytest.approx(lb, rel=1e-5)


def test_nan_loss_stops_and_keeps_last_checkpoint(tmp_path, fixture_corpus, monkeypatch):
    data, vocab = fixture_corpus
    calls = {"n": 0}
    real = LanguageModel.forward

    def forward(self, *a, **kw):
        calls["n"] += 1
        sums, state = real(self, *a, **kw)
        return (sums * float("nan") if calls["n"] == 5 else sums), state

    monkeypatch.setattr(LanguageModel, "forward", forward)
    cfg = base_config(tmp_path, data, vocab, max_steps=10, checkpoint_every=2)
    with pytest.raises(ElmoError, match=r"loss is nan at step 5; the last good checkpoint is .*checkpoint.pt \(step 4\)"):
        train(cfg, log=lambda s: None)
    ck = torch.load(tmp_path / "run" / CHECKPOINT_NAME, weights_only=False)
    assert ck["step"] == 4 and all(torch.isfinite(v).all() for v in ck["model"].values())
    assert not (tmp_path / "run" / "model").exists()


def test_bad_inputs_give_one_line_errors(tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    novocab = tmp_path / "bad_vocab.txt"
    novocab.write_text("the\nof\n")
    cases = [
        (["train", "--train", str(empty), "--out", str(tmp_path / "r1"), "--max-steps", "2"], "no sentences"),
        (["train", "--train", str(data), "--vocab", str(novocab), "--out", str(tmp_path / "r2"), "--max-steps", "2"],
         "bad_vocab.txt: the first three entries must be <S>, </S>, <UNK>"),
        (["train", "--train", str(tmp_path / "nope*.txt"), "--out", str(tmp_path / "r3"), "--max-steps", "2"],
         "matches no files"),
        (["train", "--train", str(data), "--out", str(tmp_path / "r4")], "give max_steps or epochs"),
        (["train", "--train", str(data), "--out", str(tmp_path / "r5"), "--max-steps", "2", "--model", "huge"],
         "neither a preset"),
        (["perplexity", str(tmp_path), str(data)], "not a native model directory"),
        (["vocab", str(empty), "-o", str(tmp_path / "v.txt")], "no sentences"),
    ]
    for argv, msg in cases:
        assert cli_main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)


def test_vocab_cli(tmp_path, fixture_corpus, capsys):
    data, ref_vocab = fixture_corpus
    out = tmp_path / "v.txt"
    assert cli_main(["vocab", str(data), "-o", str(out), "--min-count", "2"]) == 0
    toks = out.read_text().splitlines()
    assert toks[:3] == ["<S>", "</S>", "<UNK>"]
    counts = Vocabulary.build([data]).counts
    assert all(c >= 2 for c in Vocabulary.build([data], min_count=2).counts[3:]) and len(toks) < len(counts)


def test_options_sentence_batching_tokens_accum_bf16_adaptive(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    for i, kw in enumerate([dict(batching="sentence", batch_tokens=64, grad_accum=2, optimizer="adam"),
                            dict(precision="bf16", softmax="sampled", num_samples=10),
                            dict(softmax="adaptive", optimizer="sgd", lr=0.5, epochs=2, max_steps=None)]):
        cfg = base_config(tmp_path / str(i), data, vocab, **kw)
        s = train(cfg, log=lambda s: None)
        assert s["steps"] > 0
        hist = [json.loads(x) for x in (tmp_path / str(i) / "run" / "metrics.jsonl").read_text().splitlines()]
        assert all(math.isfinite(h["loss"]) for h in hist if "loss" in h)
        lm = LanguageModel.from_pretrained(tmp_path / str(i) / "run" / "model")
        assert lm.score([["the", "models"]])[0].forward_logprob < 0
    # epochs=2 over 4 sentences of the fixture ends by itself.
    assert s["tokens"] == 2 * sum(len(x.split()) + 1 for x in data.read_text().splitlines() if x.strip())


def test_init_from_continues_with_new_vocab(tmp_path, fixture_corpus, ptb_slice):
    data, vocab = fixture_corpus
    train(base_config(tmp_path / "a", data, vocab), log=lambda s: None)
    msgs = []
    s = train(base_config(tmp_path / "b", ptb_slice / "valid.txt", ptb_slice / "vocab.txt",
                          init_from=str(tmp_path / "a" / "run" / "model"), max_steps=2), log=msgs.append)
    assert s["steps"] == 2
    assert any("softmax rows carried over" in m for m in msgs)


def test_grad_accum_bound_keeps_micro_batch_seeds_distinct(tmp_path, fixture_corpus):
    from torchelmo.train import MAX_GRAD_ACCUM
    from torchelmo.train.step import micro_seed
    data, vocab = fixture_corpus
    with pytest.raises(ElmoError, match=f"grad_accum must be at most {MAX_GRAD_ACCUM}"):
        base_config(tmp_path, data, vocab, grad_accum=MAX_GRAD_ACCUM + 1)
    base_config(tmp_path, data, vocab, grad_accum=MAX_GRAD_ACCUM)
    seeds = {micro_seed(12345, step, m) for step in range(300) for m in range(MAX_GRAD_ACCUM)}
    assert len(seeds) == 300 * MAX_GRAD_ACCUM


def _tiny_run_argv(data, vocab, out, *extra):
    """``elmo train`` of the tiny model on the fixture corpus into ``out``, with ``extra`` flags."""
    return ["train", "--train", str(data), "--vocab", str(vocab), "--out", str(out), "--model", "tiny",
            "--batch-size", "4", "--unroll", "5", "--threads", "1", "--no-progress", *extra]


def test_cli_resume_reads_the_checkpoint_once(tmp_path, fixture_corpus, monkeypatch):
    import torchelmo.train.checkpoint as ckpt_io
    data, vocab = fixture_corpus
    out = tmp_path / "run"
    assert cli_main(_tiny_run_argv(data, vocab, out, "--log-every", "2", "--max-steps", "2")) == 0
    calls = []
    real = ckpt_io.load_checkpoint
    monkeypatch.setattr(ckpt_io, "load_checkpoint", lambda p: calls.append(p) or real(p))
    # Only the overridable flags and --out/--resume: the rest comes from the checkpoint.
    assert cli_main(["train", "--out", str(out), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    assert calls == [out / CHECKPOINT_NAME]
    assert json.loads((out / "train_config.json").read_text())["max_steps"] == 4
    assert torch.load(out / CHECKPOINT_NAME, weights_only=False)["step"] == 4


def test_cli_resume_refuses_changed_settings_and_takes_a_new_precision(tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    out = tmp_path / "run"
    assert cli_main(_tiny_run_argv(data, vocab, out, "--lr", "0.1", "--max-steps", "2")) == 0
    capsys.readouterr()
    # A setting that changes what is computed: refused in one line, naming it, before any step.
    assert cli_main(["train", "--out", str(out), "--resume", "--max-steps", "4", "--lr", "0.5", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lr (0.1 -> 0.5)" in err and "precision" in err
    assert torch.load(out / CHECKPOINT_NAME, weights_only=False)["step"] == 2
    # The same value again, or a new precision (only the matmuls' rounding changes): continues.
    assert cli_main(["train", "--out", str(out), "--resume", "--max-steps", "4", "--lr", "0.1",
                     "--precision", "bf16", "--no-progress"]) == 0
    assert json.loads((out / "train_config.json").read_text())["precision"] == "bf16"
    assert torch.load(out / CHECKPOINT_NAME, weights_only=False)["step"] == 4


def test_precision_option(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    with pytest.raises(ElmoError, match="precision must be fp32, tf32, bf16, auto, got 'fp16'"):
        base_config(tmp_path / "b", data, vocab, precision="fp16")
    with pytest.raises(ElmoError, match="unknown option bf16"):   # the older spelling is gone
        TrainConfig.from_dict({"train": [data], "out_dir": str(tmp_path / "c"), "bf16": True})
    # On CPU, tf32 computes in fp32: the same losses as fp32, bit for bit.
    losses = []
    for p in ("fp32", "tf32"):
        train(base_config(tmp_path / p, data, vocab, precision=p), log=lambda s: None)
        rows = (tmp_path / p / "run" / "metrics.jsonl").read_text().splitlines()
        losses.append([json.loads(x)["loss"] for x in rows if "loss" in json.loads(x)])
    assert losses[0] == losses[1] and losses[0]


def test_time_limit_stops_with_a_checkpoint_and_resume_continues_exactly(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    kw = dict(softmax="sampled", num_samples=20, dropout=0.1, lr_schedule="cosine", max_steps=6)
    train(base_config(tmp_path / "straight", data, vocab, **kw), log=lambda s: None)
    logs = []
    s = train(base_config(tmp_path / "chunked", data, vocab, time_limit=1e-9, **kw), log=logs.append)
    run = tmp_path / "chunked" / "run"
    assert s["stopped"] == "time_limit" and s["steps"] == 1
    assert torch.load(run / CHECKPOINT_NAME, weights_only=False)["step"] == 1
    assert not (run / "model").exists() and any("continue with --resume" in m for m in logs)
    for _ in range(2):   # two more chunks of one step each, then the rest
        assert train(base_config(tmp_path / "chunked", data, vocab, time_limit=1e-9, resume=True, **kw),
                     log=lambda s: None)["steps"] in (2, 3)
    assert "stopped" not in train(base_config(tmp_path / "chunked", data, vocab, resume=True, **kw),
                                  log=lambda s: None)
    a = LanguageModel.from_pretrained(tmp_path / "straight" / "run" / "model").state_dict()
    b = LanguageModel.from_pretrained(run / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ElmoError, match="time_limit must be a positive number"):
        base_config(tmp_path / "bad", data, vocab, time_limit=0)


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_is_exact(tmp_path, fixture_corpus, monkeypatch):
    data, vocab = fixture_corpus
    kw = dict(softmax="sampled", num_samples=20, dropout=0.1, max_steps=6, log_every=1)
    train(base_config(tmp_path / "straight", data, vocab, **kw), log=lambda s: None)

    def log(msg):
        if msg.startswith("step 2 "):
            os.kill(os.getpid(), signal.SIGTERM)   # arrives mid-run; the step finishes first
    logs = []
    s = train(base_config(tmp_path / "stopped", data, vocab, **kw), log=lambda m: (logs.append(m), log(m)))
    run = tmp_path / "stopped" / "run"
    assert s["stopped"] == "SIGTERM" and s["steps"] == 2
    assert torch.load(run / CHECKPOINT_NAME, weights_only=False)["step"] == 2 and not (run / "model").exists()
    assert any("stopped by SIGTERM at step 2: checkpoint written; continue with --resume" in m for m in logs)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL    # handlers restored
    train(base_config(tmp_path / "stopped", data, vocab, resume=True, **kw), log=lambda s: None)
    a = LanguageModel.from_pretrained(tmp_path / "straight" / "run" / "model").state_dict()
    b = LanguageModel.from_pretrained(run / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # From the command line: status 128 + SIGTERM, and a second signal ends at once.
    from torchelmo.train import Trainer
    real = Trainer._log_window

    def twice(t, *a):
        real(t, *a)
        if t.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(Trainer, "_log_window", twice)
    argv = ["train", "--train", str(data), "--vocab", str(vocab), "--model", "tiny", "--max-steps", "6",
            "--log-every", "1", "--threads", "1", "--no-progress", "--batch-size", "4", "--unroll", "5"]
    assert cli_main(argv + ["--out", str(tmp_path / "twice")]) == 130          # interrupted at once
    monkeypatch.setattr(Trainer, "_log_window",
                        lambda t, *a: (real(t, *a), t.step == 1 and os.kill(os.getpid(), signal.SIGTERM)))
    assert cli_main(argv + ["--out", str(tmp_path / "once")]) == 128 + signal.SIGTERM


def test_a_run_directory_is_not_reused_silently(tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    kw = dict(max_steps=2, checkpoint_every=1, keep_checkpoints=2)
    train(base_config(tmp_path, data, vocab, **kw), log=lambda s: None)
    run = tmp_path / "run"
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(ElmoError, match=r"holds a training run \(checkpoint.pt, checkpoints, metrics.jsonl.*"
                                        r"continue it with --resume, or start over with --overwrite"):
        train(base_config(tmp_path, data, vocab, **kw), log=lambda s: None)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before   # nothing touched
    argv = ["train", "--train", str(data), "--vocab", str(vocab), "--model", "tiny", "--max-steps", "1",
            "--threads", "1", "--no-progress", "--out", str(run)]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    # --overwrite starts over: the old run's snapshots are gone, not left to sort after the new ones.
    train(base_config(tmp_path, data, vocab, overwrite=True, max_steps=1, checkpoint_every=1000), log=lambda s: None)
    assert not (run / "checkpoints").exists()
    assert torch.load(run / CHECKPOINT_NAME, weights_only=False)["step"] == 1
    # A model directory is never a run directory.
    with pytest.raises(ElmoError, match="holds a model, not a training run"):
        train(base_config(tmp_path, data, vocab, overwrite=True, out_dir=str(run / "model")), log=lambda s: None)
    # A resumed run takes its time limit from its own command line, not from the checkpoint.
    train(base_config(tmp_path / "tl", data, vocab, max_steps=3, time_limit=1e-9), log=lambda s: None)
    s = train(base_config(tmp_path / "tl", data, vocab, max_steps=3, resume=True), log=lambda s: None)
    assert "stopped" not in s and s["steps"] == 3


@pytest.mark.core
def test_every_committed_config_loads_and_holds_only_overrides():
    import dataclasses
    root = Path(__file__).resolve().parents[1] / "configs"
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    paths = sorted(root.rglob("*.json"))
    assert len(paths) >= 4
    for path in paths:
        d = json.loads(path.read_text())
        TrainConfig.from_dict(d, str(path))
        assert d["_command"] and d["_role"], path
        same = [k for k, v in d.items() if k in defaults and defaults[k] == v]
        assert not same, f"{path}: {same} repeat the defaults"


def test_changed_training_files_are_refused_on_resume_and_new_data_starts_a_new_epoch(tmp_path, fixture_corpus):
    # A saved position (epoch, file, byte offset) is only valid for the files it was saved on.
    data, vocab = fixture_corpus
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(data.read_bytes())
    kw = dict(softmax="sampled", num_samples=20, max_steps=4)
    both = str(corpus / "*.txt")
    train(base_config(tmp_path, both, vocab, time_limit=1e-9, **kw), log=lambda s: None)
    run = tmp_path / "run"
    saved = torch.load(run / CHECKPOINT_NAME, weights_only=False)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert saved["data"]["corpus"] == [["a.txt", data.stat().st_size, digest]]
    (corpus / "b.txt").write_text("an added file\n", encoding="utf-8")
    with pytest.raises(ElmoError, match=r"checkpoint.pt: the training files changed since this position was "
                                        r"saved \(b.txt added\); resume with --new-data"):
        train(base_config(tmp_path, both, vocab, resume=True, **kw), log=lambda s: None)
    logs: list[str] = []
    train(base_config(tmp_path, both, vocab, resume=True, new_data=True, time_limit=1e-9, **kw), log=logs.append)
    assert any("new data: epoch 1 starts on the current training files" in m for m in logs)
    after = torch.load(run / CHECKPOINT_NAME, weights_only=False)
    assert after["step"] == saved["step"] + 1 and after["data"]["position"]["epoch"] == 1
    assert after["data"]["corpus"] == [["a.txt", data.stat().st_size, digest],
                                       ["b.txt", 14, hashlib.sha256(b"an added file\n").hexdigest()]]
    assert after["config"]["new_data"] is True
    # The next chunk resumes exactly again (the flag belongs to one invocation).
    assert train(base_config(tmp_path, both, vocab, resume=True, **kw), log=lambda s: None)["steps"] == 4
    with pytest.raises(ElmoError, match="new_data starts a new epoch of a resumed run"):
        base_config(tmp_path, both, vocab, new_data=True)


def test_an_edit_that_keeps_the_size_is_refused_on_resume(tmp_path, fixture_corpus):
    # One word changed for another of the same length: names and sizes agree, the digest does not.
    # A checkpoint saved before digests were recorded ([name, bytes]) still resumes on its files.
    data, vocab = fixture_corpus
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = data.read_text(encoding="utf-8")
    (corpus / "a.txt").write_text(text, encoding="utf-8")
    kw = dict(softmax="sampled", num_samples=20, max_steps=4)
    files = str(corpus / "*.txt")
    train(base_config(tmp_path, files, vocab, time_limit=1e-9, **kw), log=lambda s: None)
    run = tmp_path / "run"
    word = next(w for w in text.split() if len(w) >= 3)
    (corpus / "a.txt").write_text(text.replace(word, word[::-1] if word[::-1] != word else "x" * len(word), 1),
                                  encoding="utf-8")
    assert (corpus / "a.txt").stat().st_size == data.stat().st_size
    with pytest.raises(ElmoError, match=r"the training files changed since this position was saved "
                                        r"\(a.txt content changed \(same size\)\)"):
        train(base_config(tmp_path, files, vocab, resume=True, **kw), log=lambda s: None)
    ckpt = torch.load(run / CHECKPOINT_NAME, weights_only=False)
    ckpt["data"]["corpus"] = [x[:2] for x in ckpt["data"]["corpus"]]
    torch.save(ckpt, run / CHECKPOINT_NAME)
    assert train(base_config(tmp_path, files, vocab, resume=True, **kw), log=lambda s: None)["steps"] == 4
