"""Reading an ELMoForManyLangs model directory: its JSON configs, lexicons and state dicts."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import ElmoError
from ...io.fileio import check_path_name, read_json, read_small, refused_global
from .vocab import ONE_FIELD_TOKEN

CONFIG_NAME = "config.json"
CHAR_DIC, WORD_DIC = "char.dic", "word.dic"
TOKEN_EMBEDDER_PKL, ENCODER_PKL = "token_embedder.pkl", "encoder.pkl"

# The model configs the elmoformanylangs package ships, which the published models name without
# including them (its Embedder falls back to the package's copy when the model directory lacks it).
_SAMPLE_CONFIG: dict[str, Any] = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096,
                "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu",
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                       "n_highway": 2, "word_dim": 100, "char_dim": 50, "max_characters_per_token": 50},
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
BUNDLED_CONFIGS = {"cnn_50_100_512_4096_sample.json": _SAMPLE_CONFIG,
                   "cnn_0_100_512_4096_sample.json": _SAMPLE_CONFIG}


def _missing(path: Path) -> ElmoError:
    return ElmoError(f"{path}: missing (an ELMoForManyLangs model directory holds {CONFIG_NAME}, {CHAR_DIC}, "
                     f"{WORD_DIC}, {TOKEN_EMBEDDER_PKL} and {ENCODER_PKL})")


def _read_text(path: Path) -> str:
    if not path.exists() and not path.is_symlink():
        raise _missing(path)
    data = read_small(path, "dictionary")   # bytes: line breaks are split below, as their reader splits them
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ElmoError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise _missing(path)
    return read_json(path, "model config")


def read_lexicon(path: str | Path, specials: Sequence[str] = ()) -> dict[str, int]:
    """A ``char.dic``/``word.dic``: ``token<TAB>id`` lines, read as ELMoForManyLangs reads them.

    Lines are split where ``str.splitlines`` splits (their ``codecs`` reader does) and stripped of
    surrounding whitespace; a line left with one field is the entry of U+3000 (see
    ``ONE_FIELD_TOKEN``); a later line for a token replaces an earlier one. ``specials``: tokens
    that must be there.
    """
    path = Path(path)
    lexicon: dict[str, int] = {}
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, ONE_FIELD_TOKEN)
        if len(fields) != 2:
            raise ElmoError(f"{path}, line {n}: expected 'token<TAB>id', got {len(fields)} fields")
        token, i = fields
        try:
            lexicon[token] = int(i)
        except ValueError:
            raise ElmoError(f"{path}, line {n}: the id {i!r} is not an integer") from None
    missing = [t for t in specials if t not in lexicon]
    if missing:
        raise ElmoError(f"{path}: no entry for {', '.join(missing)} (ELMoForManyLangs' lexicons have "
                        f"{', '.join(specials)})")
    for token, i in lexicon.items():
        # The embedding has one row per entry (their EmbeddingLayer sizes it by len(lexicon)).
        if not 0 <= i < len(lexicon):
            raise ElmoError(f"{path}: {token!r} has id {i}, outside 0..{len(lexicon) - 1} (one id per entry)")
    return lexicon


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A ``.pkl`` state dict read with ``weights_only=True``: tensors and plain containers only,
    nothing in the file is run."""
    path = Path(path)
    if not path.exists():
        raise _missing(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any other global by name; a malformed file gives no such name.
        found = refused_global(e)
        if found:
            raise ElmoError(f"{path}: refused: holds Python objects ({found}) beyond tensors and plain "
                            f"containers (read with weights_only=True, so nothing in it was run)") from None
        operand = re.search(r"Unsupported operand (\d+)", str(e))
        with open(path, "rb") as f:
            pickled = f.read(1) == b"\x80"   # a pickle of protocol 2 or later; garbage starts otherwise
        if operand and pickled:   # a pickle instruction the safe reader does not run (a plain pickle's, say)
            raise ElmoError(f"{path}: refused: a pickle with instructions beyond tensors and plain containers "
                            f"(operand {operand[1]}); read with weights_only=True, so nothing in it was run") from None
        raise ElmoError(f"{path}: not a readable PyTorch file (a damaged pickle)") from None
    except (PermissionError, IsADirectoryError) as e:
        raise ElmoError(f"{path}: cannot read ({e.strerror})") from None
    except Exception as e:   # torch's readers raise many types for a damaged file (OSError too)
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise ElmoError(f"{path}: not a readable PyTorch file ({type(e).__name__}{': ' if first else ''}"
                        f"{first})") from None
    if not isinstance(state, dict):
        raise ElmoError(f"{path}: holds a {type(state).__name__}, not a state dict")
    for name, t in state.items():   # as native weights: NaN or inf would give NaN vectors silently
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ElmoError(f"{path}: {name} holds {bad} non-finite value(s) (NaN or inf); refused")
    return state


def resolve_config_path(model_dir: Path, config_path: str) -> Path | str:
    """Where their Embedder finds the model config: ``config_path`` under the model directory (an
    absolute one stays as it is), else its file name there, else the name of a config the
    elmoformanylangs package ships (returned as the name, a key of ``BUNDLED_CONFIGS``)."""
    check_path_name(config_path, f"{model_dir / CONFIG_NAME}: config_path")
    name = os.path.basename(config_path)
    for candidate in (model_dir / config_path, model_dir / name):
        if candidate.is_file():
            return candidate
    if name in BUNDLED_CONFIGS:
        return name
    raise ElmoError(f"{model_dir / CONFIG_NAME}: config_path {config_path!r} names no file (looked for it in the "
                    f"model directory, and for {name!r} there and among elmoformanylangs' own configs)")
