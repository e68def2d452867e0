"""One loader for every model directory: the layout is found by what the directory holds, and a
directory that holds none gets one error naming each layout looked for."""

import json
import shutil

import pytest
import torch

from torchelmo import BiLM, ElmoError, preset
from torchelmo.cli import main


def _model(seed: int) -> BiLM:
    torch.manual_seed(seed)
    return BiLM(preset("tiny"))


def _same(a: BiLM, b: BiLM) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_training_run_is_its_final_model_or_else_its_best(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text("{}")
    with pytest.raises(ElmoError, match="a training run without a model yet"):
        BiLM.from_pretrained(run)
    best, final = _model(0), _model(1)
    best.save_pretrained(run / "best")
    assert _same(BiLM.from_pretrained(run), best)        # while it trains: the best so far
    final.save_pretrained(run / "model")
    assert _same(BiLM.from_pretrained(run), final)       # once it ended: the final model


def test_native_and_published_folders(tmp_path):
    model = _model(2)
    model.save_pretrained(tmp_path / "native")
    assert _same(BiLM.from_pretrained(tmp_path / "native"), model)
    model.export_published(tmp_path / "published", "x")
    got = BiLM.from_pretrained(tmp_path / "published")
    for a, b in zip(got.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("holds", [[], ["notes.txt"], ["char.dic"]])
def test_a_folder_of_no_layout_names_every_layout(tmp_path, holds, capsys):
    d = tmp_path / "m"
    d.mkdir()
    for name in holds:
        (d / name).write_text("x")
    with pytest.raises(ElmoError) as e:
        BiLM.from_pretrained(d)
    msg = str(e.value)
    for layout in ("ELMoForManyLangs", "native", "published", "training run", "model.safetensors",
                   "encoder.pkl", "train_config.json"):
        assert layout in msg, (layout, msg)
    assert main(["info", str(d)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "looked for" in err[0]


def test_info_names_the_layout(tmp_path, capsys):
    _model(3).save_pretrained(tmp_path / "native")
    run = tmp_path / "run"
    shutil.copytree(tmp_path / "native", run / "best")
    (run / "train_config.json").write_text("{}")
    for where, layout in ((tmp_path / "native", "native"), (run, "training run")):
        assert main(["info", str(where)]) == 0
        assert json.loads(capsys.readouterr().out)["layout"] == layout
