"""Greedy model soup for PTB: average the parameters of several fine-tuned LMs of one shape.

Runs restarted from one model (scripts/train_ptb.sh INIT_FROM=...) stay in its basin, so their
parameters can be averaged (Wortsman et al. 2022, "model soups"). Greedy: rank the candidates by
validation forward perplexity, start from the best, add each next one if the uniform mean of the
members so far and it is better on *validation*; the test set is scored once, on the final soup.

    .venv/bin/python scripts/soup_ptb.py runs/ptb2/best runs/ptb5/avg24 runs/ptb7/avg4 \
        --out runs/soup --results results

Writes OUT/valid_<i>.json (each candidate), OUT/soup/ (the LM dir), OUT/soup.json (the steps) and,
with --results, RESULTS/ptb.json + RESULTS/ptb_sentence.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from elmo.average import average, load_lm
from elmo.data import Corpus, SentenceBatcher, StreamBatcher
from elmo.lm import LanguageModel


def stream_ppl(lm: LanguageModel, path: Path, rows: int = 20) -> dict:
    """Perplexity of ``path`` read as ``rows`` contiguous streams, state carried across 20-step windows.
    rows=1 is Kim et al. (2016)'s test protocol: the whole test set as one sequence."""
    return lm.evaluate(StreamBatcher(Corpus([path], shuffle=False), lm.vocab, rows, 20, contiguous=True),
                       stateful=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="LM directories (or checkpoints) of one shape and vocabulary")
    ap.add_argument("--ptb", default="../shared/data/lm/ptb")
    ap.add_argument("--out", required=True)
    ap.add_argument("--results", help="write ptb.json + ptb_sentence.json here")
    ap.add_argument("--alphas", type=float, nargs="+", default=[],
                    help="weights of the best member to try on validation after the greedy soup")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if any(not 0 < a < 1 for a in args.alphas):
        ap.error(f"--alphas must lie in (0, 1), got {args.alphas}")
    torch.set_num_threads(args.threads)
    out, ptb = Path(args.out), Path(args.ptb)
    out.mkdir(parents=True, exist_ok=True)
    valid = ptb / "ptb.valid.txt"

    scores = {}
    for i, m in enumerate(args.models):
        cache = out / f"valid_{i}.json"
        if cache.is_file() and json.loads(cache.read_text())["model"] == m:
            r = json.loads(cache.read_text())
        else:
            r = {"model": m, **stream_ppl(load_lm(m), valid)}
            cache.write_text(json.dumps(r, indent=2))
        scores[m] = r
        print(f"{m}: valid forward {r['ppl_forward']:.2f} backward {r['ppl_backward']:.2f}", file=sys.stderr)
    ranked = sorted(args.models, key=lambda m: scores[m]["ppl_forward"])
    members, best = [ranked[0]], scores[ranked[0]]
    steps = [{"members": list(members), "ppl_forward": best["ppl_forward"], "ppl_backward": best["ppl_backward"],
              "kept": True}]
    for m in ranked[1:]:
        r = stream_ppl(average(members + [m]), valid)
        kept = r["ppl_forward"] < best["ppl_forward"]
        steps.append({"members": members + [m], "ppl_forward": r["ppl_forward"], "ppl_backward": r["ppl_backward"],
                      "kept": kept})
        print(f"+ {m}: valid forward {r['ppl_forward']:.2f} backward {r['ppl_backward']:.2f} "
              f"({'kept' if kept else 'dropped'})", file=sys.stderr)
        if kept:
            members, best = members + [m], r
    weights = [1.0 / len(members)] * len(members)
    for a in (args.alphas if len(members) > 1 else []):
        w = [a] + [(1 - a) / (len(members) - 1)] * (len(members) - 1)
        r = stream_ppl(average(members, w), valid)
        kept = r["ppl_forward"] < best["ppl_forward"]
        steps.append({"members": list(members), "weights": w, "ppl_forward": r["ppl_forward"],
                      "ppl_backward": r["ppl_backward"], "kept": kept})
        print(f"alpha {a:.2f} on {members[0]}: valid forward {r['ppl_forward']:.2f} backward "
              f"{r['ppl_backward']:.2f} ({'kept' if kept else 'dropped'})", file=sys.stderr)
        if kept:
            weights, best = w, r
    soup = average(members, weights)
    soup.save_pretrained(out / "soup", extra={"average": {"sources": members, "n": len(members), "weights": weights,
                                                          "selection": "greedy soup on PTB validation"}})
    test = stream_ppl(soup, ptb / "ptb.test.txt")
    summary = {"members": members, "weights": weights, "valid": best, "test": test, "steps": steps, "candidates": scores}
    (out / "soup.json").write_text(json.dumps(summary, indent=2))
    print(f"soup of {len(members)}: valid forward {best['ppl_forward']:.2f}; test forward {test['ppl_forward']:.2f} "
          f"backward {test['ppl_backward']:.2f}", file=sys.stderr)
    if args.results:
        res = Path(args.results)
        sent = soup.evaluate(SentenceBatcher(Corpus([ptb / "ptb.test.txt"], shuffle=False), soup.vocab,
                                             batch_size=64, epochs=1, shuffle=False))
        (res / "ptb_sentence.json").write_text(json.dumps({"model": str(out / "soup"), "mode": "sentence",
                                                           "params": soup.num_parameters(), **sent}, indent=2))
        (res / "ptb.json").write_text(json.dumps({
            "params": soup.num_parameters(), "test_ppl_forward": test["ppl_forward"],
            "test_ppl_backward": test["ppl_backward"], "test_ppl_mean": test["ppl_mean"],
            "test_tokens": test["tokens"], "eval": "stream, 20 rows, state carried",
            "model_dir": str(out / "soup"), "model": f"greedy soup ({'uniform' if len(set(weights)) == 1 else 'weighted'} mean) of {len(members)} LMs",
            "averaged": members, "weights": weights,
            "valid": {"valid_ppl_forward": best["ppl_forward"], "valid_ppl_backward": best["ppl_backward"],
                      "valid_ppl_mean": best["ppl_mean"], "valid_tokens": best["tokens"]},
            "selection": f"{out}/soup.json (members chosen greedily by validation forward perplexity)"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
