"""The embedded default model: shipped in the package, within budget, and the README's main job
(`elmo embed examples/sentences.txt sentences.hdf5 --all`) runs on it with no download."""

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT
from torchelmo import BiLM, batch_to_ids
from torchelmo.cli import main
from torchelmo.model.registry import default_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_default_model_is_shipped_within_budget():
    d = default_model_dir()
    names = {p.name for p in d.iterdir()}
    assert {"config.json", "model.safetensors", "MODEL_CARD.md"} <= names
    weights = sum(p.stat().st_size for p in d.iterdir() if p.name != "MODEL_CARD.md")
    assert weights <= 30 * 2**20
    card = (d / "MODEL_CARD.md").read_text()
    assert "ppl_forward" in card and "no test split" in card


def test_readme_main_job_on_the_default_model(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_OFFLINE", "1")  # it must not need the network
    src = ROOT / "examples" / "sentences.txt"
    out = tmp_path / "sentences.hdf5"
    assert main(["embed", str(src), str(out), "--all", "--quiet"]) == 0
    lines = src.read_text(encoding="utf-8").splitlines()
    model = BiLM.from_pretrained("default").eval()
    dim = model.output_dim
    with h5py.File(out, "r") as f:
        assert sorted(k for k in f if k != "sentence_to_index") == sorted(str(i) for i in range(len(lines)))
        for i, line in enumerate(lines):
            toks = line.split()
            got = f[str(i)][...]
            assert got.shape == (3, len(toks), dim) and got.dtype == np.float32
            if not toks:
                continue
            with torch.no_grad():
                want = torch.stack(model(batch_to_ids([toks])).layers, 1)[0].numpy()
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # Context matters in the LSTM layers and not in E0: "bank" in lines 0 and 1.
    with h5py.File(out, "r") as f:
        a, b = f["0"][:, 1], f["1"][:, 4]
    assert lines[0].split()[1] == lines[1].split()[4] == "bank"
    np.testing.assert_allclose(a[0], b[0], atol=1e-6)
    assert np.abs(a[2] - b[2]).max() > 1e-2
