"""Throughput of `elmo embed`'s forward pass on CPU, as a fraction of the machine's sgemm rate.

    .venv/bin/python benchmarks/embed.py                 # small + original shapes, 2 threads
    .venv/bin/python benchmarks/embed.py --models small --threads 2 --tokens 20000

Real sentences (UD English EWT train, from ../shared/data), the published models' shapes with
random weights (speed does not depend on the values), the library's own batching
(:func:`torchelmo.embed.embed_sentences`, stateless defaults, all three layers returned as numpy).

FLOP counts (multiply-add = 2 FLOPs; elementwise work such as gates, max, bias is not counted):

* dense, per input token (the issue's "effective" rate): the whole model run for that token
  alone: char-CNN convolutions over all 50 character positions (sum over filters of
  (50 - w + 1) * 2 * E * w * n_w), the highway layers (2 * F * 2F each), the projection
  (2 * F * P), and for both directions and every layer the LSTM input (2 * in * 4D), recurrent
  (2 * P * 4D) and output projection (2 * D * P) products. <S>/</S> positions are not credited.
* executed: the FLOPs the implementation actually needs, by the same formulas, for the work it
  does: the char-CNN once per distinct token of a batch (the sentence markers and the padding
  row included) and only over windows that touch a real character (all-padding windows have one
  value, computed once), and the LSTMs over every position including <S> and </S>.

The dense rate credits the char-CNN savings (deduplication, skipped padding windows); the
executed rate does not, so it is the honest measure of how well the hardware is used. Both are
reported as a fraction of the sgemm rate of a 2048 x 2048 float32 matmul measured in the same
run (the best of several, before and after: the denominator is never flattered).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from torchelmo import BiLM, preset
from torchelmo.embed import WINDOW_LINES, Batching, embed_batch, embed_sentences
from torchelmo.model.chars import BOS_IDS, EOS_IDS, word_to_char_ids
from torchelmo.model.encoder import CharCNNEncoder
from torchelmo.probe.conll import read_conllu

SHARED = Path(__file__).resolve().parents[2] / "shared"
UD = SHARED / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-train.conllu"


def first_words(sentences: list[list[str]], n_tokens: int) -> list[list[str]]:
    """The first sentences, up to about ``n_tokens`` words (the one that reaches it included)."""
    out, total = [], 0
    for s in sentences:
        if total >= n_tokens:
            break
        out.append(s)
        total += len(s)
    return out


# ------------------------------------------------------------------------------------------------
# FLOP counting.
# ------------------------------------------------------------------------------------------------
def lstm_flops_per_position(cfg) -> int:
    P, D = cfg.projection_dim, cfg.lstm_dim
    per_dir_layer = 2 * P * 4 * D + 2 * P * 4 * D + 2 * D * P      # input (in = P), recurrent, projection
    return 2 * cfg.n_layers * per_dir_layer


def cnn_flops_per_token(cfg, n_chars: int = 50) -> int:
    """Char-CNN + highway + projection of one token; ``n_chars``: positions that touch a real
    character (50 for the dense count)."""
    E_, F = cfg.char_embed_dim, cfg.n_filters
    conv = sum(min(n_chars, 50 - w + 1) * 2 * E_ * w * n for w, n in cfg.filters)
    return conv + cfg.n_highway * 2 * F * 2 * F + 2 * F * cfg.projection_dim


def dense_flops(cfg, batches) -> int:
    n_tok = sum(len(s) for batch in batches for s in batch)
    return n_tok * (cnn_flops_per_token(cfg) + lstm_flops_per_position(cfg))


def window_batches(sentences) -> list[list[list[str]]]:
    """The library's stateless batches of these sentences (windows of ``WINDOW_LINES``, length
    sorting, default caps)."""
    batching = Batching.resolve(False, None, None)
    items = [s for s in sentences if s]
    out = []
    for w0 in range(0, len(items), batching.window_lines):
        window = items[w0:w0 + batching.window_lines]
        out += [[window[r] for r in rows] for rows in batching.batches([len(s) for s in window])]
    return out


def executed_flops(cfg, batches) -> int:
    """The work the implementation does for these batches (see the module docstring)."""
    total = 0
    for batch in batches:
        ids = {BOS_IDS, EOS_IDS}
        for s in batch:
            ids.update(word_to_char_ids(t) for t in s)
        if len({len(s) for s in batch}) > 1:
            ids.add((0,) * 50)                           # the padding row, encoded once
        for row in ids:
            n_real = max((k + 1 for k, c in enumerate(row) if c != 261), default=0)
            total += cnn_flops_per_token(cfg, max(1, n_real))
        total += sum(len(s) + 2 for s in batch) * lstm_flops_per_position(cfg)
    return total


# ------------------------------------------------------------------------------------------------
# Timing.
# ------------------------------------------------------------------------------------------------
def sgemm_gflops(n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def time_batches(model, batches, repeats: int) -> tuple[float, list[np.ndarray]]:
    """Best wall time of embedding these batches (all layers, as numpy), and the outputs."""
    embed_batch(model, batches[0][:8], "all", None)             # warm up
    best, out = float("inf"), []
    for _ in range(repeats):
        t = time.perf_counter()
        out = [a for batch in batches for a in embed_batch(model, batch, "all", None)]
        best = min(best, time.perf_counter() - t)
    return best, out


class PlainConvEncoder(CharCNNEncoder):
    """The char-CNN as first written: :meth:`conv_reference` (plain conv1d over every position
    and width) in place of the fast windows, then the same highways and projection."""

    def encode_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.conv_reference(ids)
        for hw in self.highways:
            h = hw(h)
        return self.proj(h)


class BaselineBiLM(BiLM):
    """The core as first written: the plain char-CNN above, and the LSTM stacks on their
    autograd-style path (out of place, a concatenation per step once rows finish), which the
    library takes when gradients are recorded. Recording them adds little (within the noise of
    a few runs) and only to the baseline, so its speed-up figure is not flattered by it."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.encoder = PlainConvEncoder(config)

    def run_stacks(self, x, lengths, state=None):
        with torch.enable_grad():
            outs, final = super().run_stacks(x, lengths, state)
        return [o.detach() for o in outs], [(c.detach(), h.detach()) for c, h in final]


def print_table(results: list[dict], sgemm: list[float]) -> None:
    """Print the figures; adds each result's ratios to the best sgemm rate (kept in the JSON)."""
    peak = max(sgemm)
    print(f"sgemm 2048x2048 float32: best {peak:.1f} GFLOP/s (runs: {', '.join(f'{s:.0f}' for s in sgemm)})")
    print(f"{'model':9s} {'regime':10s} {'dtype':9s} {'tokens':>7s} {'tok/s':>8s} {'dense GF/s':>10s} "
          f"{'%sgemm':>7s} {'exec GF/s':>10s} {'%sgemm':>7s}  notes")
    for r in results:
        r["dense_vs_sgemm"] = r["dense_gflops"] / peak
        r["executed_vs_sgemm"] = r["executed_gflops"] / peak
        if r["dtype"] == "baseline":
            fast = next(x for x in results if x["model"] == r["model"] and x["dtype"] == "float32")
            note = (f"unoptimised core; optimised is {fast['tokens_per_s'] / r['tokens_per_s']:.1f}x "
                    f"faster; max |diff| {r['max_abs_diff']:.2g}")
        elif r["dtype"] == "bfloat16":
            note = (f"vs float32: max |err| {r['max_abs_err']:.3g}, mean |err| {r['mean_abs_err']:.3g} "
                    f"(mean |value| {r['mean_abs_value']:.3g})")
        else:
            note = (f"{r['batches']} batches, {r['sentences']} sent.; GFLOP/token dense "
                    f"{r['dense_gflop_per_token']:.4f}, executed {r['executed_gflop_per_token']:.4f}")
        print(f"{r['model']:9s} {r['regime']:10s} {r['dtype']:9s} {r['tokens']:7d} {r['tokens_per_s']:8.0f} "
              f"{r['dense_gflops']:10.1f} {100 * r['dense_vs_sgemm']:6.0f}% "
              f"{r['executed_gflops']:10.1f} {100 * r['executed_vs_sgemm']:6.0f}%  {note}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small,original", help="comma-separated presets")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=12000, help="words timed per setting (about)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per setting (best is kept)")
    ap.add_argument("--no-bf16", action="store_true", help="skip the --precision bf16 runs")
    ap.add_argument("--baseline", action="store_true",
                    help="also time the unoptimised core (plain conv1d char-CNN, autograd-style LSTM), once")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, data {UD.name}")
    ud = [s.tokens for s in read_conllu(UD)]
    window = ud[:WINDOW_LINES]                                  # one full window of a real file
    all_batches = window_batches(window)
    results, sgemm = [], [sgemm_gflops()]

    def record(name, dtype, regime, batches, dt, cfg, **extra):
        n_tok = sum(len(s) for b in batches for s in b)
        dense, executed = dense_flops(cfg, batches), executed_flops(cfg, batches)
        results.append(dict(model=name, dtype=dtype, regime=regime, batches=len(batches),
                            sentences=sum(map(len, batches)), tokens=n_tok, seconds=dt,
                            tokens_per_s=n_tok / dt, dense_gflop_per_token=dense / n_tok / 1e9,
                            executed_gflop_per_token=executed / n_tok / 1e9,
                            dense_gflops=dense / dt / 1e9, executed_gflops=executed / dt / 1e9, **extra))
        sgemm.append(sgemm_gflops())

    for name in args.models.split(","):
        cfg = preset(name)
        model = BiLM(cfg).eval()
        # Regime 1, a big file: every k-th batch of one 10,000-sentence window (batches as the
        # library forms them there: length-sorted, mostly full), about --tokens words in all.
        n_window = sum(len(s) for s in window)
        k = max(1, round(n_window / args.tokens))
        sample = all_batches[k // 2::k] or all_batches[:1]   # at least one batch, however few --tokens
        dt, ref = time_batches(model, sample, args.repeats)
        record(name, "float32", "window", sample, dt, cfg)
        if not args.no_bf16:
            model.precision = "bf16"
            dt16, out16 = time_batches(model, sample, args.repeats)
            model.precision = "fp32"
            err = np.concatenate([np.abs(a - b).ravel() for a, b in zip(ref, out16)])
            scale = np.concatenate([np.abs(a).ravel() for a in ref])
            record(name, "bfloat16", "window", sample, dt16, cfg, max_abs_err=float(err.max()),
                   mean_abs_err=float(err.mean()), mean_abs_value=float(scale.mean()))
        if args.baseline:
            base = BaselineBiLM(cfg)
            base.load_state_dict(model.state_dict())
            dtb, outb = time_batches(base.eval(), sample, 1)
            record(name, "baseline", "window", sample, dtb, cfg,
                   max_abs_diff=max(float(np.abs(a - b).max()) for a, b in zip(ref, outb)))
            del base
        # Regime 2, a small file: the first --tokens words end to end (embed_sentences); too few
        # sentences per length for full batches, so the batches are ragged.
        small = first_words(ud, args.tokens)
        embed_sentences(model, small[:8], "all")
        best = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            embed_sentences(model, small, "all")
            best = min(best, time.perf_counter() - t)
        record(name, "float32", "small file", window_batches(small), best, cfg)
        del model
    peak = max(sgemm)
    print_table(results, sgemm)
    if args.json:
        args.json.write_text(json.dumps(dict(threads=args.threads, sgemm_gflops=peak,
                                             sgemm_runs=sgemm, results=results), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
