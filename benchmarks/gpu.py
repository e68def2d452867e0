"""GPU throughput of embedding and training, side by side with cuDNN, in one run.

    PYTHONPATH=src python3 benchmarks/gpu.py                       # CUDA, small + original
    PYTHONPATH=src python3 benchmarks/gpu.py --models small --out results/gpu.json
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/gpu.py --device cpu --quick   # a smoke run

Printed and written to JSON (``--out``), all on the same batches in the same process:

* the GPU's matmul rates (8192^3 fp32 IEEE, TF32, bf16) in TFLOP/s;
* per model shape (random weights of the published shapes; speed does not depend on values):
  ``embed_sentences`` (char-CNN, both stacks, all layers copied to host numpy) in each precision,
  launched eagerly and (on CUDA) replayed through CUDA graphs (``+graphs``), tokens/s, executed FLOP/s as a fraction of the matching matmul rate, and the largest absolute
  difference from fp32; then the anchor: ``nn.LSTM(P, D, proj_size=P, bidirectional=True)`` x
  ``n_layers`` (cuDNN, its defaults: TF32 allowed) on the same batches' shapes, LSTM only, fp32
  and bf16;
* training steps of the small preset (batch 128 x 20, sampled softmax as ``elmo train``) in each
  precision, tokens/s, beside a cuDNN ``nn.LSTM`` training step of the same LSTM shapes;
* the profile line: one 256-sentence batch, wall time vs GPU-busy time (the union of kernel
  intervals) and kernels launched, eagerly and with CUDA graphs.

Data: UD English EWT train sentences (``--data``: the CoNLL-U file; by default ../shared's copy,
or ``bench-data/en_ewt-ud-train.conllu`` where ../shared is absent, as on a device machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from torchelmo import BiLM, preset
from torchelmo.embed import embed_sentences
from torchelmo.lm.corpus import Corpus
from torchelmo.lm.data import StreamBatcher
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.vocab import Vocabulary
from torchelmo.numerics.precision import PRECISIONS, precision_context
from torchelmo.probe.conll import read_conllu

ROOT = Path(__file__).resolve().parents[1]
DATA = [ROOT.parent / "shared" / "data" / "pos" / "ud-english-ewt" / "en_ewt-ud-train.conllu",
        ROOT / "bench-data" / "en_ewt-ud-train.conllu"]

_spec = importlib.util.spec_from_file_location("embed_bench", Path(__file__).with_name("embed.py"))
embed_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(embed_bench)


class Clock:
    """Wall time of a block, synchronised with the device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def best(self, fn, repeats: int) -> float:
        fn()
        best = float("inf")
        for _ in range(repeats):
            self.sync()
            t = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
        return best


def matmul_rates(clock: Clock, n: int) -> dict[str, float]:
    """TFLOP/s of an n^3 matmul: fp32 (IEEE), tf32, bf16."""
    a, b = torch.randn(n, n, device=clock.device), torch.randn(n, n, device=clock.device)
    out = {}
    for name in PRECISIONS:
        x, y = (a.bfloat16(), b.bfloat16()) if name == "bf16" else (a, b)
        with precision_context("tf32" if name == "tf32" else "fp32", clock.device):
            out[name] = 2 * n ** 3 / clock.best(lambda x=x, y=y: x @ y, 5) / 1e12
    return out


def anchor_lstm(cfg, device, dtype) -> nn.Module:
    P, D = cfg.projection_dim, cfg.lstm_dim
    layers = [nn.LSTM(P if k == 0 else 2 * P, D, proj_size=P, bidirectional=True, batch_first=True)
              for k in range(cfg.n_layers)]
    return nn.ModuleList(layers).to(device=device, dtype=dtype)


def anchor_inputs(batches, P: int, device, dtype) -> list:
    """Packed random inputs shaped like our batches (markers included), drawn before timing."""
    out = []
    for batch in batches:
        lengths = torch.tensor([len(s) + 2 for s in batch])
        x = torch.randn(len(batch), int(lengths.max()), P, device=device, dtype=dtype)
        out.append(nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    return out


def run_anchor(stack: nn.ModuleList, inputs, grad: bool = False):
    """The cuDNN stack over :func:`anchor_inputs`."""
    total = None
    for h in inputs:
        for layer in stack:
            h, _ = layer(h)
        if grad:
            loss = h.data.float().square().mean()
            loss.backward()
            total = loss
    return total


def embed_section(name: str, sentences, clock: Clock, rates, args) -> dict:
    cfg = preset(name) if not args.quick else preset("small", lstm_dim=32, projection_dim=16)
    torch.manual_seed(0)
    model = BiLM(cfg).eval().to(clock.device)
    batches = embed_bench.window_batches(sentences)
    n_tok = sum(len(s) for s in sentences)
    flops = embed_bench.executed_flops(cfg, batches)
    res: dict = {"tokens": n_tok, "executed_gflop": flops / 1e9, "ours": {}, "cudnn": {}}
    ref = None
    for p, graphs in variants(args.precisions, clock.device):
        model.precision = p
        model.backend = "triton+graphs" if graphs else None
        out: list = []

        def run(out=out):
            out[:] = embed_sentences(model, sentences, "all")
        t = clock.best(run, args.repeats)
        err = 0.0 if ref is None else max(float(abs(a - b).max()) for a, b in zip(out, ref))
        ref = ref if ref is not None else list(out)
        res["ours"][p + ("+graphs" if graphs else "")] = {
            "tokens_per_s": n_tok / t, "seconds": t, "max_abs_diff_vs_fp32": err,
            "fraction_of_matmul_rate": flops / t / 1e12 / rates[p]}
    model.backend = None
    with torch.no_grad():
        for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            stack = anchor_lstm(cfg, clock.device, dtype)
            inputs = anchor_inputs(batches, cfg.projection_dim, clock.device, dtype)
            t = clock.best(lambda stack=stack, inputs=inputs: run_anchor(stack, inputs), args.repeats)
            res["cudnn"][label] = {"tokens_per_s": n_tok / t, "seconds": t}
    for name, v in res["ours"].items():
        key = "bf16" if name.startswith("bf16") else "fp32"
        v["ratio_to_cudnn_" + key] = v["tokens_per_s"] / res["cudnn"][key]["tokens_per_s"]
    res["profile"] = profile_batch(model, sentences[:256], clock, graphs=False)
    if clock.device.type == "cuda":
        res["profile_graphs"] = profile_batch(model, sentences[:256], clock, graphs=True)
    return res


def variants(precisions, device) -> list[tuple[str, bool]]:
    """Each precision eagerly, then (on CUDA) each replayed through CUDA graphs."""
    return [(p, False) for p in precisions] + [(p, True) for p in precisions if device.type == "cuda"]


def profile_batch(model: BiLM, batch, clock: Clock, graphs: bool) -> dict:
    """Wall vs GPU-busy time and kernel count of one batch (fp32), after a warm-up run."""
    model.precision = "fp32"
    model.backend = "triton+graphs" if graphs else None
    embed_sentences(model, batch, "all", batch_size=len(batch))
    if clock.device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        clock.sync()
        t = time.perf_counter()
        embed_sentences(model, batch, "all", batch_size=len(batch))
        clock.sync()
        wall = time.perf_counter() - t
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA")
    busy, end = 0.0, float("-inf")
    for s, e in spans:          # union of kernel intervals, in microseconds
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    model.backend = None
    return {"wall_ms": wall * 1e3, "gpu_busy_ms": busy / 1e3, "busy_fraction": busy / 1e6 / wall,
            "kernels": len(spans)}


def train_section(sentences, clock: Clock, args, work: Path) -> dict:
    """Training steps of the small preset (``elmo train``'s loss, sampled softmax, Adagrad) on
    the same sentences as a stream, beside a cuDNN training step of the same LSTM shapes."""
    cfg = preset("small") if not args.quick else preset("small", lstm_dim=32, projection_dim=16)
    corpus_file = work / "train.txt"
    corpus_file.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    vocab = Vocabulary.build([corpus_file])
    rows, unroll = (128, 20) if not args.quick else (8, 5)
    res: dict = {"batch": [rows, unroll], "vocab": len(vocab), "ours": {}}
    torch.manual_seed(0)
    lm = LanguageModel(cfg, vocab, softmax="sampled", num_samples=min(8192, len(vocab) // 2))
    lm = lm.to(clock.device).train()
    opt = torch.optim.Adagrad(lm.parameters(), lr=0.2, initial_accumulator_value=1.0)
    batches = StreamBatcher(Corpus([corpus_file], seed=0), vocab, rows, unroll)
    batch = next(batches).to(clock.device)
    for p in args.precisions:
        lm.bilm.precision = p   # the model applies it: once per step

        def step():
            sums, _ = lm.batch_nll(batch)
            loss = 0.5 * sums.float().sum() / batch.n_targets
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t = clock.best(step, args.repeats)
        res["ours"][p] = {"tokens_per_s": rows * unroll / t, "step_ms": t * 1e3}
    stack = anchor_lstm(cfg, clock.device, torch.float32)
    shapes = [[["w"] * (unroll - 2)] * rows]         # + the two markers = unroll positions
    inputs = anchor_inputs(shapes, cfg.projection_dim, clock.device, torch.float32)
    t = clock.best(lambda: run_anchor(stack, inputs, grad=True), args.repeats)
    res["cudnn_fp32"] = {"tokens_per_s": rows * unroll / t, "step_ms": t * 1e3}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", type=Path, default=None, help="UD EWT train .conllu")
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--models", default="small,original")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny shapes and data: checks the script runs")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    args.precisions = args.precisions.split(",")
    if args.quick:
        args.sentences, args.repeats = min(args.sentences, 24), 1
    data = args.data or next((p for p in DATA if p.is_file()), None)
    if data is None:
        raise SystemExit(f"no UD EWT data: pass --data or copy it to {DATA[1]}")
    sentences = [s.tokens for s in read_conllu(data)][: args.sentences]
    device = torch.device(args.device)
    clock = Clock(device)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "sentences": len(sentences)}
    report["matmul_tflops"] = rates = matmul_rates(clock, 8192 if not args.quick else 256)
    print("matmul TFLOP/s: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()))
    for name in args.models.split(","):
        r = report[f"embed_{name}"] = embed_section(name, sentences, clock, rates, args)
        for p, v in r["ours"].items():
            print(f"embed {name} {p}: {v['tokens_per_s']:,.0f} tokens/s, "
                  f"{v['fraction_of_matmul_rate']:.1%} of {p} matmul rate (executed FLOPs), "
                  f"max |diff| vs fp32 {v['max_abs_diff_vs_fp32']:.2e}"
                  + "".join(f", {v[k]:.2f}x cuDNN {k[-4:]}" for k in v if k.startswith("ratio")))
        for p, v in r["cudnn"].items():
            print(f"embed {name} cuDNN nn.LSTM {p}: {v['tokens_per_s']:,.0f} tokens/s (LSTM only)")
        for key in ("profile", "profile_graphs"):
            if r.get(key):
                q = r[key]
                print(f"{key.replace('_', ' with ')} {name}, 256 sentences: {q['wall_ms']:.1f} ms wall, "
                      f"{q['gpu_busy_ms']:.1f} ms GPU busy ({q['busy_fraction']:.0%}), {q['kernels']} kernels")
    with tempfile.TemporaryDirectory() as work:
        t = report["train_small"] = train_section(sentences, clock, args, Path(work))
    for p, v in t["ours"].items():
        print(f"train small {p}: {v['tokens_per_s']:,.0f} tokens/s ({v['step_ms']:.1f} ms/step), "
              f"{v['tokens_per_s'] / t['cudnn_fp32']['tokens_per_s']:.2f}x cuDNN")
    print(f"train small cuDNN nn.LSTM fp32 step: {t['cudnn_fp32']['tokens_per_s']:,.0f} tokens/s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
