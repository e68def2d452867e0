"""Each precision mode's error on real sentences: the largest absolute difference of every layer
from the fp32 CPU path, and the size of the layers for scale.

    PYTHONPATH=src python3 benchmarks/precision.py --device cuda [--model default] [--out F.json]
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/precision.py --device cpu --backend triton

On CUDA the fused kernels run compiled. The second line runs them on CPU under Triton's
interpreter, which emulates bf16 (operands rounded, products in fp32: the same numbers up to
summation order) and has no TF32 (tf32 equals fp32 there).

Data: the first ``--sentences`` sentences of UD English EWT dev (../shared, or ``--data``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from torchelmo import BiLM, batch_to_ids
from torchelmo.numerics.precision import PRECISIONS
from torchelmo.probe.conll import read_conllu

UD_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="default")
    ap.add_argument("--data", type=Path, default=UD_DEV)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--backend", default=None, help="the recurrence's backend (default: auto)")
    args = ap.parse_args()
    sentences = [s.tokens for s in read_conllu(args.data)][: args.sentences]
    ids = batch_to_ids(sentences)
    model = BiLM.from_pretrained(args.model).eval()
    with torch.no_grad():
        model.backend = "cpu"
        ref = [t.clone() for t in model(ids).layers]            # fp32, the CPU paths
        model.backend = args.backend
        model.to(args.device)
        report = {"model": args.model, "device": args.device, "sentences": len(sentences),
                  "tokens": int(sum(len(s) for s in sentences)),
                  "layer_max_abs": [float(t.abs().max()) for t in ref], "max_abs_diff": {}}
        for p in PRECISIONS:
            model.precision = p
            got = model(ids).layers
            report["max_abs_diff"][p] = [float((a.float().cpu() - b).abs().max()) for a, b in zip(got, ref)]
            print(f"{p}: max |diff| per layer vs fp32 CPU: "
                  + ", ".join(f"E{k} {d:.2e}" for k, d in enumerate(report["max_abs_diff"][p])))
    print("layer max |value|: " + ", ".join(f"E{k} {v:.2f}" for k, v in enumerate(report["layer_max_abs"])))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
