"""The names ``from_pretrained`` takes: ``default`` (the model shipped in the package), the four
published bilm-tf/AllenNLP models and their aliases, and where each one's files come from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import ElmoError
from ..io.download import cached_path, seed_cache
from ..io.fileio import check_path_name
from .config import ElmoConfig
from .weights import CONFIG_NAME

_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
REGISTRY: dict[str, dict[str, str | None]] = {
    name: {
        "options": f"{_S3}/{name}/elmo_{name}_options.json",
        "weights": f"{_S3}/{name}/elmo_{name}_weights.hdf5",
        # Not pinned yet: the published files' digests could not be read where this was written.
        # Where None, a download is cached only once its content checks out (resolve_published),
        # and the digest recorded then is checked on every later use.
        "options_sha256": None,
        "weights_sha256": None,
    }
    for name in (
        "2x1024_128_2048cnn_1xhighway",
        "2x2048_256_2048cnn_1xhighway",
        "2x4096_512_2048cnn_2xhighway",
        "2x4096_512_2048cnn_2xhighway_5.5B",
    )
}
ALIASES = {"small": "2x1024_128_2048cnn_1xhighway", "medium": "2x2048_256_2048cnn_1xhighway",
           "original": "2x4096_512_2048cnn_2xhighway", "original-5.5b": "2x4096_512_2048cnn_2xhighway_5.5B"}


def is_published(name: str) -> bool:
    return name in REGISTRY or name in ALIASES


def accepted_names() -> str:
    """Every name ``from_pretrained`` accepts, for error messages."""
    alias_of = {full: alias for alias, full in ALIASES.items()}
    published = [f"{n} ({alias_of[n]})" if n in alias_of else n for n in REGISTRY]
    return ("'default' (the embedded model), published models " + ", ".join(published)
            + ", a model directory, or a Hugging Face Hub id owner/name[@revision]")


def check_model_name(name: str | Path) -> None:
    """A one-line error for a model name that no directory can have (a path component over 255
    bytes, a NUL character), before the first look at the file system raises ``OSError``."""
    check_path_name(name)


def default_model_dir() -> Path:
    """The small model shipped inside the package (see its MODEL_CARD.md)."""
    d = Path(__file__).parents[1] / "default_model"
    if not (d / CONFIG_NAME).is_file():
        raise ElmoError(f"{d}: the embedded default model is missing from this installation")
    return d


def resolve_published(name: str, check_weights: Callable[[ElmoConfig, Path], None]) -> tuple[Path, Path]:
    """Download (or find in the cache) a registry model's options and weights. Without a pinned
    digest, the weights are cached only once ``check_weights(config, path)`` (the caller's load of
    every dataset the options ask for) has passed."""
    name = ALIASES.get(name, name)
    if name not in REGISTRY:
        raise ElmoError(f"unknown model {name!r}; published models: {', '.join(REGISTRY)}")
    entry = REGISTRY[name]
    options = cached_path(entry["options"], entry["options_sha256"],
                          verify=lambda p: ElmoConfig.from_json_file(p) and None)
    config = ElmoConfig.from_json_file(options)
    return options, cached_path(entry["weights"], entry["weights_sha256"],
                                verify=lambda path: check_weights(config, path))


def seed_published(name: str, options_file: str | Path, weight_file: str | Path,
                   check_weights: Callable[[ElmoConfig, Path], None]) -> tuple[Path, Path]:
    """Cache a registry model's options and weights from local files, once
    ``check_weights(config, weight_file)`` (the caller's load) has passed on the pair."""
    full = ALIASES.get(name, name)
    if full not in REGISTRY:
        raise ElmoError(f"unknown model {name!r}; published models: {', '.join(REGISTRY)}")
    entry = REGISTRY[full]
    config = ElmoConfig.from_json_file(options_file)
    check_weights(config, Path(weight_file))
    return (seed_cache(entry["options"], options_file, entry["options_sha256"], kind="json"),
            seed_cache(entry["weights"], weight_file, entry["weights_sha256"], kind="hdf5"))


def find_published_files(model_dir: Path) -> tuple[Path, Path] | None:
    """An ``*options.json`` and an ``*.hdf5`` weight file in a directory, if it holds one of each."""
    opts = sorted(model_dir.glob("*options.json"))
    weights = [p for p in sorted(model_dir.glob("*.hdf5")) if "weights" in p.name] or \
        sorted(model_dir.glob("*weights*.hdf5")) or sorted(model_dir.glob("*.hdf5"))
    if len(opts) == 1 and weights:
        return opts[0], weights[0]
    return None
