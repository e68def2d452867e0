"""Export for serving: the ONNX model in onnxruntime and the TorchScript one in a fresh process
equal the eager biLM on sentences of mixed lengths (padding included), batch and length dynamic."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from torchelmo import BiLM, ElmoConfig, ElmoError, batch_to_ids
from torchelmo.cli import main
from torchelmo.integrations.onnx import export, exportable

pytestmark = pytest.mark.usefixtures("one_thread")

LONG = "Pneumonoultramicroscopicsilicovolcanoconiosis-and-then-some-more-characters"
# Batches unlike the export's example input: other batch sizes, longer and shorter lengths.
BATCHES = [
    [["The", "cat", "sat", "on", "the", "mat", "."], ["Hello", "!"], ["a"], [LONG, "x", "y"]],
    [["only", "one", "sentence", "here"]],
    [["w"] * 31, [], ["Überall", "北京", "😀"]],
]


def _eager(bilm, ids):
    with torch.no_grad():
        out = bilm(ids)
    return torch.stack(out.layers), out.mask


def _tiny_random(seed=0, **kw):
    """Random weights with some spread in every tensor (biases included), so every gate matters."""
    torch.manual_seed(seed)
    shape = {"lstm_dim": 12, "projection_dim": 5, "char_embed_dim": 3, "n_highway": 1,
             "filters": [[1, 4], [2, 4], [3, 6]]}
    cfg = ElmoConfig(**{**shape, **kw})
    model = BiLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.empty_like(p).uniform_(-0.3, 0.3))
    return model


@pytest.fixture(scope="module")
def default_model():
    return BiLM.from_pretrained("default")


@pytest.mark.parametrize("kw", [{}, {"cell_clip": None, "proj_clip": None, "use_skip_connections": False,
                                     "activation": "tanh", "n_highway": 0}])
def test_scripted_module_equals_eager(kw):
    bilm = _tiny_random(**kw)
    scripted = exportable(bilm)
    for batch in BATCHES:
        ids = batch_to_ids(batch)
        want, want_mask = _eager(bilm, ids)
        with torch.no_grad():
            got, mask = scripted(ids)
        assert torch.equal(mask, want_mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert (got[:, ~mask] == 0).all()


def test_onnx_in_onnxruntime_equals_eager(default_model, tmp_path):
    path = tmp_path / "elmo.onnx"
    diff = export(default_model, path)
    assert diff is not None and diff <= 1e-5
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    graph = proto.graph
    assert [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "tokens", 50]
    assert sum(node.op_type == "Loop" for node in graph.node) == default_model.config.n_layers  # time loops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["char_ids"]
    for batch in BATCHES:
        ids = batch_to_ids(batch)
        want, want_mask = _eager(default_model, ids)
        layers, mask = session.run(["layers", "mask"], {"char_ids": ids.numpy()})
        assert layers.shape == (3, len(batch), ids.shape[1], default_model.output_dim)
        assert np.array_equal(mask, want_mask.numpy())
        np.testing.assert_allclose(layers, want.numpy(), atol=1e-5, rtol=0)


def test_torchscript_in_a_fresh_process_equals_eager(default_model, tmp_path):
    path = tmp_path / "elmo.pt"
    export(default_model, path)
    inputs = [batch_to_ids(b) for b in BATCHES]
    torch.save(inputs, tmp_path / "inputs.pt")
    # Only torch in the new process: the file must not need this library to run.
    code = ("import sys, torch\n"
            "m = torch.jit.load(sys.argv[1])\n"
            "with torch.no_grad():\n"
            "    outs = [m(ids) for ids in torch.load(sys.argv[2])]\n"
            "torch.save(outs, sys.argv[3])\n")
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "outputs.pt")], check=True, timeout=120)
    outs = torch.load(tmp_path / "outputs.pt")
    for ids, (layers, mask) in zip(inputs, outs):
        want, want_mask = _eager(default_model, ids)
        assert torch.equal(mask, want_mask)
        torch.testing.assert_close(layers, want, atol=1e-5, rtol=0)


def test_cli_export_both_formats(tmp_path, capsys):
    model_dir = _tiny_random(seed=1).save_pretrained(tmp_path / "tiny")
    for name, fmt in (("m.onnx", "onnx"), ("m.ts", "torchscript"), ("model.bin", "torchscript")):
        extra = ["--format", fmt, "--device", "cpu", "--threads", "1"] if name.endswith(".bin") else []
        assert main(["export", str(model_dir), str(tmp_path / name), *extra]) == 0
        assert f"({fmt}); matches the eager model" in capsys.readouterr().out


def test_cli_export_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "default", str(tmp_path / "model.bin")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot tell the format" in err and "--format" in err
    assert main(["export", "default", str(tmp_path / "m.onnx"), "--opset", "9"]) == 1
    assert "opset 9 is not supported (use 13 to 20)" in capsys.readouterr().err
    with pytest.raises(ElmoError, match="stateful"):
        export(BiLM.from_pretrained("default", stateful=True), tmp_path / "m.pt")


def test_export_leaves_the_model_as_it_was(tmp_path):
    bilm = _tiny_random(seed=2).train()
    bilm.precision = "bf16"   # the check compares in fp32, what the export computes in
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    assert export(bilm, tmp_path / "m.pt") <= 1e-5
    assert bilm.training and bilm.precision == "bf16"
    assert all(torch.equal(v, before[k]) for k, v in bilm.state_dict().items())


def test_export_writes_out_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    import torchelmo.integrations.onnx as E
    bilm = _tiny_random(seed=3)
    out = tmp_path / "m.pt"
    out.write_bytes(b"the previous export")

    def leftovers():
        return sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    # A failed verification (as with NaN weights) raises and keeps the previous OUT.
    monkeypatch.setattr(E, "max_difference", lambda *a, **k: float("nan"))
    with pytest.raises(ElmoError, match="would differ from the eager model by nan.*nothing was written"):
        export(bilm, out)
    assert out.read_bytes() == b"the previous export" and not leftovers()
    monkeypatch.undo()
    # Interrupted mid-way (Ctrl-C or SIGTERM, which the command turns into the same): the same.
    monkeypatch.setattr(E.torch.jit, "save", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        export(bilm, out)
    assert out.read_bytes() == b"the previous export" and not leftovers()
    monkeypatch.undo()
    # A full disk: one line, the previous OUT kept.
    real = Path.write_bytes

    def full(self, data):
        if self.name.endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(ElmoError, match="cannot write the export: No space left on device"):
        export(bilm, out)
    assert out.read_bytes() == b"the previous export" and not leftovers()
    monkeypatch.undo()
    # A directory as OUT: one line, before the model is even loaded.
    monkeypatch.setattr(E.BiLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded the model first"))
    assert main(["export", "default", str(tmp_path), "--format", "torchscript"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a directory" in err
    monkeypatch.undo()
    # And a good export replaces OUT whole.
    assert export(bilm, out) <= 1e-5
    assert out.read_bytes() != b"the previous export" and not leftovers()


def test_onnx_without_the_export_extra_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import torchelmo.integrations.onnx as E
    monkeypatch.setattr(E, "_has", lambda module: module != "onnx")
    monkeypatch.setattr(E.BiLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded the model first"))
    assert main(["export", "default", str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'torchelmo[export]'" in err
    assert not list(tmp_path.iterdir())


def test_char_cnn_equals_eager_for_every_token_length():
    """Tokens of every length up to the 50-character limit, alone and beside others: the
    widest-window product and its masking of the starts a narrower width lacks near the limit."""
    bilm = _tiny_random(filters=[[1, 4], [3, 4], [7, 6]])
    words = ["x" * n for n in range(1, 53)]
    ids = batch_to_ids([words])[0]                                       # (52, 50): one row per token
    scripted = exportable(bilm)
    with torch.no_grad():
        want = bilm.encoder.proj(bilm.encoder.highways[0](bilm.encoder.conv_reference(ids)))
        for rows in [ids, ids[:5], ids[40:47], ids[44:45], ids[-1:]]:
            i = next(k for k in range(len(ids)) if torch.equal(ids[k], rows[0]))
            torch.testing.assert_close(scripted.encode(rows), want[i:i + len(rows)], atol=1e-5, rtol=0)
