"""Helpers of the tests of reliability: the CLI's one-line errors, a server on 127.0.0.1, a
tiny published model, input files, a pid that no process has."""

import os
from pathlib import Path

from torchelmo.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(capsys, argv, *parts):
    """Run the CLI, expecting exit 1 and a single stderr line holding every one of ``parts``."""
    assert cli_main([str(a) for a in argv]) == 1, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for part in parts:
        assert part in err[0], (part, err[0])
    return err[0]


def tiny_published(tmp_path):
    from torchelmo import BiLM, preset
    return BiLM(preset("tiny")).export_published(tmp_path, "tiny")


def write_lines(path: Path, n: int) -> Path:
    words = "the quick brown fox jumps over the lazy dog again and again".split()
    path.write_text("".join(" ".join(words[: 3 + i % 9]) + "\n" for i in range(n)))
    return path


ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}

