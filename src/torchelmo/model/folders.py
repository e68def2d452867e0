"""What a model directory is, found by what it holds: one loader behind ``BiLM.from_pretrained``
and so behind every command, integration and probe that takes a model.

Each layout says what marks it and how to load it. The modules that define a kind of model add
theirs (:mod:`.bilm`: native, published and a training run's directory; :mod:`.manylangs`:
ELMoForManyLangs'), so this module knows none of them; a directory that matches none gets an
error naming every layout looked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ElmoError


@dataclass(frozen=True)
class Layout:
    name: str                              # "native", "published", ...: for messages
    holds: str                             # what marks it, for the error that lists the layouts
    matches: Callable[[Path], bool]        # directory -> whether it has this layout
    load: Callable[..., Any]               # (model class, directory, **options) -> model
    order: int                             # lower is tried first (a marker another layout shares)


LAYOUTS: list[Layout] = []

# A training run's directory (``elmo train --out RUN``): its settings, written first, and its
# model directories, the final one first.
RUN_CONFIG_NAME = "train_config.json"
RUN_MODEL_DIRS = ("model", "best")


def register(layout: Layout) -> None:
    """Add a layout (again under the same name: replaced)."""
    LAYOUTS[:] = sorted([l for l in LAYOUTS if l.name != layout.name] + [layout], key=lambda l: l.order)


def find(path: Path) -> Layout:
    """The layout of directory ``path``; an :class:`ElmoError` naming each one looked for if none."""
    for layout in LAYOUTS:
        if layout.matches(path):
            return layout
    looked = "; ".join(f"{l.name} ({l.holds})" for l in LAYOUTS)
    raise ElmoError(f"{path}: not a model directory; looked for {looked}")


def describe(path: Path) -> str:
    """The name of ``path``'s layout (for ``elmo info``)."""
    return find(path).name
