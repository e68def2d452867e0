"""Training throughput of the biLM on CPU: tokens/s and effective GFLOP/s against the same run's
2048 x 2048 sgemm rate.

    .venv/bin/python benchmarks/train.py [--preset small] [--threads 2] [--steps 6] [--batch 32]

Effective GFLOP/s counts the model's matrix-multiply FLOPs only (char-CNN, highway, projections,
both LSTM stacks, the softmax), forward + backward (= 3x forward), per step, divided by the
measured step time; elementwise work, the optimizer and data preparation count as overhead.
The sgemm rate is measured before and after the training steps (the machine is shared) and the
mean is used. Data: PTB train (../shared), vocabulary built from it (10k types, full softmax).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from torchelmo.lm.corpus import Corpus
from torchelmo.lm.data import StreamBatcher
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.softmax import SampledSoftmax
from torchelmo.lm.vocab import Vocabulary
from torchelmo.model.bilm import Regularisation
from torchelmo.train import TRAIN_PRESETS

ROOT = Path(__file__).resolve().parents[1]

PTB = ROOT.parent / "shared" / "data" / "lm" / "ptb" / "ptb.train.txt"


def sgemm_gflops(n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, (time.perf_counter() - t) / reps)
    return 2 * n ** 3 / best / 1e9


def step_flops(lm: LanguageModel, batch) -> float:
    """Forward + backward matmul FLOPs of one training step."""
    cfg = lm.config
    D, P, E = cfg.lstm_dim, cfg.projection_dim, cfg.char_embed_dim
    n = cfg.n_filters
    U = batch.char_ids.shape[0]                      # distinct tokens encoded
    conv = sum(2 * w * E * c * (50 - w + 1) for w, c in cfg.filters)
    cnn = U * (conv + cfg.n_highway * 2 * n * 2 * n + 2 * n * P)
    steps = int(batch.lengths.sum())                 # per direction
    lstm = 2 * steps * cfg.n_layers * 2 * (P * 4 * D + P * 4 * D + D * P)
    V = lm.softmax.vocab_size
    if isinstance(lm.softmax, SampledSoftmax) and lm.training:
        V = lm.softmax.num_samples + 1
    softmax = 2 * steps * 2 * P * V
    return 3.0 * (cnn + lstm + softmax)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--softmax", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="BPTT rows")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = Vocabulary.build([PTB])
    lm = LanguageModel(TRAIN_PRESETS[args.preset](), vocab, softmax=args.softmax,
                       regularisation=Regularisation(dropout=0.1)).train()
    lm.bilm.precision = "bf16" if args.bf16 else "fp32"
    opt = torch.optim.Adagrad(lm.parameters(), lr=0.2, initial_accumulator_value=1.0)
    batches = StreamBatcher(Corpus([PTB], seed=0), vocab, args.batch, 20)
    g_before = sgemm_gflops()
    state, times, flops = None, [], []
    for i in range(args.steps + 2):
        b = next(batches)
        t = time.perf_counter()
        sums, final = lm.batch_nll(b, state)
        loss = 0.5 * sums.float().sum() / b.n_targets
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 10.0)
        opt.step()
        state = [(c.detach(), h.detach()) for c, h in final]
        if i >= 2:  # warm-up steps excluded
            times.append(time.perf_counter() - t)
            flops.append(step_flops(lm, b))
    g_after = sgemm_gflops()
    sgemm = (g_before + g_after) / 2
    t = statistics.median(times)
    eff = statistics.median(f / s for f, s in zip(flops, times)) / 1e9
    tokens = args.batch * 20
    print(f"preset {args.preset} ({lm.num_parameters():,} params incl. {type(lm.softmax).__name__} over "
          f"{len(vocab):,}), {args.threads} threads, batch {args.batch}x20, bf16 {args.bf16}")
    print(f"step time (median of {len(times)}): {t * 1000:.0f} ms   training tokens/s: {tokens / t:,.0f} "
          f"(per direction; x2 predictions)")
    print(f"effective GFLOP/s: {eff:.1f}   sgemm 2048 GFLOP/s: {sgemm:.1f} (before {g_before:.1f}, after "
          f"{g_after:.1f})   ratio: {eff / sgemm:.1%}  (target >= 35%)")
    if args.json:
        args.json.write_text(json.dumps({
            "preset": args.preset, "parameters": lm.num_parameters(), "softmax": type(lm.softmax).__name__,
            "threads": args.threads, "batch": args.batch, "unroll": 20, "bf16": args.bf16, "steps": len(times),
            "step_seconds_median": t, "tokens_per_s": tokens / t, "effective_gflops": eff,
            "sgemm_gflops": sgemm, "ratio_to_sgemm": eff / sgemm}, indent=1) + "\n")


if __name__ == "__main__":
    main()
