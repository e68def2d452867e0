"""Dependency probes: which head each word attaches to (arcs), and with which relation (labels).

Both read one frozen biLM layer (E0, E1, E2) standardised with training statistics, or all
layers through a learned :class:`~torchelmo.model.mix.ScalarMix`, with the same hyper-parameters for
every input (:class:`DepsConfig`), trained with Adam on mini-batches of sentences and
early-stopped on the development score (the best dev epoch's weights are kept).

* Arc probe: for word ``i`` every candidate head ``j`` in {ROOT} and the sentence's words gets
  ``s(i, j) = (A x_i) . (B x_j)``, ``A``, ``B`` of rank :attr:`DepsConfig.rank`, ROOT a learned
  vector in the projected space; cross-entropy over each word's candidates. Metric: UAS, the
  fraction of words whose highest-scoring candidate is the gold head (punctuation included).
* Label probe: a linear softmax over ``[x_dep; x_head; x_dep * x_head]`` of each gold arc (ROOT's
  vector is zeros), predicting the universal relation (the DEPREL before ``:``). Metric: accuracy.
* Structural probe (Hewitt & Manning 2019): a linear map ``B`` of rank :attr:`DepsConfig.rank`
  trained so that ``||B (x_i - x_j)||^2`` approximates the path length between words ``i`` and
  ``j`` in the gold tree (L1 loss over each sentence's pairs, divided by its squared length).
  Metric: UUAS, the fraction of the gold tree's edges (undirected, ROOT left out) in the minimum
  spanning tree of the predicted distances. A standard probe of syntax beside the bilinear one:
  it asks whether the tree is a geometry of the layer, not whether a classifier can pick heads.
  Early-stopped on dev UUAS like the other probes (``uuas``), and again under Hewitt & Manning's
  own schedule (``uuas_hm``): the epoch of the lowest dev loss kept, the learning rate divided by
  10 after every epoch that does not lower it.

The arc and structural probes also read E2 without its residual connection (``E2 (no residual)``:
E2 - E1, layer 2's LSTM output alone, for a model with residual connections), to see whether an
E2 lead is E1's information carried up by the residual.

Test scores come with 95% bootstrap intervals over test sentences, and E2 - E1 with a paired one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn

from ..errors import ElmoError
from ..model.mix import ScalarMix
from .common import Standardize, check_seeds, fit_early_stopped, layer_names, mix_summary
from .conll import DepSentence
from .features import Features
from .stats import UnitScores, accuracy_from_counts

TASKS = ("uas", "labels", "uuas", "uuas_hm")
STRUCTURAL = ("uuas", "uuas_hm")     # the structural probe, by its two schedules
NO_RESIDUAL = "E2 (no residual)"


@dataclass
class DepsConfig:
    rank: int = 128            # rank of A and B in the arc scorer
    lr: float = 1e-3
    batch_size: int = 16       # sentences per mini-batch (~250 words of EWT)
    max_epochs: int = 40
    patience: int = 3          # epochs without a dev improvement before stopping
    weight_decay: float = 0.0
    mix_l2: float = 0.001      # the paper's lambda * ||s||^2 on the mix scalars
    seed: int = 0
    n_boot: int = 1000
    seeds: int = 1             # probes trained per input (seeds seed .. seed + seeds - 1), scored as their mean


def universal(rel: str) -> str:
    """The universal relation of a DEPREL: ``nmod:poss`` -> ``nmod``."""
    return rel.split(":", 1)[0]


@dataclass
class Trees:
    """The gold trees of one split, flat over words (rows of its :class:`Features`)."""

    offsets: np.ndarray  # (S + 1,) words of sentence s are offsets[s]:offsets[s + 1]
    heads: np.ndarray    # (N,) 0 = ROOT, else the 1-based position of the head in its sentence
    labels: np.ndarray   # (N,) relation ids; -1 = a relation unseen in training (always wrong)
    _distances: list[np.ndarray] | None = None

    @classmethod
    def build(cls, sentences: Sequence[DepSentence], index: dict[str, int]) -> Trees:
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum([len(s.heads) for s in sentences], out=offsets[1:])
        heads = np.array([h for s in sentences for h in s.heads], dtype=np.int64)
        labels = np.array([index.get(universal(r), -1) for s in sentences for r in s.rels], dtype=np.int64)
        return cls(offsets, heads, labels)

    @property
    def n_sentences(self) -> int:
        return len(self.offsets) - 1

    def distances(self, s: int) -> np.ndarray:
        """``(n, n)`` path lengths between sentence ``s``'s words in its gold tree (-1: no path,
        in a malformed tree), computed once per split."""
        if self._distances is None:
            self._distances = [tree_distances(self.heads[a:b]) for a, b in zip(self.offsets[:-1], self.offsets[1:])]
        return self._distances[s]


def tree_distances(heads: np.ndarray) -> np.ndarray:
    """``(n, n)`` path lengths in the undirected tree of ``heads`` (1-based, 0 = ROOT, which is
    not a node): a breadth-first search from every word; -1 where no path joins two words."""
    n = len(heads)
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if 0 < h <= n and h - 1 != i:
            nbrs[i].append(int(h) - 1)
            nbrs[int(h) - 1].append(i)
    out = np.full((n, n), -1, dtype=np.int64)
    for src in range(n):
        out[src, src], frontier = 0, [src]
        while frontier:
            nxt = []
            for u in frontier:
                for v in nbrs[u]:
                    if out[src, v] < 0:
                        out[src, v] = out[src, u] + 1
                        nxt.append(v)
            frontier = nxt
    return out


def spanning_tree(dist: np.ndarray) -> set[tuple[int, int]]:
    """The minimum spanning tree of a complete graph, ``dist (n, n)`` (Prim): its edges ``(i, j)``, ``i < j``."""
    n = len(dist)
    if n < 2:
        return set()
    inside = np.zeros(n, dtype=bool)
    inside[0] = True
    best, parent = dist[0].astype(np.float64).copy(), np.zeros(n, dtype=np.int64)
    edges = set()
    for _ in range(n - 1):
        j = int(np.argmin(np.where(inside, np.inf, best)))
        edges.add((min(j, int(parent[j])), max(j, int(parent[j]))))
        inside[j] = True
        closer = dist[j] < best
        best, parent = np.where(closer, dist[j], best), np.where(closer, j, parent)
    return edges


@dataclass
class Batch:
    """Some sentences' words, gathered and padded for both probes."""

    rows: np.ndarray         # (n,) feature rows of the words, sentence after sentence
    index: torch.Tensor      # (B, T) position of each word in ``rows``; -1 = padding
    target: torch.Tensor     # (B, T) gold head as a candidate index (0 ROOT, j word j); -100 padding
    head_pos: torch.Tensor   # (n,) position of each word's gold head in ``rows``; -1 = ROOT
    labels: torch.Tensor     # (n,) gold relation ids
    trees: Trees | None = None          # the split, and
    sentences: np.ndarray | None = None  # which of its sentences (for the gold distances)

    def gold_distances(self) -> torch.Tensor:
        """``(B, T, T)`` path lengths in the gold trees; -1 at padding (and where no path is)."""
        B, T = self.index.shape
        out = np.full((B, T, T), -1, dtype=np.int64)
        for b, s in enumerate(self.sentences):
            d = self.trees.distances(int(s))
            out[b, :len(d), :len(d)] = d
        return torch.from_numpy(out)

    @classmethod
    def of(cls, trees: Trees, sentences: np.ndarray) -> Batch:
        starts, ends = trees.offsets[sentences], trees.offsets[sentences + 1]
        lengths = ends - starts
        rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends)])
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]])        # (B,) each sentence's first position
        steps = np.arange(lengths.max())
        valid = steps[None] < lengths[:, None]                         # (B, T)
        heads = trees.heads[rows]
        target = np.full(valid.shape, -100, dtype=np.int64)
        target[valid] = heads                                          # row-major order = order of rows
        head_pos = np.where(heads > 0, np.repeat(first, lengths) + heads - 1, -1)
        return cls(rows, torch.from_numpy(np.where(valid, first[:, None] + steps[None], -1)),
                   torch.from_numpy(target), torch.from_numpy(head_pos), torch.from_numpy(trees.labels[rows]),
                   trees, sentences)


class Encoder(nn.Module):
    """``(n, F)`` one layer, or ``(L, n, F)`` all layers -> standardised [-> ScalarMix] -> ``(n, F)``."""

    def __init__(self, norm: Standardize, num_layers: int | None = None) -> None:
        super().__init__()
        self.norm = norm
        self.mix = ScalarMix(num_layers) if num_layers else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return x if self.mix is None else self.mix(list(x))


class ArcScorer(nn.Module):
    """Bilinear head scores of rank ``rank``: ``(B, T, T + 1)``, candidate 0 = ROOT, padding -inf."""

    def __init__(self, encoder: Encoder, dim: int, rank: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.dep = nn.Linear(dim, rank, bias=False)    # A
        self.head = nn.Linear(dim, rank, bias=False)   # B
        self.root = nn.Parameter(torch.zeros(rank))    # ROOT, already in B's space

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        h = self.encoder(x)                                            # (n, F)
        pad = torch.zeros(1, self.root.numel())
        u = torch.cat([self.dep(h), pad])                              # (n + 1, r); row n = padding
        v = torch.cat([self.head(h), pad])
        idx = torch.where(batch.index >= 0, batch.index, len(h))       # (B, T)
        cand = torch.cat([self.root.expand(len(idx), 1, -1), v[idx]], 1)  # (B, T + 1, r)
        scores = u[idx] @ cand.transpose(1, 2)                          # (B, T, T + 1)
        real = torch.cat([torch.ones(len(idx), 1, dtype=torch.bool), batch.index >= 0], 1)
        return scores.masked_fill(~real[:, None, :], float("-inf"))

    def loss(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        s = self(x, batch)
        return nn.functional.cross_entropy(s.flatten(0, 1), batch.target.flatten(), ignore_index=-100)

    def correct(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``(n,)`` whether each word's best candidate is its gold head."""
        valid = batch.index >= 0
        return (self(x, batch).argmax(-1) == batch.target)[valid]


class LabelScorer(nn.Module):
    """Linear softmax over ``[x_dep; x_head; x_dep * x_head]`` of the gold arcs: ``(n, C)``."""

    def __init__(self, encoder: Encoder, dim: int, n_labels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.out = nn.Linear(3 * dim, n_labels)

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        h = self.encoder(x)
        head = torch.where((batch.head_pos >= 0)[:, None], h[batch.head_pos.clamp(min=0)], 0.0)
        return self.out(torch.cat([h, head, h * head], -1))

    def loss(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        return nn.functional.cross_entropy(self(x, batch), batch.labels)

    def correct(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self(x, batch).argmax(-1) == batch.labels


class DistanceProbe(nn.Module):
    """Hewitt & Manning's structural probe: squared distances ``||B (x_i - x_j)||^2`` between a
    sentence's words, ``(B, T, T)``; ``B`` of rank ``rank``."""

    def __init__(self, encoder: Encoder, dim: int, rank: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.proj = nn.Linear(dim, rank, bias=False)

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        h = self.proj(self.encoder(x))                                 # (n, r)
        u = torch.cat([h, h.new_zeros(1, h.shape[1])])[torch.where(batch.index >= 0, batch.index, len(h))]  # (B, T, r)
        # |u_i|^2 + |u_j|^2 - 2 u_i.u_j: a batched matmul, not a (B, T, T, r) difference tensor
        # (five times faster forward and backward); clamped at 0 against rounding.
        sq = (u * u).sum(-1)                                           # (B, T)
        return (sq[:, :, None] + sq[:, None, :] - 2 * u @ u.transpose(1, 2)).clamp(min=0)

    def loss(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """L1 between predicted and gold distances over each sentence's pairs, divided by its
        squared length, averaged over the sentences (Hewitt & Manning's normalisation)."""
        gold = batch.gold_distances()
        pairs = gold >= 0
        lengths = (batch.index >= 0).sum(1).clamp(min=1).to(torch.float32)         # (B,)
        err = ((self(x, batch) - gold.float()).abs() * pairs).sum((1, 2)) / lengths ** 2
        return err.mean()

    @torch.no_grad()
    def correct(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``(n,)`` per word: whether the edge to its gold head is in the minimum spanning tree of
        the predicted distances (False for the root's dependent, which has no edge)."""
        d = self(x, batch).numpy()
        out = []
        for b, s in enumerate(batch.sentences):
            a, e = batch.trees.offsets[s], batch.trees.offsets[s + 1]
            n, heads = e - a, batch.trees.heads[a:e]
            tree = spanning_tree(d[b, :n, :n])
            out += [bool(0 < h <= n and (min(i, h - 1), max(i, h - 1)) in tree) for i, h in enumerate(heads)]
        return torch.tensor(out, dtype=torch.bool)


def _gather(x: np.ndarray, rows: np.ndarray, token_axis: int) -> torch.Tensor:
    return torch.from_numpy(np.take(x, rows, axis=token_axis)).float()


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, trees: Trees, token_axis: int = 0,
             batch_sentences: int = 256) -> np.ndarray:
    """``(N,)`` per-word correctness of ``model`` (an :class:`ArcScorer` or :class:`LabelScorer`)."""
    model.eval()
    out = []
    for a in range(0, trees.n_sentences, batch_sentences):
        b = Batch.of(trees, np.arange(a, min(trees.n_sentences, a + batch_sentences)))
        out.append(model.correct(_gather(x, b.rows, token_axis), b).numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


@torch.no_grad()
def dev_loss(model: nn.Module, x: np.ndarray, trees: Trees, token_axis: int = 0, batch_sentences: int = 256) -> float:
    """The probe's loss (no penalty) over all of ``trees``, each batch weighted by its sentences."""
    model.eval()
    total = 0.0
    for a in range(0, trees.n_sentences, batch_sentences):
        b = Batch.of(trees, np.arange(a, min(trees.n_sentences, a + batch_sentences)))
        total += float(model.loss(_gather(x, b.rows, token_axis), b)) * len(b.sentences)
    return total / max(trees.n_sentences, 1)


def fit_probe(model: nn.Module, x_train: np.ndarray, train: Trees, x_dev: np.ndarray, dev: Trees,
              cfg: DepsConfig, token_axis: int = 0,
              penalty: Callable[[], torch.Tensor] | None = None, by_loss: bool = False) -> dict:
    """Adam on the probe's loss over mini-batches of sentences, early-stopped on dev accuracy
    (UAS for arcs, UUAS for distances); the best epoch's weights are kept in ``model``.
    ``by_loss`` (Hewitt & Manning's schedule for the structural probe): early-stopped on the dev
    loss instead, the learning rate divided by 10 after every epoch that does not lower it;
    ``dev_acc`` is then the kept epoch's, ``dev_history`` the dev losses."""
    counted = dev.heads > 0 if isinstance(model, DistanceProbe) else None
    g = torch.Generator().manual_seed(cfg.seed)  # own generator: shuffles do not depend on init

    def epoch_losses():
        perm = torch.randperm(train.n_sentences, generator=g).numpy()
        for a in range(0, len(perm), cfg.batch_size):
            b = Batch.of(train, np.sort(perm[a:a + cfg.batch_size]))
            loss = model.loss(_gather(x_train, b.rows, token_axis), b)
            yield loss if penalty is None else loss + penalty()

    def dev_acc() -> float:
        correct = evaluate(model, x_dev, dev, token_axis)
        return float(correct.mean() if counted is None else correct[counted].mean())

    if by_loss:
        fit = fit_early_stopped(model, epoch_losses, lambda: -dev_loss(model, x_dev, dev, token_axis), lr=cfg.lr,
                                weight_decay=cfg.weight_decay, max_epochs=cfg.max_epochs, patience=cfg.patience,
                                lr_decay=0.1)
        return {"dev_acc": dev_acc(), "dev_loss": -fit["best_score"], "best_epoch": fit["best_epoch"],
                "epochs": fit["epochs"], "dev_history": [-h for h in fit["history"]]}
    fit = fit_early_stopped(model, epoch_losses, dev_acc, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            max_epochs=cfg.max_epochs, patience=cfg.patience)
    return {"dev_acc": fit["best_score"], "best_epoch": fit["best_epoch"], "epochs": fit["epochs"],
            "dev_history": fit["history"]}


def sentence_counts(correct: np.ndarray, offsets: np.ndarray, counted: np.ndarray | None = None) -> np.ndarray:
    """``(S, 2)`` per-sentence ``(correct, words)``; ``counted (N,)``: only those words (UUAS
    counts the words that have an edge to a head, not the root's dependent)."""
    if counted is None:
        c = np.add.reduceat(correct.astype(np.float64), offsets[:-1]) if len(correct) else np.zeros(0)
        return np.stack([c, np.diff(offsets).astype(np.float64)], 1)
    if not len(correct):
        return np.zeros((len(offsets) - 1, 2))
    w = counted.astype(np.float64)
    # reduceat of an empty sentence would repeat its neighbour's value: count those as zero
    empty = np.diff(offsets) == 0
    starts = np.minimum(offsets[:-1], len(correct) - 1)
    c = np.where(empty, 0.0, np.add.reduceat(correct.astype(np.float64) * w, starts))
    n = np.where(empty, 0.0, np.add.reduceat(w, starts))
    return np.stack([c, n], 1)


DISTANCES = (("root", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-6", 3, 6), ("7+", 7, 1 << 30))


def arc_distances(trees: Trees) -> np.ndarray:
    """``(N,)`` each word's distance to its gold head in words (0 for the root's dependent)."""
    pos = np.arange(len(trees.heads)) - np.repeat(trees.offsets[:-1], np.diff(trees.offsets)) + 1
    return np.where(trees.heads == 0, 0, np.abs(trees.heads - pos))


def by_distance(correct: dict[str, list[np.ndarray]], distance: np.ndarray) -> dict:
    """Accuracy per head-distance bucket (:data:`DISTANCES`) of each probe, the mean over its seeds:
    where a layer's advantage lies (short arcs or long ones)."""
    masks = [(distance >= lo) & (distance <= hi) for _, lo, hi in DISTANCES]
    out: dict = {"buckets": [b for b, _, _ in DISTANCES], "words": [int(m.sum()) for m in masks]}
    for name, runs in correct.items():
        out[name] = [float(np.mean([c[m].mean() for c in runs])) if m.any() else None for m in masks]
    return out


def neighbour_heads(offsets: np.ndarray, side: int) -> np.ndarray:
    """``(N,)`` the heads of the trivial parser that attaches every word to its left (``side=-1``)
    or right (``+1``) neighbour, and the word without one to ROOT."""
    lengths = np.diff(offsets)
    pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths) + 1     # 1-based position
    head = pos + side
    return np.where((head >= 1) & (head <= np.repeat(lengths, lengths)), head, 0)


def _check_inputs(features: tuple[Features, Features, Features],
                  trees: tuple[Sequence[DepSentence], Sequence[DepSentence], Sequence[DepSentence]]) -> None:
    for name, f, ts in zip(("train", "dev", "test"), features, trees):
        n = sum(len(s.heads) for s in ts)
        if f.offsets is None or f.n != n or len(f.offsets) != len(ts) + 1:
            raise ElmoError(f"deps: {name} features ({f.n} rows) do not match its trees "
                            f"({len(ts)} sentences, {n} words)")


def _show(log: Callable[[str], None], task: str, name: str, r: dict) -> None:
    what = {"uas": "UAS", "uuas": "UUAS", "uuas_hm": "UUAS (H&M schedule)"}.get(task, "label acc")
    log(f"deps: {name} {what} {r['acc']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] "
        f"(dev {r['dev_acc']:.4f}, epoch {r['best_epoch']}"
        + (f", sd over {len(r['seeds'])} seeds {r['sd']:.4f})" if len(r.get("seeds", ())) > 1 else ")")
        + (f", softmax(s) = {[round(w, 3) for w in r['weights']]}, gamma = {r['gamma']:.3f}"
           if "weights" in r else ""))


def run_deps(train: Features, dev: Features, test: Features,
             trees: tuple[Sequence[DepSentence], Sequence[DepSentence], Sequence[DepSentence]],
             cfg: DepsConfig | None = None, log: Callable[[str], None] = print,
             layers: list[int] | None = None, mix: bool = True, groups: list[str] | None = None,
             residual: bool = False) -> dict:
    """Arc (UAS), label and structural (UUAS) probes per layer and through the mix; ``trees`` =
    (train, dev, test); ``residual``: the model adds each layer's input to its output, so that
    the arc and structural probes also read E2 without it (:data:`NO_RESIDUAL`).

    Returns ``{"uas": {...}, "labels": {...}, ...}``, each shaped like :func:`~.pos.run_pos`'s
    result: ``layers`` (per layer ``acc``, ``ci``, each seed's score and the fit), ``paired``
    (E2 - E1), ``mix`` (with ``weights`` and ``gamma``), ``units`` (the per-sentence counts).
    ``cfg.seeds`` probes per input, scored as their mean; ``groups``: each test sentence's
    document, to resample documents instead of sentences.
    """
    cfg = cfg or DepsConfig()
    _check_inputs((train, dev, test), trees)
    check_seeds(cfg.seeds, "deps")
    rels = sorted({universal(r) for s in trees[0] for r in s.rels})
    if len(rels) < 2:
        raise ElmoError(f"deps: the training set has {len(rels)} distinct relation(s); need at least 2")
    index = {r: i for i, r in enumerate(rels)}
    d_tr, d_dev, d_te = (Trees.build(ts, index) for ts in trees)
    L, F = train.num_layers, train.dim
    layers = list(range(L)) if layers is None else layers
    names = layer_names(L)
    res: dict = {"n_train_words": int(len(d_tr.heads)), "n_test_words": int(len(d_te.heads)),
                 "n_test_sentences": d_te.n_sentences, "config": asdict(cfg),
                 "uas": {"layers": {}}, "labels": {"labels": rels, "layers": {}},
                 **{task: {"layers": {}} for task in STRUCTURAL}}
    if groups is not None:
        res["n_test_documents"] = len(set(groups))
    scores = {task: UnitScores(accuracy_from_counts, 2, groups, cfg.n_boot, cfg.seed) for task in TASKS}
    where = "test documents" if groups is not None else "test sentences"

    edges = d_te.heads > 0      # UUAS counts the gold tree's edges: every word's but the root's dependent

    def counts(task: str, correct: np.ndarray) -> np.ndarray:
        return sentence_counts(correct, d_te.offsets, edges if task in STRUCTURAL else None)

    def baseline(correct: np.ndarray, task: str = "uas") -> dict:
        return scores[task].once(counts(task, correct), "acc")

    res["uas"]["baselines"] = {f"{side} neighbour": baseline(neighbour_heads(d_te.offsets, k) == d_te.heads)
                               for side, k in (("left", -1), ("right", 1))}
    # The chain of neighbouring words as a tree (Hewitt & Manning's linear baseline).
    for task in STRUCTURAL:
        res[task]["baselines"] = {"chain": baseline(np.abs(arc_distances(d_te)) == 1, task)}
    majority = int(np.bincount(d_tr.labels).argmax())
    res["labels"]["majority"] = {"label": rels[majority], **baseline(d_te.labels == majority)}
    log("deps: baselines: UAS " + ", ".join(f"{k} {v['acc']:.4f}" for k, v in res["uas"]["baselines"].items())
        + f"; labels majority ({rels[majority]}) {res['labels']['majority']['acc']:.4f}"
        + f"; UUAS chain {res['uuas']['baselines']['chain']['acc']:.4f}")

    def probe(task: str, encoder: Encoder) -> nn.Module:
        if task == "uas":
            return ArcScorer(encoder, F, cfg.rank)
        if task in STRUCTURAL:
            return DistanceProbe(encoder, F, cfg.rank)
        return LabelScorer(encoder, F, len(rels))

    corrects: dict[str, dict[str, list[np.ndarray]]] = {task: {} for task in TASKS}

    def fits(task: str, name: str, run: Callable[[], tuple[nn.Module, dict, np.ndarray]]) -> tuple[dict, list]:
        """``cfg.seeds`` fits of one probe, scored; the first seed's fit details, and each seed's."""
        infos, models = [], []
        for s in range(cfg.seeds):
            torch.manual_seed(cfg.seed + s)
            model, info, correct = run()
            scores[task].add(name, counts(task, correct))
            corrects[task].setdefault(name, []).append(np.asarray(correct, dtype=bool))
            infos.append(info)
            models.append(model)
        r = {**scores[task].score(name, "acc"), **infos[0]}
        if cfg.seeds > 1:
            r["fits"] = infos
        return r, models

    inputs = [(names[k], lambda k=k: (train.layer(k), dev.layer(k), test.layer(k)), TASKS) for k in layers]
    if residual and {1, 2} <= set(layers):
        inputs.append((NO_RESIDUAL, lambda: tuple(f.layer(2) - f.layer(1) for f in (train, dev, test)),
                       ("uas", *STRUCTURAL)))
    for name, load, tasks in inputs:
        x_tr, x_dev, x_te = load()
        norm = Standardize.fit(x_tr)   # fixed statistics: the probes may share it
        for task in tasks:
            def run(task=task, x_tr=x_tr, x_dev=x_dev, x_te=x_te, norm=norm):
                model = probe(task, Encoder(norm))
                info = fit_probe(model, x_tr, d_tr, x_dev, d_dev, cfg, by_loss=task == "uuas_hm")
                return model, info, evaluate(model, x_te, d_te)
            r, _ = fits(task, name, run)
            res[task]["layers"][name] = r
            _show(log, task, name, r)
    for task in TASKS:
        pairs = [("E1", "E2"), ("E1", NO_RESIDUAL), (NO_RESIDUAL, "E2")]
        for a, b in pairs:
            if a in scores[task].counts and b in scores[task].counts:
                p = res[task].setdefault("paired", {})[f"{b}-{a}"] = scores[task].paired(a, b)
                d, (lo, hi) = p["diff"], p["ci"]
                log(f"deps: {task} {b} - {a} = {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired bootstrap over {where})")
    if mix:
        x_tr, x_dev, x_te = train.all_layers(), dev.all_layers(), test.all_layers()
        norm = Standardize.fit(x_tr, token_axis=1)
        for task in TASKS:
            def run_mix(task=task):
                model = probe(task, Encoder(norm, L))
                mixer = model.encoder.mix
                info = fit_probe(model, x_tr, d_tr, x_dev, d_dev, cfg, token_axis=1,
                                 penalty=lambda: mixer.l2_penalty(cfg.mix_l2), by_loss=task == "uuas_hm")
                return model, info, evaluate(model, x_te, d_te, token_axis=1)
            r, models = fits(task, "mix", run_mix)
            r.update(mix_summary([m.encoder.mix for m in models]))
            res[task]["mix"] = r
            _show(log, task, "mix", r)
    distance = arc_distances(d_te)
    for task in TASKS:
        res[task]["units"] = scores[task].units()
        # UUAS: the root's dependent has no edge, so no bucket
        res[task]["by_distance"] = by_distance(corrects[task], np.where(edges, distance, -1) if task in STRUCTURAL
                                               else distance)
    return res
