"""Greedy model soup for PTB: average the parameters of several fine-tuned LMs of one shape.

Runs restarted from one model (scripts/train_ptb.sh INIT_FROM=...) stay in its basin, so their
parameters can be averaged (Wortsman et al. 2022, "model soups"). Greedy: rank the candidates by
validation forward perplexity, start from the best, add each next one if the uniform mean of the
members so far and it is better on *validation* (passes repeat over the dropped ones until none is
added); the test set is scored once, on the final soup.

    .venv/bin/python scripts/soup_ptb.py runs/ptb2/best runs/ptb5/avg24 runs/ptb7/avg4 \
        --out runs/soup --results results

Writes OUT/valid_<i>.json (each candidate), OUT/soup/ (the LM dir), OUT/soup.json (the steps) and,
with --results, RESULTS/ptb.json (20-stream and one-stream test, --lineage fields, target met or not)
+ RESULTS/ptb_sentence.json.
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
    ap.add_argument("--lineage", help="JSON file of fields to merge into ptb.json (how the members were trained)")
    ap.add_argument("--target", type=float, default=92.3, help="forward test perplexity to meet (Kim et al. 2016)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if any(not 0 < a < 1 for a in args.alphas):
        ap.error(f"--alphas must lie in (0, 1), got {args.alphas}")
    try:  # read before the first (minutes-long) evaluation, so a bad file fails at once
        lineage = json.loads(Path(args.lineage).read_text()) if args.lineage else {}
    except (OSError, ValueError) as e:
        ap.error(f"--lineage {args.lineage}: {e}")
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
    members, weights, best = [ranked[0]], [1.0], scores[ranked[0]]
    steps = [{"members": list(members), "ppl_forward": best["ppl_forward"], "ppl_backward": best["ppl_backward"],
              "kept": True}]

    def trial(cand: list[str], w: list[float] | None, label: str) -> bool:
        """Score the (weighted) mean of ``cand`` on validation; record it; keep it if it beats the best so far."""
        nonlocal members, weights, best
        w = w or [1.0 / len(cand)] * len(cand)
        r = stream_ppl(average(cand, w), valid)
        kept = r["ppl_forward"] < best["ppl_forward"]
        steps.append({"members": list(cand), "weights": w, "ppl_forward": r["ppl_forward"],
                      "ppl_backward": r["ppl_backward"], "kept": kept})
        print(f"{label}: valid forward {r['ppl_forward']:.2f} backward {r['ppl_backward']:.2f} "
              f"({'kept' if kept else 'dropped'})", file=sys.stderr)
        if kept:
            members, weights, best = list(cand), w, r
        return kept

    pending = ranked[1:]
    while pending:  # a candidate dropped early may help once later members are in: retry until nothing is added
        dropped = [m for m in pending if not trial(members + [m], None, f"+ {m}")]
        if len(dropped) == len(pending):
            break
        pending = dropped
    for a in (args.alphas if len(members) > 1 else []):
        n = len(members)
        trial(members, [a] + [(1 - a) / (n - 1)] * (n - 1), f"alpha {a:.2f} on {members[0]}")
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
        one = stream_ppl(soup, ptb / "ptb.test.txt", rows=1)
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
            "selection": f"{out}/soup.json (members chosen greedily by validation forward perplexity)",
            "members_valid_ppl_forward": {m: round(scores[m]["ppl_forward"], 2) for m in members},
            "test_one_stream": {**{k: one[k] for k in ("ppl_forward", "ppl_backward")},
                                "eval": "the whole test set as one stream (Kim et al. 2016's test protocol)"},
            **lineage, "target_forward": args.target, "target_met": test["ppl_forward"] <= args.target}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
