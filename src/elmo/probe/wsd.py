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

import gzip
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import ElmoError
from .features import Features
from .stats import bootstrap_ci, paired_diff_ci

POS_LETTER = {"NOUN": "n", "VERB": "v", "ADJ": "a", "ADV": "r"}
SS_TYPE = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}  # 5 = adjective satellite


@dataclass
class WsdInstance:
    id: str
    sentence: int
    start: int
    end: int          # exclusive
    lemma: str
    pos: str          # n, v, a, r
    keys: list[str] = field(default_factory=list)


@dataclass
class WsdCorpus:
    path: Path
    sentences: list[list[str]]
    instances: list[WsdInstance]

    @property
    def spans(self) -> list[tuple[int, int, int]]:
        return [(i.sentence, i.start, i.end) for i in self.instances]

    def subset(self, keep: Callable[[WsdInstance], bool]) -> np.ndarray:
        return np.array([j for j, i in enumerate(self.instances) if keep(i)], dtype=np.int64)


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise ElmoError(f"{path}: no such file")
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return raw


def key_lemma_pos(key: str) -> tuple[str, str]:
    """``'bank%1:14:00::'`` -> ``('bank', 'n')``."""
    lemma, _, rest = key.partition("%")
    if not lemma or not rest or rest[0] not in SS_TYPE:
        raise ElmoError(f"bad WordNet sense key {key!r}")
    return lemma.lower(), SS_TYPE[rest[0]]


def read_gold_keys(path: str | Path) -> dict[str, list[str]]:
    path = Path(path)
    out: dict[str, list[str]] = {}
    with _open_text(path) as f:
        for i, line in enumerate(io.TextIOWrapper(f, encoding="utf-8"), 1):
            cols = line.split()
            if not cols:
                continue
            if len(cols) < 2:
                raise ElmoError(f"{path}:{i}: expected 'instance_id sense_key [sense_key ...]'")
            for k in cols[1:]:
                if "%" not in k:
                    raise ElmoError(f"{path}:{i}: {k!r} is not a WordNet sense key")
            if cols[0] in out:
                raise ElmoError(f"{path}:{i}: instance {cols[0]} listed twice")
            out[cols[0]] = cols[1:]
    return out


def read_raganato(xml_path: str | Path, key_path: str | Path | None = None,
                  limit: int | None = None) -> WsdCorpus:
    """A corpus in the unified format (``*.data.xml[.gz]`` + ``*.gold.key.txt[.gz]``).

    ``key_path`` defaults to the sibling ``.gold.key.txt`` file. ``limit``: first N sentences.
    Tokens are the ``<wf>``/``<instance>`` texts split at spaces and underscores.
    """
    import xml.parsers.expat

    xml_path = Path(xml_path)
    if key_path is None:
        name = xml_path.name.replace(".data.xml", ".gold.key.txt")
        key_path = xml_path.with_name(name)
        if not key_path.is_file() and name.endswith(".gz"):
            key_path = xml_path.with_name(name[:-3])
    gold = read_gold_keys(key_path)
    sentences: list[list[str]] = []
    instances: list[WsdInstance] = []
    state = {"tokens": None, "el": None, "attrs": None, "text": []}
    p = xml.parsers.expat.ParserCreate()

    class _Stop(Exception):
        pass

    def bad(msg: str) -> ElmoError:
        return ElmoError(f"{xml_path}:{p.CurrentLineNumber}: {msg}")

    def start(tag, attrs):
        if tag == "sentence":
            state["tokens"] = []
        elif tag in ("wf", "instance"):
            if state["tokens"] is None:
                raise bad(f"<{tag}> outside a <sentence>")
            state["el"], state["attrs"], state["text"] = tag, attrs, []

    def end(tag):
        if tag in ("wf", "instance"):
            text = "".join(state["text"]).strip()
            if not text:
                raise bad(f"<{tag}> without text")
            tokens = state["tokens"]
            parts = text.replace("_", " ").split() or [text]
            if tag == "instance":
                a = state["attrs"]
                iid, lemma, pos = a.get("id"), a.get("lemma"), a.get("pos")
                if not iid or not lemma or pos is None:
                    raise bad("<instance> lacks id, lemma or pos")
                if pos not in POS_LETTER:
                    raise bad(f"instance {iid}: pos {pos!r} is not one of {', '.join(POS_LETTER)}")
                if iid not in gold:
                    raise bad(f"instance {iid} has no gold key in {key_path}")
                instances.append(WsdInstance(iid, len(sentences), len(tokens), len(tokens) + len(parts),
                                             lemma.lower(), POS_LETTER[pos], gold[iid]))
            tokens.extend(parts)
            state["el"] = None
        elif tag == "sentence":
            if state["tokens"]:
                sentences.append(state["tokens"])
            state["tokens"] = None
            if limit is not None and len(sentences) >= limit:
                raise _Stop

    def chars(data):
        if state["el"] is not None:
            state["text"].append(data)

    p.StartElementHandler, p.EndElementHandler, p.CharacterDataHandler = start, end, chars
    with _open_text(xml_path) as f:
        try:
            p.ParseFile(f)
        except _Stop:
            pass
        except xml.parsers.expat.ExpatError as e:
            raise ElmoError(f"{xml_path}:{e.lineno}: malformed XML ({xml.parsers.expat.errors.messages[e.code]})") from None
        except (OSError, EOFError) as e:
            raise ElmoError(f"{xml_path}: cannot read ({e})") from None
    if not instances:
        raise ElmoError(f"{xml_path}: no <instance> elements found")
    if limit is None and len(gold) != len(instances):
        seen = {i.id for i in instances}
        extra = next(k for k in gold if k not in seen)
        raise ElmoError(f"{key_path}: {len(gold) - len(instances)} key(s) for instances not in "
                        f"{xml_path} (e.g. {extra})")
    return WsdCorpus(xml_path, sentences, instances)


def read_sense_index(path: str | Path) -> dict[tuple[str, str], str]:
    """WordNet ``index.sense``: ``(lemma, pos) -> first sense key`` (sense number 1)."""
    path = Path(path)
    first: dict[tuple[str, str], str] = {}
    with _open_text(path) as f:
        for i, line in enumerate(io.TextIOWrapper(f, encoding="utf-8"), 1):
            cols = line.split()
            if not cols:
                continue
            if len(cols) != 4 or not cols[2].isdigit():
                raise ElmoError(f"{path}:{i}: expected 'sense_key offset sense_number tag_cnt'")
            try:
                lp = key_lemma_pos(cols[0])
            except ElmoError as e:
                raise ElmoError(f"{path}:{i}: {e}") from None
            if cols[2] == "1":
                first.setdefault(lp, cols[0])
    if not first:
        raise ElmoError(f"{path}: no senses with sense number 1")
    return first


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


def _score(counts: np.ndarray, rows: np.ndarray | None, n_boot: int, seed: int) -> dict:
    c = counts if rows is None else counts[rows]
    f1, lo, hi = bootstrap_ci(c, f1_wsd, n_boot, seed=seed)
    return {"f1": f1, "ci": [lo, hi], "n": int(len(c))}


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

def run_wsd(train: WsdCorpus, train_feats: Features, test: WsdCorpus, test_feats: Features,
            first_sense: dict[tuple[str, str], str], dev_prefix: str = "semeval2007.",
            layers: list[int] | None = None, mix: bool = True, n_boot: int = 1000, seed: int = 0,
            mix_epochs: int = 4, log: Callable[[str], None] = print) -> dict:
    """Per-layer 1-NN F1 on ``test`` (ALL), per dataset, and the learned mix."""
    from .pos import LAYER_NAMES
    if test_feats.n != len(test.instances):
        raise ElmoError(f"wsd: {test_feats.n} feature rows for {len(test.instances)} test instances")
    inv = build_inventory(train, train_feats)
    L = train_feats.num_layers
    layers = list(range(L)) if layers is None else layers
    datasets = sorted({i.id.split(".")[0] for i in test.instances}) if "." in test.instances[0].id else []
    dev_rows = test.subset(lambda i: i.id.startswith(dev_prefix))
    rest_rows = test.subset(lambda i: not i.id.startswith(dev_prefix))
    res: dict = {"n_train_instances": len(train.instances), "n_senses": len(inv.keys),
                 "n_test_instances": len(test.instances), "n_dev_instances": int(len(dev_rows)),
                 "dev": dev_prefix.rstrip("."), "layers": {}}

    split = bool(len(dev_rows) and len(rest_rows))  # also score ALL minus the mix's dev set

    def score_counts(counts: np.ndarray) -> dict:
        r = {"all": _score(counts, None, n_boot, seed)}
        if split:
            r["dev"] = _score(counts, dev_rows, n_boot, seed)
            r["all_minus_dev"] = _score(counts, rest_rows, n_boot, seed)
        r["per_dataset"] = {d: float(f1_wsd(counts[test.subset(lambda i, d=d: i.id.startswith(d + "."))].sum(0)))
                            for d in datasets}
        r["f1"], r["ci"] = r["all"]["f1"], r["all"]["ci"]
        return r

    def evaluate(preds) -> dict:
        return score_counts(wsd_counts(test, preds))

    # Baselines: WordNet first sense, and SemCor's most frequent sense (first sense when unseen).
    res["first_sense"] = evaluate([first_sense.get((i.lemma, i.pos)) for i in test.instances])
    mfs = []
    for i in test.instances:
        cand = inv.candidates.get((i.lemma, i.pos))
        mfs.append(inv.keys[max(cand, key=lambda c: inv.counts[c])] if cand
                   else first_sense.get((i.lemma, i.pos)))
    res["semcor_mfs"] = evaluate(mfs)
    log(f"wsd: WordNet first sense F1 {res['first_sense']['f1']:.4f}, SemCor MFS F1 "
        f"{res['semcor_mfs']['f1']:.4f}")

    means = inv.vectors()
    unit_counts: dict[str, np.ndarray] = {}
    for k in layers:
        preds, used = predict_1nn(inv, test, test_feats.layer(k), means[k], first_sense)
        unit_counts[LAYER_NAMES[k]] = counts = wsd_counts(test, preds)
        r = score_counts(counts)
        r["coverage_1nn"] = float(used.mean())
        res["layers"][LAYER_NAMES[k]] = r
        log(f"wsd: {LAYER_NAMES[k]} F1 ALL {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]"
            + (f", ALL-{res['dev']} {r['all_minus_dev']['f1']:.4f}" if "all_minus_dev" in r else ""))
    if "E1" in unit_counts and "E2" in unit_counts:
        res["paired"] = {}
        parts = {"all": slice(None), **({"all_minus_dev": rest_rows} if split else {})}
        for part, rows in parts.items():
            d, lo, hi = paired_diff_ci(unit_counts["E1"][rows], unit_counts["E2"][rows], f1_wsd, n_boot, seed=seed)
            res["paired"][f"E2-E1 {part}"] = {"diff": d, "ci": [lo, hi]}
            log(f"wsd: E2 - E1 F1 ({part}) = {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired bootstrap over instances)")
    if mix:
        if not len(dev_rows):
            raise ElmoError(f"wsd: the mix needs dev instances (ids starting {dev_prefix!r}) in the test set")
        scale = layer_scales(train_feats)
        x_all = test_feats.all_layers().astype(np.float32)
        dev_corpus = WsdCorpus(test.path, test.sentences, [test.instances[j] for j in dev_rows])

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
        r = evaluate(predict_1nn(inv, test, x, sv, first_sense)[0])
        r.update(weights=learned["weights"], temperature=learned["temperature"],
                 best_epoch=learned["epoch"], dev_f1=learned["dev_f1"],
                 uniform_dev_f1=learned["uniform_dev_f1"],
                 n_mix_train_instances=learned["n_train_instances"], layer_scales=scale.tolist())
        res["mix"] = r
        grid = grid_mix(L, dev_eval)
        x, sv = mixed(grid["weights"])
        g = evaluate(predict_1nn(inv, test, x, sv, first_sense)[0])
        g.update(weights=grid["weights"], dev_f1=grid["dev_f1"], step=grid["step"])
        res["mix_grid"] = g
        log(f"wsd: mix F1 ALL {r['f1']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], ALL-{res['dev']} "
            f"{r['all_minus_dev']['f1']:.4f}, softmax(s) = {np.round(r['weights'], 3).tolist()}; "
            f"grid mix {np.round(g['weights'], 2).tolist()} F1 ALL {g['f1']:.4f}")
    return res
