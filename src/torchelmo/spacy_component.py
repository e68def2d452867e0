"""ELMo vectors in spaCy: the ``elmo`` pipeline component (needs the ``spacy`` extra).

::

    nlp = spacy.blank("en")                      # or any pipeline with a tokenizer
    nlp.add_pipe("elmo", config={"model": "default", "layers": [1, 2]})
    doc = nlp("The cat sat on the mat.")
    doc[1]._.elmo            # (2P,)   the mix of the chosen layers (their mean by default)
    doc[1]._.elmo_layers     # (len(layers), 2P)
    doc._.elmo               # (n_tokens, 2P);  doc._.elmo_layers: (len(layers), n_tokens, 2P)
    doc[0:2]._.elmo          # (2P,)   the mean over the span's tokens

The factory is registered through the ``spacy_factories`` entry point, so ``add_pipe("elmo")``
works without importing this module. ``nlp.pipe`` runs up to ``batch_size`` docs per biLM batch,
similar lengths together; every doc starts from the zero state, so its vectors do not depend on
its batch mates (up to float32 rounding, about 3e-6).
Config: ``model`` (anything :meth:`BiLM.from_pretrained` takes), ``layers`` (indices, 0 = the
token layer; default all), ``scalar_mix_parameters`` (one per chosen layer, softmax-normalised as
in :class:`~torchelmo.ScalarMix`; default equal weights), ``gamma``, ``batch_size``, ``device``
(``auto``: CUDA when available) and ``set_vectors`` (``token.vector``, ``span.vector``,
``doc.vector`` and ``similarity`` use the mix).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc, Span, Token
from spacy.util import minibatch

from .bilm import BiLM
from .embed.engine import embed_sentences
from .errors import ElmoError
from .runtime import resolve_device

DOC_ATTRS = ("elmo", "elmo_layers")


def _register_extensions() -> None:
    for name in DOC_ATTRS:
        if not Doc.has_extension(name):
            Doc.set_extension(name, default=None)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=lambda t: _row(t.doc._.elmo, t.i))
        Token.set_extension("elmo_layers", getter=lambda t: _column(t.doc._.elmo_layers, t.i))
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_mean)


def _row(a: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if a is None else a[i]


def _column(a: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if a is None else a[:, i]


def _span_mean(span: Span) -> np.ndarray | None:
    mixed = span.doc._.elmo
    if mixed is None or len(span) == 0:
        return None
    return mixed[span.start:span.end].mean(0)


class ElmoComponent:
    """Sets ``Doc._.elmo`` / ``Doc._.elmo_layers`` (and through them the Token and Span views)."""

    def __init__(self, nlp: Language, name: str, model: str, layers: list[int] | None,
                 scalar_mix_parameters: list[float] | None, gamma: float, batch_size: int,
                 device: str, set_vectors: bool) -> None:
        self.name = name
        self.bilm = BiLM.from_pretrained(model).to(resolve_device(device, "elmo component: device")).eval()
        n = self.bilm.num_layers
        self.layers = list(range(n)) if layers is None else [int(k) for k in layers]
        if not self.layers or any(not -n <= k < n for k in self.layers):
            raise ElmoError(f"elmo component: layers must be indices in 0..{n - 1}, got {layers}")
        params = [0.0] * len(self.layers) if scalar_mix_parameters is None else list(scalar_mix_parameters)
        if len(params) != len(self.layers):
            raise ElmoError(f"elmo component: {len(params)} scalar_mix_parameters for "
                            f"{len(self.layers)} layers")
        self.weights = (gamma * torch.softmax(torch.tensor(params, dtype=torch.float64), 0)).numpy()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"elmo component: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.set_vectors = set_vectors
        _register_extensions()

    def __call__(self, doc: Doc) -> Doc:
        return next(iter(self.pipe([doc])))

    def pipe(self, stream: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        """``batch_size`` (``nlp.pipe``'s) docs are gathered at a time and run sorted by length,
        at most the component's ``batch_size`` per biLM batch."""
        for docs in minibatch(stream, size=batch_size or self.batch_size):
            arrays = embed_sentences(self.bilm, [[t.text for t in doc] for doc in docs], "all",
                                     batch_size=self.batch_size)
            for doc, arr in zip(docs, arrays):
                self._set(doc, arr)
                yield doc

    def _set(self, doc: Doc, arr: np.ndarray) -> None:
        chosen = arr[self.layers]                                   # (k, n, 2P)
        doc._.elmo_layers = chosen
        doc._.elmo = np.tensordot(self.weights, chosen, axes=1).astype(np.float32)  # (n, 2P)
        if self.set_vectors:
            doc.user_hooks["vector"] = lambda d: d._.elmo.mean(0) if len(d) else None
            doc.user_token_hooks["vector"] = lambda t: t._.elmo
            doc.user_span_hooks["vector"] = lambda s: s._.elmo
            # spaCy's own similarity would warn that the vocabulary has no vectors.
            for hooks in (doc.user_hooks, doc.user_token_hooks, doc.user_span_hooks):
                hooks["similarity"] = _cosine


def _cosine(a, b) -> float:
    u, v = a.vector, b.vector
    if u is None or v is None:
        return 0.0
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    return float(u @ v) / norm if norm else 0.0


@Language.factory("elmo", default_config={"model": "default", "layers": None, "scalar_mix_parameters": None,
                                          "gamma": 1.0, "batch_size": 64, "device": "auto",
                                          "set_vectors": False})
def make_elmo(nlp: Language, name: str, model: str, layers: list[int] | None,
              scalar_mix_parameters: list[float] | None, gamma: float, batch_size: int, device: str,
              set_vectors: bool) -> ElmoComponent:
    return ElmoComponent(nlp, name, model, layers, scalar_mix_parameters, gamma, batch_size, device,
                         set_vectors)
