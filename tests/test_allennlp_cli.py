"""`elmo embed` with the flags of AllenNLP's `allennlp elmo`, and what the output file records."""

import json

import h5py
import numpy as np
import pytest
import torch

from torchelmo.cli import main


@pytest.fixture
def model_args(allennlp_dir):
    return ["--options-file", str(allennlp_dir / "options.json"),
            "--weight-file", str(allennlp_dir / "lm_weights.hdf5")]


def _run(tmp_path, lines, model_args, *flags, name="out.hdf5"):
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / name
    return main(["embed", str(src), str(out), "--all", "-qq", "--threads", "1", *model_args, *flags]), out


LINES = ["The cat sat .", "  A dog ran away  ", "Birds fly ."]


def test_use_sentence_keys(tmp_path, model_args):
    rc, by_index = _run(tmp_path, LINES, model_args, name="index.hdf5")
    assert rc == 0
    rc, by_sentence = _run(tmp_path, LINES, model_args, "--use-sentence-keys", name="keys.hdf5")
    assert rc == 0
    with h5py.File(by_index, "r") as a, h5py.File(by_sentence, "r") as b:
        assert sorted(b.keys()) == sorted(line.strip() for line in LINES)   # no sentence_to_index
        for i, line in enumerate(LINES):
            np.testing.assert_array_equal(a[str(i)][...], b[line.strip()][...])


@pytest.mark.parametrize("lines, what", [(["a b", "", "c"], "line 2: a blank line"),
                                         (["a b", "c", "a b"], "line 3: repeats an earlier sentence"),
                                         (["a / b"], "line 1: 'a / b' cannot be a dataset name")])
def test_use_sentence_keys_bad_lines(lines, what, tmp_path, model_args, capsys):
    rc, out = _run(tmp_path, lines, model_args, "--use-sentence-keys")
    last = capsys.readouterr().err.splitlines()[-1]     # (a blank line is warned about first)
    assert rc == 1 and last.startswith("elmo embed: error: ") and what in last, last
    assert not out.exists()


def test_sentence_index_flags(tmp_path, model_args, capsys):
    rc, default = _run(tmp_path, LINES, model_args, name="d.hdf5")
    rc2, included = _run(tmp_path, LINES, model_args, "--include-sentence-indices", name="i.hdf5")
    rc3, forgot = _run(tmp_path, LINES, model_args, "--forget-sentences", name="f.hdf5")
    assert rc == rc2 == rc3 == 0
    want = {line.strip(): str(i) for i, line in enumerate(LINES)}
    for path in (default, included):
        with h5py.File(path, "r") as f:
            assert json.loads(f["sentence_to_index"][0]) == want
    with h5py.File(forgot, "r") as f:
        assert "sentence_to_index" not in f and sorted(f.keys()) == ["0", "1", "2"]
    for flags in (["--include-sentence-indices", "--forget-sentences"],
                  ["--include-sentence-indices", "--use-sentence-keys"]):
        rc, _ = _run(tmp_path, LINES, model_args, *flags, name="bad.hdf5")
        err = capsys.readouterr().err
        assert rc == 1 and "--include-sentence-indices" in err and err.count("\n") == 1


def test_cuda_device(tmp_path, model_args, monkeypatch, capsys):
    rc, out = _run(tmp_path, LINES, model_args, "--cuda-device", "-1")
    assert rc == 0 and out.exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    for flags, message in ((["--cuda-device", "0"], "--cuda-device cuda:0: this torch is a CPU-only build"),
                           (["--cuda-device", "-1", "--device", "cpu"], "either --device or --cuda-device"),
                           (["--cuda-device", "-2"], "--cuda-device must be -1")):
        rc, _ = _run(tmp_path, LINES, model_args, *flags, name="bad.hdf5")
        err = capsys.readouterr().err
        assert rc == 1 and message in err and err.count("\n") == 1, err


def test_output_records_model_and_layers(tmp_path, model_args, allennlp_dir):
    rc, out = _run(tmp_path, LINES, model_args, name="a.hdf5")
    assert rc == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["elmo_model"] == f"{model_args[1]} + {model_args[3]}"
        assert f.attrs["elmo_layers"] == "all"
        options = json.loads(f.attrs["elmo_model_options"])
        assert options == json.loads((allennlp_dir / "options.json").read_text())
    src = tmp_path / "in.txt"
    out = tmp_path / "default.hdf5"
    assert main(["embed", str(src), str(out), "--top", "-qq", "--threads", "1"]) == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["elmo_model"] == "default" and f.attrs["elmo_layers"] == "top"
        assert json.loads(f.attrs["elmo_model_options"])["lstm"]["projection_dim"] == 192


def test_allennlp_mode_gives_the_drop_ins_numbers(tmp_path, model_args, allennlp_dir, capsys):
    from torchelmo.integrations.allennlp import ElmoEmbedder
    # 130 lines: three batches of AllenNLP's 64, so the carried state matters from line 64 on.
    lines = [" ".join(f"w{(7 * i + j) % 23}" for j in range(1 + i % 9)) for i in range(130)]
    rc, ours = _run(tmp_path, lines, model_args, "--allennlp", name="allennlp.hdf5")
    assert rc == 0
    ElmoEmbedder(allennlp_dir / "options.json", allennlp_dir / "lm_weights.hdf5").embed_file(
        str(tmp_path / "in.txt"), tmp_path / "dropin.hdf5")
    rc, plain = _run(tmp_path, lines, model_args, name="plain.hdf5")
    with h5py.File(ours, "r") as a, h5py.File(tmp_path / "dropin.hdf5", "r") as b, h5py.File(plain, "r") as c:
        for i in range(len(lines)):
            np.testing.assert_allclose(a[str(i)][...], b[str(i)][...], rtol=0, atol=1e-6)
        assert max(np.abs(a[str(i)][...] - c[str(i)][...]).max() for i in range(64, 130)) > 1e-3
        assert max(np.abs(a[str(i)][...] - c[str(i)][...]).max() for i in range(64)) < 1e-5
    # AllenNLP's other flags: the same numbers.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{k}\n" for k in range(23)))
    rc, cached = _run(tmp_path, lines, model_args, "--allennlp", "--vocab-path", str(vocab),
                      "--file-friendly-logging", name="cached.hdf5")
    with h5py.File(ours, "r") as a, h5py.File(cached, "r") as b:
        assert rc == 0 and all(np.allclose(a[k][...], b[k][...], rtol=0, atol=1e-6) for k in a if k.isdigit())
    # A blank line stops the run, as it stopped AllenNLP's (and the drop-in's), in one line.
    capsys.readouterr()
    rc, out = _run(tmp_path, ["a b", "", "c"], model_args, "--allennlp", name="blank.hdf5")
    err = capsys.readouterr().err
    assert rc == 1 and "line 2 is blank" in err and err.count("\n") == 1 and not out.exists()


def _allennlp_main(monkeypatch, argv):
    """AllenNLP's tests run the command as ``sys.argv = ["run.py", "elmo", ...]; main()``."""
    from torchelmo.integrations.allennlp import main as allennlp_main
    monkeypatch.setattr("sys.argv", ["run.py", "elmo", *map(str, argv)])
    allennlp_main()


def test_allennlp_main_writes_what_the_embedder_writes(tmp_path, model_args, allennlp_dir, monkeypatch):
    from torchelmo.integrations.allennlp import ElmoEmbedder
    sentences = ["Michael went to the store to buy some eggs .", "Joel rolled down the street ."]
    src = tmp_path / "sentences.txt"
    src.write_text("\n".join(sentences) + "\n")
    _allennlp_main(monkeypatch, [src, tmp_path / "out.hdf5", "--all", *model_args])
    want = ElmoEmbedder(str(allennlp_dir / "options.json"), str(allennlp_dir / "lm_weights.hdf5")).embed_batch(
        [s.split() for s in sentences])
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert set(f.keys()) == {"0", "1", "sentence_to_index"}
        for i, w in enumerate(want):
            np.testing.assert_allclose(f[str(i)][...], w, rtol=0, atol=1e-6)
    _allennlp_main(monkeypatch, [src, tmp_path / "top.hdf5", "--top", "--forget-sentences", *model_args])
    with h5py.File(tmp_path / "top.hdf5", "r") as f:
        assert set(f.keys()) == {"0", "1"}
        np.testing.assert_allclose(f["1"][...], want[1][-1], rtol=0, atol=1e-6)


def test_allennlp_main_raises_configuration_error_on_blank_lines(tmp_path, model_args, monkeypatch):
    # AllenNLP's own test: "A", "", "", "B" -> ConfigurationError, under AllenNLP's module paths too.
    import sys

    from torchelmo import ElmoError
    from torchelmo.integrations.allennlp import ConfigurationError, register_as_allennlp
    src = tmp_path / "sentences.txt"
    src.write_text("A\n\n\nB\n")
    with pytest.raises(ConfigurationError, match="line 2 is blank") as e:
        _allennlp_main(monkeypatch, [src, tmp_path / "out.hdf5", "--all", *model_args])
    assert isinstance(e.value, ElmoError) and e.value.message == str(e.value)
    assert not (tmp_path / "out.hdf5").exists()
    for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
        monkeypatch.delitem(sys.modules, name)
    assert register_as_allennlp()
    try:
        from allennlp.commands import main as their_main
        from allennlp.common.checks import ConfigurationError as TheirError
        monkeypatch.setattr("sys.argv", ["run.py", "elmo", str(src), str(tmp_path / "out.hdf5"), "--all", *model_args])
        with pytest.raises(TheirError):
            their_main()
    finally:
        for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
            del sys.modules[name]
