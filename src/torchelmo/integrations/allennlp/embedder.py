"""``allennlp.commands.elmo.ElmoEmbedder``: all layers of a biLM as numpy arrays, by sentence,
batch, stream of sentences or file (HDF5 as ``allennlp elmo`` wrote it; ``input_file`` a path or
an open stream).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import numpy as np
import torch

from ...embed import engine
from ...errors import ElmoError
from ...model.bilm import BiLM
from ...model.chars import batch_to_ids, sentence_lengths
from ...model.registry import ALIASES, REGISTRY
from ...runtime import resolve_cuda_device
from .checks import ConfigurationError
from .modules import _ElmoBiLm

DEFAULT_BATCH_SIZE = 64          # AllenNLP's ElmoEmbedder and `allennlp elmo`
# What ElmoEmbedder() and ElmoTokenEmbedder() load without files: AllenNLP's default, 2x4096_512_2048cnn_2xhighway.
DEFAULT_MODEL = "original"
# allennlp.commands.elmo's names for that model's files (code such as flair's reads them).
DEFAULT_OPTIONS_FILE = REGISTRY[ALIASES[DEFAULT_MODEL]]["options"]
DEFAULT_WEIGHT_FILE = REGISTRY[ALIASES[DEFAULT_MODEL]]["weights"]


class ElmoEmbedder:
    """``allennlp.commands.elmo.ElmoEmbedder``: all layers of a biLM as numpy arrays.

    ``ElmoEmbedder()`` loads AllenNLP's default, the original published model (downloaded once
    and cached); ``model=`` takes any name :meth:`BiLM.from_pretrained` takes instead (e.g.
    ``"default"``, the small model shipped in the package, offline). ``cuda_device``: -1 the CPU,
    N GPU N. Arrays are ``(L, n_tokens, 2P)``: ``(3, n, 1024)`` for the published models.
    ``elmo_bilm`` is AllenNLP's :class:`._ElmoBiLm` over the model (its ``_elmo_lstm._states`` is
    the carried state), ``bilm`` the torchelmo :class:`~torchelmo.BiLM` itself.
    """

    def __init__(self, options_file: str | None = None, weight_file: str | None = None,
                 cuda_device: int = -1, *, model: str | Path | None = None, stateful: bool = True) -> None:
        if (options_file is None) != (weight_file is None):
            raise ElmoError("ElmoEmbedder: options_file and weight_file go together")
        if options_file is not None and model is not None:
            raise ElmoError("ElmoEmbedder: give either model or options_file/weight_file, not both")
        device = resolve_cuda_device(cuda_device, "cuda_device")
        if options_file is not None:
            bilm = BiLM.from_published(options_file, weight_file, stateful=stateful)
        else:
            bilm = BiLM.from_pretrained(DEFAULT_MODEL if model is None else model, stateful=stateful)
        self.elmo_bilm = _ElmoBiLm(None, None, module=bilm.to(device).eval())
        self.cuda_device = cuda_device

    @property
    def bilm(self) -> BiLM:
        return self.elmo_bilm.bilm

    def batch_to_embeddings(self, batch: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, L, T, 2P)`` activations and the ``(B, T)`` mask of one batch."""
        with torch.no_grad():
            out = self.bilm(batch_to_ids(batch).to(self.bilm.device))
        return torch.stack(out.layers, dim=1), out.mask

    def _empty(self) -> np.ndarray:
        return np.zeros((self.bilm.num_layers, 0, self.bilm.output_dim), np.float32)

    def embed_sentence(self, sentence: list[str]) -> np.ndarray:
        """One tokenised sentence: ``(L, n_tokens, 2P)``."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: list[list[str]]) -> list[np.ndarray]:
        """One array per sentence of ``batch``, run as one batch (an empty sentence: ``(L, 0, 2P)``)."""
        sentence_lengths(batch, "ElmoEmbedder", allow_empty=True)   # None, a str: one-line errors
        if all(len(s) == 0 for s in batch):          # nothing to run; the carried state is kept
            return [self._empty() for _ in batch]
        return engine.embed_batch(self.bilm, batch, "all", None)

    def embed_sentences(self, sentences: Iterable[list[str]],
                        batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[np.ndarray]:
        """A generator of arrays, in order, running ``batch_size`` sentences at a time."""
        if sentences is None or isinstance(sentences, (str, bytes)):
            raise ElmoError(f"ElmoEmbedder.embed_sentences: expected an iterable of sentences (lists of "
                            f"tokens), got {type(sentences).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"batch_size must be a positive integer, got {batch_size!r}")
        batch: list[list[str]] = []
        for s in sentences:
            batch.append(s)
            if len(batch) == batch_size:
                yield from self.embed_batch(batch)
                batch = []
        if batch:
            yield from self.embed_batch(batch)

    def embed_file(self, input_file: IO | str | Path, output_file_path: str | Path,
                   output_format: str = "all", batch_size: int = DEFAULT_BATCH_SIZE,
                   forget_sentences: bool = False, use_sentence_keys: bool = False) -> None:
        """Embed a file of whitespace-tokenised sentences, one per line, into HDF5 as ``allennlp
        elmo`` did: datasets named by line index (or, ``use_sentence_keys``, by the sentence), plus
        ``sentence_to_index`` unless ``forget_sentences``. ``output_format``: all, top or average.
        ``input_file`` is an open text file (closed afterwards, as AllenNLP does) or a path.
        Batches are ``batch_size`` lines in file order; the carried state starts from zero. A blank
        line is AllenNLP's :class:`~.checks.ConfigurationError`, as in AllenNLP.
        """
        from ...embed.hdf5 import BlankLineError, embed_file

        if output_format not in ("all", "top", "average"):
            raise ElmoError(f"output_format must be all, top or average, got {output_format!r}")
        with _input_path(input_file) as path:
            try:
                embed_file(self.bilm, path, output_file_path, output_format,
                           batch_size=batch_size if self.bilm.stateful else None,
                           sentence_index=not forget_sentences,
                           keys="sentence" if use_sentence_keys else "index", blank_lines="error")
            except BlankLineError as e:
                raise ConfigurationError(str(e)) from None


class _input_path:
    """A path for ``input_file``: its own, or a temporary copy of a stream's text."""

    def __init__(self, input_file: IO | str | Path) -> None:
        self.file, self.tmp = input_file, None

    def __enter__(self) -> str:
        if not hasattr(self.file, "read"):
            return str(self.file)
        name = getattr(self.file, "name", None)
        if isinstance(name, str) and Path(name).is_file() and self.file.tell() == 0:
            return name
        self.tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False)
        n = 1
        try:
            with self.tmp:
                for line in self.file:
                    self.tmp.write(line if isinstance(line, str) else line.decode("utf-8"))
                    n += 1
        except BaseException as e:   # __exit__ will not run: the copy goes here
            Path(self.tmp.name).unlink(missing_ok=True)
            if isinstance(e, UnicodeDecodeError):
                raise ElmoError(f"{name if isinstance(name, str) else 'input_file'}: not UTF-8 text near "
                                f"line {n} ({e.reason})") from None
            raise
        return self.tmp.name

    def __exit__(self, *exc) -> bool:
        if self.tmp is not None:
            Path(self.tmp.name).unlink(missing_ok=True)
        if hasattr(self.file, "close"):
            self.file.close()
        return False
