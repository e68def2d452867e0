"""WSD probe, as in the ELMo paper (Peters et al. 2018, sec. 5.3).

* Sense vectors: for each WordNet sense key seen in SemCor, the mean of a layer's representation
  over its SemCor instances (an instance that is a multi-word unit, ``took_place``, is the mean of
  its tokens; the biLM reads ``took place``).
* Prediction: the cosine nearest neighbour among the sense vectors of the instance's lemma and POS;
  a lemma/POS never seen in SemCor backs off to its WordNet first sense (``index.sense``, sense
  number 1).
* Score: F1 (precision over answered, recall over all instances; a prediction is right if it is
  one of the gold keys) on Raganato's unified set ``ALL``, with a 95% bootstrap interval over
  instances. ``ALL`` contains SemEval-2007, the dev set used to pick the mix, so the mix is also
  reported on ``ALL`` minus SemEval-2007, and every layer per dataset.

The learned mix (see :func:`learn_mix`): ``x = sum_k w_k x_k / r_k`` with ``w = softmax(s)`` and
``r_k`` the layer's RMS norm over SemCor instances (so weights compare layers at equal scale);
sense vectors mix the same way (a mean is linear). ``s`` is trained on SemCor with a
classification objective: softmax over the lemma's candidate senses of ``cos(x, m_sense) / tau``,
with leave-one-out sense vectors (an instance never votes for itself); the epoch with the best
SemEval-2007 F1 is kept. A grid search over the weight simplex maximising SemEval-2007 F1 is
reported beside it as a check. ``gamma`` does not exist for a cosine classifier (scale-free); the
learned temperature ``tau`` is reported instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ElmoError
from .common import layer_names
from .features import Features
from .stats import as_lists, bootstrap_ci, paired_diff_ci

# The readers live in .wsd_data; re-exported here, where the probe's users have always found them.
from .wsd_data import (
    POS_LETTER,
    SS_TYPE,
    WsdCorpus,
    WsdInstance,
    key_lemma_pos,
    read_gold_keys,
    read_raganato,
    read_sense_index,
)

__all__ = ["POS_LETTER", "SS_TYPE", "SenseInventory", "WsdCorpus", "WsdInstance", "build_inventory",
           "f1_wsd", "grid_mix", "key_lemma_pos", "layer_scales", "learn_mix", "predict_1nn",
           "read_gold_keys", "read_raganato", "read_sense_index", "run_wsd", "wsd_counts"]

# -- the 1-NN classifier -------------------------------------------------------------------------

@dataclass
class SenseInventory:
    keys: list[str]                         # K sense keys seen in SemCor
    sums: np.ndarray                        # (L, K, F) float64 sums of instance vectors
    counts: np.ndarray                      # (K,)
    candidates: dict[tuple[str, str], list[int]]  # (lemma, pos) -> sense indices

    def vectors(self, weights: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
        """``(L, K, F)`` per-layer means, or ``(K, F)`` for a mix ``sum_k w_k mean_k / scale_k``."""
        means = self.sums / self.counts[None, :, None]
        if weights is None:
            return means
        return np.tensordot(np.asarray(weights) / scale, means, axes=1)


def build_inventory(train: WsdCorpus, feats: Features) -> SenseInventory:
    if feats.n != len(train.instances):
        raise ElmoError(f"wsd: {feats.n} feature rows for {len(train.instances)} training instances")
    index: dict[str, int] = {}
    rows, cols = [], []
    for j, inst in enumerate(train.instances):
        for k in inst.keys:
            rows.append(index.setdefault(k, len(index)))
            cols.append(j)
    keys = list(index)
    rows_a, cols_a = np.asarray(rows), np.asarray(cols)
    sums = np.zeros((feats.num_layers, len(keys), feats.dim))
    for l in range(feats.num_layers):
        np.add.at(sums[l], rows_a, feats.layer(l)[cols_a])
    counts = np.bincount(rows_a, minlength=len(keys)).astype(np.float64)
    candidates: dict[tuple[str, str], list[int]] = {}
    for k, i in index.items():
        candidates.setdefault(key_lemma_pos(k), []).append(i)
    return SenseInventory(keys, sums, counts, candidates)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def predict_1nn(inv: SenseInventory, corpus: WsdCorpus, x: np.ndarray, sense_vecs: np.ndarray,
                first_sense: dict[tuple[str, str], str]) -> tuple[list[str | None], np.ndarray]:
    """Predicted key per instance (None: no answer) and whether it came from the 1-NN (vs back-off).

    ``x (N, F)``: instance vectors; ``sense_vecs (K, F)``.
    """
    xu, su = _unit(x), _unit(sense_vecs)
    preds: list[str | None] = []
    used = np.zeros(len(corpus.instances), dtype=bool)
    for j, inst in enumerate(corpus.instances):
        cand = inv.candidates.get((inst.lemma, inst.pos))
        if cand:
            preds.append(inv.keys[cand[int(np.argmax(su[cand] @ xu[j]))]])
            used[j] = True
        else:
            preds.append(first_sense.get((inst.lemma, inst.pos)))
    return preds, used


def wsd_counts(corpus: WsdCorpus, preds: list[str | None]) -> np.ndarray:
    """Per-instance ``(correct, answered, 1)``."""
    return np.array([[float(p is not None and p in i.keys), float(p is not None), 1.0]
                     for i, p in zip(corpus.instances, preds)])


def f1_wsd(c: np.ndarray) -> np.ndarray:
    p = c[..., 0] / np.maximum(c[..., 1], 1)
    r = c[..., 0] / np.maximum(c[..., 2], 1)
    return 2 * p * r / np.maximum(p + r, 1e-12)


def _score(counts: np.ndarray, rows: np.ndarray | None, n_boot: int, seed: int,
           groups: np.ndarray | None = None) -> dict:
    c = counts if rows is None else counts[rows]
    g = groups if groups is None or rows is None else groups[rows]
    f1, lo, hi = bootstrap_ci(c, f1_wsd, n_boot, seed=seed, groups=g)
    return {"f1": f1, "ci": [lo, hi], "n": int(len(c))}


def instance_documents(corpus: WsdCorpus) -> np.ndarray:
    """Each instance's document: ``<dataset>.<doc>`` of Raganato's ``<dataset>.<doc>.<sentence>.<token>``."""
    docs = np.array([".".join(i.id.split(".")[:2]) for i in corpus.instances])
    if any(i.id.count(".") < 3 for i in corpus.instances):
        raise ElmoError(f"{corpus.path}: instance ids do not name their documents (expected "
                        "<dataset>.<doc>.<sentence>.<token>)")
    return docs


# -- the mix -------------------------------------------------------------------------------------

def layer_scales(feats: Features) -> np.ndarray:
    """RMS vector norm of each layer over the instances (``(L,)``)."""
    return np.array([np.sqrt(np.mean(np.sum(feats.layer(k).astype(np.float64) ** 2, -1)))
                     for k in range(feats.num_layers)]) + 1e-12


def learn_mix(inv: SenseInventory, train: WsdCorpus, train_feats: Features, scale: np.ndarray,
              dev_eval: Callable[[np.ndarray], float], epochs: int = 4, max_instances: int = 50000,
              batch_size: int = 256, lr: float = 0.05, seed: int = 0,
              log: Callable[[str], None] = print) -> dict:
    """Train ``s`` (and a temperature) by softmax over each instance's candidate senses; keep the
    epoch with the best ``dev_eval(weights)`` (the uniform start's dev F1 is reported beside it,
    not selected: the weights shown are always learned ones)."""
    if epochs < 1:
        raise ElmoError(f"wsd: the mix needs at least 1 epoch, got {epochs}")
    rng = np.random.default_rng(seed)
    key_index = {k: i for i, k in enumerate(inv.keys)}
    items = []  # (instance row, candidate list, position of gold)
    for j, inst in enumerate(train.instances):
        cand = inv.candidates.get((inst.lemma, inst.pos), [])
        g = key_index[inst.keys[0]]
        if len(cand) >= 2 and inv.counts[g] >= 2:
            items.append((j, cand, cand.index(g)))
    if not items:
        raise ElmoError("wsd: no SemCor instance has two candidate senses to learn the mix from")
    if len(items) > max_instances:
        items = [items[i] for i in sorted(rng.choice(len(items), max_instances, replace=False))]
    L = inv.sums.shape[0]
    X = torch.from_numpy(train_feats.all_layers(np.array([it[0] for it in items])).astype(np.float32))
    sums = torch.from_numpy(inv.sums).float()
    counts = torch.from_numpy(inv.counts).float()
    sc = torch.from_numpy(scale).float().view(L, 1, 1)
    s = torch.zeros(L, requires_grad=True)
    log_t = torch.tensor(np.log(10.0), dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([s, log_t], lr=lr)
    C = max(len(it[1]) for it in items)
    cand = torch.full((len(items), C), -1, dtype=torch.long)
    for r, it in enumerate(items):
        cand[r, :len(it[1])] = torch.tensor(it[1])
    gold_pos = torch.tensor([it[2] for it in items])
    uniform_f1 = dev_eval(np.full(L, 1.0 / L))
    best = None
    log(f"wsd mix: uniform weights, dev F1 {uniform_f1:.4f}")
    for epoch in range(1, epochs + 1):
        perm = torch.from_numpy(rng.permutation(len(items)))
        for a in range(0, len(items), batch_size):
            b = perm[a:a + batch_size]
            cb, gb, xb = cand[b], gold_pos[b], X[:, b] / sc               # xb (L, B, F)
            valid = cb >= 0
            ci = cb.clamp(min=0)
            m_sum = sums[:, ci]                                            # (L, B, C, F)
            n = counts[ci].clone()                                         # (B, C)
            rows = torch.arange(len(b))
            # Leave the instance out of its own gold sense's mean.
            m_sum[:, rows, gb] -= X[:, b]
            n[rows, gb] -= 1
            means = m_sum / n.clamp(min=1).unsqueeze(0).unsqueeze(-1) / sc.unsqueeze(-1)
            w = torch.softmax(s, 0)
            xm = torch.einsum("l,lbf->bf", w, xb)
            mm = torch.einsum("l,lbcf->bcf", w, means)
            cos = torch.nn.functional.cosine_similarity(xm.unsqueeze(1), mm, dim=-1)
            logits = (cos * log_t.exp()).masked_fill(~valid, -1e9)
            loss = torch.nn.functional.cross_entropy(logits, gb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        weights = torch.softmax(s.detach(), 0).numpy()
        f1 = dev_eval(weights)
        log(f"wsd mix: epoch {epoch} softmax(s) = {np.round(weights.astype(float), 3).tolist()}, "
            f"tau = {float(1 / log_t.detach().exp()):.4f}, loss {float(loss.detach()):.4f}, dev F1 {f1:.4f}")
        if best is None or f1 >= best["dev_f1"]:
            best = {"dev_f1": f1, "weights": weights.tolist(), "epoch": epoch,
                    "temperature": float(1 / log_t.detach().exp())}
    best["n_train_instances"] = len(items)
    best["uniform_dev_f1"] = uniform_f1
    return best


def grid_mix(L: int, dev_eval: Callable[[np.ndarray], float], step: float = 0.1) -> dict:
    """Best simplex point by dev F1 (ties: the one nearest to uniform)."""
    m = int(round(1 / step))
    best = None
    for point in _simplex(L, m):
        w = np.array(point, dtype=np.float64) / m
        f1 = dev_eval(w)
        key = (f1, -np.abs(w - 1.0 / L).sum())
        if best is None or key > best[0]:
            best = (key, w)
    return {"dev_f1": best[0][0], "weights": best[1].tolist(), "step": step}


def _simplex(L: int, m: int):
    if L == 1:
        yield (m,)
        return
    for i in range(m + 1):
        for rest in _simplex(L - 1, m - i):
            yield (i, *rest)


# -- the probe -----------------------------------------------------------------------------------

@dataclass
class _TestScorer:
    """Scores per-instance counts on ALL, on the mix's dev part and the rest, and per dataset."""

    test: WsdCorpus
    dev_rows: np.ndarray
    rest_rows: np.ndarray
    n_boot: int
    seed: int
    groups: np.ndarray | None = None         # each instance's document (None: instances resampled)
    datasets: list[str] = field(init=False)  # ids are "<dataset>.<doc>.<sentence>.<token>"

    def __post_init__(self) -> None:
        ids = [i.id for i in self.test.instances]
        self.datasets = sorted({i.split(".")[0] for i in ids}) if "." in ids[0] else []

    @property
    def split(self) -> bool:  # ALL minus the mix's dev set is scored only when both parts exist
        return bool(len(self.dev_rows) and len(self.rest_rows))

    def __call__(self, counts: np.ndarray) -> dict:
        test, n_boot, seed, g = self.test, self.n_boot, self.seed, self.groups
        r = {"all": _score(counts, None, n_boot, seed, g)}
        if self.split:
            r["dev"] = _score(counts, self.dev_rows, n_boot, seed, g)
            r["all_minus_dev"] = _score(counts, self.rest_rows, n_boot, seed, g)
        r["per_dataset"] = {d: float(f1_wsd(counts[test.subset(lambda i, d=d: i.id.startswith(d + "."))].sum(0)))
                            for d in self.datasets}
        r["f1"], r["ci"] = r["all"]["f1"], r["all"]["ci"]
        return r

    def preds(self, preds: list[str | None]) -> dict:
        return self(wsd_counts(self.test, preds))


def run_wsd(train: WsdCorpus, train_feats: Features, test: WsdCorpus, test_feats: Features,
            first_sense: dict[tuple[str, str], str], dev_prefix: str = "semeval2007.",
            layers: list[int] | None = None, mix: bool = True, n_boot: int = 1000, seed: int = 0,
            mix_epochs: int = 4, log: Callable[[str], None] = print, documents: bool = False) -> dict:
    """Per-layer 1-NN F1 on ``test`` (ALL), per dataset, and the learned mix. ``documents``: the
    bootstrap draws test documents instead of instances; ``res["units"]`` holds the per-instance
    counts ``(correct, answered, 1)`` and each instance's document."""
    if test_feats.n != len(test.instances):
        raise ElmoError(f"wsd: {test_feats.n} feature rows for {len(test.instances)} test instances")
    inv = build_inventory(train, train_feats)
    L = train_feats.num_layers
    layers = list(range(L)) if layers is None else layers
    names = layer_names(L)
    groups = instance_documents(test) if documents else None
    score = _TestScorer(test, test.subset(lambda i: i.id.startswith(dev_prefix)),
                        test.subset(lambda i: not i.id.startswith(dev_prefix)), n_boot, seed, groups)
    where = "documents" if documents else "instances"
    res: dict = {"n_train_instances": len(train.instances), "n_senses": len(inv.keys),
                 "n_test_instances": len(test.instances), "n_dev_instances": int(len(score.dev_rows)),
                 "dev": dev_prefix.rstrip("."), "layers": {}}

    # Baselines: WordNet first sense, and SemCor's most frequent sense (first sense when unseen).
    res["first_sense"] = score.preds([first_sense.get((i.lemma, i.pos)) for i in test.instances])
    mfs = []
    for i in test.instances:
        cand = inv.candidates.get((i.lemma, i.pos))
        mfs.append(inv.keys[max(cand, key=lambda c: inv.counts[c])] if cand
                   else first_sense.get((i.lemma, i.pos)))
    res["semcor_mfs"] = score.preds(mfs)
    log(f"wsd: WordNet first sense F1 {res['first_sense']['f1']:.4f}, SemCor MFS F1 "
        f"{res['semcor_mfs']['f1']:.4f}")

    means = inv.vectors()
    unit_counts: dict[str, np.ndarray] = {}
    for k in layers:
        preds, used = predict_1nn(inv, test, test_feats.layer(k), means[k], first_sense)
        unit_counts[names[k]] = counts = wsd_counts(test, preds)
        r = score(counts)
        r["coverage_1nn"] = float(used.mean())
        res["layers"][names[k]] = r
        log(f"wsd: {names[k]} F1 ALL {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]"
            + (f", ALL-{res['dev']} {r['all_minus_dev']['f1']:.4f}" if "all_minus_dev" in r else ""))
    if "E1" in unit_counts and "E2" in unit_counts:
        res["paired"] = {}
        parts = {"all": slice(None), **({"all_minus_dev": score.rest_rows} if score.split else {})}
        for part, rows in parts.items():
            d, lo, hi = paired_diff_ci(unit_counts["E1"][rows], unit_counts["E2"][rows], f1_wsd, n_boot, seed=seed,
                                       groups=None if groups is None else groups[rows])
            res["paired"][f"E2-E1 {part}"] = {"diff": d, "ci": [lo, hi]}
            log(f"wsd: E2 - E1 F1 ({part}) = {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired bootstrap over {where})")
    if mix:
        if not len(score.dev_rows):
            raise ElmoError(f"wsd: the mix needs dev instances (ids starting {dev_prefix!r}) in the test set")
        res["mix"], res["mix_grid"] = _mixes(inv, train, train_feats, test_feats, first_sense, score,
                                             mix_epochs, seed, log)
        r, g = res["mix"], res["mix_grid"]
        log(f"wsd: mix F1 ALL {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], ALL-{res['dev']} "
            f"{r['all_minus_dev']['f1']:.4f}, softmax(s) = {np.round(r['weights'], 3).tolist()}; "
            f"grid mix {np.round(g['weights'], 2).tolist()} F1 ALL {g['f1']:.4f}")
        unit_counts["mix"] = r.pop("_counts")
    res["units"] = {"k": 3, "seeds": 1, "resampled": where,
                    "documents": None if groups is None else groups.tolist(),
                    "ids": [i.id for i in test.instances], "dev_prefix": dev_prefix,
                    "counts": {n: as_lists(c) for n, c in unit_counts.items()}}
    return res


def _mixes(inv: SenseInventory, train: WsdCorpus, train_feats: Features, test_feats: Features,
           first_sense: dict[tuple[str, str], str], score: _TestScorer, mix_epochs: int, seed: int,
           log: Callable[[str], None]) -> tuple[dict, dict]:
    """The learned mix and the grid-searched one, both selected on the dev rows, scored on the test."""
    test, dev_rows = score.test, score.dev_rows
    scale = layer_scales(train_feats)
    x_all = test_feats.all_layers().astype(np.float32)
    dev_corpus = WsdCorpus(test.path, test.sentences, [test.instances[j] for j in dev_rows], test.documents)

    def mixed(weights, rows=None):
        w = np.asarray(weights) / scale
        x = np.tensordot(w, x_all if rows is None else x_all[:, rows], axes=1)
        return x, inv.vectors(weights, scale)

    def dev_eval(weights) -> float:
        x, sv = mixed(weights, dev_rows)
        preds, _ = predict_1nn(inv, dev_corpus, x, sv, first_sense)
        return float(f1_wsd(wsd_counts(dev_corpus, preds).sum(0)))

    learned = learn_mix(inv, train, train_feats, scale, dev_eval, epochs=mix_epochs, seed=seed, log=log)
    x, sv = mixed(learned["weights"])
    counts = wsd_counts(test, predict_1nn(inv, test, x, sv, first_sense)[0])
    r = score(counts)
    r["_counts"] = counts
    r.update(weights=learned["weights"], temperature=learned["temperature"],
             best_epoch=learned["epoch"], dev_f1=learned["dev_f1"],
             uniform_dev_f1=learned["uniform_dev_f1"],
             n_mix_train_instances=learned["n_train_instances"], layer_scales=scale.tolist())
    grid = grid_mix(train_feats.num_layers, dev_eval)
    x, sv = mixed(grid["weights"])
    g = score.preds(predict_1nn(inv, test, x, sv, first_sense)[0])
    g.update(weights=grid["weights"], dev_f1=grid["dev_f1"], step=grid["step"])
    return r, g
