"""Every benchmark script runs, in a quick mode (small sizes, one thread), and writes its JSON:
a script the docs point to cannot rot unnoticed. The figures themselves are meaningless at these
sizes; the docs' figures come from the full runs their commands give."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

EXTRAS_NEEDED = ("triton", "onnxruntime")   # and ../shared (UD EWT, the PTB sample), which the scripts read

# script -> quick arguments; "{json}" is where its figures go ("" where it writes none).
QUICK = {
    "chars.py": ["--sentences", "100", "--repeats", "1", "--out", "{json}"],
    "embed.py": ["--models", "small", "--threads", "1", "--tokens", "200", "--repeats", "1", "--json", "{json}"],
    "embed_memory.py": ["--lines", "100", "--json", "{json}"],
    "cpu_precision.py": ["--threads", "1", "--models", "default", "--tokens", "200", "--repeats", "1",
                         "--train-steps", "1", "--train-batch", "4", "--train-softmax", "adaptive",
                         "--no-emulate", "--no-matmuls", "--out", "{json}"],
    "embed_precision.py": ["--models", "readme", "--rounds", "1", "--precisions", "fp32,bf16", "--out", "{json}"],
    "cpu_loops.py": ["--threads", "1", "--pairs", "1", "--tokens", "200", "--rows", "16", "--out", "{json}"],
    "bf16_training.py": ["--steps", "2", "--eval-every", "2", "--valid-lines", "20", "--threads", "1",
                         "--out", "{json}"],
    "bf16_probe.py": ["--tasks", "wsj", "--limit", "40", "--threads", "1", "--out", "{json}"],
    "train.py": ["--steps", "1", "--batch", "2", "--threads", "1", "--json", "{json}"],
    "export.py": ["--models", "default", "--threads", "1", "--sentences", "8", "--batch", "4", "--rounds", "1",
                  "--out", "{json}"],
    # The GPU scripts on the CPU: the same code paths, without the Triton kernels.
    "gpu.py": ["--quick", "--device", "cpu", "--out", "{json}"],
    "precision.py": ["--device", "cpu", "--sentences", "4", "--out", "{json}"],
    "threads_shared.py": ["--load", "0", "--rounds", "1", "--sentences", "20", "--out", "{json}"],
}
NOT_HERE = {
    "kernels.py": "tests/test_fused_compile.py runs it (compiling every kernel, checked)",
    "gpu_session.sh": "the device session: needs a CUDA GPU (docs/gpu.md)",
}


def test_every_benchmark_is_run_here_or_says_where():
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == set(QUICK) | set(NOT_HERE)


@pytest.mark.parametrize("script", sorted(QUICK))
def test_benchmark_runs_quickly(script, tmp_path):
    out = tmp_path / "figures.json"
    argv = [a.replace("{json}", str(out)) for a in QUICK[script]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures, "no figures written"
    assert not list((ROOT / "results").glob("*.tmp")), "a benchmark left a temporary in results/"
