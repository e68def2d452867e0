"""The fused kernels compile for real GPUs (sm_90 and sm_80) with no spills, shared memory every
current GPU has, and tensor cores exactly where the precision allows them. Runs without a GPU:
Triton compiles ahead of time with the ptxas its wheel ships."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra

# Only looked up, not imported: importing Triton here, before test_fused asks for its CPU
# interpreter, would leave the kernels half-built for the GPU in this process.
if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed", allow_module_level=True)
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels.py"


def _report(tmp_path, *args):
    out = tmp_path / "kernels.json"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--check", "--out", str(out)],
                          check=False, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode == 2 and "not found" in proc.stderr:
        pytest.skip(proc.stderr.strip())   # a Triton build without the NVIDIA tools
    rows = json.loads(out.read_text())["kernels"] if out.exists() else []
    return proc, rows


def test_kernels_compile_clean_for_hopper_and_ampere(tmp_path):
    proc, rows = _report(tmp_path, "--cc", "90", "80", "--rows", "16", "64", "256", "1024")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"gates_fwd", "proj_fwd", "gates_bwd", "rec_bwd"}
    for r in rows:
        assert r["spill_bytes"] == 0 and r["shared_bytes"] <= 99 * 1024, r
        tensor = r["HGMMA"] + r["HMMA"]
        assert (tensor == 0) if r["precision"] == "fp32" else (tensor > 0), r
    # Hopper's warpgroup MMA where a program has 64 rows; Ampere has none.
    assert any(r["HGMMA"] for r in rows if r["cc"] == 90 and r["tiles"][0] == 64)
    assert not any(r["HGMMA"] for r in rows if r["cc"] == 80)
