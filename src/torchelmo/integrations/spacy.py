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
``doc.vector``, ``has_vector`` and ``similarity`` use the mix; the mix is stored as ``doc.tensor``,
replacing what an earlier component put there).

Processes: ``nlp.pipe(texts, n_process=N)`` works with either start method (fork, spawn). A worker
process runs PyTorch on one thread: N workers then share the cores without oversubscription, and a
forked worker never enters the thread pool its parent started (which would hang). Docs come back
from workers through spaCy's serialisation, which keeps ``._.elmo``, ``._.elmo_layers`` and
``doc.tensor`` but drops hooks: there ``.vector`` and ``has_vector`` still come from the mix, while
``similarity`` is spaCy's own (which calls two tokens of the same word identical);
:func:`similarity` gives the cosine of the mixes for any two docs, spans or tokens.

Saving: ``nlp.to_disk(path)`` stores the component's model in ``path/elmo/model`` (the native
format) and ``spacy.load(path)`` reads it from there, so a saved pipeline does not need what its
``model`` setting named, however it was named (a folder, relative or absolute, a registry name,
a Hub id) and from whatever working directory it is loaded. spaCy builds the component from its
settings before handing it the saved copy: where the ``model`` setting cannot be loaded there
(a relative folder seen from elsewhere, a name that cannot be fetched offline), the component
waits for that copy, and says in one line why it has no model if it is used without one. A
folder that exists but does not load is an error at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc, Span, Token
from spacy.util import minibatch

from ..embed.engine import embed_sentences
from ..errors import ElmoError
from ..io.fileio import own_directory
from ..model.bilm import BiLM
from ..runtime import resolve_device

DOC_ATTRS = ("elmo", "elmo_layers")


MODEL_DIR = "model"   # the component's model inside a pipeline saved with nlp.to_disk


def _register_extensions() -> None:
    # Module-level getters: spaCy pickles the extensions for spawned worker processes.
    for name in DOC_ATTRS:
        if not Doc.has_extension(name):
            Doc.set_extension(name, default=None)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=_token_mix)
        Token.set_extension("elmo_layers", getter=_token_layers)
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_mean)


def _token_mix(token: Token) -> np.ndarray | None:
    mixed = token.doc._.elmo
    return None if mixed is None else mixed[token.i]


def _token_layers(token: Token) -> np.ndarray | None:
    layers = token.doc._.elmo_layers
    return None if layers is None else layers[:, token.i]


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
        self.model = model
        self.device = resolve_device(device, "elmo component: device")
        self.requested_layers = layers
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"elmo component: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.set_vectors = set_vectors
        self.scalar_mix_parameters = scalar_mix_parameters
        self.gamma = gamma
        self._pid = os.getpid()
        self._bilm: BiLM | None = None
        self._missing: str | None = None
        _register_extensions()
        try:
            bilm = BiLM.from_pretrained(model)
        except ElmoError as e:
            if Path(model).expanduser().exists():    # there, but broken: nothing saved can stand in
                raise
            self._missing = f"{e}; nor was this pipeline loaded from a directory that holds its model"
        else:
            self._use(bilm)                          # the settings checked against the model at once

    @property
    def bilm(self) -> BiLM:
        if self._bilm is None:
            raise ElmoError(f"elmo component: {self._missing}")
        return self._bilm

    def _use(self, bilm: BiLM) -> None:
        """Take ``bilm`` as the component's model, checking the layer settings against it."""
        n = bilm.num_layers
        layers = self.requested_layers
        chosen = list(range(n)) if layers is None else [int(k) for k in layers]
        if not chosen or any(not -n <= k < n for k in chosen):
            raise ElmoError(f"elmo component: layers must be indices in 0..{n - 1}, got {layers}")
        params = ([0.0] * len(chosen) if self.scalar_mix_parameters is None
                  else list(self.scalar_mix_parameters))
        if len(params) != len(chosen):
            raise ElmoError(f"elmo component: {len(params)} scalar_mix_parameters for {len(chosen)} layers")
        self.layers = chosen
        self.weights = (self.gamma * torch.softmax(torch.tensor(params, dtype=torch.float64), 0)).numpy()
        self._bilm = bilm.to(self.device).eval()
        self._missing = None

    def __call__(self, doc: Doc) -> Doc:
        return next(iter(self.pipe([doc])))

    def pipe(self, stream: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        """``batch_size`` (``nlp.pipe``'s) docs are gathered at a time and run sorted by length,
        at most the component's ``batch_size`` per biLM batch."""
        if os.getpid() != self._pid:   # a worker of nlp.pipe(n_process=...): see the module's notes
            torch.set_num_threads(1)
            self._pid = os.getpid()
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
            # spaCy takes vectors from doc.tensor when the vocabulary has none, and the tensor
            # survives serialisation (worker processes, DocBin); the hooks do not.
            doc.tensor = doc._.elmo
            # spaCy's own similarity calls two tokens of the same word identical, and warns that
            # the vocabulary has no vectors.
            for hooks in (doc.user_hooks, doc.user_token_hooks, doc.user_span_hooks):
                hooks["similarity"] = similarity

    def to_disk(self, path: str | Path, exclude: Iterable[str] = ()) -> None:
        self.bilm.save_pretrained(own_directory(Path(path) / MODEL_DIR))

    def from_disk(self, path: str | Path, exclude: Iterable[str] = ()) -> ElmoComponent:
        saved = Path(path) / MODEL_DIR
        if not saved.is_dir():
            raise ElmoError(f"elmo component: {saved}: no model here (a pipeline saved with "
                            "nlp.to_disk keeps the component's model in this directory)")
        self._use(BiLM.from_pretrained(saved))
        return self


def similarity(a: Doc | Span | Token, b: Doc | Span | Token) -> float:
    """The cosine of two ELMo mixes (docs and spans: the mean over their tokens); 0.0 when one is
    empty or zero."""
    u, v = _mix(a), _mix(b)
    if u is None or v is None:
        return 0.0
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    return float(u @ v) / norm if norm else 0.0


def _mix(x: Doc | Span | Token) -> np.ndarray | None:
    if isinstance(x, Doc):
        return x._.elmo.mean(0) if x._.elmo is not None and len(x) else None
    return x._.elmo


@Language.factory("elmo", default_config={"model": "default", "layers": None, "scalar_mix_parameters": None,
                                          "gamma": 1.0, "batch_size": 64, "device": "auto",
                                          "set_vectors": False})
def make_elmo(nlp: Language, name: str, model: str, layers: list[int] | None,
              scalar_mix_parameters: list[float] | None, gamma: float, batch_size: int, device: str,
              set_vectors: bool) -> ElmoComponent:
    return ElmoComponent(nlp, name, model, layers, scalar_mix_parameters, gamma, batch_size, device,
                         set_vectors)
