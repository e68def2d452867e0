"""``RUN/metrics.jsonl`` (one JSON object per log line or validation) and, when installed,
TensorBoard scalars under ``RUN/tensorboard``."""

from __future__ import annotations

import json
from pathlib import Path

from ..fileio import atomic_path

METRICS_NAME = "metrics.jsonl"


class MetricsLog:
    def __init__(self, out_dir: str | Path, resumed_at: int | None) -> None:
        """Start the log; on resume (``resumed_at`` = the checkpoint's step) drop what was logged
        after the checkpoint: those steps are recomputed now."""
        path = Path(out_dir) / METRICS_NAME
        if resumed_at is not None and path.is_file():
            keep = [ln for ln in path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= resumed_at]
            with atomic_path(path) as tmp:
                tmp.write_text("".join(ln + "\n" for ln in keep))
        elif resumed_at is None:
            path.write_text("")
        self.file = open(path, "a", encoding="utf-8")
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        except Exception:  # tensorboard is optional
            pass

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
