"""Model configuration in the published ``options.json`` schema.

The published biLM (bilm-tf, AllenNLP) describes a model with a nested JSON object::

    {"lstm": {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"},
     "char_cnn": {"embedding": {"dim"}, "filters", "n_highway", "n_characters",
                  "max_characters_per_token", "activation"}}

:class:`ElmoConfig` is the flat, typed view of it. We keep the published schema as the on-disk
format of our own models too, so every model this library makes exports to the published layout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ElmoError
from ..io.fileio import read_json
from .chars import MAX_CHARS

# Keys bilm-tf writes into training configs; harmless at inference, so accepted and ignored.
TRAINING_KEYS = {
    "bidirectional", "dropout", "all_clip_norm_val", "n_epochs", "n_train_tokens", "batch_size",
    "n_tokens_vocab", "unroll_steps", "n_negative_samples_batch", "learning_rate",
    "share_embedding_softmax", "sample_softmax",
}
LSTM_REQUIRED = {"dim", "projection_dim", "n_layers"}
LSTM_OPTIONAL = {"cell_clip", "proj_clip", "use_skip_connections"}
CNN_REQUIRED = {"embedding", "filters", "n_characters", "max_characters_per_token"}
CNN_OPTIONAL = {"n_highway", "activation"}
# Where each attribute lives in the published schema (errors name the option as the file spells it).
OPTION_NAMES = {"lstm_dim": "lstm.dim", "projection_dim": "lstm.projection_dim", "n_layers": "lstm.n_layers",
                "cell_clip": "lstm.cell_clip", "proj_clip": "lstm.proj_clip",
                "char_embed_dim": "char_cnn.embedding.dim"}
N_CHARACTERS = 262  # 261 published char ids (+1 shifted) plus id 0 for padded token positions


@dataclass
class ElmoConfig:
    """Shapes and constants of a biLM. Defaults are the published small model."""

    lstm_dim: int = 1024                 # D: LSTM cell size
    projection_dim: int = 128            # P: projected hidden size, and the token embedding size
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True
    char_embed_dim: int = 16
    filters: list[list[int]] = field(default_factory=lambda: [
        [1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    n_highway: int = 1
    activation: str = "relu"
    n_characters: int = N_CHARACTERS
    max_characters_per_token: int = MAX_CHARS

    def __post_init__(self) -> None:
        self.filters = _filters(self.filters, "config")
        self.validate()

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        """Size of each ELMo layer E_k: forward and backward concatenated."""
        return 2 * self.projection_dim

    @property
    def num_layers_out(self) -> int:
        """Number of representations E_0 .. E_L."""
        return self.n_layers + 1

    def validate(self, source: str = "config") -> None:
        def bad(msg: str) -> ElmoError:
            return ElmoError(f"{source}: {msg}")

        for name, hi in (("lstm_dim", MAX_DIM), ("projection_dim", MAX_DIM), ("n_layers", MAX_LAYERS),
                         ("char_embed_dim", MAX_DIM)):
            _check_int(getattr(self, name), f"option {OPTION_NAMES[name]}", 1, hi, source)
        _check_int(self.n_highway, "option char_cnn.n_highway", 0, MAX_LAYERS, source)
        for name in ("cell_clip", "proj_clip"):
            _check_clip(getattr(self, name), f"option {OPTION_NAMES[name]}", source)
        if not isinstance(self.use_skip_connections, bool):
            raise bad(f"option lstm.use_skip_connections must be true or false, got "
                      f"{self.use_skip_connections!r}")
        if self.activation not in ("relu", "tanh"):
            raise bad(f"option char_cnn.activation must be 'relu' or 'tanh', got {self.activation!r}")
        self._check_characters(source)
        if not self.filters:
            raise bad("option char_cnn.filters is empty")
        C = self.max_characters_per_token
        for w, n in self.filters:
            if not (1 <= w <= C) or not (1 <= n <= MAX_DIM):
                raise bad(f"option char_cnn.filters has a bad entry [{w}, {n}] (widths 1..{C}, "
                          f"counts 1..{MAX_DIM})")
        if self.num_parameters() > MAX_PARAMETERS:
            raise bad(f"the options describe {self.num_parameters():,} parameters, more than the "
                      f"{MAX_PARAMETERS:,} this library accepts (a mistyped size?)")

    def _check_characters(self, source: str) -> None:
        """The character vocabulary and token width: the published ones (a subclass for another
        model family checks its own)."""
        if self.n_characters != N_CHARACTERS or isinstance(self.n_characters, bool):
            raise ElmoError(f"{source}: option char_cnn.n_characters is {self.n_characters}; this model format "
                            f"needs {N_CHARACTERS} (261 character ids + padding; 261 from a training config is "
                            f"accepted)")
        if self.max_characters_per_token != MAX_CHARS or isinstance(self.max_characters_per_token, bool):
            raise ElmoError(f"{source}: option char_cnn.max_characters_per_token must be {MAX_CHARS}, "
                            f"got {self.max_characters_per_token}")

    def num_parameters(self) -> int:
        """Parameters of the biLM these options describe (checked before anything is allocated)."""
        E, n, P, D = self.char_embed_dim, self.n_filters, self.projection_dim, self.lstm_dim
        cnn = self.n_characters * E + sum(w * E * c + c for w, c in self.filters)
        cnn += self.n_highway * (2 * n * n + 2 * n) + n * P + P
        lstm = self.n_layers * 2 * ((P + P) * 4 * D + 4 * D + D * P)   # both directions
        return cnn + lstm

    # -- the published schema ----------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: dict[str, Any], source: str = "options") -> ElmoConfig:
        """Parse a published ``options.json`` object; ``source`` names the file in errors."""
        if not isinstance(options, dict):
            raise ElmoError(f"{source}: expected a JSON object, got {type(options).__name__}")
        _check_keys(options, {"lstm", "char_cnn"}, TRAINING_KEYS, source, "")
        lstm, cnn = options["lstm"], options["char_cnn"]
        for sect, d in (("lstm", lstm), ("char_cnn", cnn)):
            if not isinstance(d, dict):
                raise ElmoError(f"{source}: option {sect} must be an object")
        _check_keys(lstm, LSTM_REQUIRED, LSTM_OPTIONAL, source, "lstm.")
        _check_keys(cnn, CNN_REQUIRED, CNN_OPTIONAL, source, "char_cnn.")
        emb = cnn["embedding"]
        if not isinstance(emb, dict):
            raise ElmoError(f"{source}: option char_cnn.embedding must be an object")
        _check_keys(emb, {"dim"}, set(), source, "char_cnn.embedding.")
        n_chars = cnn["n_characters"]
        if n_chars == N_CHARACTERS - 1 and not isinstance(n_chars, bool):
            n_chars = N_CHARACTERS  # a bilm-tf training config; ids are shifted at inference
        try:
            cfg = cls(
                lstm_dim=lstm["dim"],
                projection_dim=lstm["projection_dim"],
                n_layers=lstm["n_layers"],
                cell_clip=lstm.get("cell_clip"),
                proj_clip=lstm.get("proj_clip"),
                use_skip_connections=lstm.get("use_skip_connections", False),
                char_embed_dim=emb["dim"],
                filters=cnn["filters"],        # checked by __post_init__, re-prefixed below
                n_highway=0 if cnn.get("n_highway") is None else cnn["n_highway"],
                activation=cnn.get("activation", "relu"),
                n_characters=n_chars,
                max_characters_per_token=cnn["max_characters_per_token"],
            )
        except ElmoError as e:
            raise ElmoError(f"{source}: {str(e).split(': ', 1)[-1]}") from None
        return cfg

    def to_options(self) -> dict[str, Any]:
        return {
            "lstm": {
                "dim": self.lstm_dim, "projection_dim": self.projection_dim, "n_layers": self.n_layers,
                "cell_clip": self.cell_clip, "proj_clip": self.proj_clip,
                "use_skip_connections": self.use_skip_connections,
            },
            "char_cnn": {
                "embedding": {"dim": self.char_embed_dim}, "filters": self.filters,
                "n_highway": self.n_highway, "n_characters": self.n_characters,
                "max_characters_per_token": self.max_characters_per_token,
                "activation": self.activation,
            },
        }

    @classmethod
    def from_json_file(cls, path: str | Path) -> ElmoConfig:
        return cls.from_options(read_json(path, "options file", expect=None), source=str(path))

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_options(), indent=2) + "\n", encoding="utf-8")


# Bounds that keep a mistyped size from allocating until the machine dies; the largest published
# model (4096/512, 2 highways) has about 94M parameters.
MAX_DIM = 65_536
MAX_LAYERS = 64
MAX_PARAMETERS = 2_000_000_000


def _check_int(v: Any, what: str, lo: int, hi: int, source: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ElmoError(f"{source}: {what} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ElmoError(f"{source}: {what} must be in {lo}..{hi:,}, got {v:,}")


def _check_clip(v: Any, what: str, source: str) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ElmoError(f"{source}: {what} must be a number or null, got {v!r}")
    if not math.isfinite(v) or v <= 0:
        raise ElmoError(f"{source}: {what} must be a positive finite number or null, got {v!r}")


def _filters(filters: Any, source: str) -> list[list[int]]:
    """``[[width, count], ...]`` with integer entries (a float or a bool is not rounded)."""
    if not isinstance(filters, (list, tuple)):
        raise ElmoError(f"{source}: option char_cnn.filters must be a list of [width, count], got {filters!r}")
    out = []
    for f in filters:
        if (not isinstance(f, (list, tuple)) or len(f) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in f)):
            raise ElmoError(f"{source}: option char_cnn.filters entry {f!r} is not [width, count] integers")
        out.append([f[0], f[1]])
    return out


def _check_keys(d: dict, required: set[str], optional: set[str], source: str, prefix: str) -> None:
    missing = sorted(required - d.keys())
    if missing:
        raise ElmoError(f"{source}: missing option {', '.join(prefix + k for k in missing)}")
    extra = sorted(d.keys() - required - optional)
    if extra:
        raise ElmoError(f"{source}: unknown option {', '.join(prefix + k for k in extra)}")


# Shapes of the published models (see the README table); 'tiny' is the fixture's shape, for tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(lstm_dim=64, projection_dim=16, char_embed_dim=4, n_highway=2,
                 filters=[[1, 4], [2, 8], [3, 16], [4, 32], [5, 64]]),
    "small": dict(lstm_dim=1024, projection_dim=128, n_highway=1),
    "medium": dict(lstm_dim=2048, projection_dim=256, n_highway=1),
    "original": dict(lstm_dim=4096, projection_dim=512, n_highway=2),
}


def preset(name: str, **overrides: Any) -> ElmoConfig:
    if name not in PRESETS:
        raise ElmoError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return ElmoConfig(**{**PRESETS[name], **overrides})
