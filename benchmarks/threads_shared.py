"""``elmo embed`` on a machine whose cores other jobs share: the default threads against
``--threads 1``, and the default with idle OpenMP threads spinning (``OMP_WAIT_POLICY=ACTIVE``,
what torch did before the command line chose ``PASSIVE``), whole processes, in alternating rounds.

    .venv/bin/python benchmarks/threads_shared.py --out results/threads_shared.json
    .venv/bin/python benchmarks/threads_shared.py --load 2 --rounds 3

* Input: the first 600 sentences (``--sentences``) of WikiText-2 valid (as ``benchmarks/embed_precision.py``), the
  published small shapes with random weights.
* Load: ``--load`` processes that each keep a core busy (a Python loop) for the whole run; 0 is
  the idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_precision import wiki_sentences  # noqa: E402

from torchelmo import BiLM, preset  # noqa: E402
from torchelmo.runtime import cpu_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"default": ([], {}), "threads 1": (["--threads", "1"], {}),
            "default, spinning": ([], {"OMP_WAIT_POLICY": "ACTIVE"})}


def embed(model: Path, text: Path, out: Path, flags: list[str], env: dict) -> float:
    cmd = [sys.executable, "-m", "torchelmo.cli", "embed", str(text), str(out), "--all", "--model", str(model),
           "--silent", *flags]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, **env})
    out.unlink()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the runs (default 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=600)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    os.environ.clear()
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        text = tmp / "wiki.txt"
        text.write_text("\n".join(wiki_sentences(args.sentences)) + "\n", encoding="utf-8")
        torch.manual_seed(0)
        BiLM(preset("small")).save_pretrained(tmp / "small")
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
        try:
            times: dict[str, list[float]] = {k: [] for k in SETTINGS}
            for _ in range(args.rounds):
                for name, (flags, extra) in SETTINGS.items():
                    times[name].append(embed(tmp / "small", text, tmp / "o.h5", flags, extra))
        finally:
            for p in busy:
                p.kill()
    report = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__},
              "load": args.load, "rounds": args.rounds, "seconds": times,
              "median_seconds": {k: statistics.median(v) for k, v in times.items()}}
    for k, v in report["median_seconds"].items():
        print(f"  load {args.load}: {k:18s} {v:6.2f} s (median of {args.rounds})", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
