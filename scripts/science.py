"""The science biLMs: the published-small shapes trained here on the open corpus, in chunks, each
run's record kept whole in results/science/RUN/record.json.

    .venv/bin/python scripts/science.py train --minutes 140    # one chunk: resume, train, checkpoint, stop
    .venv/bin/python scripts/science.py record                  # rewrite the record from the run
    .venv/bin/python scripts/science.py probe step-003906       # every probe on a milestone (or: default)
    .venv/bin/python scripts/science.py probe small             # the same suite on a published model
    .venv/bin/python scripts/science.py probe step-062500 --headline   # the final model, in results/probe

``--run NAME`` (before the command) picks the run, ``configs/science/NAME.json``: ``small-160m``
(the default: round two, 160M tokens per direction from step 0) or ``small`` (round one, 80M
tokens, finished; its model was lost with the machine it lived on). A run's config holds its
budget (``_budget``), fixed before the start; ``max_steps`` and the cosine schedule follow from it.

The runs live outside the checkout (``../runs``, beside ``../shared``): a session's work tree is
laid anew, the machine's other files are kept, until the machine changes. Steps of ``train``:

1. The corpus (``scripts/prepare_corpus.py ../runs/corpus``) and the vocabulary (``elmo vocab``,
   tokens seen at least ``MIN_COUNT`` times), once; both are deterministic, so a new machine
   rebuilds the same files.
2. ``elmo train --config configs/science/NAME.json --resume --time-limit MINUTES``: continues the
   run exactly where its last checkpoint left it and stops cleanly after MINUTES with a checkpoint
   (``--new-data WHY``: the training files changed, the data starts a new epoch on them).
   The output is appended to RUN/train.log.
3. The chunk (start and end step, tokens, wall time, machine, threads, precision, code, the
   validations it ran) is appended to the record itself, which lives in the repository, so that
   the history survives the loss of ``../runs``; a validation that happened in the chunk has its
   ``best/`` model copied to RUN/milestones/ when it is that validation's model (the models the
   probes compare along the way).

4. The milestones of the validations in :data:`KEPT` (about 20M, 40M, 80M and 120M tokens) go into
   the repository, ``results/science/RUN/models/step-NNNNNN`` (fp16 safetensors with the record
   ``elmo train --continue-from`` needs, the SHA-256 in the run's record): the models the probes
   describe, and where the run goes on from if ``../runs`` is lost. Commit them with the record.

If the record says the run got further than the checkpoints on this machine, ``../runs`` was lost:
``train`` stops and says so; ``--restart-lost WHY`` continues the run from the latest milestone in
the repository (``elmo train --continue-from``: its weights, step, schedule and data position, a
fresh optimizer warmed up again), or from step 0 if there is none, with the loss written into the
record (the steps, tokens, hours and milestones that went).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "science"
CORPUS = ROOT.parent / "runs" / "corpus"
DATA = ROOT.parent / "shared" / "data"
# Each run's probes: round two's in results/probe (its final model's report there itself), round
# one's beside them.
PROBE_DIRS = {"small": "round-one"}
MIN_COUNT = 3
RUN = "small-160m"   # set by --run
# The validations (every eval_every steps) whose milestones go into the repository: an early one,
# then every 40M tokens or so, so that a lost ../runs costs at most that much training.
KEPT = (2, 4, 8, 12)
# The tasks whose data name each sentence's document: probed again with the state carried (--context document).
DOCUMENT_TASKS = ("pos", "pos_xpos", "pos_wsj", "deps", "wsd", "coref")


def probes_dir() -> Path:
    return ROOT / "results" / "probe" / PROBE_DIRS.get(RUN, "")


def config_path() -> Path:
    return CONFIGS / f"{RUN}.json"


def models_dir() -> Path:
    """The run's milestones kept in the repository."""
    return ROOT / "results" / "science" / RUN / "models"


def keep_in_repository(run: Path, name: str) -> Path:
    """A milestone of ``run`` into :func:`models_dir`: fp16 storage (half the size; loading
    computes in fp32), with its ``training.json`` record, from which the run can be continued."""
    from torchelmo.lm.model import LanguageModel
    src, dest = run / "milestones" / name, models_dir() / name
    meta = json.loads((src / "training.json").read_text(encoding="utf-8"))
    LanguageModel.from_pretrained(src).save_pretrained(dest, extra={"train": meta["train"]}, dtype="float16")
    mib = sum(p.stat().st_size for p in dest.iterdir()) / 2**20
    print(f"science.py: milestone {name} kept in {dest.relative_to(ROOT)} ({mib:.1f} MiB): commit it with "
          "the record", file=sys.stderr)
    return dest


def committed_models() -> dict[str, int]:
    """The milestones in the repository, name -> step."""
    d = models_dir()
    return {p.name: int(p.name.split("-")[-1]) for p in sorted(d.glob("step-*")) if (p / "model.safetensors").is_file()}


def record_path() -> Path:
    return ROOT / "results" / "science" / RUN / "record.json"


def budget() -> dict:
    raw = json.loads(config_path().read_text(encoding="utf-8"))
    return {k: v for k, v in raw.get("_budget", {}).items() if not k.startswith("_")}


def config() -> dict:
    """The run's configuration, every field resolved (the file holds only what differs from the
    defaults)."""
    from torchelmo.train import TrainConfig
    path = config_path()
    if not path.is_file():
        sys.exit(f"science.py: --run {RUN}: no {path.relative_to(ROOT)}")
    return dataclasses.asdict(TrainConfig.from_dict(json.loads(path.read_text(encoding="utf-8")), str(path)))


def run_dir(cfg: dict) -> Path:
    return (ROOT / cfg["out_dir"]).resolve()


def sh(cmd: list[str], log: Path | None = None, stopped_ok: bool = False, on_line=None) -> int:
    """Run ``cmd`` from the repository root, echoing (and appending to ``log``) its output.
    ``stopped_ok``: exit 130/143 (``elmo train`` stopped by SIGINT/SIGTERM, checkpoint written)
    is returned, not an error. ``on_line``: called with each line of output."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "a", encoding="utf-8") if log else open(os.devnull, "w") as f:
        for line in proc.stdout:
            sys.stderr.write(line)
            f.write(line)
            f.flush()
            if on_line is not None:
                on_line(line)
    if proc.wait() != 0 and not (stopped_ok and proc.returncode in (130, 143)):
        sys.exit(f"science.py: {' '.join(cmd[:4])} failed (exit {proc.returncode})")
    return proc.returncode


def prepare(cfg: dict) -> None:
    if not (CORPUS / "counts.json").is_file():
        sh([sys.executable, "scripts/prepare_corpus.py", str(CORPUS)])
    vocab = ROOT / cfg["vocab"]
    if not vocab.is_file():
        vocab.parent.mkdir(parents=True, exist_ok=True)
        sh([sys.executable, "-m", "torchelmo.cli", "vocab", *cfg["train"], "-o", cfg["vocab"],
            "--min-count", str(MIN_COUNT)])


def machine(threads: int | None) -> str:
    import torch

    from torchelmo.numerics.precision import cpu_bf16_support
    from torchelmo.runtime import cpu_name
    return (f"{os.cpu_count()}-core {cpu_name()} (bf16: {cpu_bf16_support()}), torch {torch.__version__.split('+')[0]}, "
            f"{threads or 'default'} threads")


def code_version() -> str:
    """The checkout's commit, ``+changes`` when its code or configs differ from it: which code
    trained a chunk (a change of rounding, say, shows in the record)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "src", "scripts", "configs", "pyproject.toml")
    return commit + ("+changes" if changed else "")


def checkpoint_progress(run: Path) -> dict:
    """Step, tokens and training seconds of the run's last checkpoint (zeros before the first)."""
    path = run / "checkpoint.pt"
    if not path.is_file():
        return {"step": 0, "tokens": 0, "seconds": 0.0}
    import torch
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return {"step": ckpt["step"], "tokens": ckpt["tokens_seen"], "seconds": round(ckpt["elapsed"], 1)}


def best_step(run: Path) -> int | None:
    """The training step of the model in RUN/best (None without one)."""
    path = run / "best" / "training.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("train", {}).get("steps")


def validations(run: Path) -> list[dict]:
    out = []
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if "valid_ppl_mean" in e:
                out.append(e)
    return out


def load_record() -> dict:
    """The run's committed record (empty before its first chunk)."""
    path = record_path()
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def train(args) -> int:
    cfg = config()
    prepare(cfg)
    run = run_dir(cfg)
    record = load_record()
    before = checkpoint_progress(run)
    recorded = record.get("progress", {"step": 0, "tokens": 0, "seconds": 0.0})
    continue_from = None
    if recorded["step"] > before["step"]:
        kept = {n: s for n, s in committed_models().items() if before["step"] < s <= recorded["step"]}
        latest = max(kept, key=kept.get) if kept else None
        if not args.restart_lost:
            sys.exit(f"science.py: the record says run {RUN} reached step {recorded['step']:,} "
                     f"({recorded['tokens']:,} tokens), but {run} holds step {before['step']:,}: its "
                     "checkpoints were lost (a new machine?). Give --restart-lost WHY to train again "
                     + (f"from the milestone in the repository, {latest}" if latest else
                        "from that checkpoint (step 0 if none)") + " with the loss recorded")
        if latest:
            continue_from = models_dir() / latest
        record.setdefault("lost", []).append({
            "noticed": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "why": args.restart_lost,
            "recorded": recorded, "resumed_from": before, "milestones": record.get("milestones", []),
            **({"continued_from": {"model": latest, "step": kept[latest]}} if latest else {})})
        ours = committed_models()   # the milestones the continued run still descends from
        record["milestones"] = [n for n in record.get("milestones", []) if latest and ours.get(n, 1 << 62) <= kept[latest]]
    run.mkdir(parents=True, exist_ok=True)
    n_valid = len(validations(run))
    started, t0, code = datetime.datetime.now(datetime.UTC), time.monotonic(), code_version()
    cmd = [sys.executable, "-m", "torchelmo.cli", "train", "--config", os.path.relpath(config_path(), ROOT),
           "--resume", "--time-limit", str(args.minutes)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.new_data:
        cmd += ["--new-data"]
    if continue_from is not None:
        cmd += ["--continue-from", os.path.relpath(continue_from, ROOT)]
    # Each validation's model is kept as a milestone as soon as it is written (best/ holds only
    # the latest improving one): on the next line of output after the validation's.
    pending: list[int] = []

    def keep_milestone(line: str) -> None:
        if pending and best_step(run) == pending[0]:
            dest = run / "milestones" / f"step-{pending[0]:06d}"
            if not dest.exists():
                shutil.copytree(run / "best", dest)
        if pending and not line.startswith(f"step {pending[0]} validation"):
            pending.clear()
        if " validation ppl " in line and line.startswith("step "):
            pending[:] = [int(line.split()[1])]

    rc = sh(cmd, log=run / "train.log", stopped_ok=True, on_line=keep_milestone)   # a signal stops the chunk with a checkpoint
    keep_milestone("")
    after, valid = checkpoint_progress(run), validations(run)
    threads = args.threads or cfg.get("threads")
    chunk = {"started": started.isoformat(timespec="seconds"), "wall_seconds": round(time.monotonic() - t0, 1),
             "machine": machine(threads), "precision": cfg["precision"], "code": code,
             "step": [before["step"], after["step"]], "tokens": [before["tokens"], after["tokens"]],
             "train_seconds": round(after["seconds"] - before["seconds"], 1),
             "tokens_per_s": round((after["tokens"] - before["tokens"]) / max(1e-9, after["seconds"] - before["seconds"]), 1),
             "validations": valid[n_valid:]}
    if args.new_data:
        chunk["new_data"] = args.new_data
    if continue_from is not None:
        chunk["continued_from"] = continue_from.name
    if rc:
        chunk["stopped_by"] = {130: "SIGINT", 143: "SIGTERM"}[rc]
    with open(run / "chunks.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(chunk) + "\n")
    # Every kept validation's milestone not yet in the repository (one of an earlier chunk too, if
    # that chunk ended before it could copy it).
    for path in sorted((run / "milestones").glob("step-*")):
        step = int(path.name.split("-")[-1])
        if step % cfg["eval_every"] == 0 and step // cfg["eval_every"] in KEPT and path.name not in committed_models():
            keep_in_repository(run, path.name)
    record.setdefault("chunks", []).append(chunk)
    write_record(cfg, record)
    return 0


def write_record(cfg: dict, record: dict | None = None) -> None:
    """Rewrite the run's record: its chunks (from the committed record: they survive ``../runs``),
    its progress and milestones (from the run, when it is here), the validations of its chunks."""
    from torchelmo.lm.corpus import file_digest
    record = load_record() if record is None else record
    run = run_dir(cfg)
    chunks = record.get("chunks", [])
    def current(chunk: dict, step: int) -> bool:
        """Whether a validation describes the model trained now: not one of a model lost since,
        unless the run was continued from a milestone at or after it."""
        return not any(x.get("resumed_from") is not None and chunk["started"] < x["noticed"]
                       and step > x.get("continued_from", {}).get("step", -1) for x in record.get("lost", []))
    progress = checkpoint_progress(run) if (run / "checkpoint.pt").is_file() else record.get(
        "progress", checkpoint_progress(run))
    counts = json.loads((CORPUS / "counts.json").read_text()) if (CORPUS / "counts.json").is_file() else None
    milestones = record.get("milestones", [])
    if (run / "milestones").is_dir():
        milestones = sorted(set(milestones) | {p.name for p in (run / "milestones").iterdir()})
    tokens_per_step = cfg["batch_size"] * cfg["unroll"]
    record = {
        "recipe": "scripts/science.py", "run": RUN, "config": os.path.relpath(config_path(), ROOT), "budget": budget(),
        "vocabulary_min_count": MIN_COUNT,
        # The totals; per source in results/corpus.json.
        "corpus": (counts and {k: counts[k] for k in ("train_total", "valid_total") if k in counts}) or record.get("corpus"),
        "progress": {**{k: progress[k] for k in ("step", "tokens", "seconds")},
                     "fraction_of_budget": round(progress["tokens"] / budget()["tokens"], 4)},
        "chunks": chunks,
        # Validations of the chunks since the last loss (the ones before it describe a lost model).
        "validation": [{"step": v["step"], "tokens": v["step"] * tokens_per_step,
                        "ppl_forward": round(v["valid_ppl_forward"], 2), "ppl_backward": round(v["valid_ppl_backward"], 2),
                        "ppl_mean": round(v["valid_ppl_mean"], 2)}
                       for c in chunks for v in c.get("validations", []) if current(c, v["step"])],
        "milestones": milestones,
        # The milestones in the repository (fp16), each with the SHA-256 of its weights.
        "models": {n: {"step": st, "sha256": file_digest(models_dir() / n / "model.safetensors")}
                   for n, st in committed_models().items()},
        **({"lost": record["lost"]} if record.get("lost") else {}),
    }
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path.relative_to(ROOT)}: step {progress['step']}, {progress['tokens']:,} tokens "
          f"({record['progress']['fraction_of_budget']:.1%} of the budget)", file=sys.stderr)


def probe(args) -> int:
    """``elmo probe all`` on a milestone of the run (or ``default``) into results/probe/LABEL (with
    ``--headline``: into results/probe itself, the final model's report; round one's under
    results/probe/round-one), then every run there side by side, ordered by training tokens
    (``elmo probe compare``), into comparison.md there."""
    cfg = config()
    run = run_dir(cfg)
    from torchelmo.model.registry import ALIASES, is_published
    if args.model == "default":
        model, label, tokens = "default", "default", None
    elif is_published(args.model):
        # AllenNLP's published weights (downloaded once, then cached): the same suite on the
        # paper's models; label by alias, so that `small` and its long name are one run.
        model = args.model
        label = "published-" + next((a for a, n in ALIASES.items() if args.model in (a, n)), args.model)
        tokens = None
    else:
        # The one in the repository if it is there (the results name it), else the run's.
        where = models_dir() if args.model in committed_models() else run / "milestones"
        model = os.path.relpath(where / args.model, ROOT)   # the results name no machine's paths
        if not (ROOT / model).is_dir():
            sys.exit(f"science.py: no milestone {args.model} in {models_dir().relative_to(ROOT)} or {run / 'milestones'}")
        step = int(args.model.split("-")[-1])
        tokens = step * cfg["batch_size"] * cfg["unroll"]
        label = f"science-{tokens / 1e6:.0f}M"
    probes = probes_dir()
    out = probes if args.headline else probes / label
    owner = (out / "LABEL").read_text().strip() if (out / "LABEL").is_file() else None
    if args.headline and (out / "results.json").is_file() and owner != label:
        # results.json accumulates tasks: another model's would mix into this one's.
        sys.exit(f"science.py: {out / 'results.json'} holds another model's probes; move it away first")
    # The static baseline's text is the biLM's own training text, which the config names by pattern
    # (for a published model, this run's text: the 1B Word Benchmark is not here).
    prepare(cfg)
    corpus = sorted(os.path.relpath(f, ROOT) for pattern in cfg["train"] for f in glob.glob(str(ROOT / pattern)))
    cmd = [sys.executable, "-m", "torchelmo.cli", "probe", "all", "--model", model, "--data",
           os.path.relpath(DATA, ROOT), "--out", os.path.relpath(out, ROOT), "--corpus", *corpus]
    if args.tasks:
        cmd += ["--tasks", args.tasks]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    # Round two's protocol (docs/science.md): three probes per input, documents resampled.
    cmd += ["--probe-seeds", str(args.probe_seeds), "--ner-seeds", str(args.ner_seeds), "--resample", "documents"]
    if args.no_control:
        cmd += ["--no-control"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "TOKENS").write_text(f"{tokens or 0}\n")
    (out / "LABEL").write_text(f"{label}\n")
    if args.condition != "document":
        sh(cmd, log=out / "probe.log")
    # Round two: every task whose data names documents again, each sentence's features carrying
    # the LSTM state of its document's previous sentences (NER's WNUT-17 names none).
    with_docs = [t for t in (args.tasks.split(",") if args.tasks else DOCUMENT_TASKS) if t in DOCUMENT_TASKS]
    if with_docs and args.condition != "zero":
        doc = list(cmd)
        for flag in ("--out", "--tasks"):     # replaced below
            if flag in doc:
                del doc[doc.index(flag):doc.index(flag) + 2]
        doc += ["--out", os.path.relpath(out / "document", ROOT), "--tasks", ",".join(with_docs),
                "--context", "document"]
        sh(doc, log=out / "probe-document.log")
    compare_runs(probes)
    return 0


def compare_runs(probes: Path) -> None:
    """Every model's run under ``probes`` side by side (``elmo probe compare``), ordered by the
    tokens each model read, into comparison.md there; the carried-state runs (each run's
    ``document/``) likewise into ``comparison-document/``."""
    found = []
    others = ("coref-document", "document", *PROBE_DIRS.values())
    for d in [probes, *(p for p in probes.iterdir() if p.is_dir() and p.name not in others)]:
        if (d / "results.json").is_file():
            n = int((d / "TOKENS").read_text()) if (d / "TOKENS").is_file() else 0
            name = (d / "LABEL").read_text().strip() if (d / "LABEL").is_file() else d.name
            found.append((n, name, d))
    for sub, out in (("", probes), ("document", probes / "comparison-document")):
        runs = [(n, name, os.path.relpath(d / sub, ROOT)) for n, name, d in sorted(found)
                if (d / sub / "results.json").is_file()]
        # The default decision (docs/science.md): this run's latest model against the default.
        trained = [name for n, name, _ in runs if n]
        decide = ["--decide", f"{trained[-1]}:default"] if trained and "default" in [r[1] for r in runs] else []
        if runs:
            sh([sys.executable, "-m", "torchelmo.cli", "probe", "compare",
                *(f"{name}@{n}={d}" if n else f"{name}={d}" for n, name, d in runs),
                "--out", os.path.relpath(out, ROOT), *decide])


def main() -> int:
    global RUN
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=RUN, help=f"which run: configs/science/RUN.json (default {RUN})")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="one chunk of training")
    t.add_argument("--minutes", type=float, required=True, help="stop cleanly after this long")
    t.add_argument("--threads", type=int, help="override the config's threads")
    t.add_argument("--new-data", metavar="WHY",
                   help="the training files changed (say how, for the record): a new epoch starts on them")
    t.add_argument("--restart-lost", metavar="WHY",
                   help="the run's checkpoints are gone: train again from what is here, the loss recorded")
    t.set_defaults(func=train)
    p = sub.add_parser("probe", help="every probe on a milestone (or the default model), then the comparison")
    p.add_argument("model", help="a milestone's name (step-NNNNNN, see the record), 'default', or a published "
                                 "model (small, original, ...: elmo info --list; downloads its weights once)")
    p.add_argument("--tasks", help="a subset of elmo probe all's tasks")
    p.add_argument("--threads", type=int)
    p.add_argument("--ner-seeds", type=int, default=3,
                   help="taggers per input in the NER task (elmo probe's --ner-seeds; default 3)")
    p.add_argument("--probe-seeds", type=int, default=3,
                   help="probes per input in the other tasks (elmo probe's --probe-seeds; default 3)")
    p.add_argument("--no-control", action="store_true", help="skip the random-weights control")
    p.add_argument("--condition", choices=("both", "zero", "document"), default="both",
                   help="the features' condition: each sentence from the zero state, with the state carried "
                        "through its document, or both (the default; a run cut short goes on with the one missing)")
    p.add_argument("--headline", action="store_true",
                   help="write into results/probe itself: the final model's report (results.json, report.md)")
    p.set_defaults(func=probe)
    r = sub.add_parser("record", help="rewrite results/science/RUN/record.json from the run")
    r.set_defaults(func=lambda a: write_record(config()) or 0)
    args = ap.parse_args()
    RUN = args.run
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
