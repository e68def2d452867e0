"""Do bf16 features tell a probe what fp32 features tell it? The POS probe (``elmo probe pos`` /
``pos-wsj``: a linear classifier per layer, and the learned mix) trained on one model's features
extracted in fp32 and in bf16, with the same seed on the same sentences; per layer, the paired
bootstrap over test sentences of bf16's accuracy minus fp32's.

    .venv/bin/python benchmarks/bf16_probe.py --out results/bf16_probe.json
    .venv/bin/python benchmarks/bf16_probe.py --model PATH --tasks wsj --limit 500   # a quick look

Protocol, fixed before the numbers: UD English EWT (UPOS) and the WSJ sample (PTB tags) from
``../shared/data``, all sentences, the probes' defaults (``ProbeConfig``), 1,000 resamples. A
layer passes when the 95% paired interval of bf16 - fp32 contains zero (its accuracy is within
fp32's paired interval); each precision's own interval is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from torchelmo.model.bilm import BiLM
from torchelmo.numerics.precision import cpu_bf16_support
from torchelmo.probe.conll import read_conllu
from torchelmo.probe.features import extract
from torchelmo.probe.pos import ProbeConfig, run_pos
from torchelmo.probe.stats import accuracy_from_counts, paired_diff_ci
from torchelmo.probe.treebank import SPLITS, read_treebank

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
UD = [DATA / "pos" / "ud-english-ewt" / f"en_ewt-ud-{s}.conllu" for s in ("train", "dev", "test")]
TREEBANK = DATA / "text" / "nltk" / "treebank.zip"


def splits(task: str, limit: int | None) -> list:
    """(train, dev, test) tagged sentences; ``limit``: N training sentences, N/4 dev and test."""
    sizes = (limit, limit and max(1, limit // 4), limit and max(1, limit // 4))
    if task == "pos":
        return [read_conllu(p, "upos", limit=n) for p, n in zip(UD, sizes)]
    return [read_treebank(TREEBANK, split, limit=n) for split, n in zip(SPLITS, sizes)]


def probe(model: str, precision: str, task: str, sets: list, cache: Path, cfg: ProbeConfig) -> tuple[dict, dict]:
    """The probe's results and its per-test-sentence counts (``units``) for one precision."""
    bilm = BiLM.from_pretrained(model, precision=precision).eval()
    t = time.perf_counter()
    feats = [extract(bilm, [s.tokens for s in ss], cache, name=f"{task}-{split}", progress=False)
             for ss, split in zip(sets, ("train", "dev", "test"))]
    seconds = time.perf_counter() - t
    units: dict[str, np.ndarray] = {}
    res = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), cfg, log=lambda m: None, units=units)
    res["extract_seconds"] = seconds
    return res, units


def compare(model: str, task: str, limit: int | None, cache: Path, cfg: ProbeConfig) -> dict:
    sets = splits(task, limit)
    (fp32, u32), (bf16, u16) = (probe(model, p, task, sets, cache, cfg) for p in ("fp32", "bf16"))
    rows = {}
    for name in [*fp32["layers"], "mix"]:
        a, b = (fp32["mix"], bf16["mix"]) if name == "mix" else (fp32["layers"][name], bf16["layers"][name])
        d, lo, hi = paired_diff_ci(u32[name], u16[name], accuracy_from_counts, cfg.n_boot, seed=cfg.seed)
        rows[name] = {"fp32": a["acc"], "fp32_ci": a["ci"], "bf16": b["acc"], "bf16_ci": b["ci"],
                      "bf16_minus_fp32": d, "paired_ci": [lo, hi], "passes": lo <= 0.0 <= hi}
        if name == "mix":
            rows[name].update(fp32_weights=a["weights"], bf16_weights=b["weights"])
    label = Path(model).name if Path(model).is_dir() else model     # a folder by its name, not its path
    return {"model": label, "task": task, "test_sentences": fp32["n_test_sentences"],
            "test_tokens": fp32["n_test_tokens"], "layers": rows,
            "extract_seconds": {"fp32": fp32["extract_seconds"], "bf16": bf16["extract_seconds"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["default"], help="models (names or folders; default: default)")
    ap.add_argument("--tasks", default="pos,wsj", help="pos (UD EWT) and/or wsj (the WSJ sample)")
    ap.add_argument("--limit", type=int, help="first N training sentences (N/4 dev and test): a quick look")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if cpu_bf16_support() != "amx":
        print(f"bf16_probe.py: this CPU's bf16 support is {cpu_bf16_support()!r}; bf16 runs as fp32 here")
    cfg = ProbeConfig()
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        for model in args.model:
            for task in args.tasks.split(","):
                r = compare(model, task, args.limit, Path(cache), cfg)
                runs.append(r)
                print(f"{model} {task} ({r['test_tokens']:,} test tokens, {r['test_sentences']:,} sentences):")
                for name, x in r["layers"].items():
                    print(f"  {name:3s} fp32 {x['fp32']:.4f} [{x['fp32_ci'][0]:.4f}, {x['fp32_ci'][1]:.4f}]  "
                          f"bf16 {x['bf16']:.4f}  bf16 - fp32 {x['bf16_minus_fp32']:+.4f} "
                          f"[{x['paired_ci'][0]:+.4f}, {x['paired_ci'][1]:+.4f}]  "
                          f"{'within' if x['passes'] else 'OUTSIDE'}")
    report = {"torch": torch.__version__, "bf16_support": cpu_bf16_support(), "threads": args.threads,
              "limit": args.limit, "probe_config": vars(cfg), "runs": runs,
              "all_pass": all(x["passes"] for r in runs for x in r["layers"].values())}
    print(f"every layer within fp32's paired interval: {report['all_pass']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
