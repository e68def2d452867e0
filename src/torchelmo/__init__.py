"""elmo: ELMo (Peters et al. 2018) in PyTorch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import ElmoError

__version__ = "0.1.0"
__all__ = ["BiLM", "BiLMOutput", "Elmo", "ElmoConfig", "ElmoError", "ScalarMix", "batch_to_ids",
           "preset", "word_to_char_ids", "__version__"]

# The public names and their modules, imported on first use: `import torchelmo` stays light, so
# the `elmo` command is inside its own error handling (Ctrl-C included) before torch loads.
_EXPORTS = {"BiLM": "model.bilm", "BiLMOutput": "model.bilm", "batch_to_ids": "model.chars",
            "word_to_char_ids": "model.chars", "ElmoConfig": "model.config", "preset": "model.config",
            "Elmo": "model.mix", "ScalarMix": "model.mix"}

if TYPE_CHECKING:
    from .model.bilm import BiLM, BiLMOutput
    from .model.chars import batch_to_ids, word_to_char_ids
    from .model.config import ElmoConfig, preset
    from .model.mix import Elmo, ScalarMix


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif not name.startswith("__"):
        try:   # a subpackage, as `torchelmo.numerics` after `import torchelmo`
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
