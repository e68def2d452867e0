"""Peak memory of `elmo embed --top` as the input grows: it should stay flat.

    .venv/bin/python benchmarks/embed_memory.py                     # 5k and 50k lines, 1 thread
    .venv/bin/python benchmarks/embed_memory.py --lines 5000 20000 50000 --threads 2

Input: sentences of UD English EWT train (from ../shared/data), repeated in order until there are
enough lines. Each size runs `elmo embed INPUT OUT --top` with the embedded default model in a
fresh process; its peak resident set size (ru_maxrss, from wait4) is reported with the time and
the output size, and all of it written to --json.

Memory is bounded by the batching window (the sentences held to be sorted by length) and the
largest batch, not by the input: outputs are written as each batch finishes. A small input can
peak lower only because its windows hold fewer (and shorter) long sentences.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchelmo.probe.conll import read_conllu

ROOT = Path(__file__).resolve().parents[1]
UD = ROOT.parent / "shared" / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-train.conllu"


def write_input(path: Path, n_lines: int, sentences: list[str]) -> int:
    """``n_lines`` lines cycling through ``sentences``; returns the token count."""
    lines = [sentences[i % len(sentences)] for i in range(n_lines)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sum(len(s.split()) for s in lines)


def run_one(inp: Path, out: Path, threads: int) -> dict:
    elmo = Path(sys.executable).with_name("elmo")
    cmd = [str(elmo), "embed", str(inp), str(out), "--top", "--threads", str(threads), "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return {"peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 1),
            "output_mb": round(out.stat().st_size / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[5000, 50000])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here (results/embed_memory.json holds the "
                                    "documented run)")
    args = ap.parse_args()
    sentences = [" ".join(s.tokens) for s in read_conllu(UD)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lines:
            inp, out = Path(tmp) / f"in{n}.txt", Path(tmp) / f"out{n}.h5"
            tokens = write_input(inp, n, sentences)
            row = {"lines": n, "tokens": tokens, **run_one(inp, out, args.threads)}
            rows.append(row)
            print(f"{n:>7,} lines {tokens:>9,} tokens: peak RSS {row['peak_rss_mb']:7.1f} MB, "
                  f"{row['seconds']:6.1f} s, output {row['output_mb']:7.1f} MB", flush=True)
            out.unlink()
    result = {"command": "elmo embed INPUT OUT --top (default model)", "threads": args.threads,
              "input": "UD English EWT train, cycled", "runs": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
