"""Install a PyTorch that fits this machine into the running Python's environment, before
``pip install -e .`` (which then keeps it): the README's first command runs this.

- A torch already installed in torchelmo's range is kept.
- With an NVIDIA GPU (``nvidia-smi``, or the driver's ``/proc`` entry): pip's default build,
  which on Linux is the CUDA one.
- Without one: a CPU build (a few hundred MB instead of several GB, and no "No CUDA runtime"
  warnings): one that pip's own sources already offer (a ``+cpu`` release, e.g. from a
  ``find-links`` directory), else PyTorch's CPU index, else (that index unreachable) pip's
  default build, said so in one line.

``--dry-run`` prints the pip command instead of running it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import urllib.request

LOW, HIGH = (2, 13), (2, 15)              # pyproject.toml: torch>=2.13,<2.15
RANGE = f"torch>={LOW[0]}.{LOW[1]},<{HIGH[0]}.{HIGH[1]}"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _release(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def in_range(version: str) -> bool:
    return LOW <= _release(version) < HIGH


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia/version")


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def offered_versions() -> list[str]:
    """The torch releases pip's configured sources offer (``pip index versions``)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "torch"], capture_output=True,
                         text=True, timeout=300).stdout
    m = re.search(r"Available versions: (.*)", out)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def reachable(url: str, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def plan(installed: str | None, gpu: bool, offered: list[str], cpu_index: bool) -> tuple[list[str] | None, str]:
    """The pip arguments to run (None: nothing to do) and a line saying why."""
    if installed is not None and in_range(installed):
        return None, f"torch {installed} is installed and in range ({RANGE}): kept"
    if gpu:
        return ["install", RANGE], "an NVIDIA GPU is present: pip's default build (CUDA on Linux)"
    cpu = [v for v in offered if v.endswith("+cpu") and in_range(v)]
    if cpu:
        best = max(cpu, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])))
        return ["install", f"torch=={best}"], f"no GPU: the CPU build torch {best}, which pip's sources offer"
    if cpu_index:
        return ["install", RANGE, "--index-url", CPU_INDEX], f"no GPU: a CPU build from {CPU_INDEX}"
    return ["install", RANGE], (f"no GPU, but no CPU build is offered and {CPU_INDEX} is unreachable: pip's "
                                "default build (on Linux the CUDA one, several GB)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="print the pip command instead of running it")
    args = p.parse_args(argv)
    installed, gpu = installed_torch(), has_gpu()
    needs_look = not gpu and not (installed and in_range(installed))
    offered = offered_versions() if needs_look else []
    cpu_index = needs_look and not any(v.endswith("+cpu") and in_range(v) for v in offered) and reachable(CPU_INDEX)
    pip_args, why = plan(installed, gpu, offered, cpu_index)
    print(f"install_torch: {why}", file=sys.stderr)
    if pip_args is None:
        return 0
    command = [sys.executable, "-m", "pip", *pip_args]
    if args.dry_run:
        print(" ".join(command))
        return 0
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
