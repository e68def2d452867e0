"""``RUN/metrics.jsonl`` (one JSON object per log line or validation) and, when installed,
TensorBoard scalars under ``RUN/tensorboard``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..io.fileio import atomic_path

METRICS_NAME = "metrics.jsonl"


class MetricsLog:
    def __init__(self, out_dir: str | Path, resumed_at: int | None) -> None:
        """Start the log; on resume (``resumed_at`` = the checkpoint's step) drop what was logged
        after the checkpoint: those steps are recomputed now."""
        path = Path(out_dir) / METRICS_NAME
        self.last_valid: dict | None = None   # the last validation kept from before a resume
        if resumed_at is not None and path.is_file():
            keep = []
            for ln in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(ln)
                except json.JSONDecodeError:  # a line cut short by a kill: recomputed anyway
                    continue
                if isinstance(entry, dict) and entry.get("step", 0) <= resumed_at:
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
            warnings.warn(f"{Path(out_dir) / 'tensorboard'}: TensorBoard logging is off ({e.strerror or e})",
                          stacklevel=2)

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
