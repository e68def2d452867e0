"""Models on the Hugging Face Hub: repository ids as model names, and model cards.

A Hub repository holding the native format (``config.json`` + ``model.safetensors``, what
:meth:`BiLM.save_pretrained` writes) is loaded by its id, ``owner/name`` or
``owner/name@revision`` (a branch, tag or commit); one holding a whole LM (what
:meth:`LanguageModel.save_pretrained` writes: also ``training.json`` and ``vocab.txt``) is loaded
by :meth:`LanguageModel.from_pretrained` the same way. Files come through ``huggingface_hub``
(the optional ``hub`` extra) and its cache, so ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``
and ``HF_TOKEN`` apply as everywhere else; ``ELMO_OFFLINE=1`` also keeps it to the cache.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ElmoError
from ..io.download import offline_mode
from ..io.fileio import atomic_path
from . import weights
from .registry import accepted_names

# The files a model needs: the native format, and for an LM its softmax's description and vocabulary.
FILES = [weights.CONFIG_NAME, weights.WEIGHTS_NAME, weights.EXTRA_CONFIG_NAME, weights.VOCAB_NAME]
REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_])(?:@(?P<revision>[\w./-]+))?$")
CARD_NAME = "README.md"
CARD_MARK = "<!-- model card written by torchelmo's save_pretrained -->"


NOT_FOUND = "no such model directory, and not a published model name"


def unknown_model(name: str, why: str = NOT_FOUND, accepted: str | None = None) -> ElmoError:
    return ElmoError(f"{name}: {why}; accepted: {accepted or accepted_names()}")


def is_repo_id(name: str) -> bool:
    return REPO_ID.match(name) is not None and ".." not in name


def resolve(name: str, accepted: str | None = None) -> Path:
    """The local snapshot directory of Hub model ``name`` (downloaded once, then cached); any
    name that is not a Hub id gets the error that lists every accepted name (``accepted``, by
    default those of ``BiLM.from_pretrained``)."""
    m = REPO_ID.match(name)
    if m is None or ".." in name:
        raise unknown_model(name, accepted=accepted)
    try:
        import huggingface_hub
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise unknown_model(name, "no such model directory, and loading it from the Hugging Face Hub "
                                  "needs huggingface_hub: pip install 'torchelmo[hub]'", accepted) from None
    from .. import __version__
    repo, revision = m["repo"], m["revision"]
    try:
        path = huggingface_hub.snapshot_download(
            repo, revision=revision, allow_patterns=FILES, library_name="torchelmo",
            library_version=__version__, local_files_only=offline_mode())
    except hf_errors.RevisionNotFoundError:
        raise ElmoError(f"{name}: the Hugging Face Hub repository {repo} has no revision "
                        f"{revision!r}") from None
    except hf_errors.RepositoryNotFoundError:
        raise unknown_model(name, "no such model directory, and no such (or no accessible) "
                                  "Hugging Face Hub repository", accepted) from None
    except hf_errors.LocalEntryNotFoundError:
        raise ElmoError(f"{name}: no such model directory, and not in the Hugging Face Hub cache while "
                        "the Hub cannot be reached (HF_HUB_OFFLINE, ELMO_OFFLINE or no connection)") from None
    except (hf_errors.HFValidationError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ElmoError(f"{name}: cannot get it from the Hugging Face Hub ({first})") from None
    path = Path(path)
    if not (path / weights.CONFIG_NAME).is_file():
        raise ElmoError(f"{name}: the Hugging Face Hub repository holds no {weights.CONFIG_NAME} "
                        f"(a torchelmo model is {weights.CONFIG_NAME} + {weights.WEIGHTS_NAME})")
    return path


# ------------------------------------------------------------------------------------------------
# Model cards.
# ------------------------------------------------------------------------------------------------
def _yaml_list(key: str, values: str | list[str] | None) -> list[str]:
    if not values:
        return []
    values = [values] if isinstance(values, str) else list(values)
    return [f"{key}:"] + [f"- {v}" for v in values]


def model_card(bilm, repo_id: str | None = None, description: str | None = None,
               license: str | None = None, language: str | list[str] | None = None,
               datasets: str | list[str] | None = None) -> str:
    """A Hub model card (README.md with YAML metadata) describing ``bilm``."""
    cfg = bilm.config
    meta = ["library_name: torchelmo", "pipeline_tag: feature-extraction",
            *_yaml_list("tags", ["elmo", "torchelmo", "contextual-embeddings"])]
    meta += [f"license: {license}"] if license else []
    meta += _yaml_list("language", language) + _yaml_list("datasets", datasets)
    name = repo_id or "OWNER/NAME"
    n_params = sum(p.numel() for p in bilm.parameters())
    return "\n".join([
        "---", *meta, "---", CARD_MARK, "",
        f"# {repo_id.split('/')[-1] if repo_id else 'ELMo biLM'}", "",
        description or "An ELMo bidirectional language model (Peters et al. 2018) for torchelmo.", "",
        "## Use", "",
        "```python",
        "from torchelmo import BiLM, batch_to_ids",
        "",
        f'bilm = BiLM.from_pretrained("{name}")   # pip install "torchelmo[hub]"',
        'out = bilm(batch_to_ids([["The", "cat", "sat", "."]]))',
        (f"layers, mask = out.layers, out.mask   # {cfg.num_layers_out} layers, "
         f"each (batch, tokens, {cfg.output_dim})"),
        "```", "",
        f"or from the command line: `elmo embed sentences.txt out.hdf5 --all --model {name}`.", "",
        "## Model", "",
        f"- Parameters: {n_params:,} (the biLM; no softmax)",
        (f"- Layers out: {cfg.num_layers_out} (E0, the char-CNN token embedding, and {cfg.n_layers} "
         f"biLSTM layers), each {cfg.output_dim}-dimensional"),
        (f"- LSTM: {cfg.n_layers} layers, cell {cfg.lstm_dim}, projection {cfg.projection_dim}; "
         f"char-CNN: {cfg.n_filters} filters, {cfg.n_highway} highway layer(s)"),
        (f"- Files: `{weights.CONFIG_NAME}` (the published options.json schema) and "
         f"`{weights.WEIGHTS_NAME}`; `BiLM.export_published` converts to the AllenNLP/bilm-tf layout."),
        "",
    ])


def write_model_card(bilm, out_dir: str | Path, **card) -> Path | None:
    """Write ``README.md`` (see :func:`model_card` for ``card``) into ``out_dir``, unless a
    README.md that torchelmo did not write is there: a hand-written card is kept."""
    path = Path(out_dir) / CARD_NAME
    if path.exists() and CARD_MARK not in path.read_text(encoding="utf-8", errors="replace"):
        return None
    with atomic_path(path) as tmp:
        tmp.write_text(model_card(bilm, **card), encoding="utf-8")
    return path
