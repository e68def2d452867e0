"""NER probe on WNUT-17: what ELMo adds over E0 alone and over static word embeddings.

One small tagger (:class:`BiLSTMTagger`: per-feature standardization, dropout, a 1-layer BiLSTM,
a linear layer, token-level softmax; no CRF) is trained on different frozen inputs:

* ``mix``: all biLM layers through a learned :class:`~torchelmo.model.mix.ScalarMix` (``softmax(s)``, gamma),
* ``E0``: the biLM's context-free char-CNN layer only,
* ``top``: the biLM's top layer only (the paper's "last only" input, Table 2),
* ``static``: SVD-PPMI word vectors trained by :func:`train_static_embeddings` on the same text as
  the biLM (lower-cased; out-of-vocabulary tokens get a zero vector, which is the point: WNUT-17's
  entities are new words),
* and the controls of :mod:`torchelmo.commands.probe` (the same biLM with random weights).

Early stopping on dev entity F1; test entity-level F1 (exact span and type, conlleval-style BIO
decoding) with a 95% bootstrap interval over test sentences.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ..errors import ElmoError
from ..io.fileio import atomic_path
from ..io.text import read_sentences
from ..model.mix import ScalarMix
from .common import Standardize, check_seeds, fit_early_stopped
from .conll import bio_spans
from .stats import as_lists, bootstrap_ci, f1_from_counts, paired_diff_ci

# -- static embeddings ---------------------------------------------------------------------------

@dataclass
class StaticEmbeddings:
    words: list[str]
    vectors: np.ndarray  # (V, d) float32, unit rows
    lowercase: bool = True

    def lookup(self, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, float]:
        """``(N tokens, d)`` vectors (zeros when unknown) and the OOV rate."""
        index = {w: i for i, w in enumerate(self.words)}
        ids = np.array([index.get(t.lower() if self.lowercase else t, -1) for s in sentences for t in s])
        out = np.zeros((len(ids), self.vectors.shape[1]), dtype=np.float32)
        known = ids >= 0
        out[known] = self.vectors[ids[known]]
        return out, float(1 - known.mean()) if len(ids) else 0.0


def train_static_embeddings(files: Sequence[str | Path], dim: int = 300, window: int = 5,
                            min_count: int = 3, max_vocab: int = 50000, cds: float = 0.75,
                            cache_dir: str | Path | None = None, seed: int = 0,
                            log: Callable[[str], None] = print) -> StaticEmbeddings:
    """SVD of the positive PMI matrix (Levy, Goldberg & Dagan 2015): symmetric ``window``, context
    distribution smoothing ``cds``, vectors ``U sqrt(S)``, rows normalised. Cached by content."""
    h = hashlib.sha256(repr((dim, window, min_count, max_vocab, cds, seed)).encode())
    for p in map(Path, files):
        if not p.is_file():
            raise ElmoError(f"{p}: no such corpus file")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    cache = Path(cache_dir) / f"static-{h.hexdigest()[:16]}.npz" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        z = np.load(cache, allow_pickle=False)
        return StaticEmbeddings([str(w) for w in z["words"]], z["vectors"])

    sents = [[t.lower() for t in toks] for toks in read_sentences(files, what="corpus file")]
    if not sents:
        raise ElmoError(f"corpus {' '.join(map(str, files))}: no sentences")
    freq = Counter(t for s in sents for t in s)
    words = [w for w, c in freq.most_common(max_vocab) if c >= min_count]
    if len(words) < 2:
        raise ElmoError(f"static embeddings: fewer than 2 words seen {min_count} times in the corpus")
    index = {w: i for i, w in enumerate(words)}
    V = len(words)
    ids = np.concatenate([np.array([index.get(t, -1) for t in s] + [-1] * window) for s in sents])
    pairs = []
    for d in range(1, window + 1):  # -1 separators keep windows inside sentences
        a, b = ids[:-d], ids[d:]
        ok = (a >= 0) & (b >= 0)
        pairs.append(a[ok].astype(np.int64) * V + b[ok])
    codes, counts = np.unique(np.concatenate(pairs), return_counts=True)
    rows, cols = codes // V, codes % V
    rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])  # symmetric
    counts = np.concatenate([counts, counts]).astype(np.float64)
    row_sum = np.bincount(rows, counts, V)
    col_pow = np.bincount(cols, counts, V) ** cds
    pmi = np.log(counts * col_pow.sum() / (row_sum[rows] * col_pow[cols]))
    keep = pmi > 0
    log(f"static embeddings: {len(sents)} sentences, vocabulary {V}, {keep.sum()} positive PMI cells")
    M = torch.sparse_coo_tensor(np.stack([rows[keep], cols[keep]]), pmi[keep].astype(np.float32),
                                (V, V), check_invariants=False).coalesce()
    torch.manual_seed(seed)
    k = min(dim, V - 1)
    U, S, _ = torch.svd_lowrank(M, q=min(k + 10, V), niter=4)
    vec = (U[:, :k] * S[:k].sqrt()).numpy()
    vec /= np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
    emb = StaticEmbeddings(words, vec.astype(np.float32))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cache) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, words=np.array(words), vectors=emb.vectors)
    return emb


# -- the tagger ----------------------------------------------------------------------------------

@dataclass
class TaggerConfig:
    hidden: int = 128
    dropout: float = 0.5
    lr: float = 1e-3
    batch_size: int = 32
    max_epochs: int = 30
    patience: int = 5
    min_epochs: int = 10                   # entities are rare: a tagger may predict all O at first
    mix_l2: float = 0.001
    seed: int = 0
    n_boot: int = 1000


class BiLSTMTagger(nn.Module):
    """``x (L, B, T, F)`` (a ScalarMix over L > 1 layers) or ``(1, B, T, F)`` -> ``(B, T, C)``."""

    def __init__(self, norm: Standardize, num_layers: int, dim: int, n_tags: int, cfg: TaggerConfig) -> None:
        super().__init__()
        self.norm = norm
        self.mix = ScalarMix(num_layers) if num_layers > 1 else None
        self.drop = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(dim, cfg.hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * cfg.hidden, n_tags)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        L, B, T, F = x.shape
        x = self.norm(x.reshape(L, B * T, F)).reshape(L, B, T, F)
        h = self.mix(list(x)) if self.mix is not None else x[0]
        h = self.drop(h)
        packed = nn.utils.rnn.pack_padded_sequence(h, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        return self.out(self.drop(out))


@dataclass
class TaggingData:
    """Token features ``(L, N, F)`` with sentence ``offsets`` and tag ids ``(N,)``."""

    x: np.ndarray
    offsets: np.ndarray
    y: np.ndarray

    def batch(self, sents: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lengths = np.diff(self.offsets)[sents]
        T = int(lengths.max())
        L, _, F = self.x.shape
        xb = np.zeros((L, len(sents), T, F), dtype=np.float32)
        yb = np.full((len(sents), T), -100, dtype=np.int64)
        for r, s in enumerate(sents):
            a, b = self.offsets[s], self.offsets[s + 1]
            xb[:, r, :b - a] = self.x[:, a:b]
            yb[r, :b - a] = self.y[a:b]
        return torch.from_numpy(xb), torch.from_numpy(lengths), torch.from_numpy(yb)

    @property
    def n_sentences(self) -> int:
        return len(self.offsets) - 1


def tag(model: BiLSTMTagger, data: TaggingData, batch_size: int = 64) -> list[np.ndarray]:
    return tag_and_score(model, data, batch_size)[0]


@torch.no_grad()
def tag_and_score(model: BiLSTMTagger, data: TaggingData, batch_size: int = 64) -> tuple[list[np.ndarray], float]:
    """Each sentence's predicted tag ids, and the gold tags' mean log-likelihood (one pass)."""
    model.eval()
    out = []
    total = n = 0.0
    for a in range(0, data.n_sentences, batch_size):
        sents = np.arange(a, min(data.n_sentences, a + batch_size))
        xb, lengths, yb = data.batch(sents)
        logits = model(xb, lengths)
        total += float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1),
                                                   ignore_index=-100, reduction="sum"))
        n += float((yb != -100).sum())
        pred = logits.argmax(-1).numpy()
        out.extend(pred[r, :lengths[r]] for r in range(len(sents)))
    return out, -total / max(n, 1.0)


def entity_counts(pred: list[np.ndarray], data: TaggingData, labels: list[str]) -> np.ndarray:
    """Per-sentence ``(tp, fp, fn)`` of exact (span, type) entity matches."""
    rows = []
    for s, p in enumerate(pred):
        gold_ids = data.y[data.offsets[s]:data.offsets[s + 1]]
        g = bio_spans([labels[i] for i in gold_ids])
        q = bio_spans([labels[i] for i in p])
        tp = len(g & q)
        rows.append((tp, len(q) - tp, len(g) - tp))
    return np.array(rows, dtype=np.float64)


def train_tagger(train: TaggingData, dev: TaggingData, labels: list[str], cfg: TaggerConfig,
                 log: Callable[[str], None] = print, name: str = "") -> tuple[BiLSTMTagger, dict]:
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    L, _, F = train.x.shape
    model = BiLSTMTagger(Standardize.fit(train.x, token_axis=1), L, F, len(labels), cfg)

    def epoch_losses():
        perm = rng.permutation(train.n_sentences)
        for a in range(0, len(perm), cfg.batch_size):
            xb, lengths, yb = train.batch(perm[a:a + cfg.batch_size])
            logits = model(xb, lengths)
            loss = nn.functional.cross_entropy(logits.reshape(-1, len(labels)), yb.reshape(-1),
                                               ignore_index=-100)
            yield loss if model.mix is None else loss + model.mix.l2_penalty(cfg.mix_l2)

    # One pass over dev per epoch gives both: the F1, and the tags' likelihood that breaks its
    # ties (what still improves while F1 is flat at 0); fit_early_stopped asks for the second
    # right after the first.
    likelihood = [0.0]

    def dev_f1() -> float:
        pred, likelihood[0] = tag_and_score(model, dev)
        return float(f1_from_counts(entity_counts(pred, dev, labels).sum(0)))

    fit = fit_early_stopped(model, epoch_losses, dev_f1, lr=cfg.lr, max_epochs=cfg.max_epochs,
                            patience=cfg.patience, min_epochs=cfg.min_epochs, tie_break=lambda: likelihood[0])
    log(f"ner: {name} best dev F1 {fit['best_score']:.4f} at epoch {fit['best_epoch']}")
    return model, {"dev_f1": fit["best_score"], "best_epoch": fit["best_epoch"], "epochs": fit["epochs"]}


def encode_bio(*splits) -> tuple[list[str], list[np.ndarray]]:
    """Tag ids over the union of all splits' tags (a type absent from training is still scored)."""
    labels = ["O"] + sorted({t for ss in splits for s in ss for t in s} - {"O"})
    index = {t: i for i, t in enumerate(labels)}
    return labels, [np.array([index[t] for s in ss for t in s], dtype=np.int64) for ss in splits]


def mean_f1(c: np.ndarray) -> np.ndarray:
    """The mean over seeds of micro F1: ``c[..., 3k:3k + 3]`` holds seed k's (tp, fp, fn)."""
    return np.mean([f1_from_counts(c[..., k:k + 3]) for k in range(0, c.shape[-1], 3)], axis=0)


# Differences the downstream claims rest on: what the contextual layers add over E0 alone and over
# static vectors, and what the mix of all layers adds over the top layer alone (the paper's Table
# 2: "all layers" beat "last only"); b - a, a paired bootstrap over test sentences of the
# seed-mean F1.
PAIRS = (("E0", "mix"), ("static", "mix"), ("static", "E0"), ("top", "mix"))


def run_ner(inputs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], offsets: tuple, tags: tuple,
            cfg: TaggerConfig | None = None, log: Callable[[str], None] = print, seeds: int = 1) -> dict:
    """Train and score the tagger ``seeds`` times per input (seeds ``cfg.seed`` .. ``cfg.seed +
    seeds - 1``: initialisation, dropout and batch order).

    ``inputs``: name -> (train, dev, test) feature arrays, each ``(L, N, F)``; ``offsets``: the
    (train, dev, test) sentence offsets; ``tags``: the (train, dev, test) BIO tag lists.

    Per input: ``f1`` the mean over seeds of the test entity F1, ``ci`` its bootstrap interval
    over test sentences, ``f1_sd`` the spread over seeds, ``seeds`` each seed's own scores;
    ``paired``: :data:`PAIRS`' differences with paired intervals.
    """
    cfg = cfg or TaggerConfig()
    check_seeds(seeds, "ner")
    labels, ys = encode_bio(*tags)
    res: dict = {"labels": labels, "config": asdict(cfg), "seeds": seeds, "inputs": {}, "paired": {}}
    n_ent = sum(len(bio_spans(s)) for s in tags[2])
    res["n_test_entities"] = n_ent
    res["n_test_sentences"] = len(tags[2])
    counts_of: dict[str, np.ndarray] = {}
    for name, arrays in inputs.items():
        data = []
        for split, x, off, y in zip(("train", "dev", "test"), arrays, offsets, ys):
            if x.ndim != 3 or x.shape[1] != len(y) or off[-1] != len(y):
                raise ElmoError(f"ner: {name} {split} features {x.shape} do not match {len(y)} tokens")
            data.append(TaggingData(x, off, y))
        runs, counts = [], []
        for k in range(seeds):
            seed_cfg = replace(cfg, seed=cfg.seed + k)
            model, info = train_tagger(data[0], data[1], labels, seed_cfg, log,
                                       name if seeds == 1 else f"{name} seed {seed_cfg.seed}")
            c = entity_counts(tag(model, data[2]), data[2], labels)
            f1, lo, hi = bootstrap_ci(c, f1_from_counts, cfg.n_boot, seed=cfg.seed)
            tp, fp, fn = c.sum(0)
            run = {"seed": seed_cfg.seed, "f1": f1, "ci": [lo, hi], "precision": float(tp / max(tp + fp, 1)),
                   "recall": float(tp / max(tp + fn, 1)), **info}
            if model.mix is not None:
                run["weights"], run["gamma"] = model.mix.weights(), model.mix.gamma_value()
            runs.append(run)
            counts.append(c)
        counts_of[name] = np.concatenate(counts, axis=1)                     # (sentences, 3 x seeds)
        f1, lo, hi = bootstrap_ci(counts_of[name], mean_f1, cfg.n_boot, seed=cfg.seed)
        r = {"f1": f1, "ci": [lo, hi], "f1_sd": float(np.std([x["f1"] for x in runs], ddof=1)) if seeds > 1 else 0.0,
             "precision": float(np.mean([x["precision"] for x in runs])),
             "recall": float(np.mean([x["recall"] for x in runs])),
             **{k: runs[0][k] for k in ("dev_f1", "best_epoch", "epochs")}}
        if "weights" in runs[0]:
            r["weights"] = np.mean([x["weights"] for x in runs], axis=0).tolist()
            r["gamma"] = float(np.mean([x["gamma"] for x in runs]))
        if seeds > 1:
            r["seeds"] = runs
        res["inputs"][name] = r
        spread = f", sd over {seeds} seeds {r['f1_sd']:.4f}" if seeds > 1 else ""
        log(f"ner: {name} test entity F1 {f1:.4f} [{lo:.4f}, {hi:.4f}] (P {r['precision']:.3f}, "
            f"R {r['recall']:.3f}{spread})" + (f", softmax(s) = {[round(w, 3) for w in r['weights']]}"
                                               if "weights" in r else ""))
    for a, b in PAIRS:
        if a in counts_of and b in counts_of:
            d, lo, hi = paired_diff_ci(counts_of[a], counts_of[b], mean_f1, cfg.n_boot, seed=cfg.seed)
            res["paired"][f"{b}-{a}"] = {"diff": d, "ci": [lo, hi]}
            log(f"ner: {b} - {a}: {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired over test sentences)")
    res["units"] = {"k": 3, "seeds": seeds, "resampled": "units", "documents": None,
                    "counts": {n: as_lists(c) for n, c in counts_of.items()}}
    return res
