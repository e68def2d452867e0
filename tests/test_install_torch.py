"""scripts/install_torch.py, which the README's first command runs: a torch that fits the machine
(a CPU build where no GPU is present) in torchelmo's range."""

import importlib.util
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_torch)


@pytest.mark.core
def test_the_range_is_pyprojects():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert install_torch.RANGE in deps


@pytest.mark.parametrize("installed, gpu, offered, index, want", [
    ("2.13.0+cpu", False, [], False, None),                                      # in range: kept
    ("2.14.1", True, [], False, None),
    (None, True, ["2.14.1", "2.13.0+cpu"], True, ["install", "torch>=2.13,<2.15"]),   # a GPU: the default build
    ("2.12.1", False, ["2.15.0", "2.14.1", "2.13.0+cpu", "2.12.0+cpu"], True, ["install", "torch==2.13.0+cpu"]),
    (None, False, ["2.14.1+cpu", "2.13.0+cpu", "2.15.0+cpu"], False, ["install", "torch==2.14.1+cpu"]),
    (None, False, ["2.14.1", "2.13.0"], True,
     ["install", "torch>=2.13,<2.15", "--index-url", "https://download.pytorch.org/whl/cpu"]),
    (None, False, ["2.14.1", "2.13.0"], False, ["install", "torch>=2.13,<2.15"]),          # said so
])
@pytest.mark.core
def test_plan(installed, gpu, offered, index, want):
    got, why = install_torch.plan(installed, gpu, offered, index)
    assert got == want
    assert why and "\n" not in why
    if want == ["install", "torch>=2.13,<2.15"] and not gpu:
        assert "unreachable" in why and "several GB" in why


def test_dry_run_in_an_empty_environment_picks_a_cpu_build_here(tmp_path):
    # This machine has no GPU; pip's sources here offer a +cpu release (or the CPU index).
    if install_torch.has_gpu():
        pytest.skip("a GPU is present: the default build is the right one")
    venv.create(tmp_path / "env", with_pip=True)
    py = tmp_path / "env" / "bin" / "python"
    r = subprocess.run([str(py), str(ROOT / "scripts" / "install_torch.py"), "--dry-run"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("install_torch: no GPU")
    assert re.search(r"pip install (torch==2\.1[34]\.\d+\+cpu|torch>=2\.13,<2\.15 --index-url)", r.stdout), r.stdout
    # And in this environment (torch in range): nothing to install.
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "install_torch.py"), "--dry-run"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout == "" and "kept" in r.stderr
