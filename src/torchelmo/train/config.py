"""What a training run is: :class:`TrainConfig` (saved as ``train_config.json`` and in every
checkpoint) and the model presets ``elmo train --model`` accepts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ElmoError
from ..io.fileio import check_path_name
from ..lm.softmax import KINDS as SOFTMAX_KINDS
from ..model.bilm import Regularisation
from ..model.config import ElmoConfig, preset
from ..numerics.precision import CHOICES as PRECISION_CHOICES

SOFTMAX_CHOICES = ("auto", *SOFTMAX_KINDS)
# A step's micro-batches seed their generators with step * MAX_GRAD_ACCUM + micro: no two collide.
MAX_GRAD_ACCUM = 64

# Shapes of the biLM. 'cpu' is ours: ~5.9M parameters with a 10k-word softmax (PTB), a char-CNN
# like Kim et al.'s LSTM-Char-Small (widths 1-6, 20 w filters, one highway layer) under a
# projected LSTM; it trains at about 1k tokens/s on one CPU core.
TRAIN_PRESETS: dict[str, Callable[[], ElmoConfig]] = {
    "tiny": lambda: preset("tiny"),
    "small": lambda: preset("small"),
    "medium": lambda: preset("medium"),
    "original": lambda: preset("original"),
    "cpu": lambda: ElmoConfig(lstm_dim=512, projection_dim=192, n_layers=2, char_embed_dim=16,
                              filters=[[w, 20 * w] for w in range(1, 7)], n_highway=1),
}

# Fields that may be changed when resuming: they do not change what is computed, or extend it,
# or (precision) only how its matmuls round.
RESUME_OVERRIDABLE = {"max_steps", "epochs", "log_every", "eval_every", "checkpoint_every", "patience",
                      "threads", "progress", "out_dir", "resume", "keep_checkpoints", "time_limit",
                      "precision"}
# Fields that belong to one invocation: a resumed run takes them from its own command line (or
# their defaults), never from the checkpoint.
PER_INVOCATION = {"time_limit": None, "overwrite": False, "new_data": False, "continue_from": None}
# Steps over which a run continued from a saved model warms its learning rate up again (its
# optimizer starts with empty moments) when the run has no warm-up of its own.
REWARM_STEPS = 1000


@dataclass
class TrainConfig:
    train: list[str]                       # corpus files or globs (one sentence per line)
    out_dir: str
    vocab: str | None = None               # built from the training corpus if not given
    valid: list[str] = field(default_factory=list)
    model: str = "small"                   # a preset name or a published options.json
    softmax: str = "auto"                  # auto | full | sampled | adaptive
    num_samples: int = 8192                # negatives of the sampled softmax
    batching: str = "stream"               # stream (truncated BPTT) | sentence
    batch_size: int | None = 128           # global rows (stream) or sentences per step
    batch_tokens: int | None = None        # instead of batch_size: tokens per global batch
    unroll: int = 20
    state_reset: float = 0.0               # stream: chance per row and window to restart from zero
    optimizer: str = "adagrad"             # adagrad | adam | sgd
    lr: float | None = None                # 0.2 adagrad, 1e-3 adam, 1.0 sgd
    adagrad_init: float = 1.0
    weight_decay: float = 0.0
    clip_norm: float = 10.0
    dropout: float = 0.1
    variational_dropout: bool = False      # one dropout mask per window over time (Gal & Ghahramani)
    weight_drop: float = 0.0               # DropConnect on the LSTM recurrent matrices (AWD-LSTM)
    lr_decay: float = 1.0                  # multiply the lr by this when validation does not improve
    lr_schedule: str = "constant"          # constant | linear | cosine (to 0 at max_steps)
    warmup_steps: int = 0                  # linear warm-up from 0 over this many steps
    precision: str = "fp32"                # fp32 | tf32 | bf16 | auto (see torchelmo.numerics.precision)
    seed: int = 0
    grad_accum: int = 1
    max_steps: int | None = None
    epochs: int | None = None
    log_every: int = 50
    eval_every: int = 1000
    eval_mode: str = "sentence"            # sentence (zero state) | stream (contiguous BPTT)
    eval_batch_size: int = 64
    checkpoint_every: int = 1000
    keep_checkpoints: int = 0              # also keep the last N checkpoints in checkpoints/ (for elmo average)
    patience: int | None = None            # early stopping: evaluations without improvement
    time_limit: float | None = None        # minutes for this invocation; then checkpoint and stop (--resume goes on)
    overwrite: bool = False                # start over in an out_dir that holds a run (deleting it)
    new_data: bool = False                 # with resume: the corpus files changed; a new epoch starts on them
    init_from: str | None = None
    continue_from: str | None = None       # a saved model of this run (best/, model/): continue it, inexactly
    threads: int | None = None
    device: str = "auto"
    block_lines: int = 1_000_000
    progress: bool = True
    resume: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.train, str):
            self.train = [self.train]
        if isinstance(self.valid, str):
            self.valid = [self.valid]
        self.validate()

    def validate(self) -> None:
        def bad(msg: str) -> ElmoError:
            return ElmoError(f"train config: {msg}")

        _check_types(self)
        check_path_name(self.out_dir)
        if Path(self.out_dir).exists() and not Path(self.out_dir).is_dir():
            raise bad(f"out_dir {self.out_dir} is a file; the run directory must be a directory")
        if not self.train:
            raise bad("no training corpus given")
        if self.softmax not in SOFTMAX_CHOICES:
            raise bad(f"softmax must be {', '.join(SOFTMAX_CHOICES[:-1])} or {SOFTMAX_CHOICES[-1]}, "
                      f"got {self.softmax!r}")
        if self.precision not in PRECISION_CHOICES:
            raise bad(f"precision must be {', '.join(PRECISION_CHOICES)}, got {self.precision!r}")
        if self.batching not in ("stream", "sentence"):
            raise bad(f"batching must be stream or sentence, got {self.batching!r}")
        if self.eval_mode not in ("stream", "sentence"):
            raise bad(f"eval_mode must be stream or sentence, got {self.eval_mode!r}")
        if self.optimizer not in ("adagrad", "adam", "sgd"):
            raise bad(f"optimizer must be adagrad, adam or sgd, got {self.optimizer!r}")
        if self.batch_tokens is not None:
            self.batch_size = None
        if self.batch_size is None and self.batch_tokens is None:
            raise bad("give batch_size or batch_tokens")
        for name in ("batch_size", "batch_tokens", "unroll", "grad_accum", "log_every", "eval_every",
                     "checkpoint_every", "eval_batch_size", "num_samples", "block_lines"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise bad(f"{name} must be a positive integer, got {v!r}")
        if self.grad_accum > MAX_GRAD_ACCUM:
            raise bad(f"grad_accum must be at most {MAX_GRAD_ACCUM} (each micro-batch of a step draws "
                      f"from its own seeded generator), got {self.grad_accum}")
        if self.new_data and not self.resume:
            raise bad("new_data starts a new epoch of a resumed run: give it with resume")
        if self.time_limit is not None and self.time_limit <= 0:
            raise bad(f"time_limit must be a positive number of minutes, got {self.time_limit!r}")
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 0:
            raise bad(f"keep_checkpoints must be a non-negative integer, got {self.keep_checkpoints!r}")
        if self.max_steps is not None and self.max_steps < 0:
            raise bad(f"max_steps must be >= 0, got {self.max_steps}")
        if self.max_steps is None and self.epochs is None:
            raise bad("give max_steps or epochs (or both)")
        if not 0.0 <= self.dropout < 1.0:
            raise bad(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.weight_drop < 1.0:
            raise bad(f"weight_drop must be in [0, 1), got {self.weight_drop}")
        if self.lr is not None and not self.lr > 0:
            raise bad(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.state_reset <= 1.0:
            raise bad(f"state_reset must be in [0, 1], got {self.state_reset}")
        if not 0 < self.lr_decay <= 1:
            raise bad(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise bad(f"lr_schedule must be constant, linear or cosine, got {self.lr_schedule!r}")
        if self.lr_schedule != "constant" and self.max_steps is None:
            raise bad(f"lr_schedule {self.lr_schedule} decays to 0 at max_steps: give max_steps")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise bad(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")

    def lr_factor(self, step: int, rewarm_from: int | None = None) -> float:
        """The schedule's multiplier for the update after ``step`` finished steps (a pure function
        of the step, so a resumed run follows the same curve). ``rewarm_from``: the step a run was
        continued at from a saved model; its fresh optimizer warms up again from there."""
        f = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if rewarm_from is not None:
            f *= min(1.0, (step + 1 - rewarm_from) / (self.warmup_steps or REWARM_STEPS))
        if self.lr_schedule == "constant":
            return f
        frac = min(1.0, step / max(1, self.max_steps))
        decay = 1.0 - frac if self.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
        return f * decay

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else {"adagrad": 0.2, "adam": 1e-3, "sgd": 1.0}[self.optimizer]

    def regularisation(self) -> Regularisation:
        return Regularisation(self.dropout, self.variational_dropout, self.weight_drop)

    def model_config(self) -> ElmoConfig:
        if self.model in TRAIN_PRESETS:
            return TRAIN_PRESETS[self.model]()
        path = Path(self.model)
        if path.is_file():
            return ElmoConfig.from_json_file(path)
        raise ElmoError(f"model {self.model!r}: neither a preset ({', '.join(TRAIN_PRESETS)}) nor an "
                        "options.json file")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "train config") -> TrainConfig:
        """The options of a JSON object; keys starting with ``_`` are comments (a config file's
        ``"_command"`` says how it is run)."""
        if not isinstance(d, dict):
            raise ElmoError(f"{source}: expected a JSON object of options, got {type(d).__name__}")
        d = {k: v for k, v in d.items() if not k.startswith("_")}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ElmoError(f"{source}: unknown option {', '.join(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ElmoError(f"{source}: {e}") from None


# A field's annotation -> the JSON values it takes. Ints are never bools, floats take ints, and
# nothing is coerced: "false" is not False, 64.9 is not 64.
_TYPES: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _check_types(cfg: TrainConfig) -> None:
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        kind, _, optional = str(f.type).partition(" | ")
        if v is None and optional == "None":
            continue
        if not _TYPES[kind](v):
            want = {"int": "an integer", "float": "a finite number", "bool": "true or false",
                    "str": "a string", "list[str]": "a list of strings"}[kind]
            raise ElmoError(f"train config: {f.name} must be {want}{' or null' if optional else ''}, got {v!r}")
