"""elmo average (checkpoint averaging) and elmo train --keep-checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import shared_path
from torchelmo.cli import main
from torchelmo.lm.model import LanguageModel
from torchelmo.train import TrainConfig, train
from torchelmo.train.average import average, load_lm


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = shared_path("fixtures", "bilm-tf", "train")
    out = tmp_path_factory.mktemp("avg") / "run"
    cfg = TrainConfig(train=[str(d / "data.txt")], vocab=str(d / "vocab.txt"), out_dir=str(out), model="tiny",
                      softmax="full", batch_size=4, unroll=5, max_steps=7, log_every=7, checkpoint_every=2,
                      keep_checkpoints=2, optimizer="adam", lr=1e-2, threads=1, progress=False)
    train(cfg, log=lambda s: None)
    return out


def test_keep_checkpoints_keeps_the_last_n(run):
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    # steps 2, 4, 6 on schedule and 7 at the end; only the last two stay
    assert kept == ["step-00000006.pt", "step-00000007.pt"]
    last = torch.load(run / "checkpoints" / "step-00000007.pt", weights_only=False)
    now = torch.load(run / "checkpoint.pt", weights_only=False)
    assert last["step"] == now["step"] == 7
    for k, v in now["model"].items():
        assert torch.equal(v, last["model"][k])


def test_average_is_the_elementwise_mean(run, tmp_path):
    a, b = (run / "checkpoints" / f"step-0000000{s}.pt" for s in (6, 7))
    rc = main(["average", str(a), str(b), "-o", str(tmp_path / "avg")])
    assert rc == 0
    got = LanguageModel.from_pretrained(tmp_path / "avg")
    sa = torch.load(a, weights_only=False)["model"]
    sb = torch.load(b, weights_only=False)["model"]
    differs = 0
    for k, v in got.state_dict().items():
        want = (sa[k].double() + sb[k].double()) / 2
        torch.testing.assert_close(v, want.to(v.dtype), rtol=1e-6, atol=1e-7)
        differs += int(not torch.equal(sa[k], sb[k]))
    assert differs > 0  # the two snapshots really are different (a step of Adam apart)
    # the averaged LM is a working LM: it scores text like its sources
    sents = [["the", "cat", "sat"], ["a", "dog"]]
    s_avg = [s.forward_logprob for s in got.eval().score(sents)]
    s_b = [s.forward_logprob for s in load_lm(b).eval().score(sents)]
    assert all(abs(x - y) < 5.0 for x, y in zip(s_avg, s_b))


def test_average_of_one_model_or_copies_is_identity(run, tmp_path):
    src = run / "model"
    again = average([src, src, src])
    ref = LanguageModel.from_pretrained(src)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    one = average([run / "checkpoint.pt"])
    for k, v in ref.state_dict().items():  # the final checkpoint holds the final model
        assert torch.equal(one.state_dict()[k], v)


def test_average_rejects_mismatched_models(run, tmp_path, capsys):
    d = shared_path("fixtures", "bilm-tf", "train")
    other = tmp_path / "other"
    train(TrainConfig(train=[str(d / "data.txt")], vocab=str(d / "vocab.txt"), out_dir=str(other), model="tiny",
                      softmax="adaptive", batch_size=4, unroll=5, max_steps=1, threads=1, progress=False),
          log=lambda s: None)
    assert main(["average", str(run / "model"), str(other / "model"), "-o", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("elmo average: error: ") and str(other / "model") in err and "\n" not in err
    assert main(["average", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "x")]) == 1
    assert "no such LM directory or checkpoint" in capsys.readouterr().err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert main(["average", str(tmp_path / "junk.pt"), "-o", str(tmp_path / "x")]) == 1
    assert "cannot read checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_weighted_average_interpolates(run, tmp_path, capsys):
    a, b = (run / "checkpoints" / f"step-0000000{s}.pt" for s in (6, 7))
    # weights are normalised: 1 and 3 mean 0.25 a + 0.75 b
    assert main(["average", str(a), str(b), "--weights", "1", "3", "-o", str(tmp_path / "w")]) == 0
    got = LanguageModel.from_pretrained(tmp_path / "w")
    sa = torch.load(a, weights_only=False)["model"]
    sb = torch.load(b, weights_only=False)["model"]
    for k, v in got.state_dict().items():
        want = 0.25 * sa[k].double() + 0.75 * sb[k].double()
        torch.testing.assert_close(v, want.to(v.dtype), rtol=1e-6, atol=1e-7)
    meta = json.loads((tmp_path / "w" / "training.json").read_text())["average"]
    assert meta["weights"] == [0.25, 0.75] and meta["n"] == 2
    # the end points are the models themselves
    for w, src in (([1, 0], sa), ([0, 2], sb)):
        end = average([a, b], w)
        for k, v in end.state_dict().items():
            torch.testing.assert_close(v, src[k], rtol=1e-6, atol=1e-7)
    capsys.readouterr()
    for bad in (["1"], ["1", "-1"], ["0", "0"], ["nan", "1"]):
        assert main(["average", str(a), str(b), "--weights", *bad, "-o", str(tmp_path / "bad")]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("elmo average: error: ") and "error: average:" not in err and "weight" in err and "\n" not in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.core
def test_keep_checkpoints_must_be_non_negative(tmp_path):
    from torchelmo.errors import ElmoError
    with pytest.raises(ElmoError, match="keep_checkpoints"):
        TrainConfig(train=["x"], out_dir=str(tmp_path), max_steps=1, keep_checkpoints=-1)
