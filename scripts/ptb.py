"""The PTB result, end to end: train the phases of configs/ptb/ in order, score the last phase's
best model on the test set and write results/ptb.json whole.

    .venv/bin/python scripts/ptb.py                 # resumable: run it again after any interruption
    .venv/bin/python scripts/ptb.py --score-only    # re-score the finished runs, rewrite the JSON

Run from anywhere; paths in the configs are relative to the repository root. Steps:

1. ``elmo vocab`` of PTB train into the configs' vocabulary file (once; every phase shares it).
2. ``elmo train --config configs/ptb/phaseN.json --resume`` for each phase, in order of N (a phase
   whose run directory holds a finished ``model/`` is skipped); each restarts from the previous
   phase's ``best/`` (``init_from``). The output is appended to RUN/train.log.
3. The last phase's ``best/`` scored on PTB test three ways: 20 contiguous streams with the state
   carried (the published figure, as word-level LM papers count), the whole test set as one stream
   (Kim et al. 2016's protocol) and sentence by sentence from the zero state. Every prediction of
   ``</S>`` (``<eos>``) counts: 82,430 tokens.
4. results/ptb.json: the test and validation figures, the target, and per phase its config, steps,
   tokens, seconds of training steps, best validation and validation curve (from the run's
   ``model/training.json``, ``best/training.json`` and ``metrics.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 92.3  # forward test perplexity of Kim et al. (2016), LSTM-Char-Small (5M parameters)
MAX_PARAMS = 6_000_000


def phase_configs(config_dir: Path) -> list[tuple[str, Path, dict]]:
    """(name, path, config) of every phase<N>.json, in order of N; checks that they form one chain."""
    found = []
    for p in config_dir.glob("phase*.json"):
        m = re.fullmatch(r"phase(\d+)", p.stem)
        if m:
            found.append((int(m.group(1)), p.stem, p, json.loads(p.read_text(encoding="utf-8"))))
    if not found:
        sys.exit(f"ptb.py: no phase<N>.json in {config_dir}")
    found.sort()
    phases = [(name, path, cfg) for _, name, path, cfg in found]
    for (_, _, prev), (name, _, cfg) in zip(phases, phases[1:]):
        want = f"{prev['out_dir']}/best"
        if cfg.get("init_from") != want:
            sys.exit(f"ptb.py: {name} must start from the previous phase (init_from {want!r}), "
                     f"has {cfg.get('init_from')!r}")
    vocabs = {cfg.get("vocab") for _, _, cfg in phases}
    if len(vocabs) != 1 or None in vocabs:
        sys.exit(f"ptb.py: the phases must share one vocabulary file, have {sorted(map(str, vocabs))}")
    return phases


def run(cmd: list[str], log: Path | None = None) -> None:
    """Run ``cmd``, echoing its output (and appending it to ``log``); exit on failure."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "a", encoding="utf-8") if log else open(os.devnull, "w") as f:
        for line in proc.stdout:
            sys.stderr.write(line)
            f.write(line)
            f.flush()
    if proc.wait() != 0:
        sys.exit(f"ptb.py: {cmd[3] if len(cmd) > 3 else cmd[0]} failed (exit {proc.returncode})")


def train_phases(phases: list[tuple[str, Path, dict]], threads: int | None) -> None:
    py = [sys.executable, "-m", "torchelmo.cli"]
    vocab = Path(phases[0][2]["vocab"])
    if not vocab.is_file():
        vocab.parent.mkdir(parents=True, exist_ok=True)
        run(py + ["vocab", *phases[0][2]["train"], "-o", str(vocab)])
    for name, path, cfg in phases:
        out = Path(cfg["out_dir"])
        if (out / "model" / "training.json").is_file():
            print(f"{name}: finished ({out}/model), skipped", file=sys.stderr)
            continue
        out.mkdir(parents=True, exist_ok=True)
        cmd = py + ["train", "--config", os.path.relpath(path, ROOT), "--resume"]
        run(cmd + (["--threads", str(threads)] if threads else []), log=out / "train.log")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        sys.exit(f"ptb.py: {path}: {e} (has the phase finished?)")


def phase_record(name: str, path: Path, cfg: dict) -> dict:
    out = Path(cfg["out_dir"])
    done = read_json(out / "model" / "training.json")["train"]
    best = read_json(out / "best" / "training.json")["train"]["valid"]
    curve: dict[str, list[float]] = {}
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if "valid_ppl_forward" in e:
                curve[str(e["step"])] = [round(e["valid_ppl_forward"], 2), round(e["valid_ppl_backward"], 2)]
    return {"phase": name, "config": os.path.relpath(path, ROOT), "steps": done["steps"], "tokens": done["tokens"],
            "step_seconds": done["seconds"],
            "best_valid": {"step": best["step"], "ppl_forward": best["valid_ppl_forward"],
                           "ppl_backward": best["valid_ppl_backward"]},
            "validation_by_step": curve}


def machine(threads: int) -> str:
    import torch

    from torchelmo.runtime import cpu_name
    cpu = cpu_name()
    dev = f"CUDA ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "CPU"
    return (f"{os.cpu_count()}-core {cpu}, torch {torch.__version__.split('+')[0]} {dev}, fp32, "
            f"{threads} thread{'s' if threads != 1 else ''}")


def score(phases: list[tuple[str, Path, dict]], test: Path, threads: int) -> dict:
    import torch

    from torchelmo.lm.model import LanguageModel

    torch.set_num_threads(threads)
    cfg = phases[-1][2]
    model_dir = Path(cfg["out_dir"]) / "best"
    lm = LanguageModel.from_pretrained(model_dir)
    if torch.cuda.is_available():
        lm = lm.to("cuda")
    params = lm.num_parameters()
    runs = {"stream": ("20 contiguous streams, state carried across 20-step windows (the published figure)",
                       dict(mode="stream", batch_size=20)),
            "one_stream": ("the whole test set as one stream, state carried (Kim et al. 2016's protocol)",
                           dict(mode="stream", batch_size=1)),
            "sentence": ("each sentence from the zero state", dict(mode="sentence"))}
    test_out: dict = {}
    for key, (protocol, kw) in runs.items():
        with torch.no_grad():
            r = lm.perplexity([test], **kw)
        print(f"test {key}: forward {r['ppl_forward']:.2f} backward {r['ppl_backward']:.2f} "
              f"({r['tokens']:,} tokens)", file=sys.stderr)
        if test_out.setdefault("tokens", r["tokens"]) != r["tokens"]:
            sys.exit(f"ptb.py: {key} counted {r['tokens']} test tokens, not {test_out['tokens']}")
        test_out[key] = {"ppl_forward": r["ppl_forward"], "ppl_backward": r["ppl_backward"], "protocol": protocol}
    valid = read_json(model_dir / "training.json")["train"]["valid"]
    records = [phase_record(*p) for p in phases]
    fwd = test_out["stream"]["ppl_forward"]
    return {
        "recipe": "scripts/ptb.py",
        "model_dir": str(model_dir),
        "params": params,
        "target": {"ppl_forward": TARGET, "max_params": MAX_PARAMS,
                   "reference": "Kim et al. 2016, LSTM-Char-Small", "met": fwd <= TARGET and params <= MAX_PARAMS},
        "valid": {"step": valid["step"], "tokens": valid["valid_tokens"], "ppl_forward": valid["valid_ppl_forward"],
                  "ppl_backward": valid["valid_ppl_backward"], "protocol": "20 contiguous streams, state carried"},
        "test": test_out,
        "training": {"steps": sum(r["steps"] for r in records), "tokens": sum(r["tokens"] for r in records),
                     "step_seconds": round(sum(r["step_seconds"] for r in records), 1),
                     "machine": machine(threads)},
        "phases": records,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="configs/ptb", help="directory of phase<N>.json TrainConfig files")
    ap.add_argument("--test", default="../shared/data/lm/ptb/ptb.test.txt")
    ap.add_argument("--out", default="results/ptb.json")
    ap.add_argument("--threads", type=int, help="override the configs' threads (training and scoring)")
    ap.add_argument("--score-only", action="store_true", help="do not train; score the finished runs")
    args = ap.parse_args()
    os.chdir(ROOT)
    phases = phase_configs(Path(args.configs).resolve())
    if not args.score_only:
        train_phases(phases, args.threads)
    threads = args.threads or phases[-1][2].get("threads") or 1
    result = score(phases, Path(args.test), threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {out}: test forward {result['test']['stream']['ppl_forward']:.2f} "
          f"backward {result['test']['stream']['ppl_backward']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
