"""What the compiled CPU loops buy, each against what runs without it, alternating in one process
(this host's speed drifts within minutes; pairs measured moments apart say more than two runs).

    .venv/bin/python benchmarks/cpu_loops.py --out results/cpu_loops.json
    .venv/bin/python benchmarks/cpu_loops.py --threads 1 --pairs 2 --tokens 500   # a quick look

* Gate loop: one LSTM step's epilogue (``torchelmo.numerics.epilogue``, bf16 products of the small model's
  step, ``(2, rows, 4096)``), compiled with multiply-adds contracted to FMA (``compiled._OPTIONS``)
  and without (Inductor's default).
* Encoder loops: bf16 embedding of the published small shapes (random weights; UD English EWT
  sentences, the library's stateless batches) with the highway's and the max-pool's compiled
  loops, and with the eager ops they replace; the token encoder alone, and the whole embedding.

Each figure: the best time of each side over ``--pairs`` alternating pairs, and the median and
range of the pairs' ratios (without / with).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from cpu_precision import embed_all, machine, sample_batches, spread

from torchelmo import BiLM, preset
from torchelmo.model import encoder
from torchelmo.model.chars import batch_to_ids
from torchelmo.numerics import compiled, epilogue
from torchelmo.numerics.precision import cpu_bf16_support


def best_of(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def paired(with_, without, pairs: int, reps: int) -> dict:
    """Seconds of each side (best) and the ratios without / with of ``pairs`` alternating pairs."""
    a, b = [], []
    for k in range(pairs):
        for side in ((with_, without) if k % 2 else (without, with_)):
            (a if side is with_ else b).append(best_of(side, reps))
    ratios = [y / x for x, y in zip(a, b)]
    return {"with_s": min(a), "without_s": min(b), "ratio_best": min(b) / min(a), "ratios": ratios,
            "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}


def gate_loop(rows: int, pairs: int) -> dict:
    z = torch.randn(2, rows, 4096).bfloat16()
    bias, c = torch.randn(2, 1, 4096), torch.randn(2, rows, 1024)
    fast = compiled._compile(epilogue.step)
    plain = torch.compile(lambda *a: epilogue.step(*a), dynamic=False,
                          options={**compiled._OPTIONS, "cpp.enable_floating_point_contract_flag": "off"})
    args = (z, None, bias, c, 3.0, True)
    with compiled.settings():
        out = paired(lambda: fast(*args), lambda: plain(*args), pairs, 50)
        diff = (fast(*args)[0] - plain(*args)[0]).abs().max().item()
    return {"shape": [2, rows, 4096], **out, "max_abs_diff_c": diff}


def encoder_loops(tokens: int, pairs: int) -> dict:
    batches = sample_batches(tokens)
    torch.manual_seed(0)
    model = BiLM(preset("small")).eval()
    model.precision, model.backend = "bf16", "cpu+compile"
    found = encoder.usable

    def toggled(on: bool, fn):
        def run():
            encoder.usable = found if on else (lambda: False)
            try:
                fn()
            finally:
                encoder.usable = found
        return run

    ids = [batch_to_ids(b) for b in batches]

    def encode():
        with torch.no_grad():
            for x in ids:
                model.encoder(x, precision=model.resolved_precision().name)

    def embed():
        embed_all(model, batches)

    toggled(True, embed)()                      # compile every loop once
    toggled(False, embed)()
    return {"model": "small", "tokens": sum(len(s) for b in batches for s in b), "batches": len(batches),
            "encoder": paired(toggled(True, encode), toggled(False, encode), pairs, 3),
            "embedding": paired(toggled(True, embed), toggled(False, embed), pairs, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=6000, help="words of UD EWT to embed")
    ap.add_argument("--rows", type=int, default=256, help="running rows of the gate loop's step")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"machine": machine(), "threads": {}}
    if not compiled.usable() or cpu_bf16_support() != "amx":
        print("no compiled loops here (they need a C++ compiler), or no AMX: nothing to compare")
        result["skipped"] = "no C++ compiler or no AMX"
    else:
        for n in args.threads:
            torch.set_num_threads(n)
            row = {"gate_loop": gate_loop(args.rows, args.pairs), "encoder_loops": encoder_loops(args.tokens, args.pairs)}
            result["threads"][str(n)] = row
            g, e = row["gate_loop"], row["encoder_loops"]
            print(f"{n} thread(s)")
            print(f"  gate loop {tuple(g['shape'])}: FMA {g['with_s'] * 1e3:.2f} ms, without {g['without_s'] * 1e3:.2f} ms"
                  f"  x{g['ratio_best']:.2f} (pairs {spread(g['ratios'])})")
            for part in ("encoder", "embedding"):
                p = e[part]
                print(f"  bf16 {part}, small shapes, {e['tokens']:,} words: loops {p['with_s'] * 1e3:.1f} ms, eager ops"
                      f" {p['without_s'] * 1e3:.1f} ms  x{p['ratio_best']:.3f} (pairs {spread(p['ratios'])})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
