"""Coreference probe on LitBank: does a frozen layer say whether two mentions corefer?

The protocol (``docs/science.md``): the 100 LitBank novel openings are split by novel, 70 train /
10 dev / 20 test, by a fixed seeded shuffle of the file names. Every gold mention ``j`` is paired
with each of its previous (up to 50) gold mentions ``i`` in the same document; the label is 1 when
the two belong to the same entity. A mention's vector is the mean of its tokens' vectors in one
layer (features of each sentence on its own); the probe is logistic regression over
``[m_i; m_j; m_i * m_j]`` of standardized span vectors, the same for every layer, and a
:class:`~torchelmo.model.mix.ScalarMix` over the layers under the same head. Gold mentions are given, so
this measures linking, not mention detection.

The metric is pairwise F1 (micro over test pairs, threshold 0.5) with a 95% bootstrap interval
over test *mentions*: every mention with at least one candidate is a unit carrying the
``(tp, fp, fn)`` of its candidate pairs, so the pairs of one anaphor are resampled together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ..errors import ElmoError
from ..model.mix import ScalarMix
from .common import Standardize, check_seeds, fit_early_stopped, layer_names, mix_summary
from .features import Features, Span
from .litbank import CorefDocument, part_sizes, read_litbank, split_documents
from .stats import UnitScores, f1_from_counts

# -- mention pairs -------------------------------------------------------------------------------

@dataclass
class CorefSet:
    """One split's mentions (rows of its span matrix) and their candidate antecedent pairs.

    ``pairs (P, 2)``: ``(i, j)`` mention rows, antecedent ``i`` before anaphor ``j`` in one
    document; ``labels (P,)`` 1 when they share an entity; ``units (P,)`` the bootstrap unit of
    the pair (its anaphor ``j``, numbered over the mentions that have a candidate).
    """

    sentences: list[list[str]]  # the documents' sentences, concatenated
    spans: list[Span]           # (M,) (sentence index into ``sentences``, start, end)
    heads: list[str]            # (M,) the span's last token, lower-cased
    pairs: np.ndarray           # (P, 2) int64
    labels: np.ndarray          # (P,) int64, 0 / 1
    units: np.ndarray           # (P,) int64 in [0, n_units)
    n_units: int
    n_anaphoric: int            # anaphors with at least one positive candidate
    n_documents: int
    n_entities: int
    names: list[str] = field(default_factory=list)
    unit_docs: list[str] = field(default_factory=list)   # (n_units,) each unit's document (novel)
    sentence_docs: list[str] = field(default_factory=list)   # each sentence's document

    def summary(self) -> dict:
        return {"documents": self.n_documents, "sentences": len(self.sentences),
                "mentions": len(self.spans), "entities": self.n_entities, "pairs": int(len(self.labels)),
                "positive_pairs": int(self.labels.sum()), "units": self.n_units,
                "anaphoric_mentions": self.n_anaphoric}


def build_pairs(docs: Sequence[CorefDocument], max_antecedents: int = 50) -> CorefSet:
    """Every gold mention against its previous ``max_antecedents`` gold mentions (document order:
    sentence, start, end), within its document."""
    if max_antecedents < 1:
        raise ElmoError(f"coref: max_antecedents must be >= 1, got {max_antecedents}")
    sentences: list[list[str]] = []
    spans: list[Span] = []
    heads: list[str] = []
    pairs, labels, units = [], [], []
    unit_docs: list[str] = []
    sentence_docs: list[str] = []
    n_units = n_anaphoric = n_entities = 0
    for doc in docs:
        base_s, base_m = len(sentences), len(spans)
        sentences.extend(doc.sentences)
        sentence_docs.extend([doc.name] * len(doc.sentences))
        ms = sorted(doc.mentions)
        n_entities += len({m.entity for m in ms})
        for m in ms:
            spans.append((base_s + m.sentence, m.start, m.end))
            heads.append(doc.sentences[m.sentence][m.end - 1].lower())
        entity = np.array([m.entity for m in ms], dtype=np.int64)
        for j in range(1, len(ms)):
            i = np.arange(max(0, j - max_antecedents), j)
            y = (entity[i] == entity[j]).astype(np.int64)
            pairs.append(np.stack([base_m + i, np.full_like(i, base_m + j)], 1))
            labels.append(y)
            units.append(np.full_like(i, n_units))
            unit_docs.append(doc.name)
            n_units += 1
            n_anaphoric += int(y.any())
    cat = (lambda xs, shape: np.concatenate(xs) if xs else np.zeros(shape, dtype=np.int64))
    return CorefSet(sentences, spans, heads, cat(pairs, (0, 2)), cat(labels, (0,)), cat(units, (0,)),
                    n_units, n_anaphoric, len(docs), n_entities, [d.name for d in docs], unit_docs,
                    sentence_docs)


def unit_counts(pred: np.ndarray, labels: np.ndarray, units: np.ndarray, n_units: int) -> np.ndarray:
    """Per-unit ``(tp, fp, fn)`` ``(n_units, 3)`` from per-pair 0/1 predictions and labels ``(P,)``."""
    pred, labels = np.asarray(pred).astype(bool), np.asarray(labels).astype(bool)
    cols = [pred & labels, pred & ~labels, ~pred & labels]
    return np.stack([np.bincount(units, c.astype(np.float64), n_units) for c in cols], 1)


def head_match(cs: CorefSet) -> np.ndarray:
    """The string baseline: "same entity" iff the two spans' last tokens match, ignoring case."""
    heads = np.array(cs.heads, dtype=object)
    if len(cs.pairs) == 0:
        return np.zeros(0, dtype=bool)
    return heads[cs.pairs[:, 0]] == heads[cs.pairs[:, 1]]


# -- the probe -----------------------------------------------------------------------------------

@dataclass
class CorefConfig:
    lr: float = 1e-3
    batch_size: int = 1024     # pairs
    max_epochs: int = 20
    patience: int = 3          # epochs without a dev-F1 improvement before stopping
    mix_l2: float = 0.001      # the paper's lambda * ||s||^2 on the mix scalars
    seed: int = 0
    n_boot: int = 1000
    max_antecedents: int = 50
    seeds: int = 1             # probes trained per input (seeds seed .. seed + seeds - 1), scored as their mean
    documents: bool = False    # the bootstrap draws test novels instead of mentions
    context: str = "sentence"  # features from the zero state per sentence, or "document": carried from
                               # the novel's previous sentence (probe_coref)


class PairProbe(nn.Module):
    """Logistic regression on a mention pair: ``x_i, x_j`` ``(B, F)`` one layer, or ``(L, B, F)``
    all layers through a ScalarMix -> standardized ``m`` -> ``w . [m_i; m_j; m_i * m_j] + b``
    -> ``(B,)`` logits."""

    def __init__(self, norm: Standardize, dim: int, num_layers: int | None = None) -> None:
        super().__init__()
        self.norm = norm
        self.mix = ScalarMix(num_layers) if num_layers else None
        self.head = nn.Linear(3 * dim, 1)

    def span(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return h if self.mix is None else self.mix(list(h))

    def forward(self, x_i: torch.Tensor, x_j: torch.Tensor) -> torch.Tensor:
        a, b = self.span(x_i), self.span(x_j)
        return self.head(torch.cat([a, b, a * b], -1)).squeeze(-1)


def _rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    # Mentions are the last-but-one axis of (M, F) and of (L, M, F); float16 is cast per batch.
    return x.index_select(x.dim() - 2, idx).float()


@torch.no_grad()
def predict_pairs(model: PairProbe, x: torch.Tensor, pairs: np.ndarray, batch: int = 8192) -> np.ndarray:
    """``(P,)`` 0/1 "same entity" at probability 0.5 (logit 0); pair features built per batch."""
    model.eval()
    p = torch.from_numpy(pairs)
    out = [model(_rows(x, p[a:a + batch, 0]), _rows(x, p[a:a + batch, 1])) > 0
           for a in range(0, len(p), batch)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=bool)


def fit_pair_probe(model: PairProbe, x_train: torch.Tensor, train: CorefSet, x_dev: torch.Tensor,
                   dev: CorefSet, cfg: CorefConfig) -> tuple[PairProbe, dict]:
    """Mini-batch Adam on binary cross-entropy, early-stopped on dev pairwise F1.

    Positives are rare (most candidates are other entities), so the loss weighs them by
    ``pos_weight = n_neg / n_pos`` of the training pairs: both classes count alike in the loss
    and a threshold of 0.5 is not drowned by the negatives.
    """
    g = torch.Generator().manual_seed(cfg.seed)  # own generator: shuffles do not depend on init
    pairs = torch.from_numpy(train.pairs)
    y = torch.from_numpy(train.labels).float()
    n_pos = float(y.sum())
    pos_weight = torch.tensor((len(y) - n_pos) / max(n_pos, 1.0))
    penalty = (lambda: model.mix.l2_penalty(cfg.mix_l2)) if model.mix is not None else None

    def epoch_losses():
        perm = torch.randperm(len(y), generator=g)
        for a in range(0, len(y), cfg.batch_size):
            idx = perm[a:a + cfg.batch_size]
            logits = model(_rows(x_train, pairs[idx, 0]), _rows(x_train, pairs[idx, 1]))
            loss = nn.functional.binary_cross_entropy_with_logits(logits, y[idx], pos_weight=pos_weight)
            yield loss if penalty is None else loss + penalty()

    def dev_f1() -> float:
        c = unit_counts(predict_pairs(model, x_dev, dev.pairs), dev.labels, dev.units, dev.n_units)
        return float(f1_from_counts(c.sum(0)))

    fit = fit_early_stopped(model, epoch_losses, dev_f1, lr=cfg.lr, max_epochs=cfg.max_epochs,
                            patience=cfg.patience)
    return model, {"dev_f1": fit["best_score"], "best_epoch": fit["best_epoch"], "epochs": fit["epochs"],
                   "dev_history": fit["history"], "pos_weight": float(pos_weight)}


def _as_array(f: Features | np.ndarray) -> np.ndarray:
    """``(L, M, F)`` span features from a :class:`Features` cache or an array."""
    x = f.all_layers() if isinstance(f, Features) else np.asarray(f)
    if x.ndim != 3:
        raise ElmoError(f"coref: span features must be (layers, mentions, dim), got shape {x.shape}")
    return x


def run_coref(train: Features | np.ndarray, dev: Features | np.ndarray, test: Features | np.ndarray,
              sets: tuple[CorefSet, CorefSet, CorefSet], cfg: CorefConfig | None = None,
              layers: list[int] | None = None, mix: bool = True,
              log: Callable[[str], None] = print) -> dict:
    """Per-layer pair probes and the mix probe on precomputed span features.

    ``train``/``dev``/``test``: ``(L, M, F)`` span vectors (or their :class:`Features`), row ``m``
    the mention ``sets[k].spans[m]``; ``sets``: the (train, dev, test) :class:`CorefSet`.
    """
    cfg = cfg or CorefConfig()
    xs = [_as_array(f) for f in (train, dev, test)]
    for name, x, cs in zip(("train", "dev", "test"), xs, sets):
        if x.shape[1] != len(cs.spans):
            raise ElmoError(f"coref: {name} features ({x.shape[1]} rows) do not match its "
                            f"{len(cs.spans)} mentions")
        if cs.n_units == 0:
            raise ElmoError(f"coref: the {name} set has no mention pairs")
    tr, dv, te = sets
    if tr.labels.sum() == 0:
        raise ElmoError("coref: no coreferent pair in the training set")
    L, _, F = xs[0].shape
    layers = list(range(L)) if layers is None else layers
    names = layer_names(L)
    check_seeds(cfg.seeds, "coref")
    res: dict = {"counts": {k: cs.summary() for k, cs in zip(("train", "dev", "test"), sets)},
                 "config": asdict(cfg), "layers": {}, "baselines": {}}
    groups = te.unit_docs if cfg.documents else None
    where = "test novels" if cfg.documents else "test mentions"
    scores = UnitScores(f1_from_counts, 3, groups, cfg.n_boot, cfg.seed)

    def rates(c: np.ndarray) -> dict:
        tp, fp, fn = c.sum(0)
        return {"precision": float(tp / max(tp + fp, 1)), "recall": float(tp / max(tp + fn, 1))}

    for key, pred, what in (("majority", np.zeros(len(te.labels), dtype=bool), "always 'different'"),
                            ("head_match", head_match(te), "same last token, any case")):
        c = unit_counts(pred, te.labels, te.units, te.n_units)
        r = res["baselines"][key] = {**scores.once(c, "f1"), **rates(c), "rule": what}
        log(f"coref: baseline {key} ({what}) test pairwise F1 {r['f1']:.4f} "
            f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]")

    def fits(name: str, make: Callable[[], PairProbe], x_tr, x_dev, x_te) -> tuple[dict, list[PairProbe]]:
        """``cfg.seeds`` fits of one probe, scored as their mean; precision and recall of each seed averaged."""
        infos, models, prs = [], [], []
        for s in range(cfg.seeds):
            torch.manual_seed(cfg.seed + s)
            model, info = fit_pair_probe(make(), x_tr, tr, x_dev, dv, replace(cfg, seed=cfg.seed + s))
            c = unit_counts(predict_pairs(model, x_te, te.pairs), te.labels, te.units, te.n_units)
            scores.add(name, c)
            infos.append(info)
            models.append(model)
            prs.append(rates(c))
        r = {**scores.score(name, "f1"), **{k: float(np.mean([p[k] for p in prs])) for k in prs[0]}, **infos[0]}
        if cfg.seeds > 1:
            r["fits"] = infos
        return r, models

    def spread(r: dict) -> str:
        return f", sd over {cfg.seeds} seeds {r['sd']:.4f}" if cfg.seeds > 1 else ""

    t = [torch.from_numpy(x) for x in xs]
    for k in layers:
        x_tr = t[0][k].float()
        r, _ = fits(names[k], lambda x_tr=x_tr: PairProbe(Standardize.fit(x_tr.numpy()), F), x_tr, t[1][k], t[2][k])
        res["layers"][names[k]] = r
        log(f"coref: {names[k]} test pairwise F1 {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] "
            f"(P {r['precision']:.3f}, R {r['recall']:.3f}; dev {r['dev_f1']:.4f}, epoch {r['best_epoch']}"
            f"{spread(r)})")
    if "E1" in scores.counts and "E2" in scores.counts:
        p = res["paired"] = {"E2-E1": scores.paired("E1", "E2")}
        d, (lo, hi) = p["E2-E1"]["diff"], p["E2-E1"]["ci"]
        log(f"coref: E2 - E1 = {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired bootstrap over {where})")
    if mix:
        r, models = fits("mix", lambda: PairProbe(Standardize.fit(xs[0], token_axis=1), F, num_layers=L),
                         t[0], t[1], t[2])
        r.update(mix_summary([m.mix for m in models]))
        res["mix"] = r
        log(f"coref: mix test pairwise F1 {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], softmax(s) = "
            f"{[round(w, 3) for w in r['weights']]}, gamma = {r['gamma']:.3f}{spread(r)}")
    res["units"] = {**scores.units(), "documents": te.unit_docs}
    return res


def probe_coref(bilm, litbank_dir: str | Path, cache: str | Path | None = None,
                cfg: CorefConfig | None = None, log: Callable[[str], None] = print,
                progress: bool = False, limit_docs: int | None = None) -> dict:
    """The coreference row of the protocol: read LitBank, split by novel, extract span features
    of each split, run :func:`run_coref`.

    ``limit_docs`` (a quick run): keep that many documents, each part of the protocol's split cut
    in proportion, so a quick run's test novels are still test novels.
    """
    from .features import extract

    cfg = cfg or CorefConfig()
    docs = read_litbank(litbank_dir)
    parts = split_documents(docs, seed=cfg.seed)
    if limit_docs is not None:
        keep = part_sizes(min(limit_docs, len(docs)), [len(p) for p in parts])
        parts = tuple(p[:k] for p, k in zip(parts, keep))
    if any(len(p) == 0 for p in parts):
        raise ElmoError(f"coref: need at least 3 documents (one per split), got {sum(map(len, parts))}")
    sets = tuple(build_pairs(p, cfg.max_antecedents) for p in parts)
    for name, cs in zip(("train", "dev", "test"), sets):
        c = cs.summary()
        log(f"coref: {name} {c['documents']} novels, {c['mentions']} mentions, {c['pairs']} pairs "
            f"({c['positive_pairs']} coreferent), {c['anaphoric_mentions']} anaphoric mentions")
    if cfg.context not in ("sentence", "document"):
        raise ElmoError(f"coref: context must be 'sentence' or 'document', got {cfg.context!r}")
    feats = [extract(bilm, cs.sentences, cache, spans=cs.spans, name=f"coref-{name}", progress=progress,
                     documents=cs.sentence_docs if cfg.context == "document" else None)
             for name, cs in zip(("train", "dev", "test"), sets)]
    res = run_coref(*feats, sets, cfg, log=log)  # type: ignore[arg-type]
    res["documents"] = {name: cs.names for name, cs in zip(("train", "dev", "test"), sets)}
    return res
