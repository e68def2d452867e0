"""The training recipe: set up the data, the LM and the optimizer, step, validate, checkpoint, and
write the model directories (see :mod:`torchelmo.train`)."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import ElmoError
from ..io.fileio import atomic_path, own_directory
from ..lm.corpus import Corpus
from ..lm.data import SentenceBatcher, StreamBatcher
from ..lm.model import LanguageModel
from ..lm.softmax import AdaptiveSoftmax, softmax_kind
from ..lm.vocab import Vocabulary
from ..model.folders import RUN_CONFIG_NAME
from ..runtime import check_allocation, keep_heap, resolve_device, set_threads, write
from . import checkpoint as ckpt_io
from .config import REWARM_STEPS, TrainConfig
from .distributed import DistEnv, seed_rngs, setup_distributed
from .metrics import MetricsLog
from .progress import StopSignals, Window, progress_bar, report, stop_reason
from .step import Stepper
from .validation import Validator

TRAIN_CONFIG_NAME = RUN_CONFIG_NAME   # what marks a run directory (a model wherever one is named)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    """The optimizer, fused (one pass over each parameter and its state; about 4x faster than the
    per-tensor loop on a CPU) where PyTorch has a fused kernel for the parameters' device."""
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64) for p in params)
    if cfg.optimizer == "adagrad":
        if fused and any(p.device.type != "cpu" for p in params):
            fused = False   # Adagrad's fused kernel is CPU-only
        return torch.optim.Adagrad(params, lr=cfg.learning_rate, initial_accumulator_value=cfg.adagrad_init,
                                   weight_decay=cfg.weight_decay, fused=fused or None)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=fused or None)
    return torch.optim.SGD(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=fused or None)


def make_batcher(cfg: TrainConfig, vocab: Vocabulary, env: DistEnv) -> StreamBatcher | SentenceBatcher:
    corpus = Corpus(cfg.train, shuffle=True, seed=cfg.seed, block_lines=cfg.block_lines)
    if cfg.batching == "stream":
        rows = cfg.batch_size if cfg.batch_size is not None else max(1, cfg.batch_tokens // cfg.unroll)
        if rows % env.world_size:
            raise ElmoError(f"stream batching: {rows} rows cannot be split evenly over "
                            f"{env.world_size} ranks")
        return StreamBatcher(corpus, vocab, rows, cfg.unroll, env.rank, env.world_size, cfg.epochs)
    return SentenceBatcher(corpus, vocab, cfg.batch_size, cfg.batch_tokens, env.rank, env.world_size,
                           cfg.epochs, shuffle=True, seed=cfg.seed)


def build_lm(cfg: TrainConfig, vocab: Vocabulary, log: Callable[[str], None]) -> LanguageModel:
    """A new LM per ``cfg``: fresh, or started from ``cfg.init_from``."""
    softmax = None if cfg.softmax == "auto" else cfg.softmax
    if cfg.init_from and not cfg.continue_from:   # continuing: the weights come from the saved model
        return LanguageModel.init_from(cfg.init_from, vocab, softmax=softmax, num_samples=cfg.num_samples,
                                       log=log, regularisation=cfg.regularisation())
    return LanguageModel(cfg.model_config(), vocab, softmax=cfg.softmax, num_samples=cfg.num_samples,
                         regularisation=cfg.regularisation())


def run_vocabulary(cfg: TrainConfig, out: Path, env: DistEnv) -> Vocabulary:
    """``cfg.vocab``, or one built from the training corpus (identically on every rank) and saved
    as the run's ``vocab.txt``, which ``cfg.vocab`` then names (resume reads it)."""
    if cfg.vocab is not None:
        return Vocabulary.from_file(cfg.vocab)
    vocab = Vocabulary.build(cfg.train)
    cfg.vocab = str(out / "vocab.txt")
    if env.is_main:
        vocab.save(cfg.vocab)
    return vocab


def wrap_ddp(lm: LanguageModel, env: DistEnv, device: torch.device) -> torch.nn.Module:
    """``lm`` itself on one rank, else its DistributedDataParallel wrapper."""
    if not env.active:
        return lm
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(lm, device_ids=[device.index] if device.type == "cuda" else None,
               # the adaptive softmax skips the tail clusters no target falls in
               find_unused_parameters=isinstance(lm.softmax, AdaptiveSoftmax))


class Trainer:
    """A training run as a recipe: ``Trainer(cfg)`` decides where it runs (threads, device, ranks),
    :meth:`setup` builds each component in turn (:meth:`_setup_data`, :meth:`_setup_model`,
    :meth:`_setup_optimizer`, :meth:`_setup_restore`), :meth:`train` is the loop and
    :meth:`cleanup` the teardown. :func:`train` runs the four."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = None,
                 resume_from: dict | None = None) -> None:
        """``resume_from``: the checkpoint ``cfg`` was merged with (:func:`checkpoint.resume_point`)."""
        self.cfg, self.out, self.resumed = cfg, Path(cfg.out_dir), resume_from
        set_threads(cfg.threads)
        keep_heap()   # the steps' large temporaries reused, not mapped afresh every step
        # auto: this rank's GPU if there is one; cuda without an index: this rank's (LOCAL_RANK)
        self.device = resolve_device(cfg.device, "--device")
        self.env = setup_distributed(self.device)
        self._log = log or write     # through tqdm: a log line never lands on the progress bar
        self.state = None            # carried LSTM state (stream batching)
        self.progress = ckpt_io.Progress()
        self.continued: tuple[ckpt_io.Progress, dict] | None = None   # --continue-from's point
        self.checkpoints = ckpt_io.Checkpointer(cfg, self.env, self.device, self.out, self.log)

    def setup(self) -> Trainer:
        self._setup_data()
        self._setup_model()
        self._setup_optimizer()
        self._setup_restore()
        return self

    def _setup_data(self) -> None:
        """The vocabulary (built from the training corpus, identically on every rank, unless
        given) and the batcher."""
        self.vocab = run_vocabulary(self.cfg, self.out, self.env)
        self.batcher = make_batcher(self.cfg, self.vocab, self.env)

    def _setup_model(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the same initial parameters on every rank
        if self.resumed is not None:
            self.lm = ckpt_io.lm_from_checkpoint(self.resumed, self.out / ckpt_io.CHECKPOINT_NAME, self.vocab,
                                                 load_weights=False)
        else:
            self.lm = build_lm(cfg, self.vocab, self.log)
            if cfg.continue_from:
                self.continued = ckpt_io.continue_point(cfg.continue_from, cfg, self.lm)
        cfg.softmax = softmax_kind(self.lm.softmax)  # resolved, so that a resume rebuilds the same
        self.lm.to(self.device)
        self.lm.bilm.precision = cfg.precision   # applied by the model, once per step and evaluation
        self.lm.bilm.long_run = True             # its validations too may compile (backend auto)

    def _setup_optimizer(self) -> None:
        # Gradients and the optimizer's state (Adam keeps two slots per weight, Adagrad one), before
        # either is allocated: the kernel would end a run over its limit without a word.
        slots = 3 if self.cfg.optimizer == "adam" else 2
        check_allocation(4 * slots * self.lm.num_parameters(), "training's gradients and optimizer state")
        self.optimizer = make_optimizer(self.cfg, self.lm.parameters())

    def _setup_restore(self) -> None:
        """The checkpoint's state when resuming (else the dropout streams' seeds), then the DDP
        wrapper and the stepper."""
        if self.resumed is not None:
            self.progress, self.state = self.checkpoints.restore(self.resumed, self.lm, self.optimizer, self.batcher)
            self._set_lr()
            self.log(f"resumed from {self.checkpoints.path} at step {self.step}")
        elif self.continued is not None:
            self.progress, data = self.continued
            self.batcher.load_state_dict(data, new_data=self.cfg.new_data, where=f"--continue-from {self.cfg.continue_from}")
            seed_rngs(self.cfg.seed * 1000 + 1 + self.env.rank + 7919 * self.step)
            self._set_lr()
            self.log(f"continued from {self.cfg.continue_from} at step {self.step}, inexactly: the optimizer's "
                     f"moments, the carried LSTM state and the dropout streams start afresh, and the learning "
                     f"rate warms up again over {self.cfg.warmup_steps or REWARM_STEPS:,} steps")
        else:
            seed_rngs(self.cfg.seed * 1000 + 1 + self.env.rank)  # dropout masks differ per rank
        self.model = wrap_ddp(self.lm, self.env, self.device)
        self.stepper = Stepper(self.cfg, self.env, self.device, self.model, self.lm, self.optimizer, self.batcher)
        self.validate_at = Validator(self.cfg, self.env, self.lm, self.out, self.log,
                                     lambda p: ckpt_io.continuation(self.cfg, p, self.batcher))

    def cleanup(self) -> None:
        """Tear down the process group, if this run started one."""
        if self.env.active and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()  # rank 0 writes the model dirs last
            # The DDP reducer holds the process group: free it now, not at interpreter shutdown,
            # where gloo's threads can be torn down unjoined (a SIGABRT after a finished run).
            self.model = self.lm = None
            gc.collect()
            dist.destroy_process_group()

    @property
    def step(self) -> int:
        return self.progress.step

    def log(self, msg: str) -> None:
        if self.env.is_main:
            self._log(msg)

    def save_checkpoint(self) -> None:
        self.checkpoints.save(self.progress, self.lm, self.optimizer, self.batcher, self.state)

    def _set_lr(self) -> None:
        p = self.progress
        lr = self.cfg.learning_rate * p.lr_scale * self.cfg.lr_factor(self.step, p.rewarm_from)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    # -- one step --------------------------------------------------------------------------------
    def train_step(self, micro: list) -> tuple[float, int]:
        """One optimizer step over ``micro`` batches; returns (global loss, global targets)."""
        loss, n_global, grad_norm, self.state = self.stepper.gradients(micro, self.state, self.step)
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            raise _diverged(loss, grad_norm, self.step + 1, self.checkpoints)
        self._set_lr()
        self.optimizer.step()
        return loss, n_global

    def validate(self, metrics: MetricsLog | None) -> dict | None:
        result = self.validate_at(self.progress, metrics)
        self._set_lr()
        return result

    def write_config(self) -> None:
        if self.env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.out / TRAIN_CONFIG_NAME) as tmp:
                tmp.write_text(json.dumps(asdict(self.cfg), indent=2) + "\n")


    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> dict:
        """Step until ``max_steps``, the epochs, early stopping, the time limit or a signal;
        validate, checkpoint and log on the way; returns a summary."""
        cfg, env, p = self.cfg, self.env, self.progress
        self.write_config()
        n_params = self.lm.num_parameters()
        self.log(f"elmo train: {n_params:,} parameters ({self.lm.bilm.config.lstm_dim}/"
                 f"{self.lm.bilm.config.projection_dim} LSTM, {type(self.lm.softmax).__name__} over "
                 f"{len(self.vocab):,} types), {env.world_size} rank(s) on {self.device}, "
                 f"{cfg.batching} batches, {cfg.optimizer} lr {cfg.learning_rate}")
        metrics = MetricsLog(self.out, self.step if self.resumed is not None else None) if env.is_main else None
        if metrics is not None and self.continued is not None:
            metrics.record({"step": self.step, "continued_from": str(cfg.continue_from)})
        bar = progress_bar(env.is_main and cfg.progress, cfg.max_steps, self.step)
        window, stopped_early, last_eval = Window(), False, None
        done = lambda: cfg.max_steps is not None and self.step >= cfg.max_steps  # noqa: E731
        deadline = None if cfg.time_limit is None else time.monotonic() + 60.0 * cfg.time_limit
        try:
            with StopSignals() as signals:
                while not done():
                    t0 = time.perf_counter()
                    micro = self.stepper.next_micro_batches()
                    if micro is None:
                        break  # the requested epochs are done
                    loss, ntok = self.train_step(micro)
                    p.step += 1
                    p.tokens_seen += ntok
                    p.elapsed += time.perf_counter() - t0
                    window.add(loss, ntok)
                    if bar is not None:
                        bar.update(1)
                    if self.step % cfg.log_every == 0 or done():
                        self._log_window(window, metrics, bar)
                        window = Window()
                    if cfg.valid and self.step % cfg.eval_every == 0:
                        last_eval = self.validate(metrics)
                        stopped_early = cfg.patience is not None and p.bad_evals >= cfg.patience
                    if self.step % cfg.checkpoint_every == 0 or stopped_early:
                        self.save_checkpoint()
                    if stopped_early:
                        self.log(f"early stopping at step {self.step}: no improvement in {cfg.patience} evaluations")
                        break
                    stop = None if done() else stop_reason(signals, deadline, self.env)
                    if stop:
                        if window.tokens:
                            self._log_window(window, metrics, bar)
                        if self.checkpoints.last_step != self.step:
                            self.save_checkpoint()
                        why = (f"time limit of {cfg.time_limit:g} min reached" if stop == "time_limit"
                               else f"stopped by {stop}")
                        self.log(f"{why} at step {self.step}: checkpoint written; continue with --resume")
                        return self._done(_summary(p, n_params, last_eval, self.out, stop))
                last_eval = self._finish(metrics, last_eval)
        finally:
            if bar is not None:
                bar.close()
            if metrics is not None:
                metrics.close()
        return self._done(_summary(p, n_params, last_eval, self.out))

    def _done(self, summary: dict) -> dict:
        self.log(f"{'stopped' if 'stopped' in summary else 'done'}: {json.dumps(summary)}")
        return summary

    def _log_window(self, window: Window, metrics: MetricsLog | None, bar) -> None:
        p = self.progress
        report(window.entry(self.step, self.batcher.epoch, self.optimizer.param_groups[0]["lr"], p.tokens_seen,
                            p.elapsed), metrics, bar, self.log)

    def _finish(self, metrics: MetricsLog | None, last_eval: dict | None) -> dict | None:
        """A final validation and checkpoint, and the model directories (rank 0)."""
        cfg, p = self.cfg, self.progress
        if cfg.valid and p.last_valid_step != self.step:
            last_eval = self.validate(metrics)
        elif cfg.valid and last_eval is None and metrics is not None:
            last_eval = metrics.last_valid   # a resumed run that had validated this step already
        if self.checkpoints.last_step != self.step:
            self.save_checkpoint()
        if self.env.is_main:
            _write_models(self.lm, self.out, {"train": {"steps": self.step, "tokens": p.tokens_seen,
                                                        "seconds": round(p.elapsed, 1), "config": asdict(cfg),
                                                        ckpt_io.CONTINUE_KEY: ckpt_io.continuation(cfg, p, self.batcher)}})
        return last_eval



def _write_models(lm: LanguageModel, out: Path, extra: dict) -> None:
    """The final model directories: ``model/``, ``published/``, and ``best/`` if no validation
    made one (best = final)."""
    lm.save_pretrained(own_directory(out / "model"), extra=extra)
    lm.bilm.export_published(own_directory(out / "published"))
    if (out / "best").is_symlink() or not (out / "best").is_dir():
        lm.save_pretrained(own_directory(out / "best"), extra=extra)


def _diverged(loss: float, grad_norm: float, step: int, checkpoints: ckpt_io.Checkpointer) -> ElmoError:
    where = (f"the last good checkpoint is {checkpoints.path} (step {checkpoints.last_step})"
             if checkpoints.last_step is not None else "no checkpoint was written yet")
    what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", grad_norm)
    return ElmoError(f"training stopped: the {what} is {value} at step {step}; {where}. Lower the "
                     "learning rate (--lr) or resume from the checkpoint with --resume")


def _summary(p: ckpt_io.Progress, n_params: int, last_eval: dict | None, out: Path,
             stopped: str | None = None) -> dict:
    summary = {"steps": p.step, "tokens": p.tokens_seen, "seconds": round(p.elapsed, 1),
               "parameters": n_params, "best_valid_ppl_mean": None if math.isinf(p.best) else p.best,
               "valid": last_eval, "out_dir": str(out)}
    if stopped:
        summary["stopped"] = stopped
    return summary


def train(cfg: TrainConfig, log: Callable[[str], None] | None = None, resume_from: dict | None = None) -> dict:
    """Train (or, with ``cfg.resume``, resume) per ``cfg``; returns a summary. Call from every rank
    under torchrun. ``resume_from``: the checkpoint, when the caller has read it already (then
    ``cfg`` must be :func:`checkpoint.resume_point`'s configuration)."""
    main = os.environ.get("RANK", "0") == "0"
    # One trainer per run directory, from before the run is read until its last write (rank 0
    # holds it for the ranks of its job).
    with ckpt_io.hold_run_dir(cfg.out_dir) if main else contextlib.nullcontext():
        if cfg.resume and resume_from is None:
            settings, resume_from = ckpt_io.resume_point(cfg.out_dir, asdict(cfg))
            if resume_from is not None:
                cfg = TrainConfig.from_dict(settings, str(Path(cfg.out_dir) / ckpt_io.CHECKPOINT_NAME))
        if resume_from is not None and cfg.continue_from:
            raise ElmoError(f"{cfg.out_dir}: holds a checkpoint (step {resume_from['step']:,}); --resume alone "
                            "continues it exactly (--continue-from is for a run whose checkpoints are lost)")
        if resume_from is None:   # a new run: checked on every rank before anything is written
            ckpt_io.claim_run_dir(cfg.out_dir, cfg.overwrite, cfg.resume, delete=main)
        trainer = Trainer(cfg, log, resume_from)
        try:
            return trainer.setup().train()
        finally:
            trainer.cleanup()
