"""POS probe: a linear classifier on one frozen biLM layer (E0, E1, E2), and a mix probe.

Every layer gets the same classifier and the same hyper-parameters (:class:`ProbeConfig`):
softmax regression trained with Adam, mini-batches of tokens, early-stopped on dev accuracy
(the best dev epoch's weights are kept). The mix probe puts a :class:`~torchelmo.model.mix.ScalarMix`
(learned ``s``, ``gamma``) under the same linear head, so ``softmax(s)`` says which layers a
POS tagger takes. Test accuracy comes with a 95% bootstrap interval over test sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn

from ..errors import ElmoError
from ..model.mix import ScalarMix
from .common import Standardize, check_seeds, fit_early_stopped, layer_names, mix_summary
from .features import Features
from .stats import UnitScores, accuracy_from_counts


@dataclass
class ProbeConfig:
    lr: float = 1e-3
    batch_size: int = 256
    max_epochs: int = 40
    patience: int = 3          # epochs without a dev improvement before stopping
    weight_decay: float = 0.0
    mix_l2: float = 0.001      # the paper's lambda * ||s||^2 on the mix scalars
    seed: int = 0
    n_boot: int = 1000
    seeds: int = 1             # probes trained per input (seeds seed .. seed + seeds - 1), scored as their mean


class MixLinear(nn.Module):
    """``(L, B, F)`` stacked layers -> per-layer standardization -> ScalarMix -> linear head ->
    ``(B, C)`` logits."""

    def __init__(self, norm: Standardize, num_layers: int, dim: int, n_classes: int) -> None:
        super().__init__()
        self.norm = norm
        self.mix = ScalarMix(num_layers)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(list(self.norm(x))))


def linear_probe(x_train: np.ndarray, n_classes: int) -> nn.Module:
    return nn.Sequential(Standardize.fit(x_train), nn.Linear(x_train.shape[-1], n_classes))


def fit_classifier(model: nn.Module, x_train, y_train: np.ndarray, x_dev, y_dev: np.ndarray,
                   cfg: ProbeConfig, token_axis: int = 0,
                   penalty: Callable[[], torch.Tensor] | None = None) -> tuple[nn.Module, dict]:
    """Mini-batch Adam on cross-entropy, early-stopped on dev accuracy; returns the best model.

    ``x_*``: numpy arrays with the examples along ``token_axis`` (0 for ``(N, F)``, 1 for
    ``(L, N, F)``).
    """
    g = torch.Generator().manual_seed(cfg.seed)  # own generator: shuffles do not depend on init
    yt = torch.from_numpy(y_train).long()
    n = len(yt)

    def epoch_losses():
        perm = torch.randperm(n, generator=g).numpy()
        for a in range(0, n, cfg.batch_size):
            idx = np.sort(perm[a:a + cfg.batch_size])
            xb = torch.from_numpy(np.take(x_train, idx, axis=token_axis)).float()
            loss = nn.functional.cross_entropy(model(xb), yt[idx])
            yield loss if penalty is None else loss + penalty()

    def dev_acc() -> float:
        return float((predict(model, x_dev, token_axis) == y_dev).mean())

    fit = fit_early_stopped(model, epoch_losses, dev_acc, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            max_epochs=cfg.max_epochs, patience=cfg.patience)
    return model, {"dev_acc": fit["best_score"], "best_epoch": fit["best_epoch"], "epochs": fit["epochs"],
                   "dev_history": fit["history"]}


@torch.no_grad()
def predict(model: nn.Module, x, token_axis: int = 0, batch: int = 8192) -> np.ndarray:
    model.eval()
    n = x.shape[token_axis]
    out = []
    for a in range(0, n, batch):
        xb = torch.from_numpy(np.take(x, np.arange(a, min(n, a + batch)), axis=token_axis)).float()
        out.append(model(xb).argmax(-1).numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def sentence_counts(correct: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-sentence ``(correct, tokens)`` from per-token correctness and sentence offsets."""
    c = np.add.reduceat(correct.astype(np.float64), offsets[:-1]) if len(correct) else np.zeros(0)
    return np.stack([c, np.diff(offsets).astype(np.float64)], 1)


def encode_tags(tags_train: list[list[str]], *others: list[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """Label ids from the training tags; a tag unseen in training maps to -1 (always wrong)."""
    labels = sorted({t for s in tags_train for t in s})
    index = {t: i for i, t in enumerate(labels)}
    enc = [np.array([index.get(t, -1) for s in ss for t in s], dtype=np.int64)
           for ss in (tags_train, *others)]
    return labels, enc


def run_pos(train: Features, dev: Features, test: Features, tags: tuple[list, list, list],
            cfg: ProbeConfig | None = None, layers: list[int] | None = None, mix: bool = True,
            log: Callable[[str], None] = print, units: dict[str, np.ndarray] | None = None,
            label: str = "pos", groups: list[str] | None = None) -> dict:
    """Per-layer linear probes and the mix probe; ``tags`` = (train, dev, test) tag lists per sentence;
    ``label`` begins each line it logs and each error (``elmo probe tag``: the tag set's name).

    Each probe is trained ``cfg.seeds`` times (seeds ``cfg.seed`` on) and scored as the mean of
    their test accuracies, with a bootstrap interval over test sentences or, with ``groups`` (each
    test sentence's document), over documents; ``res["units"]`` holds the per-sentence counts.
    ``units``, if given, receives each probe's per-test-sentence ``(correct, tokens)`` counts
    (``(S, 2 * seeds)``, keyed ``E0``.. and ``mix``), to pair it with another run on the same test set."""
    cfg = cfg or ProbeConfig()
    for name, f, t in (("train", train, tags[0]), ("dev", dev, tags[1]), ("test", test, tags[2])):
        if f.offsets is None or f.n != sum(len(s) for s in t):
            raise ElmoError(f"{label}: {name} features ({f.n} rows) do not match its tags "
                            f"({sum(len(s) for s in t)} tokens)")
    check_seeds(cfg.seeds, label)
    labels, (y_tr, y_dev, y_te) = encode_tags(*tags)
    if len(labels) < 2:
        raise ElmoError(f"{label}: the training set has {len(labels)} distinct tag(s); need at least 2")
    L, F = train.num_layers, train.dim
    layers = list(range(L)) if layers is None else layers
    names = layer_names(L)
    scores = UnitScores(accuracy_from_counts, 2, groups, cfg.n_boot, cfg.seed)
    res: dict = {"labels": labels, "n_train_tokens": int(len(y_tr)), "n_test_tokens": int(len(y_te)),
                 "n_test_sentences": int(len(test.offsets) - 1), "config": asdict(cfg), "layers": {}}
    if groups is not None:
        res["n_test_documents"] = len(set(groups))
    where = "test documents" if groups is not None else "test sentences"

    def counts(pred: np.ndarray) -> np.ndarray:
        return sentence_counts(pred == y_te, test.offsets)

    def fits(make: Callable[[], tuple[nn.Module, dict]], name: str) -> dict:
        """``cfg.seeds`` fits of one probe, scored; the first seed's fit details, and each seed's."""
        infos = []
        for s in range(cfg.seeds):
            torch.manual_seed(cfg.seed + s)
            model, info, pred = make()
            scores.add(name, counts(pred))
            infos.append({**info, "model": model})
        r = {**scores.score(name, "acc"), **{k: v for k, v in infos[0].items() if k != "model"}}
        if cfg.seeds > 1:
            r["fits"] = [{k: v for k, v in i.items() if k != "model"} for i in infos]
        r["_models"] = [i["model"] for i in infos]
        return r

    majority = int(np.bincount(y_tr).argmax())
    res["majority"] = {"tag": labels[majority], **scores.once(counts(np.full_like(y_te, majority)), "acc")}
    log(f"{label}: majority-class baseline ({labels[majority]}) test acc {res['majority']['acc']:.4f}")

    def spread(r: dict) -> str:
        return f", sd over {cfg.seeds} seeds {r['sd']:.4f}" if cfg.seeds > 1 else ""

    for k in layers:
        x_tr, x_dev, x_te = train.layer(k), dev.layer(k), test.layer(k)

        def make(x_tr=x_tr, x_dev=x_dev, x_te=x_te):
            model, info = fit_classifier(linear_probe(x_tr, len(labels)), x_tr, y_tr, x_dev, y_dev, cfg)
            return model, info, predict(model, x_te)
        r = fits(make, names[k])
        r.pop("_models")
        res["layers"][names[k]] = r
        log(f"{label}: {names[k]} test acc {r['acc']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}] "
            f"(dev {r['dev_acc']:.4f}, epoch {r['best_epoch']}{spread(r)})")
    if "E1" in scores.counts and "E2" in scores.counts:
        res["paired"] = {"E2-E1": scores.paired("E1", "E2")}
        d, (lo, hi) = res["paired"]["E2-E1"]["diff"], res["paired"]["E2-E1"]["ci"]
        log(f"{label}: E2 - E1 = {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (paired bootstrap over {where})")
    if mix:
        x_tr, x_dev, x_te = train.all_layers(), dev.all_layers(), test.all_layers()

        def make_mix():
            model = MixLinear(Standardize.fit(x_tr, token_axis=1), L, F, len(labels))
            model, info = fit_classifier(model, x_tr, y_tr, x_dev, y_dev, cfg, token_axis=1,
                                         penalty=lambda: model.mix.l2_penalty(cfg.mix_l2))
            return model, info, predict(model, x_te, token_axis=1)
        r = fits(make_mix, "mix")
        models = r.pop("_models")
        r.update(mix_summary([m.mix for m in models]))
        res["mix"] = r
        log(f"{label}: mix test acc {r['acc']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], softmax(s) = "
            f"{[round(w, 3) for w in r['weights']]}, gamma = {r['gamma']:.3f}{spread(r)}")
    if units is not None:
        units.update({n: np.concatenate(c, axis=1) for n, c in scores.counts.items()})
    res["units"] = scores.units()
    return res
