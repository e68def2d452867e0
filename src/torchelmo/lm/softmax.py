"""Output layers of the biLM: one softmax shared by the forward and the backward LM (as bilm-tf).

All three map hidden states ``h (N, P)`` and target ids ``(N,)`` to per-token negative
log-likelihoods ``(N,)`` (natural log):

- :class:`FullSoftmax`: ``logits = h W^T + b`` over the whole vocabulary.
- :class:`SampledSoftmax`: the same parameters; in training the loss uses the target and K
  negatives drawn from a log-uniform (Zipfian) distribution over the frequency-sorted vocabulary,
  ``P(k) = log((k + 2) / (k + 1)) / log(V + 1)``, shared by every token of the batch (both
  directions), each logit corrected by ``- log(K P(k))`` and accidental hits removed (Jean et al.
  2015; TF's ``sampled_softmax_loss``). Evaluation is the exact full softmax.
- :class:`AdaptiveSoftmax`: Grave et al. 2017 (``torch.nn.AdaptiveLogSoftmaxWithLoss``) with
  frequency-based clusters.

:func:`default_softmax` picks full up to 50k types, sampled above (the original's choice for its
793k vocabulary); the adaptive one is the fastest exact option for large vocabularies on CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ElmoError
from ..numerics.operands import affine, linear

KINDS = ("full", "sampled", "adaptive")


def _up(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (bfloat16 logits under autocast are normalised in float32)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def default_softmax(vocab_size: int) -> str:
    return "full" if vocab_size <= 50_000 else "sampled"


class FullSoftmax(nn.Module):
    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        # bilm-tf: normal with stddev 1/sqrt(P).
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(dim))

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """``(N, P)`` -> ``(N, V)`` log-probabilities."""
        return F.log_softmax(_up(F.linear(h, self.weight, self.bias)), dim=-1)

    def nll(self, h: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None,
            precision: str | None = None) -> torch.Tensor:
        """``(N, P)``, ``(N,)`` -> ``(N,)``; ``precision``: the model's, resolved (bf16: bf16
        operands on a CPU, :mod:`torchelmo.numerics.operands`; None: fp32)."""
        logits = _up(linear(self, h, precision))
        return F.cross_entropy(logits, targets, reduction="none")


def log_uniform_probs(vocab_size: int) -> torch.Tensor:
    k = torch.arange(vocab_size, dtype=torch.float64)
    return ((k + 2).log() - (k + 1).log()) / math.log(vocab_size + 1)


def sample_log_uniform(vocab_size: int, num_samples: int, generator: torch.Generator | None = None,
                       device: torch.device | str = "cpu") -> torch.Tensor:
    """K ids in ``[0, V)`` drawn with replacement from the log-uniform distribution
    (inverse CDF: ``floor(exp(u log(V + 1))) - 1``)."""
    u = torch.rand(num_samples, generator=generator, dtype=torch.float64)
    ids = (u * math.log(vocab_size + 1)).exp().floor().long() - 1
    return ids.clamp_(0, vocab_size - 1).to(device)


class SampledSoftmax(FullSoftmax):
    """Full-softmax parameters, sampled loss in training mode, exact loss in eval mode."""

    def __init__(self, vocab_size: int, dim: int, num_samples: int = 8192) -> None:
        super().__init__(vocab_size, dim)
        if not 1 <= num_samples:
            raise ElmoError(f"sampled softmax: number of negative samples must be positive, got {num_samples}")
        self.num_samples = min(num_samples, vocab_size)
        self.register_buffer("log_q", log_uniform_probs(vocab_size).log().float(), persistent=False)

    def sampled_nll(self, h: torch.Tensor, targets: torch.Tensor, samples: torch.Tensor,
                    precision: str | None = None) -> torch.Tensor:
        """The sampled loss for given negative ``samples (K,)``."""
        K = samples.numel()
        log_kq = (math.log(K) + self.log_q).to(self.weight.dtype)
        w_t, b_t = self.weight[targets], self.bias[targets]
        true_logit = _up((h * w_t).sum(-1)) + b_t - log_kq[targets]           # (N,)
        s_logits = _up(affine(h, self.weight[samples], self.bias[samples], precision)) - log_kq[samples]   # (N, K)
        s_logits = s_logits.masked_fill(samples.unsqueeze(0) == targets.unsqueeze(1), float("-inf"))
        logits = torch.cat([true_logit.unsqueeze(1), s_logits], dim=1)
        return -F.log_softmax(logits, dim=1)[:, 0]

    def nll(self, h: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None,
            precision: str | None = None) -> torch.Tensor:
        if not self.training:
            return super().nll(h, targets, precision=precision)
        samples = sample_log_uniform(self.vocab_size, self.num_samples, generator, h.device)
        return self.sampled_nll(h, targets, samples, precision)


class AdaptiveSoftmax(nn.Module):
    def __init__(self, vocab_size: int, dim: int, cutoffs: list[int] | None = None, div_value: float = 4.0) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.cutoffs = list(cutoffs) if cutoffs else default_cutoffs(vocab_size)
        if not self.cutoffs or sorted(set(self.cutoffs)) != self.cutoffs or self.cutoffs[-1] >= vocab_size \
                or self.cutoffs[0] < 1:
            raise ElmoError(f"adaptive softmax: cutoffs must be increasing and within (0, {vocab_size}), "
                            f"got {self.cutoffs}")
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(dim, vocab_size, self.cutoffs, div_value=div_value,
                                                 head_bias=True)
        self.div_value = div_value

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        return self.asm.log_prob(_up(h))

    def nll(self, h: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None,
            precision: str | None = None) -> torch.Tensor:
        """``(N, P)``, ``(N,)`` -> ``(N,)``: what ``-self.asm(h, targets).output`` gives, with its
        products through :func:`~torchelmo.numerics.operands.linear` (bf16 operands under bf16)."""
        asm, h = self.asm, _up(h)
        head = F.log_softmax(_up(linear(asm.head, h, precision)), dim=-1)      # (N, shortlist + clusters)
        bounds = asm.cutoffs                                                   # [shortlist, c2, ..., V]
        cluster = torch.bucketize(targets, targets.new_tensor(bounds), right=True)   # 0: the head
        in_head = torch.where(cluster == 0, targets, asm.shortlist_size + cluster - 1)
        logp = head.gather(1, in_head.unsqueeze(1)).squeeze(1)
        for i, proj in enumerate(asm.tail):
            rows = (cluster == i + 1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            tail = F.log_softmax(_up(linear(proj[1], linear(proj[0], h.index_select(0, rows), precision), precision)),
                                 dim=-1)
            word = (targets.index_select(0, rows) - bounds[i]).unsqueeze(1)
            logp = logp.index_add(0, rows, tail.gather(1, word).squeeze(1))
        return -logp


def default_cutoffs(vocab_size: int) -> list[int]:
    """Head of ~2% (at least 2000 types), then clusters 5x bigger each."""
    cuts, c = [], max(2000, vocab_size // 50)
    while c < vocab_size:
        cuts.append(c)
        c *= 5
        if len(cuts) == 3:
            break
    return cuts or [max(1, vocab_size // 2)]


def count_parameters(kind: str, vocab_size: int, dim: int, cutoffs: list[int] | None = None,
                     div_value: float = 4.0) -> int:
    """The parameters :func:`make_softmax` would allocate (to check memory before it does)."""
    if kind == "auto":
        kind = default_softmax(vocab_size)
    if kind != "adaptive":
        return (dim + 1) * vocab_size
    bounds = [*(cutoffs or default_cutoffs(vocab_size)), vocab_size]
    n = (dim + 1) * (bounds[0] + len(bounds) - 1)                          # the head, with its bias
    for i in range(len(bounds) - 1):                                        # each tail: down, then out
        hidden = max(1, int(dim // (div_value ** (i + 1))))
        n += dim * hidden + hidden * (bounds[i + 1] - bounds[i])
    return n


def make_softmax(kind: str, vocab_size: int, dim: int, num_samples: int = 8192,
                 cutoffs: list[int] | None = None) -> nn.Module:
    if kind == "auto":
        kind = default_softmax(vocab_size)
    if kind == "full":
        return FullSoftmax(vocab_size, dim)
    if kind == "sampled":
        return SampledSoftmax(vocab_size, dim, num_samples)
    if kind == "adaptive":
        if vocab_size < 4:
            raise ElmoError(f"adaptive softmax needs a vocabulary of at least 4, got {vocab_size}")
        return AdaptiveSoftmax(vocab_size, dim, cutoffs)
    raise ElmoError(f"unknown softmax {kind!r}; choose one of auto, {', '.join(KINDS)}")


def softmax_kind(module: nn.Module) -> str:
    return {FullSoftmax: "full", SampledSoftmax: "sampled", AdaptiveSoftmax: "adaptive"}[type(module)]


def softmax_config(module: nn.Module) -> dict:
    cfg: dict = {"kind": softmax_kind(module), "vocab_size": module.vocab_size, "dim": module.dim}
    if isinstance(module, SampledSoftmax):
        cfg["num_samples"] = module.num_samples
    if isinstance(module, AdaptiveSoftmax):
        cfg["cutoffs"] = module.cutoffs
        cfg["div_value"] = module.div_value
    return cfg


def softmax_from_config(cfg: dict) -> nn.Module:
    kind = cfg["kind"]
    if kind == "adaptive":
        return AdaptiveSoftmax(cfg["vocab_size"], cfg["dim"], cfg.get("cutoffs"), cfg.get("div_value", 4.0))
    return make_softmax(kind, cfg["vocab_size"], cfg["dim"], cfg.get("num_samples", 8192))
