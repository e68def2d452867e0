"""bf16 against fp32 on the CPU, side by side in one run: embedding and training throughput, the
matmul rates behind them, the machine's bf16 support, and the error of every layer.

    .venv/bin/python benchmarks/cpu_precision.py --out results/cpu_precision.json
    .venv/bin/python benchmarks/cpu_precision.py --threads 1 --models small --no-train --no-emulate

* Embedding: real sentences (UD English EWT train), the library's stateless batches, all three
  layers as float32 numpy (``torchelmo.embed.embed_batch``), the published small and original
  shapes with random weights and the embedded default model. fp32 and bf16, each with the eager
  (``cpu``) and the compiled gate epilogue (``cpu+compile``, what ``auto`` runs for bf16), alternate
  on the same batches (best of ``--repeats`` each, and per repeat the paired ratio of fp32's time
  to bf16's: on a shared host the spread of those says more than one best) after a warm-up batch
  that compiles; the error
  is measured per layer against fp32 eager: max and mean absolute, and the mean relative to the
  layer's mean magnitude.
* Training: the small preset on PTB (stream batches, ``--train-softmax``, ``--train-batch``), an
  fp32 and a bf16 model with the same initial weights on the same batches (``elmo train``'s
  optimizer: fused Adagrad), each in its own process, the processes alternating (best round each,
  and per round the paired ratio).
* Matmuls: the shapes of the small and original recurrences and a 2048^3 sgemm, fp32 and bf16.
* Emulation: the embedding of the small shapes rerun in a child process with oneDNN capped at
  AVX512-BF16 without AMX, and at AVX-512 without bf16 (``ONEDNN_MAX_CPU_ISA``), as on CPUs that
  lack those units.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from torchelmo import BiLM, preset
from torchelmo.embed import WINDOW_LINES, Batching, embed_batch
from torchelmo.lm.corpus import Corpus
from torchelmo.lm.data import StreamBatcher
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.vocab import Vocabulary
from torchelmo.model.bilm import Regularisation
from torchelmo.numerics.backend import resolve_backend
from torchelmo.numerics.precision import cpu_bf16_support, support_line
from torchelmo.probe.conll import read_conllu
from torchelmo.runtime import cpu_name, keep_heap
from torchelmo.train import TRAIN_PRESETS, TrainConfig
from torchelmo.train.trainer import make_optimizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
UD = DATA / "pos" / "ud-english-ewt" / "en_ewt-ud-train.conllu"
PTB = DATA / "lm" / "ptb" / "ptb.train.txt"
MATMULS = {"small step [x;h]W": (256, 257, 4096), "small projection": (256, 1024, 128),
           "original step hW_h": (256, 512, 16384), "original projection": (256, 4096, 512),
           "sgemm 2048": (2048, 2048, 2048)}



@contextlib.contextmanager
def _math_mode(mode: str):
    """oneDNN's math mode for fp32 tensors (``bf16``: operands rounded inside each call), set for
    this benchmark's rows and restored: the library itself never sets it."""
    mkl = torch.backends.mkldnn
    saved = mkl.matmul.fp32_precision
    mkl.matmul.fp32_precision = mode
    try:
        yield
    finally:
        mkl.matmul.fp32_precision = saved

def machine() -> dict:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "bf16_support": cpu_bf16_support(),
            "support_line": support_line(), "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}


def matmul_rates() -> dict:
    """GFLOP/s of each shape: fp32, fp32 tensors in oneDNN's bf16 math mode (what the softmax's
    other products get under bf16), and bf16 tensors (what the model's products multiply)."""
    out = {}
    for name, (m, k, n) in MATMULS.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        a16, b16 = a.bfloat16(), b.bfloat16()
        reps = max(1, 2**30 // (m * k * n))          # about 2 GFLOP per timing
        row = {}
        for p, x, y in (("fp32", a, b), ("bf16", a, b), ("bf16_tensors", a16, b16)):
            with _math_mode("bf16" if p == "bf16" else "ieee"):
                x @ y
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    for _ in range(reps):
                        x @ y
                    best = min(best, (time.perf_counter() - t) / reps)
            row[p] = 2 * m * k * n / best / 1e9
        out[name] = {"shape": [m, k, n], "fp32_gflops": row["fp32"], "bf16_gflops": row["bf16"],
                     "bf16_tensor_gflops": row["bf16_tensors"], "ratio": row["bf16"] / row["fp32"],
                     "tensor_ratio": row["bf16_tensors"] / row["fp32"]}
    return out


def sample_batches(n_tokens: int) -> list[list[list[str]]]:
    """Every k-th of the library's batches of one streaming window of UD EWT train."""
    window = [s.tokens for s in read_conllu(UD)][:WINDOW_LINES]
    batching = Batching.resolve(False, None, None)
    batches = [[window[r] for r in rows] for rows in batching.batches([len(s) for s in window])]
    total = sum(len(s) for s in window)
    k = max(1, round(total / n_tokens))
    return batches[k // 2::k] or batches[:1]   # at least one batch, however few tokens


def embed_all(model: BiLM, batches) -> tuple[float, list[np.ndarray]]:
    t = time.perf_counter()
    out = [a for b in batches for a in embed_batch(model, b, "all", None)]
    return time.perf_counter() - t, out


def layer_errors(ref: list[np.ndarray], got: list[np.ndarray]) -> list[dict]:
    errs = []
    for k in range(ref[0].shape[0]):
        a = np.concatenate([r[k].ravel() for r in ref])
        b = np.concatenate([g[k].ravel() for g in got])
        d = np.abs(a - b)
        scale = float(np.abs(a).mean())
        errs.append({"layer": f"E{k}", "max_abs": float(d.max()), "mean_abs": float(d.mean()),
                     "mean_abs_value": scale, "mean_relative": float(d.mean()) / scale})
    return errs


# (precision, backend) of each embedding run: eager, and with the compiled gate epilogue.
SETTINGS = (("fp32", "cpu"), ("fp32", "cpu+compile"), ("bf16", "cpu"), ("bf16", "cpu+compile"))


def spread(ratios: list[float]) -> str:
    """Paired ratios as ``median [min-max]``."""
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


def embedding(models: list[str], batches, repeats: int) -> list[dict]:
    rows = []
    n_tok = sum(len(s) for b in batches for s in b)
    for name in models:
        torch.manual_seed(0)
        model = (BiLM.from_pretrained("default") if name == "default" else BiLM(preset(name))).eval()
        first = {}
        for p, b in SETTINGS:   # warm-up: the compiles happen here, not in the timed runs
            model.precision, model.backend = p, b
            t = time.perf_counter()
            embed_batch(model, batches[0][:4], "all", None)
            first[f"{p}_{b}"] = time.perf_counter() - t
        auto = resolve_backend("auto", "cpu", 1, 1, model.config.lstm_dim, "bf16")   # what bf16 runs by default
        best, outs, paired = dict.fromkeys(SETTINGS, float("inf")), {}, []
        for _ in range(repeats):
            took = {}
            for s in SETTINGS:
                model.precision, model.backend = s
                took[s], outs[s] = embed_all(model, batches)
                best[s] = min(best[s], took[s])
            paired.append(took[("fp32", "cpu")] / took[("bf16", auto)])
        rate = {f"{p}_{b}": n_tok / best[(p, b)] for p, b in SETTINGS}
        row = {"model": name, "tokens": n_tok, "batches": len(batches), "tokens_per_s": rate,
               "first_batch_seconds": first,   # 4 sentences, compile included (cold or from the disk cache)
               "bf16_auto_backend": auto,
               "fp32_tokens_per_s": rate["fp32_cpu"], "bf16_tokens_per_s": rate[f"bf16_{auto}"],
               "speedup": rate[f"bf16_{auto}"] / rate["fp32_cpu"],
               "paired_speedups": paired,   # per repeat: fp32's time over bf16's, measured moments apart
               "speedup_over_fp32_compiled": rate["bf16_cpu+compile"] / rate["fp32_cpu+compile"],
               "fp32_compiled_over_eager": rate["fp32_cpu+compile"] / rate["fp32_cpu"],
               "bf16_compiled_over_eager": rate["bf16_cpu+compile"] / rate["bf16_cpu"],
               "errors": layer_errors(outs[("fp32", "cpu")], outs[("bf16", auto)]),
               "errors_bf16_eager": layer_errors(outs[("fp32", "cpu")], outs[("bf16", "cpu")]),
               "errors_fp32_compiled": layer_errors(outs[("fp32", "cpu")], outs[("fp32", "cpu+compile")])}
        rows.append(row)
        worst = max(e["mean_relative"] for e in row["errors"])
        print(f"  embed {name:8s} fp32 {rate['fp32_cpu']:8,.0f} tok/s (compiled epilogue {rate['fp32_cpu+compile']:8,.0f})"
              f"  bf16 {rate['bf16_cpu']:8,.0f} (compiled epilogue {rate['bf16_cpu+compile']:8,.0f})"
              f"  x{row['speedup']:.2f} (per repeat {spread(paired)})  worst layer mean rel. error {worst:.2%}",
              flush=True)
    return rows


# Untimed steps first: a training run's steady state, where bf16's padded product shapes
# (torchelmo.numerics.operands) have met their kernels; the first steps compile dozens of them.
TRAIN_WARMUP = 12


def train_steps(precision: str, steps: int, batch: int, softmax: str) -> dict:
    """One model's training steps (the first ``TRAIN_WARMUP`` untimed): seconds per step and the
    losses."""
    vocab = Vocabulary.build([PTB])
    torch.manual_seed(0)
    lm = LanguageModel(TRAIN_PRESETS["small"](), vocab, softmax=softmax,
                       regularisation=Regularisation(dropout=0.1)).train()
    lm.bilm.precision = precision
    # elmo train's optimizer (Adagrad, lr 0.2, accumulator 1.0, fused where PyTorch has the kernel)
    opt = make_optimizer(TrainConfig(train=[str(PTB)], out_dir="", max_steps=steps + TRAIN_WARMUP), lm.parameters())
    batcher = StreamBatcher(Corpus([PTB], seed=0), vocab, batch, 20)
    state, times, losses = None, [], []
    for i in range(steps + TRAIN_WARMUP):
        b = next(batcher)
        g = torch.Generator().manual_seed(i)
        t = time.perf_counter()
        sums, final = lm.batch_nll(b, state, g)
        loss = 0.5 * sums.sum() / b.n_targets
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 10.0)
        opt.step()
        state = [(c.detach(), h.detach()) for c, h in final]
        if i >= TRAIN_WARMUP:
            times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
    return {"step_seconds": times, "losses": losses}


def training(steps: int, batch: int, softmax: str, threads: int, rounds: int = 2) -> dict:
    """fp32 and bf16 from the same initial weights on the same batches, each model in its own
    process (one process alternating both measured fp32 far below its own speed), the processes
    alternating; each precision's median step of its best round, and per round the ratio of the
    two processes' median steps."""
    runs: dict[str, list[dict]] = {"fp32": [], "bf16": []}
    for _ in range(rounds):
        for p in runs:
            cmd = [sys.executable, __file__, "--threads", str(threads), "--train-child", p,
                   "--train-steps", str(steps), "--train-batch", str(batch), "--train-softmax", softmax]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[p].append(json.loads(res.stdout.splitlines()[-1]))
    tok = batch * 20
    rate = {p: max(tok / statistics.median(r["step_seconds"]) for r in rs) for p, rs in runs.items()}
    paired = [statistics.median(f["step_seconds"]) / statistics.median(b["step_seconds"])
              for f, b in zip(runs["fp32"], runs["bf16"])]
    out = {"preset": "small", "softmax": softmax, "batch": f"{batch}x20", "steps_untimed": TRAIN_WARMUP, "steps_timed": steps,
           "processes_per_precision": rounds, "fp32_tokens_per_s": rate["fp32"], "bf16_tokens_per_s": rate["bf16"],
           "final_loss": {p: rs[0]["losses"][-1] for p, rs in runs.items()}}
    out["speedup"] = out["bf16_tokens_per_s"] / out["fp32_tokens_per_s"]
    out["paired_speedups"] = paired   # per round: the fp32 process's median step over the bf16 one's that followed
    print(f"  train small/{softmax} {batch}x20 fp32 {out['fp32_tokens_per_s']:7,.0f} tok/s  bf16 "
          f"{out['bf16_tokens_per_s']:7,.0f}  x{out['speedup']:.2f} (per round {spread(paired)})", flush=True)
    return out


def emulated(tokens: int) -> list[dict]:
    """The small shapes' embedding in child processes with oneDNN capped below AMX / below bf16."""
    rows = []
    for isa in ("AVX512_CORE_BF16", "AVX512_CORE"):
        env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa}
        cmd = [sys.executable, __file__, "--threads", "1", "--models", "small", "--tokens", str(tokens),
               "--no-train", "--no-emulate", "--no-matmuls", "--json-stdout"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        child = json.loads(res.stdout.splitlines()[-1])
        rows.append({"onednn_max_cpu_isa": isa, "bf16_support": child["machine"]["bf16_support"],
                     **child["threads"]["1"]["embedding"][0]})
        r = rows[-1]
        print(f"  emulated {isa}: fp32 {r['fp32_tokens_per_s']:,.0f} tok/s, bf16 {r['bf16_tokens_per_s']:,.0f} "
              f"(x{r['speedup']:.2f}); bf16 max |diff| from fp32 {max(e['max_abs'] for e in r['errors']):.2g}",
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="small,original,default", help="comma-separated; empty: no embedding")
    ap.add_argument("--tokens", type=int, default=6000, help="words embedded per setting (about)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=8)
    ap.add_argument("--train-batch", default="64,128", help="rows per batch, comma-separated")
    ap.add_argument("--train-softmax", default="adaptive,full")
    ap.add_argument("--train-rounds", type=int, default=2, help="processes per precision and setting")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--no-emulate", action="store_true")
    ap.add_argument("--no-matmuls", action="store_true")
    ap.add_argument("--json-stdout", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--train-child", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.train_child:
        torch.set_num_threads(int(args.threads))
        keep_heap()   # as elmo train does
        print(json.dumps(train_steps(args.train_child, args.train_steps, int(args.train_batch), args.train_softmax)))
        return
    report = {"machine": machine(), "threads": {}}
    if not args.json_stdout:
        print(report["machine"]["support_line"], flush=True)
    batches = sample_batches(args.tokens) if args.models else []
    for n in (int(x) for x in args.threads.split(",")):
        torch.set_num_threads(n)
        if not args.json_stdout:
            print(f"{n} thread(s)", flush=True)
        r = report["threads"][str(n)] = {}
        if not args.no_matmuls:
            r["matmuls"] = matmul_rates()
            for name, m in r["matmuls"].items():
                print(f"  matmul {name:22s} fp32 {m['fp32_gflops']:6.0f} GFLOP/s  bf16 math mode "
                      f"{m['bf16_gflops']:6.0f} (x{m['ratio']:.2f})  bf16 tensors {m['bf16_tensor_gflops']:6.0f} "
                      f"(x{m['tensor_ratio']:.2f})", flush=True)
        if args.models:
            r["embedding"] = embedding(args.models.split(","), batches, args.repeats)
        if not args.no_train:
            r["training"] = [training(args.train_steps, b, s, n, args.train_rounds) for s in args.train_softmax.split(",")
                             for b in (int(x) for x in args.train_batch.split(","))]
    if not args.no_emulate:
        torch.set_num_threads(1)
        report["emulated"] = emulated(args.tokens)
    if args.json_stdout:
        print(json.dumps(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
