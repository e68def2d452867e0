"""Whole-process ``elmo embed --all``: fp32 against bf16, as a user runs it, process start, model
load, compiling (where ``auto`` compiles) and writing included.

    .venv/bin/python benchmarks/embed_precision.py --out results/embed_precision.json
    .venv/bin/python benchmarks/embed_precision.py --models small --rounds 3 --threads 1

* Input: the first 600 sentences of WikiText-2 valid (../shared/data/lm/wikitext-2-valid-test;
  paragraphs split at " . ", sentences of 3-60 words kept), for the published small and
  original shapes with random weights (seed 0; speed does not depend on the values); and the
  README's main job (examples/sentences.txt, the shipped default model).
* Each round runs every precision once, one after the other, in fresh processes; the table
  gives each precision's median wall time and, per round, the ratio of fp32's time to the other's
  (moments apart: on a shared host their spread says more than any one time).
* Error: the first round's outputs, per layer, against fp32's: max |diff| and mean |diff| over
  mean |fp32| (relative).
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

import h5py
import numpy as np
import torch

from torchelmo import BiLM, preset
from torchelmo.numerics.precision import cpu_bf16_support, support_line
from torchelmo.runtime import cpu_name

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "lm" / "wikitext-2-valid-test" / "wiki.valid.tokens"
ELMO = [sys.executable, "-m", "torchelmo.cli"]


def wiki_sentences(n: int) -> list[str]:
    out = []
    for line in WIKI.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith(" ="):
            continue
        for s in line.split(" . "):
            words = s.split()
            if 3 <= len(words) <= 60:
                out.append(" ".join(words) + " .")
                if len(out) == n:
                    return out
    return out


def embed(model: str, text: Path, out: Path, precision: str, threads: int) -> float:
    cmd = [*ELMO, "embed", str(text), str(out), "--all", "--model", model, "--precision", precision,
           "--threads", str(threads), "--silent"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t


def layer_errors(got: Path, want: Path) -> list[dict]:
    with h5py.File(got, "r") as g, h5py.File(want, "r") as w:
        keys = [k for k in w if k.isdigit()]
        a = np.concatenate([g[k][()] for k in keys], axis=1)    # (3, tokens, 2P)
        b = np.concatenate([w[k][()] for k in keys], axis=1)
    return [{"layer": i, "max_abs": float(np.abs(a[i] - b[i]).max()),
             "relative": float(np.abs(a[i] - b[i]).mean() / np.abs(b[i]).mean())} for i in range(a.shape[0])]


def bench(name: str, model: str, text: Path, precisions: list[str], rounds: int, threads: int, tmp: Path) -> dict:
    times: dict[str, list[float]] = {p: [] for p in precisions}
    for r in range(rounds):
        for p in precisions:
            times[p].append(embed(model, text, tmp / f"{name}-{p}-{r}.hdf5", p, threads))
    row = {"model": name, "input": str(text.relative_to(ROOT)) if text.is_relative_to(ROOT) else text.name,
           "words": sum(len(line.split()) for line in text.read_text(encoding="utf-8").splitlines()),
           "threads": threads, "rounds": rounds, "seconds": times,
           "median_seconds": {p: statistics.median(t) for p, t in times.items()}}
    for p in precisions[1:]:
        paired = [f / o for f, o in zip(times["fp32"], times[p])]
        row[f"fp32_over_{p}"] = {"median": statistics.median(paired), "min": min(paired), "max": max(paired)}
        row[f"errors_{p}"] = layer_errors(tmp / f"{name}-{p}-0.hdf5", tmp / f"{name}-fp32-0.hdf5")
        errs = ", ".join(f"{e['relative']:.2%}" for e in row[f"errors_{p}"])
        print(f"  {name:9s} {row['words']:6,d} words, {threads} thread(s): fp32 {row['median_seconds']['fp32']:6.2f} s, "
              f"{p} {row['median_seconds'][p]:6.2f} s; fp32/{p} per round {row[f'fp32_over_{p}']['median']:.2f}x "
              f"[{row[f'fp32_over_{p}']['min']:.2f}-{row[f'fp32_over_{p}']['max']:.2f}]; "
              f"relative error per layer {errs}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small,original,readme", help="comma-separated: small, original, readme")
    ap.add_argument("--sentences", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precisions", default="fp32,bf16,auto", help="fp32 first")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    precisions = args.precisions.split(",")
    if precisions[0] != "fp32":
        sys.exit("embed_precision.py: --precisions must start with fp32 (the reference)")
    report = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                          "bf16_support": cpu_bf16_support(), "support_line": support_line()},
              "runs": []}
    print(support_line(), flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        text = tmp / "wiki.txt"
        text.write_text("\n".join(wiki_sentences(args.sentences)) + "\n", encoding="utf-8")
        for name in args.models.split(","):
            if name == "readme":
                row = bench(name, "default", ROOT / "examples" / "sentences.txt", precisions, args.rounds,
                            args.threads, tmp)
            else:
                torch.manual_seed(0)
                BiLM(preset(name)).save_pretrained(tmp / name)
                row = bench(name, str(tmp / name), text, precisions, args.rounds, args.threads, tmp)
            report["runs"].append(row)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
