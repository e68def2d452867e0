"""Character ids per second: ``batch_to_ids`` (one buffer, no per-token Python) beside the
token-by-token mapping (``word_to_char_ids`` per token, cached), side by side in one run.

    .venv/bin/python benchmarks/chars.py [--sentences 4000] [--batch 256] [--out results/chars.json]

Data: UD English EWT train (../shared), batches of consecutive sentences. On a GPU the character
ids are built on the host for every batch, so this rate bounds embedding throughput.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from torchelmo.model.chars import batch_to_ids, word_to_char_ids
from torchelmo.probe.conll import read_conllu

UD = Path(__file__).resolve().parents[2] / "shared" / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-train.conllu"


def token_by_token(batch: list[list[str]]) -> np.ndarray:
    T = max(len(s) for s in batch)
    out = np.zeros((len(batch), T, 50), np.int64)
    for b, s in enumerate(batch):
        if s:
            out[b, :len(s)] = [word_to_char_ids(t) for t in s]
    return out


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sentences = [s.tokens for s in read_conllu(UD)][: args.sentences]
    batches = [sentences[i:i + args.batch] for i in range(0, len(sentences), args.batch)]
    n = sum(len(s) for s in sentences)
    for b in batches:   # the two agree
        assert np.array_equal(batch_to_ids(b).numpy(), token_by_token(b))
    fast = best_time(lambda: [batch_to_ids(b) for b in batches], args.repeats)
    slow = best_time(lambda: [token_by_token(b) for b in batches], args.repeats)
    report = {"tokens": n, "batch": args.batch, "batch_to_ids_tokens_per_s": n / fast,
              "token_by_token_tokens_per_s": n / slow, "speedup": slow / fast}
    print(f"{n:,} tokens in batches of {args.batch}: batch_to_ids {n / fast:,.0f} tokens/s, "
          f"token by token {n / slow:,.0f} tokens/s ({slow / fast:.1f}x)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
