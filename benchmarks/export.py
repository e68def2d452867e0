"""Exported models against the eager one on CPU: tokens/s of eager PyTorch, ONNX Runtime and
TorchScript on the same batches, in one run, and each export's largest difference from eager.

    .venv/bin/python benchmarks/export.py --out results/export.json      # default + small, 2 threads
    .venv/bin/python benchmarks/export.py --models default --threads 1 --sentences 100

Real sentences (UD English EWT dev, from ../shared/data) in batches of ``--batch`` in file order
(what a server sees); the default model (trained weights) and the published small shapes
(random weights: speed does not depend on the values). Each runtime gets the same thread count;
rounds alternate between the runtimes and the best round of each is kept, so machine noise hits
all of them alike. Target: ONNX Runtime at least as fast as eager, outputs equal to 1e-5.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from torchelmo import BiLM, batch_to_ids, preset
from torchelmo.integrations.onnx import export
from torchelmo.probe.conll import read_conllu

SHARED = Path(__file__).resolve().parents[2] / "shared"
UD_DEV = SHARED / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


def model_for(name: str) -> BiLM:
    if name == "default":
        return BiLM.from_pretrained("default").eval()
    torch.manual_seed(0)
    return BiLM(preset(name)).eval()


def runners(bilm: BiLM, tmp: Path, threads: int) -> dict:
    """name -> a function from char ids ``(B, T, 50)`` to the ``(L, B, T, 2P)`` layer stack."""
    import onnxruntime

    export(bilm, tmp / "m.onnx")
    export(bilm, tmp / "m.pt")
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(tmp / "m.onnx"), opts, providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(tmp / "m.pt"))

    def eager(ids):
        with torch.no_grad():
            return torch.stack(bilm(ids).layers).numpy()

    def onnx(ids):
        return session.run(["layers"], {"char_ids": ids.numpy()})[0]

    def torchscript(ids):
        with torch.no_grad():
            return scripted(ids)[0].numpy()

    return {"eager": eager, "onnxruntime": onnx, "torchscript": torchscript}


def measure(name: str, batches: list[torch.Tensor], n_tokens: int, threads: int, rounds: int) -> list[dict]:
    bilm = model_for(name)
    with tempfile.TemporaryDirectory() as d:
        run = runners(bilm, Path(d), threads)
        ref = [run["eager"](ids) for ids in batches]
        rows = {k: {"model": name, "runtime": k, "threads": threads, "tokens": n_tokens, "seconds": float("inf")}
                for k in run}
        for k, f in run.items():
            rows[k]["max_abs_diff"] = max(float(np.abs(f(ids) - r).max()) for ids, r in zip(batches, ref))
        for _ in range(rounds):
            for k, f in run.items():
                t = time.perf_counter()
                for ids in batches:
                    f(ids)
                rows[k]["seconds"] = min(rows[k]["seconds"], time.perf_counter() - t)
    for r in rows.values():
        r["tokens_per_s"] = n_tokens / r["seconds"]
        r["vs_eager"] = r["tokens_per_s"] / (n_tokens / rows["eager"]["seconds"])
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="default,small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sentences = [s.tokens for s in read_conllu(UD_DEV)][:args.sentences]
    batches = [batch_to_ids(sentences[i:i + args.batch]) for i in range(0, len(sentences), args.batch)]
    n_tokens = sum(map(len, sentences))
    print(f"torch {torch.__version__}, {args.threads} threads, {len(sentences)} sentences "
          f"({n_tokens} tokens) of {UD_DEV.name} in batches of {args.batch}")
    rows = []
    for name in args.models.split(","):
        rows += measure(name, batches, n_tokens, args.threads, args.rounds)
    print(f"{'model':8s} {'runtime':12s} {'tokens/s':>9s} {'x eager':>8s} {'max |diff|':>11s}")
    for r in rows:
        print(f"{r['model']:8s} {r['runtime']:12s} {r['tokens_per_s']:9.0f} {r['vs_eager']:8.2f} "
              f"{r['max_abs_diff']:11.2e}")
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "threads": args.threads,
                                        "sentences": len(sentences), "batch": args.batch, "rows": rows},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
