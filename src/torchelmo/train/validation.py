"""Validation during training: the held-out perplexity on rank 0, the best model kept in
``OUT/best`` (with what continuing the run from it needs), the learning rate decayed when validation stops improving, and that bookkeeping
shared with every rank."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from ..io.fileio import own_directory
from ..lm.model import LanguageModel
from .checkpoint import CONTINUE_KEY, Progress
from .config import TrainConfig
from .distributed import DistEnv
from .metrics import MetricsLog


class Validator:
    def __init__(self, cfg: TrainConfig, env: DistEnv, lm: LanguageModel, out: Path,
                 log: Callable[[str], None], continuation: Callable[[Progress], dict] | None = None) -> None:
        """``continuation``: what ``best/`` records for continuing the run from it (the trainer's
        :func:`~torchelmo.train.checkpoint.continuation`)."""
        self.cfg, self.env, self.lm, self.out, self.log = cfg, env, lm, out, log
        self.continuation = continuation

    def evaluate(self) -> dict:
        """Validation perplexity (``cfg.eval_mode``) of the current model."""
        cfg = self.cfg
        return self.lm.perplexity(cfg.valid, cfg.eval_mode, batch_size=cfg.eval_batch_size, unroll=cfg.unroll)

    def __call__(self, p: Progress, metrics: MetricsLog | None) -> dict | None:
        """Validate at ``p.step``: updates ``p``'s best, bad evaluations and lr scale on every
        rank; returns the metrics line (rank 0) or None."""
        result = None
        if self.env.is_main:
            t0 = time.perf_counter()
            r = self.evaluate()
            result = {"step": p.step, "valid_ppl_forward": r["ppl_forward"], "valid_ppl_backward": r["ppl_backward"],
                      "valid_ppl_mean": r["ppl_mean"], "valid_tokens": r["tokens"],
                      "valid_seconds": round(time.perf_counter() - t0, 1)}
            metrics.record(result)
            self.log(f"step {p.step} validation ppl forward {r['ppl_forward']:.2f} backward "
                     f"{r['ppl_backward']:.2f} mean {r['ppl_mean']:.2f}")
            if r["ppl_mean"] < p.best:
                p.best, p.bad_evals = r["ppl_mean"], 0
                train = {"steps": p.step, "valid": result}
                if self.continuation is not None:
                    train[CONTINUE_KEY] = self.continuation(replace(p, last_valid_step=p.step))
                self.lm.save_pretrained(own_directory(self.out / "best"), extra={"train": train})
            else:
                p.bad_evals += 1
                if self.cfg.lr_decay < 1.0:
                    p.lr_scale *= self.cfg.lr_decay
                    self.log(f"validation did not improve: lr x {self.cfg.lr_decay} -> "
                             f"{self.cfg.learning_rate * p.lr_scale:.3g}")
        if self.env.active:
            obj = [(p.best, p.bad_evals, p.lr_scale)]
            dist.broadcast_object_list(obj, src=0)
            p.best, p.bad_evals, p.lr_scale = obj[0]
        p.last_valid_step = p.step
        return result
