"""What a training run shows and listens to while it steps: the loss window behind each log line,
the progress bar, and the signals that stop it cleanly."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable

import torch.distributed as dist

from ..signals import Interrupts
from .distributed import DistEnv
from .metrics import MetricsLog


class Window:
    """Loss and throughput since the last log line."""

    def __init__(self) -> None:
        self.loss, self.tokens, self.t0 = 0.0, 0, time.perf_counter()

    def add(self, loss: float, tokens: int) -> None:
        self.loss += loss * tokens
        self.tokens += tokens

    def entry(self, step: int, epoch: int, lr: float, tokens_seen: int, elapsed: float) -> dict:
        avg = self.loss / max(1, self.tokens)
        return {"step": step, "epoch": epoch, "loss": avg, "ppl": math.exp(min(avg, 50.0)),
                "tokens_per_s": self.tokens / max(time.perf_counter() - self.t0, 1e-9),
                "lr": lr, "tokens": tokens_seen, "time": round(elapsed, 2)}


def progress_bar(enabled: bool, total: int | None, initial: int):
    """A tqdm bar over steps (None when disabled; tqdm itself turns off without a terminal)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, mininterval=1.0, disable=None)


def report(entry: dict, metrics: MetricsLog | None, bar, log: Callable[[str], None]) -> None:
    """A window's entry to the metrics log, and to the bar or a log line."""
    if metrics is not None:
        metrics.record(entry)
    if bar is not None:
        bar.set_postfix(tok_s=f"{entry['tokens_per_s']:.0f}", loss=f"{entry['loss']:.3f}",
                        ppl=f"{entry['ppl']:.1f}", refresh=False)
    if bar is None or bar.disable:
        log(f"step {entry['step']} epoch {entry['epoch']} loss {entry['loss']:.4f} ppl {entry['ppl']:.2f} "
            f"{entry['tokens_per_s']:.0f} tok/s lr {entry['lr']:.3g}")


class StopSignals(Interrupts):
    """SIGINT and SIGTERM while training: the step in progress finishes, a checkpoint is written
    and the run stops, to be continued with ``--resume``; a second signal stops at once."""

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


def stop_reason(signals: StopSignals, deadline: float | None, env: DistEnv) -> str | None:
    """``SIGINT``/``SIGTERM`` after a signal, ``time_limit`` past the deadline, as rank 0 sees it
    (so that every rank stops at the same step)."""
    stop = signals.name
    if stop is None and deadline is not None and time.monotonic() >= deadline:
        stop = "time_limit"
    if env.active:
        box = [stop]
        dist.broadcast_object_list(box, src=0)
        stop = box[0]
    return stop
