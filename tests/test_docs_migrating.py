"""docs/migrating.md runs as written: its torchelmo blocks (```python / ```bash), in order, in one
namespace (the AllenNLP, flair-only and ELMoForManyLangs blocks, tagged as such, are for reading)."""

import re
import shlex
import sys

import h5py
import torch

from conftest import ROOT
from torchelmo.cli import main

EXTRAS_NEEDED = ("flair",)   # the flair blocks


def test_migrating_examples_run(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "migrating.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```(python|bash)\n(.*?)^```", text, re.M | re.S)
    assert [kind for kind, _ in blocks].count("python") == 7 and len(blocks) == 8
    monkeypatch.chdir(tmp_path)
    n = torch.get_num_threads()
    namespace: dict = {}
    try:
        torch.set_num_threads(1)
        for kind, code in blocks:
            if kind == "python":
                exec(compile(code, "docs/migrating.md", "exec"), namespace)
            else:
                for line in code.strip().splitlines():
                    argv = shlex.split(line)
                    assert argv[0] == "elmo" and main(argv[1:] + ["-q"]) == 0
    finally:
        torch.set_num_threads(n)
        for name in [m for m in sys.modules if m == "allennlp" or m.startswith("allennlp.")]:
            del sys.modules[name]       # the flair block registered the drop-in as allennlp
    with h5py.File(tmp_path / "vectors.hdf5", "r") as f:
        assert sorted(f.keys()) == ["0", "1"] and f["0"].shape[:2] == (3, 5)
