"""Every shell and Python block of the README and docs/ runs as written, in a fresh directory
holding the files the text names as the reader's own (in.txt, corpus.txt, my-model, a trained
run); a block that cannot run here carries a tag that says why (```bash long, ```python hub, ...).
docs/migrating.md's blocks run in tests/test_docs_migrating.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from torchelmo.cli import main as cli_main

EXTRAS_NEEDED = ("onnxruntime", "spacy")   # the export and spaCy blocks

# Tags of blocks that are shown, not run here, and why.
NOT_RUN = {
    "setup": "the set-up of a fresh machine, which .ci/run and .ci/package run",
    "install": "installs packages",
    "hub": "needs a Hugging Face account and the network",
    "long": "hours of training or probing on real data",
    "sketch": "an elided command or class (`...`)",
    "gpu": "needs a CUDA device",
    "allennlp": "AllenNLP's own code, shown beside ours",
    "elmoformanylangs": "ELMoForManyLangs' own code, shown beside ours",
    "manylangs": "needs a published ELMoForManyLangs model directory",
}
FENCE = re.compile(r"^```(bash|python)([^\n]*)\n(.*?)^```", re.M | re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_HERE = ["README.md", "docs/embed.md", "docs/export.md", "docs/training.md"]


def _blocks(path: Path) -> list[tuple[str, str, str]]:
    return [(kind, info.strip(), code) for kind, info, code in FENCE.findall(path.read_text(encoding="utf-8"))]


def test_every_block_runs_or_says_why_not():
    runnable = set()
    for path in DOCS:
        rel = path.relative_to(ROOT).as_posix()
        for kind, info, _code in _blocks(path):
            if info:
                assert info in NOT_RUN, f"{rel}: a ```{kind} {info} block: unknown tag (known: {sorted(NOT_RUN)})"
            else:
                runnable.add(rel)
    # Each file with a block to run is run by a test below (or by test_docs_migrating.py).
    assert runnable == set(RUN_HERE) | {"docs/migrating.md"}, runnable


def _lines(path: Path, n: int) -> Path:
    words = "the cat sat on a mat while birds flew south in winter and the dog slept".split()
    path.write_text("".join(" ".join(words[(i + k) % len(words)] for k in range(3 + i % 9)) + " .\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _setup(name: str, tmp: Path) -> None:
    """The files a document's blocks take as the reader's own."""
    if name == "docs/embed.md":
        _lines(tmp / "in.txt", 40)
        _lines(tmp / "corpus.txt", 30)
        assert cli_main(["embed", "corpus.txt", "out.hdf5", "--all", "-q"]) == 0
    elif name == "docs/export.md":
        from torchelmo import BiLM
        BiLM.from_pretrained("default").save_pretrained("my-model")
    elif name == "docs/training.md":
        _lines(tmp / "corpus.txt", 400)
        assert cli_main(["vocab", "corpus.txt", "-o", "vocab.txt"]) == 0
        assert cli_main(["train", "--train", "corpus.txt", "--vocab", "vocab.txt", "--out", "runs/mine",
                         "--model", "tiny", "--max-steps", "4", "--batch-size", "4", "--unroll", "8",
                         "--threads", "1", "--no-progress", "-q"]) == 0


@pytest.mark.parametrize("name", RUN_HERE)
def test_blocks_run_as_written(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    namespace: dict = {}
    try:
        _setup(name, tmp_path)
        ran = 0
        for kind, info, code in _blocks(ROOT / name):
            if info:
                continue
            if kind == "python":
                exec(compile(code, name, "exec"), namespace)
            else:
                out = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                                     capture_output=True, text=True, timeout=600)
                assert out.returncode == 0, f"{name}:\n{code}\n{out.stderr[-2000:]}"
            ran += 1
        assert ran > 0
    finally:
        torch.set_num_threads(n)


def test_the_readme_python_example_compiles_nothing(tmp_path):
    # Its frozen Elmo under autograd (a task model's training loop) runs the inference path, and
    # a short job compiles no loop: no graph in a fresh process with an empty compile cache.
    code = next(code for kind, info, code in _blocks(ROOT / "README.md") if kind == "python" and not info)
    script = tmp_path / "example.py"
    script.write_text(code + "\nfrom torch._dynamo.utils import counters\n"
                      "print('frames', sum(counters['frames'].values()), 'graphs', counters['stats']['unique_graphs'])\n",
                      encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "frames 0 graphs 0", run.stdout
