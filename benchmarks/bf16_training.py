"""Does bf16 training on the CPU learn what fp32 learns? The PTB recipe's first phase
(``configs/ptb/phase8.json``: the ``cpu`` shape, full softmax, Adam, dropout and weight drop)
trained for a fixed number of steps twice, ``--precision fp32`` and ``--precision bf16``, from the
same seed on the same batches, each with ``elmo train`` in its own process; the validation
perplexity of both, and their training speed.

    .venv/bin/python benchmarks/bf16_training.py --out results/bf16_training.json
    .venv/bin/python benchmarks/bf16_training.py --steps 20 --eval-every 10 --valid-lines 300   # a quick look

Protocol, fixed before the numbers: 1,000 steps of 32 x 20 tokens (640k tokens, about 0.7 of an
epoch), the recipe's schedule shortened to those steps (warm-up 200, cosine), validation on all
of PTB valid every 500 steps. Target: bf16's validation perplexity within 1% of fp32's at the
last validation. Training speed: the trainer's own tokens/s (median of its log lines).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from torchelmo.numerics.precision import cpu_bf16_support

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "lm" / "ptb"
RECIPE = ROOT / "configs" / "ptb" / "phase8.json"


def run(precision: str, steps: int, eval_every: int, threads: int, work: Path, valid: Path) -> dict:
    cfg = json.loads(RECIPE.read_text(encoding="utf-8"))
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    out = work / precision
    cfg.update(train=[str(SHARED / "ptb.train.txt")], valid=[str(valid)],
               vocab=str(work / "vocab.txt"), out_dir=str(out), max_steps=steps, eval_every=eval_every,
               warmup_steps=min(cfg["warmup_steps"], steps // 5), checkpoint_every=steps, log_every=max(1, steps // 20),
               patience=None, threads=threads, precision=precision, resume=False)
    path = work / f"{precision}.json"
    path.write_text(json.dumps(cfg, indent=1))
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "torchelmo.cli", "train", "--config", str(path)],
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"bf16_training.py: the {precision} run failed:\n{res.stderr[-3000:]}")
    seconds = time.perf_counter() - t
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [{"step": x["step"], "ppl": x["valid_ppl_mean"], "forward": x["valid_ppl_forward"],
              "backward": x["valid_ppl_backward"]} for x in lines if "valid_ppl_mean" in x]
    speeds = [x["tokens_per_s"] for x in lines if "tokens_per_s" in x]
    return {"precision": precision, "validation": valid, "tokens_per_s": statistics.median(speeds),
            "wall_seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--valid-lines", type=int, help="validate on the first lines of PTB valid only (a quick look)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        subprocess.run([sys.executable, "-m", "torchelmo.cli", "vocab", str(SHARED / "ptb.train.txt"),
                        "-o", str(work / "vocab.txt")], check=True, stdout=subprocess.DEVNULL)
        valid = SHARED / "ptb.valid.txt"
        if args.valid_lines:
            lines = valid.read_text(encoding="utf-8").splitlines(keepends=True)[:args.valid_lines]
            valid = work / "valid.txt"
            valid.write_text("".join(lines), encoding="utf-8")
        runs = [run(p, args.steps, args.eval_every, args.threads, work, valid) for p in ("fp32", "bf16")]
    fp32, bf16 = (r["validation"][-1]["ppl"] for r in runs)
    report = {"torch": torch.__version__, "bf16_support": cpu_bf16_support(), "threads": args.threads,
              "valid_lines": args.valid_lines or "all",
              "recipe": str(RECIPE.relative_to(ROOT)), "steps": args.steps, "batch": "32x20", "runs": runs,
              "relative_difference": bf16 / fp32 - 1.0, "speedup": runs[1]["tokens_per_s"] / runs[0]["tokens_per_s"]}
    for r in runs:
        curve = ", ".join(f"{v['step']}: {v['ppl']:.2f}" for v in r["validation"])
        print(f"{r['precision']}: validation perplexity {curve}; {r['tokens_per_s']:,.0f} tokens/s")
    print(f"bf16 against fp32 at step {runs[0]['validation'][-1]['step']}: {report['relative_difference']:+.2%} "
          f"perplexity, x{report['speedup']:.2f} tokens/s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
