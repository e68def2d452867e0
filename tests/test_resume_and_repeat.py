"""Runs that resume where they stopped and reruns that repeat: metrics without duplicates after a
resume, the same settings bitwise the same, shards that merge into the unsharded run (docs/reliability.md)."""

import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from helpers import ENV, one_line_error, write_lines
from torchelmo.cli import main as cli_main


# Metrics.
def test_resuming_a_finished_run_adds_no_metrics_line(tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = (run / "metrics.jsonl").read_text()
    assert sum("valid_ppl_mean" in ln for ln in before.splitlines()) == 1
    assert cli_main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert (run / "metrics.jsonl").read_text() == before


# One trainer per run directory.
def test_a_second_trainer_on_a_run_directory_is_refused_in_one_line(tmp_path, tiny_run, fixture_corpus, capsys):
    # While one process holds the run (as a trainer does from before it reads the run until its
    # last write), resuming it and starting over in it are refused, naming the holder, before
    # anything is read or deleted; once the holder is killed, its lock file blocks nothing.
    data, vocab = fixture_corpus
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    files = sorted(p.name for p in run.iterdir())
    hold = ("import sys, time\nfrom torchelmo.train.checkpoint import hold_run_dir\n"
            "with hold_run_dir(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["train", "--out", run, "--resume", "--no-progress"],
                     ["train", "--out", run, "--overwrite", "--train", data, "--vocab", vocab, "--model", "tiny",
                      "--max-steps", "2", "--no-progress"]):
            one_line_error(capsys, argv, str(run), "another elmo train", f"pid {holder.pid}")
        assert sorted(p.name for p in run.iterdir()) == sorted({*files, "train.lock"})
        assert (run / "checkpoint.pt").stat().st_size > 0
    finally:
        holder.kill()
        holder.wait()
    assert cli_main(["train", "--out", str(run), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_a_lock_that_is_a_link_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").symlink_to(tmp_path / "elsewhere")
    from torchelmo.errors import ElmoError
    from torchelmo.train.checkpoint import hold_run_dir
    with pytest.raises(ElmoError, match="cannot open the run's lock"):
        with hold_run_dir(run):
            pass
    assert not (tmp_path / "elsewhere").exists()


def test_a_run_writes_its_model_folders_over_links_not_through_them(tmp_path, tiny_run):
    # model/, published/ and best/ are the run's own: a link planted there is replaced by the
    # folder, and the directory it pointed to is left as it was.
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    elsewhere = {}
    for name in ("model", "published", "best"):
        shutil.rmtree(run / name)
        elsewhere[name] = tmp_path / f"elsewhere-{name}"
        elsewhere[name].mkdir()
        (elsewhere[name] / "keep.txt").write_text(name)
        (run / name).symlink_to(elsewhere[name], target_is_directory=True)
    assert cli_main(["train", "--out", str(run), "--resume", "--max-steps", "8", "--no-progress"]) == 0
    for name in ("model", "published", "best"):
        assert [p.name for p in elsewhere[name].iterdir()] == ["keep.txt"], name
        assert not (run / name).is_symlink() and (run / name).is_dir() and any((run / name).iterdir()), name


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


@pytest.mark.core
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


@pytest.mark.core
def test_a_rerun_with_the_same_settings_is_bitwise_identical(tmp_path):
    from torchelmo.cli import main
    inp = write_lines(tmp_path / "in.txt", 120)
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



# Resume knows its vocabulary by content, not by its file's name and size.
@pytest.mark.parametrize("change", ["swap two words", "append a word"])
def test_resume_refuses_a_changed_vocabulary_in_one_line(tmp_path, fixture_corpus, capsys, change):
    from conftest import base_config
    from torchelmo.train import train
    data, vocab = fixture_corpus
    mine = tmp_path / "vocab.txt"
    shutil.copy(vocab, mine)
    train(base_config(tmp_path, data, mine, max_steps=3, checkpoint_every=3), log=lambda s: None)
    run = tmp_path / "run"
    lines = mine.read_text(encoding="utf-8").splitlines()
    if change == "swap two words":
        lines[5], lines[6] = lines[6], lines[5]        # same size, same words, another order
    else:
        lines.append("zyzzyva")
    mine.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = (run / "checkpoint.pt").read_bytes()
    one_line_error(capsys, ["train", "--out", run, "--resume", "--max-steps", "4", "--no-progress"],
                   str(mine), "not the vocabulary", "words changed, added or reordered")
    assert (run / "checkpoint.pt").read_bytes() == before


def test_a_checkpoint_from_before_the_vocabulary_digest_still_resumes(tmp_path, tiny_run):
    # Runs in progress keep their checkpoints loadable: one without the digest resumes unchecked.
    import torch
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    assert len(ckpt.pop("vocab_digest")) == 64
    torch.save(ckpt, run / "checkpoint.pt")
    assert cli_main(["train", "--out", str(run), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    assert "vocab_digest" in torch.load(run / "checkpoint.pt", weights_only=False)
