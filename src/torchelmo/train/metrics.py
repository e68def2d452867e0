"""``RUN/metrics.jsonl`` (one JSON object per log line or validation) and, when installed,
TensorBoard scalars under ``RUN/tensorboard``."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ElmoError, warn
from ..io.fileio import atomic_path

METRICS_NAME = "metrics.jsonl"


class MetricsLog:
    def __init__(self, out_dir: str | Path, resumed_at: int | None) -> None:
        """Start the log; on resume (``resumed_at`` = the checkpoint's step) drop what was logged
        after the checkpoint: those steps are recomputed now."""
        path = Path(out_dir) / METRICS_NAME
        self.last_valid: dict | None = None   # the last validation kept from before a resume
        _check_kind(path)
        if resumed_at is not None and path.is_file():
            keep = []
            for ln in _checked_lines(path):
                entry = json.loads(ln)
                if entry["step"] <= resumed_at:
                    keep.append(ln)
                    if "valid_ppl_mean" in entry:
                        self.last_valid = entry
            with atomic_path(path) as tmp:
                tmp.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
        elif resumed_at is None:
            path.write_text("")
        self.file = open(path, "a", encoding="utf-8")
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:   # tensorboard is optional: without it, metrics.jsonl alone
            return
        try:
            self.tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        except OSError as e:  # installed but cannot write: say so once, keep training
            warn(f"{Path(out_dir) / 'tensorboard'}: TensorBoard logging is off ({e.strerror or e})")

    def record(self, entry: dict) -> None:
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in entry.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, entry["step"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


def check_log(out_dir: str | Path) -> None:
    """Refuse, in one line, a run's metrics log that a resume could not continue (checked before
    the run is read further: a damaged log stops nothing half way)."""
    path = Path(out_dir) / METRICS_NAME
    _check_kind(path)
    if path.is_file():
        _checked_lines(path)


def _check_kind(path: Path) -> None:
    if path.exists() and (path.is_symlink() or not path.is_file()):
        raise ElmoError(f"{path}: not a regular file (the run's metrics log); move it away")


def _checked_lines(path: Path) -> list[str]:
    """The log's lines, each a JSON object with a whole-number ``step`` >= 0; the last line may be
    cut short (a kill while writing it: dropped, its step is recomputed); any other damage is one
    line naming the file and line."""
    raw = path.read_bytes().split(b"\n")
    numbered = [(i, b) for i, b in enumerate(raw, 1) if b.strip()]
    out = []
    for k, (i, b) in enumerate(numbered):
        try:
            ln = b.decode("utf-8")
            entry = json.loads(ln)
        except (UnicodeDecodeError, json.JSONDecodeError):
            if k == len(numbered) - 1:
                continue
            raise ElmoError(f"{path}:{i}: not a line of JSON (the run's metrics log is damaged); "
                            "remove the line to resume") from None
        step = entry.get("step") if isinstance(entry, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ElmoError(f"{path}:{i}: a metrics line must be an object with a whole-number step >= 0, "
                            f"got {ln[:80]!r}; remove the line to resume")
        out.append(ln)
    return out
