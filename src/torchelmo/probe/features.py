"""Frozen-biLM features for probing, cached on disk.

For a list of tokenised sentences, :func:`extract` runs the biLM once (no gradients, eval mode)
and stores every layer's representation of every token, or of every requested span (a span's
vector is the mean over its tokens: WSD instances that are multi-word units). The cache file is
HDF5, keyed by a fingerprint of the model's weights and of the data, so a rerun (or another probe
on the same data) reads the file instead of running the biLM::

    features  (L, N, F) float16   L = n_layers + 1 (E0 .. E_L), N tokens or spans, F = 2P
    offsets   (S + 1,)  int64     rows of sentence s are offsets[s]:offsets[s + 1] (token mode)

Storage is float16 (halves the disk and memory; probe accuracies are unaffected at 1e-3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from ..errors import ElmoError
from ..io.fileio import atomic_path
from ..io.text import length_batches
from ..model.bilm import BiLM

FORMAT_VERSION = 1
Span = tuple[int, int, int]  # (sentence index, start token, end token exclusive)


def model_fingerprint(bilm: BiLM) -> str:
    """SHA-256 (16 hex digits) over the config, every parameter and buffer in order, the lexicons
    of a model with its own token ids, and the precision when it is not fp32 (reduced-precision
    features are other features)."""
    h = hashlib.sha256(json.dumps(bilm.config.to_options(), sort_keys=True).encode())
    lexicons = getattr(bilm, "vocab", None)   # a model with its own token ids (ELMoForManyLangs')
    if lexicons is not None:
        h.update(lexicons.digest())
    precision = bilm.resolved_precision().name
    if precision != "fp32":
        h.update(f"precision={precision}".encode())
    for name, t in bilm.state_dict().items():
        if "cache" in name:  # token-embedding caches are derived data, not weights
            continue
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def data_fingerprint(sentences: Sequence[Sequence[str]], spans: Sequence[Span] | None = None) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}".encode())
    for s in sentences:
        h.update("\x1f".join(s).encode())
        h.update(b"\x1e")
    if spans is not None:
        h.update(np.asarray(spans, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass
class Features:
    """Cached features; ``layer(k)`` loads one layer as float32 ``(N, F)``."""

    path: Path
    num_layers: int
    n: int
    dim: int
    offsets: np.ndarray | None  # token mode only

    def layer(self, k: int, rows: np.ndarray | slice | None = None) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            x = f["features"][k]
        return (x if rows is None else x[rows]).astype(np.float32)

    def all_layers(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """``(L, N, F)`` float16 (cast per batch; all layers of a big set in float32 is a lot)."""
        with h5py.File(self.path, "r") as f:
            x = f["features"][...]
        return x if rows is None else x[:, rows]


def validate_sentences(sentences: Sequence[Sequence[str]], what: str = "data") -> None:
    for i, s in enumerate(sentences):
        if len(s) == 0:
            raise ElmoError(f"{what}: sentence {i} is empty")
        for t in s:
            if not isinstance(t, str) or not t or t != t.strip():
                raise ElmoError(f"{what}: sentence {i} has a bad token {t!r} (empty or with spaces)")


@torch.no_grad()
def extract(bilm: BiLM, sentences: Sequence[Sequence[str]], cache_dir: str | Path | None = None,
            spans: Sequence[Span] | None = None, name: str = "data", max_tokens: int = 4096,
            max_sentences: int = 128, progress: bool = True, documents: Sequence[str] | None = None) -> Features:
    """Features of every token (``spans=None``) or of every span, cached under ``cache_dir``.

    ``cache_dir=None`` uses a temporary file that lives as long as the process. ``documents``
    (each sentence's document, a document's sentences consecutive and in order): each sentence
    starts from the LSTM state its document's previous sentence ended with, in both directions,
    as AllenNLP's stateful ELMo computes it (documents run side by side, one row each); None:
    every sentence from the zero state.
    """
    validate_sentences(sentences, name)
    doc_rows = None if documents is None else document_rows(documents, len(sentences), name)
    if spans is not None:
        for j, (s, a, b) in enumerate(spans):
            if not (0 <= s < len(sentences) and 0 <= a < b <= len(sentences[s])):
                raise ElmoError(f"{name}: span {j} {(s, a, b)} is outside its sentence")
    key = f"{name}-{model_fingerprint(bilm)}-{data_fingerprint(sentences, spans)}"
    if doc_rows is not None:   # other features: the same sentences with their documents' context
        key += "-doc" + hashlib.sha256(json.dumps(doc_rows).encode()).hexdigest()[:8]
    if cache_dir is None:
        import tempfile
        cache_dir = Path(tempfile.gettempdir()) / "elmo-probe-cache"
    path = Path(cache_dir) / f"{key}.h5"
    if path.is_file():
        try:
            return _open(path)
        except (OSError, KeyError, ElmoError):
            path.unlink()  # a damaged cache is recomputed, never trusted

    L, F = bilm.num_layers, bilm.output_dim
    lengths = [len(s) for s in sentences]
    offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1]) if spans is None else len(spans)
    by_sentence: dict[int, list[int]] = {}
    if spans is not None:
        for j, (s, _, _) in enumerate(spans):
            by_sentence.setdefault(s, []).append(j)
    if doc_rows is None:
        needed = list(range(len(sentences))) if spans is None else sorted(by_sentence)
        # Similar lengths together keep padding small; max_tokens bounds rows x longest.
        batches = length_batches([lengths[i] for i in needed], max_sentences, max_tokens)
    else:
        # Every sentence runs (its state is the next one's), batch k holding the k-th sentence of
        # each document still going: documents longest first, so the rows running are a prefix
        # and each row's carried state is its own document's.
        needed = list(range(len(sentences)))
        docs = sorted(doc_rows, key=len, reverse=True)
        batches = [[d[k] for d in docs if len(d) > k] for k in range(len(docs[0]) if docs else 0)]

    was_training, was_stateful = bilm.training, bilm.stateful
    bilm.eval()
    if doc_rows is not None:
        bilm.stateful = True
        bilm.reset_states()
    from tqdm.auto import tqdm
    try:
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            ds = f.create_dataset("features", (L, n, F), dtype="float16",
                                  chunks=(1, min(max(n, 1), 4096), F))
            if spans is None:
                f.create_dataset("offsets", data=offsets)
            f.attrs.update(version=FORMAT_VERSION, key=key, mode="tokens" if spans is None else "spans")
            bar = tqdm(total=sum(lengths[i] for i in needed), unit="tok", desc=f"features {name}",
                       disable=not progress, leave=False)
            buf = np.zeros((L, n, F), dtype=np.float16) if n * L * F <= 2 ** 29 else None
            for batch in batches:
                idx = [needed[b] for b in batch]
                out = bilm.embed_sentences([list(sentences[i]) for i in idx])   # host ids: see BiLM.forward
                layers = torch.stack(out.layers).float().cpu()  # (L, B, T, F)
                for r, i in enumerate(idx):
                    if spans is None:
                        rows = slice(int(offsets[i]), int(offsets[i + 1]))
                        vals = layers[:, r, :lengths[i]].numpy()
                    elif i not in by_sentence:   # run only for its document's state
                        continue
                    else:
                        js = by_sentence[i]
                        rows = np.asarray(js)
                        vals = np.stack([layers[:, r, spans[j][1]:spans[j][2]].mean(1).numpy()
                                         for j in js], 1)
                    if buf is not None:
                        buf[:, rows] = vals
                    else:
                        for k in range(L):
                            if isinstance(rows, slice):
                                ds[k, rows] = vals[k]
                            else:  # h5py wants increasing indices
                                o = np.argsort(rows)
                                ds[k, rows[o]] = vals[k][o]
                bar.update(sum(lengths[i] for i in idx))
            bar.close()
            if buf is not None:
                ds[...] = buf
    finally:
        bilm.train(was_training)
        if doc_rows is not None:
            bilm.stateful = was_stateful
            bilm.reset_states()
    return _open(path)


def document_rows(documents: Sequence[str], n: int, what: str = "data") -> list[list[int]]:
    """The sentence indices of each document, in order; its sentences must be consecutive."""
    if len(documents) != n:
        raise ElmoError(f"{what}: {len(documents)} document names for {n} sentences")
    rows: list[list[int]] = []
    seen: set[str] = set()
    for i, d in enumerate(documents):
        if rows and documents[i - 1] == d:
            rows[-1].append(i)
            continue
        if d in seen:
            raise ElmoError(f"{what}: document {d!r} comes back at sentence {i}: a document's sentences must "
                            "be consecutive")
        seen.add(d)
        rows.append([i])
    return rows


def _open(path: Path) -> Features:
    with h5py.File(path, "r") as f:
        if f.attrs.get("version") != FORMAT_VERSION or "features" not in f:
            raise ElmoError(f"{path}: not a feature cache of version {FORMAT_VERSION}")
        L, n, F = f["features"].shape
        offsets = f["offsets"][...] if "offsets" in f else None
    return Features(path, L, n, F, offsets)


def random_like(bilm: BiLM, seed: int = 0) -> BiLM:
    """The control: the same architecture with freshly initialised (untrained) weights."""
    torch.manual_seed(seed)
    model = BiLM(bilm.config, precision=bilm.precision).to(bilm.device)
    model.long_run = bilm.long_run
    return model.eval()
