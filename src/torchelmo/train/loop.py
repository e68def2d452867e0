"""The outer loop of :class:`~torchelmo.train.Trainer`: steps, logging, validation, checkpoints, and
the model directories at the end."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from .metrics import MetricsLog

if TYPE_CHECKING:
    from .trainer import Trainer


class _Window:
    """Loss and throughput since the last log line."""

    def __init__(self) -> None:
        self.loss, self.tokens, self.t0 = 0.0, 0, time.perf_counter()

    def entry(self, t: Trainer) -> dict:
        avg = self.loss / max(1, self.tokens)
        return {"step": t.step, "epoch": t.batcher.epoch, "loss": avg, "ppl": math.exp(min(avg, 50.0)),
                "tokens_per_s": self.tokens / max(time.perf_counter() - self.t0, 1e-9),
                "lr": t.optimizer.param_groups[0]["lr"], "tokens": t.progress.tokens_seen,
                "time": round(t.progress.elapsed, 2)}


def _progress_bar(t: Trainer):
    if not (t.env.is_main and t.cfg.progress):
        return None
    from tqdm.auto import tqdm
    return tqdm(total=t.cfg.max_steps, initial=t.step, unit="step", dynamic_ncols=True, mininterval=1.0,
                disable=None)


def _log_window(t: Trainer, window: _Window, metrics: MetricsLog | None, bar) -> None:
    entry = window.entry(t)
    if metrics is not None:
        metrics.record(entry)
    if bar is not None:
        bar.set_postfix(tok_s=f"{entry['tokens_per_s']:.0f}", loss=f"{entry['loss']:.3f}",
                        ppl=f"{entry['ppl']:.1f}", refresh=False)
    if bar is None or bar.disable:
        t.log(f"step {t.step} epoch {entry['epoch']} loss {entry['loss']:.4f} ppl {entry['ppl']:.2f} "
              f"{entry['tokens_per_s']:.0f} tok/s lr {entry['lr']:.3g}")


class StopSignals:
    """SIGINT and SIGTERM while training: the step in progress finishes, a checkpoint is written
    and the run stops, to be continued with ``--resume``; a second signal stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():   # elsewhere signals cannot be set
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        return False

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


def run_loop(t: Trainer) -> dict:
    cfg, env, p = t.cfg, t.env, t.progress
    t.write_config()
    n_params = t.lm.num_parameters()
    t.log(f"elmo train: {n_params:,} parameters ({t.lm.bilm.config.lstm_dim}/"
          f"{t.lm.bilm.config.projection_dim} LSTM, {type(t.lm.softmax).__name__} over "
          f"{len(t.vocab):,} types), {env.world_size} rank(s) on {t.device}, "
          f"{cfg.batching} batches, {cfg.optimizer} lr {cfg.learning_rate}")
    metrics = MetricsLog(t.out, t.step if t.resumed is not None else None) if env.is_main else None
    bar = _progress_bar(t)
    window, stopped_early, last_eval = _Window(), False, None
    should_stop = lambda: cfg.max_steps is not None and t.step >= cfg.max_steps  # noqa: E731
    deadline = None if cfg.time_limit is None else time.monotonic() + 60.0 * cfg.time_limit
    signals = StopSignals()
    try:
        signals.__enter__()
        while not should_stop():
            t0 = time.perf_counter()
            micro = t.next_micro_batches()
            if micro is None:
                break  # the requested epochs are done
            loss, ntok = t.train_step(micro)
            p.step += 1
            p.tokens_seen += ntok
            p.elapsed += time.perf_counter() - t0
            window.loss += loss * ntok
            window.tokens += ntok
            if bar is not None:
                bar.update(1)
            if t.step % cfg.log_every == 0 or should_stop():
                _log_window(t, window, metrics, bar)
                window = _Window()
            if cfg.valid and t.step % cfg.eval_every == 0:
                last_eval = t.validate(metrics)
                p.last_valid_step = t.step
                stopped_early = cfg.patience is not None and p.bad_evals >= cfg.patience
            if t.step % cfg.checkpoint_every == 0 or stopped_early:
                t.save_checkpoint()
            if stopped_early:
                t.log(f"early stopping at step {t.step}: no improvement in {cfg.patience} evaluations")
                break
            if should_stop():
                continue
            stop = None
            if signals.signum is not None or t.env.active:
                stop = _agree(t, signal.Signals(signals.signum).name if signals.signum else None)
            if stop is None and deadline is not None and _agree(t, time.monotonic() >= deadline):
                stop = "time_limit"
            if stop:
                if window.tokens:
                    _log_window(t, window, metrics, bar)
                if t.last_checkpoint_step != t.step:
                    t.save_checkpoint()
                why = f"time limit of {cfg.time_limit:g} min reached" if stop == "time_limit" else f"stopped by {stop}"
                t.log(f"{why} at step {t.step}: checkpoint written; continue with --resume")
                return _summary(t, n_params, last_eval, stopped=stop)
        last_eval = _finish(t, metrics, last_eval)
    finally:
        signals.__exit__()
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
    return _summary(t, n_params, last_eval)


def _summary(t: Trainer, n_params: int, last_eval: dict | None, stopped: str | None = None) -> dict:
    p = t.progress
    summary = {"steps": t.step, "tokens": p.tokens_seen, "seconds": round(p.elapsed, 1),
               "parameters": n_params, "best_valid_ppl_mean": None if math.isinf(p.best) else p.best,
               "valid": last_eval, "out_dir": str(t.out)}
    if stopped:
        summary["stopped"] = stopped
    t.log(f"{'stopped' if stopped else 'done'}: {json.dumps(summary)}")
    return summary


def _agree(t: Trainer, value):
    """``value`` as rank 0 has it, on every rank (so that all ranks stop at the same step)."""
    box = [value]
    if t.env.active:
        import torch.distributed as dist
        dist.broadcast_object_list(box, src=0)
    return box[0]

def _finish(t: Trainer, metrics: MetricsLog | None, last_eval: dict | None) -> dict | None:
    """A final validation and checkpoint, and the model directories (rank 0)."""
    cfg, p = t.cfg, t.progress
    if cfg.valid and p.last_valid_step != t.step:
        last_eval = t.validate(metrics)
        p.last_valid_step = t.step
    elif cfg.valid and last_eval is None and metrics is not None:
        last_eval = metrics.last_valid   # a resumed run that had validated this step already
    if t.last_checkpoint_step != t.step:
        t.save_checkpoint()
    if t.env.is_main:
        extra = {"train": {"steps": t.step, "tokens": p.tokens_seen, "seconds": round(p.elapsed, 1),
                           "config": asdict(cfg)}}
        t.lm.save_pretrained(t.out / "model", extra=extra)
        t.lm.bilm.export_published(t.out / "published")
        if not (t.out / "best").is_dir():  # no validation set: best = final
            t.lm.save_pretrained(t.out / "best", extra=extra)
    return last_eval
