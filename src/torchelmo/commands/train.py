"""``elmo train``: the command line over :func:`torchelmo.train.train`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from typing import Any

from ..errors import ElmoError
from ..io.fileio import read_json
from ..numerics.precision import CHOICES as PRECISION_CHOICES
from ..numerics.precision import PRECISION_HELP
from ..runtime import add_device_args, add_quiet_args, show_summary
from ..signals import Interrupts
from ..train.checkpoint import resume_point
from ..train.config import SOFTMAX_CHOICES, TRAIN_PRESETS, TrainConfig
from ..train.trainer import train


def _add_train_args(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    d = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    g = p.add_argument_group("data")
    g.add_argument("--train", nargs="+", default=S, metavar="FILE", help="training corpus files or globs")
    g.add_argument("--valid", nargs="+", default=S, metavar="FILE", help="validation files")
    g.add_argument("--vocab", default=S, help="vocabulary file (default: built from --train into OUT/vocab.txt)")
    g.add_argument("--out", dest="out_dir", default=S, help="run directory")
    g.add_argument("--config", default=S, help="a JSON file of TrainConfig fields (flags override it)")
    g.add_argument("--batching", choices=["stream", "sentence"], default=S, help=f"default {d['batching']}")
    g.add_argument("--batch-size", type=int, default=S, help=f"global rows/sentences per step (default {d['batch_size']})")
    g.add_argument("--batch-tokens", type=int, default=S, help="global tokens per step (instead of --batch-size)")
    g.add_argument("--unroll", type=int, default=S, help=f"BPTT window (default {d['unroll']})")
    g.add_argument("--state-reset", type=float, default=S,
                   help="stream batching: probability per row and window of restarting from the zero "
                        "state (default 0, the original; >0 keeps the LM sane from a zero state)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=S, help=f"preset ({', '.join(TRAIN_PRESETS)}) or options.json "
                                              f"(default {d['model']})")
    g.add_argument("--softmax", choices=SOFTMAX_CHOICES, default=S,
                   help=f"training softmax (default {d['softmax']}: full for small vocabularies)")
    g.add_argument("--num-samples", type=int, default=S, help=f"sampled softmax negatives (default {d['num_samples']})")
    g.add_argument("--dropout", type=float, default=S, help=f"default {d['dropout']}")
    g.add_argument("--variational-dropout", action="store_true", default=S,
                   help="one dropout mask per window, shared over time (default: a mask per step)")
    g.add_argument("--weight-drop", type=float, default=S,
                   help="DropConnect on the LSTM recurrent matrices, as AWD-LSTM (default 0)")
    g.add_argument("--init-from", default=S, help="start from this model: an LM or a biLM (a directory, a "
                                              "published name or a Hugging Face Hub id)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=["adagrad", "adam", "sgd"], default=S,
                   help=f"default {d['optimizer']}")
    g.add_argument("--lr", type=float, default=S, help="default 0.2 adagrad, 1e-3 adam, 1.0 sgd")
    g.add_argument("--lr-decay", type=float, default=S, help="lr factor when validation does not improve")
    g.add_argument("--lr-schedule", choices=["constant", "linear", "cosine"], default=S,
                   help="decay the lr to 0 at --max-steps (default constant)")
    g.add_argument("--warmup-steps", type=int, default=S, help="linear lr warm-up (default 0)")
    g.add_argument("--weight-decay", type=float, default=S, help=f"default {d['weight_decay']}")
    g.add_argument("--clip-norm", type=float, default=S, help=f"default {d['clip_norm']}")
    g.add_argument("--grad-accum", type=int, default=S,
                   help="micro-batches per step (same global batch, less memory; default 1)")
    g.add_argument("--precision", choices=PRECISION_CHOICES, default=S,
                   help=PRECISION_HELP + "; parameters and optimizer state stay fp32")
    g.add_argument("--seed", type=int, default=S, help=f"initialisation and data order (default {d['seed']})")
    g.add_argument("--max-steps", type=int, default=S, help="stop after this many optimiser steps")
    g.add_argument("--epochs", type=int, default=S, help="stop after this many passes over --train")
    g = p.add_argument_group("run")
    g.add_argument("--log-every", type=int, default=S,
                   help=f"steps between metrics records and log lines (default {d['log_every']})")
    g.add_argument("--eval-every", type=int, default=S,
                   help=f"steps between validations (default {d['eval_every']})")
    g.add_argument("--eval-mode", choices=["sentence", "stream"], default=S,
                   help="validation: each sentence from a zero state, or contiguous streams "
                        f"(default {d['eval_mode']})")
    g.add_argument("--eval-batch-size", type=int, default=S,
                   help=f"validation batch size (default {d['eval_batch_size']})")
    g.add_argument("--checkpoint-every", type=int, default=S,
                   help=f"steps between checkpoints (OUT/checkpoint.pt; default {d['checkpoint_every']})")
    g.add_argument("--keep-checkpoints", type=int, default=S, metavar="N",
                   help="also keep the last N checkpoints in OUT/checkpoints/ (to average with elmo average)")
    g.add_argument("--patience", type=int, default=S, help="early stopping after N evaluations without improvement")
    g.add_argument("--time-limit", type=float, default=S, metavar="MINUTES",
                   help="train this long, then write a checkpoint and stop without finishing the run "
                        "(continue it with --resume): for chunked training")
    add_device_args(g, suppress=True)
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S,
                   help="log lines instead of a progress bar (for log files)")
    add_quiet_args(g)
    g.add_argument("--resume", action="store_true", default=S,
                   help="continue from OUT/checkpoint.pt if there is one (else start)")
    g.add_argument("--continue-from", metavar="MODEL_DIR", default=S,
                   help="a run whose checkpoints are lost: continue it from one of the models it saved "
                        "(OUT/best, OUT/model, or a copy) at that model's step, schedule and data position; "
                        "inexact: the optimizer's moments start empty and the lr warms up again")
    g.add_argument("--new-data", action="store_true", default=S,
                   help="with --resume, after the training files changed: start a new epoch on "
                        "them (a saved position is only valid for the files it was saved on)")
    g.add_argument("--overwrite", action="store_true", default=S,
                   help="start a new run in an OUT that holds one, deleting it (without this or "
                        "--resume, such an OUT is refused)")


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields of ``--config FILE`` with the flags given on top."""
    given = {k: v for k, v in vars(args).items() if k not in ("func", "command", "config", "quiet")}
    if getattr(args, "quiet", 0):
        given["progress"] = False
    base: dict[str, Any] = {}
    if getattr(args, "config", None):
        base = read_json(args.config, "train config")
    return {**base, **given}


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, dict | None]:
    """The run's configuration and, when resuming, the checkpoint it continues (read once here)."""
    settings, ckpt = settings_from_args(args), None
    if settings.get("resume"):
        settings, ckpt = resume_point(settings.get("out_dir"), settings, strict=True)
    if "out_dir" not in settings:
        raise ElmoError("--out is required")
    if "train" not in settings:
        raise ElmoError("--train is required")
    return TrainConfig.from_dict(settings, args.config if getattr(args, "config", None) else "elmo train"), ckpt


def _run_train(args) -> int:
    # From the start, SIGTERM ends in one line as Ctrl-C does; the training loop then takes both
    # signals over itself (a checkpoint, then a clean stop) and gives them back after.
    with Interrupts():
        cfg, ckpt = config_from_args(args)
        quiet = getattr(args, "quiet", 0)
        summary = train(cfg, log=(lambda _: None) if quiet else None, resume_from=ckpt)
    if summary.get("stopped") in ("SIGINT", "SIGTERM"):   # a clean stop, but not the run's end
        return 128 + int(getattr(signal, summary["stopped"]))
    if quiet and show_summary(args) and os.environ.get("RANK", "0") == "0":
        best = summary.get("best_valid_ppl_mean")
        print(f"elmo train: {summary['steps']} steps, {summary['tokens']:,} tokens in "
              f"{summary['seconds']}s" + (f", best validation perplexity {best:.2f}" if best is not None else "")
              + f" -> {summary['out_dir']}", file=sys.stderr)
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("train", help="train a biLM (torchrun for many processes)")
    _add_train_args(p)
    p.set_defaults(func=_run_train)
