"""The bidirectional language model that is trained: :class:`~torchelmo.model.bilm.BiLM` + a shared softmax.

Loss (bilm-tf): ``0.5 * (L_fwd + L_bwd)``, each the mean negative log-likelihood per target of
its direction. Dropout as bilm-tf: on each LSTM layer's input (``BiLM.dropout``, the residual adds
the dropped input back) and on the top LSTM output before the softmax; none in the char-CNN.
Options beyond bilm-tf, for small corpora that overfit: variational dropout (the same mask at
every step of a window) and weight drop (DropConnect on the recurrent matrices, AWD-LSTM).

A trained LM is saved as a native model directory that :meth:`BiLM.from_pretrained` reads like
any other (``config.json`` + ``model.safetensors``), with the softmax tensors (``softmax.*``)
stored beside the biLM's, ``training.json`` describing them, and the output vocabulary
``vocab.txt``. :meth:`LanguageModel.from_pretrained` restores the whole LM (to score text or to
continue training) from its directory or a Hugging Face Hub id; :meth:`LanguageModel.init_from`
starts a new LM from a trained one with a new vocabulary (fine-tuning on domain text).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ElmoError
from ..io.fileio import read_json
from ..model import hub
from ..model.bilm import BiLM, Regularisation, State, sequence_dropout
from ..model.config import ElmoConfig
from ..model.registry import check_model_name, is_published
from ..model.weights import CONFIG_NAME, EXTRA_CONFIG_NAME, VOCAB_NAME, load_native, require_native_weights, save_native
from ..runtime import check_allocation
from .corpus import Corpus
from .data import Batch, SentenceBatcher, StreamBatcher, sentences_batch
from .softmax import (
    AdaptiveSoftmax,
    FullSoftmax,
    count_parameters,
    make_softmax,
    softmax_config,
    softmax_from_config,
    softmax_kind,
)
from .vocab import Vocabulary

DEFAULT_REGULARISATION = Regularisation(dropout=0.1)  # bilm-tf's
LM_FORMAT = "elmo-lm-1"
PERPLEXITY_MODES = ("sentence", "stream")
LM_NAMES = "an LM directory (what elmo train writes, e.g. RUN/best) or a Hugging Face Hub id owner/name[@revision]"


@dataclass
class SentenceScore:
    """Log-probabilities (natural log) of one sentence ``w1 .. wn`` under both LMs.

    ``forward_token_logprobs[i]`` is ``log p(w_{i+1} | <S> w_1 .. w_i)`` for i < n and
    ``log p(</S> | ...)`` at i = n; ``backward_token_logprobs[i]`` is ``log p(w_i | w_{i+1} .. w_n
    </S>)`` with index 0 the ``<S>`` prediction, i.e. aligned with ``<S> w1 .. wn``. Both have n + 1
    entries; targets outside the vocabulary are scored as ``<UNK>``.
    """

    tokens: list[str]
    forward_logprob: float
    backward_logprob: float
    forward_token_logprobs: list[float]
    backward_token_logprobs: list[float]

    @property
    def n_predictions(self) -> int:
        return len(self.tokens) + 1


class LanguageModel(nn.Module):
    def __init__(self, config: ElmoConfig, vocab: Vocabulary, softmax: str = "auto",
                 num_samples: int = 8192, cutoffs: list[int] | None = None,
                 regularisation: Regularisation = DEFAULT_REGULARISATION,
                 softmax_module: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        self.vocab = vocab
        if softmax_module is None:   # the softmax's rows too, before either is allocated
            n = config.num_parameters() + count_parameters(softmax, len(vocab), config.projection_dim, cutoffs)
            check_allocation(4 * n, f"a language model over {len(vocab):,} words ({n:,} parameters)")
        self.bilm = BiLM(config, regularisation=regularisation)
        self.softmax = softmax_module if softmax_module is not None else make_softmax(
            softmax, len(vocab), config.projection_dim, num_samples, cutoffs)
        if self.softmax.vocab_size != len(vocab):
            raise ElmoError(f"softmax has {self.softmax.vocab_size} rows but the vocabulary {len(vocab)} tokens")

    # The regularisation lives on the biLM (which applies it inside the stacks); one source of truth.
    dropout = property(lambda self: self.bilm.dropout)
    variational_dropout = property(lambda self: self.bilm.variational_dropout)
    weight_drop = property(lambda self: self.bilm.weight_drop)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- the objective ---------------------------------------------------------------------------
    def token_nll(self, char_ids: torch.Tensor, token_index: torch.Tensor, targets: torch.Tensor,
                  lengths: torch.Tensor, state: State | None = None,
                  generator: torch.Generator | None = None,
                  groups: list[tuple[int, int]] | None = None) -> tuple[torch.Tensor, State]:
        """Per-target negative log-likelihoods.

        Parameters
        ----------
        char_ids : ``(U, 50)`` the distinct input tokens' char ids.
        token_index : ``(2, B, T)`` indices into ``char_ids`` ([0] forward, [1] backward inputs), -1 = pad.
        targets : ``(2, B, T)`` vocabulary ids, -1 = pad.
        lengths : ``(B,)`` steps per row.
        state : carried LSTM state (per layer ``c (2, B, D), h (2, B, P)``) or None (zeros).
        groups : ``char_ids``' runs of equal character length, when sorted (see :class:`Batch`).

        Returns
        -------
        ``nll (2, B, T)`` (0 at padding) and the final state.
        """
        with self.bilm.precision_scope() as precision:
            outs, final = self.bilm.run_tokens(char_ids, token_index, lengths, state, groups)
            top = outs[-1]
            if self.training and self.dropout > 0:
                top = sequence_dropout(top, self.dropout, self.variational_dropout)
            mask = targets >= 0
            nll = self.softmax.nll(top[mask], targets[mask], generator, precision.name)
        out = torch.zeros(targets.shape, dtype=nll.dtype, device=nll.device)
        out[mask] = nll
        return out, final

    def forward(self, char_ids: torch.Tensor, token_index: torch.Tensor, targets: torch.Tensor,
                lengths: torch.Tensor, state: State | None = None,
                generator: torch.Generator | None = None,
                groups: list[tuple[int, int]] | None = None) -> tuple[torch.Tensor, State]:
        """``(2,)`` summed negative log-likelihood per direction, and the final state."""
        nll, final = self.token_nll(char_ids, token_index, targets, lengths, state, generator, groups)
        return nll.sum(dim=(1, 2)), final

    def batch_nll(self, batch: Batch, state: State | None = None,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, State]:
        return self(batch.char_ids, batch.token_index, batch.targets, batch.lengths, state, generator,
                    batch.groups)

    # -- scoring ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.bilm.device

    @torch.no_grad()
    def score(self, sentences: Sequence[Sequence[str]], batch_size: int = 64) -> list[SentenceScore]:
        """Per-sentence log-probabilities in both directions (each sentence on its own, zero state)."""
        was_training = self.training
        self.eval()
        out: list[SentenceScore] = []
        try:
            for i in range(0, len(sentences), batch_size):
                chunk = [list(s) for s in sentences[i:i + batch_size]]
                _check_sentences(sentences[i:i + batch_size], i)
                b = sentences_batch(chunk, self.vocab).to(self.device)
                nll, _ = self.token_nll(b.char_ids, b.token_index, b.targets, b.lengths, groups=b.groups)
                lp = (-nll).double().cpu()
                for j, s in enumerate(chunk):
                    n = len(s) + 1
                    fwd = lp[0, j, :n].tolist()
                    bwd = lp[1, j, :n].flip(0).tolist()
                    out.append(SentenceScore(s, sum(fwd), sum(bwd), fwd, bwd))
        finally:
            self.train(was_training)
        return out

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch], stateful: bool = False) -> dict:
        """Perplexity over batches (full softmax): per direction and their geometric mean.

        ``stateful``: carry the LSTM state from batch to batch (contiguous BPTT streams).
        """
        was_training = self.training
        self.eval()
        sums = torch.zeros(2, dtype=torch.float64)
        n, state = 0, None
        try:
            for b in batches:
                b = b.to(self.device)
                s, final = self.batch_nll(b, state if stateful else None)
                sums += s.double().cpu()
                n += b.n_targets
                if stateful:
                    state = final
        finally:
            self.train(was_training)
        if n == 0:
            raise ElmoError("perplexity: no tokens to evaluate")
        avg = (sums / n).tolist()
        return {"tokens": n, "nll_forward": avg[0], "nll_backward": avg[1],
                "ppl_forward": math.exp(avg[0]), "ppl_backward": math.exp(avg[1]),
                "ppl_mean": math.exp(0.5 * (avg[0] + avg[1]))}

    def perplexity(self, files: Sequence[str | Path] | str | Path, mode: str = "sentence",
                   batch_size: int = 64, unroll: int = 20) -> dict:
        """Perplexity of both directions on text files (one sentence per line).

        ``mode="sentence"``: every sentence on its own from the zero state, ``batch_size``
        sentences per batch. ``mode="stream"``: the text as ``batch_size`` contiguous streams cut
        into ``unroll``-step windows with the state carried (word-level LM papers' protocol;
        ``batch_size=1`` is one stream). Returns :meth:`evaluate`'s dict.
        """
        if mode not in PERPLEXITY_MODES:
            raise ElmoError(f"perplexity mode must be {' or '.join(PERPLEXITY_MODES)}, got {mode!r}")
        corpus = Corpus(files, shuffle=False)
        if mode == "stream":
            return self.evaluate(StreamBatcher(corpus, self.vocab, batch_size, unroll, contiguous=True),
                                 stateful=True)
        return self.evaluate(SentenceBatcher(corpus, self.vocab, batch_size=batch_size, epochs=1, shuffle=False))

    # -- saving and loading ----------------------------------------------------------------------
    def lm_config(self) -> dict:
        return {"format": LM_FORMAT, "softmax": softmax_config(self.softmax), "dropout": self.dropout,
                "variational_dropout": self.variational_dropout, "weight_drop": self.weight_drop,
                "vocab_file": VOCAB_NAME, "vocab_size": len(self.vocab)}

    def save_pretrained(self, out_dir: str | Path, extra: dict | None = None, dtype: str = "float32") -> Path:
        """Native model dir: the biLM (readable by ``BiLM.from_pretrained``) + softmax + vocab;
        ``dtype``: the weights' type on disk (loading computes in fp32)."""
        out_dir = Path(out_dir)
        tensors = {f"softmax.{k}": v for k, v in self.softmax.state_dict().items()}
        save_native(self.bilm, out_dir, extra_tensors=tensors, extra_config={**self.lm_config(), **(extra or {})},
                    dtype=dtype)
        self.vocab.save(out_dir / VOCAB_NAME)
        return out_dir

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, dropout: float | None = None) -> LanguageModel:
        """A whole LM saved by :meth:`save_pretrained`: its directory, or the Hugging Face Hub id
        ``owner/name[@revision]`` of a repository holding one (a directory of that name wins)."""
        return cls._from_dir(lm_dir(name_or_path), str(name_or_path), dropout)

    @classmethod
    def _from_dir(cls, model_dir: Path, name: str, dropout: float | None) -> LanguageModel:
        meta = read_lm_meta(model_dir, name)
        require_native_weights(model_dir)   # files first: the model is allocated last
        vocab = Vocabulary.from_file(model_dir / meta.get("vocab_file", VOCAB_NAME))
        config = ElmoConfig.from_json_file(model_dir / CONFIG_NAME)
        sm = softmax_from_config(meta["softmax"])
        reg = Regularisation(meta.get("dropout", 0.1) if dropout is None else dropout,
                             bool(meta.get("variational_dropout", False)), float(meta.get("weight_drop", 0.0)))
        lm = cls(config, vocab, regularisation=reg, softmax_module=sm)
        _load_softmax(lm, load_native(lm.bilm, model_dir), name)
        return lm

    @classmethod
    def init_from(cls, source: str | Path, vocab: Vocabulary, softmax: str | None = None,
                  num_samples: int = 8192, log=print,
                  regularisation: Regularisation = DEFAULT_REGULARISATION) -> LanguageModel:
        """A new LM over ``vocab`` from a trained model: an LM (directory or Hub id: biLM +
        softmax) or any biLM ``BiLM.from_pretrained`` reads (a published one has no released
        softmax: a fresh one is initialised). Rows of tokens in both vocabularies are copied; a new
        token starts as the old ``<UNK>`` row with the bias lowered by ``log(n_new + 1)``, so the
        old ``<UNK>`` probability is shared out among the new tokens and the new ``<UNK>``."""
        check_model_name(source)
        path = Path(str(source))
        if not path.is_dir() and hub.is_repo_id(str(source)):
            path = hub.resolve(str(source))   # an LM or a biLM on the Hub; its files are read once
        is_lm = path.is_dir() and (path / EXTRA_CONFIG_NAME).is_file() and (path / CONFIG_NAME).is_file()
        old = cls._from_dir(path, str(source), None) if is_lm else None
        bilm = old.bilm if old is not None else BiLM.from_pretrained(path)
        kind = softmax or "auto"
        if kind == "auto" and old is not None:
            kind = softmax_kind(old.softmax)
        cutoffs = None
        if old is not None and isinstance(old.softmax, AdaptiveSoftmax) and kind == "adaptive":
            cutoffs = old.softmax.cutoffs
        lm = cls(bilm.config, vocab, softmax=kind, num_samples=num_samples, cutoffs=cutoffs,
                 regularisation=regularisation)
        lm.bilm.load_state_dict(bilm.state_dict())
        if old is None:
            log(f"init-from {source}: biLM weights loaded; it has no softmax, a new one is initialised")
        else:
            _carry_softmax(old, lm, source, log)
        return lm


def _check_sentences(sentences: Sequence, first: int) -> None:
    for j, s in enumerate(sentences, first):
        if isinstance(s, str):
            raise ElmoError(f"score: sentence {j} is a str, expected a list of tokens")
        if len(s) == 0:
            raise ElmoError(f"score: sentence {j} is empty")


def lm_dir(name_or_path: str | Path) -> Path:
    """The local directory of an LM: a directory as given (an existing one wins over a Hub id of
    the same spelling), or the cached snapshot of a Hub id; anything else is a one-line error."""
    name = str(name_or_path)
    check_model_name(name)
    path = Path(name)
    if path.is_dir():
        return path
    if path.exists():
        raise ElmoError(f"{name}: a file, not an LM directory")
    if name == "default" or is_published(name):
        raise ElmoError(f"{name}: a biLM without a softmax layer (published models and 'default' have "
                        f"none); it cannot score text. Train an LM from it with elmo train --init-from {name}")
    if not hub.is_repo_id(name):
        raise hub.unknown_model(name, "no such LM directory, and not a Hugging Face Hub id", LM_NAMES)
    return hub.resolve(name, LM_NAMES)


def read_lm_meta(model_dir: Path, name: str | None = None) -> dict:
    """The LM description (``training.json``) of a model directory, checked; errors name it
    ``name`` (a Hub id, say) or else its path."""
    name = name or str(model_dir)
    if not (model_dir / CONFIG_NAME).is_file():
        raise ElmoError(f"{name}: not a native model directory (no {CONFIG_NAME})")
    meta_path = model_dir / EXTRA_CONFIG_NAME
    if not meta_path.is_file():
        raise ElmoError(f"{name}: a biLM without a softmax layer (no {EXTRA_CONFIG_NAME}); it cannot "
                        "score text. Train one with `elmo train`, or start from it with --init-from")
    meta = read_json(meta_path, "LM description")
    if meta.get("format") != LM_FORMAT:
        raise ElmoError(f"{meta_path}: not an elmo LM description (format {meta.get('format')!r})")
    return meta


def _load_softmax(lm: LanguageModel, tensors: dict[str, torch.Tensor], name: str) -> None:
    sm_state = {k[len("softmax."):]: v for k, v in tensors.items() if k.startswith("softmax.")}
    missing = set(lm.softmax.state_dict()) - set(sm_state)
    if missing:
        raise ElmoError(f"{name}: softmax tensors missing: {', '.join(sorted(missing))}")
    try:
        lm.softmax.load_state_dict(sm_state)
    except RuntimeError as e:
        raise ElmoError(f"{name}: softmax tensors do not fit {EXTRA_CONFIG_NAME} ({e})") from None


def _carry_softmax(old: LanguageModel, new: LanguageModel, source, log) -> None:
    """The trained softmax of ``old`` into ``new`` (another vocabulary: rows remapped)."""
    if isinstance(old.softmax, FullSoftmax) and isinstance(new.softmax, FullSoftmax):
        _remap_rows(old, new, log)
    elif old.vocab.tokens == new.vocab.tokens and type(old.softmax) is type(new.softmax):
        new.softmax.load_state_dict(old.softmax.state_dict())
    else:
        raise ElmoError(f"init-from {source}: a {softmax_kind(old.softmax)} softmax cannot be carried "
                        f"over to a {softmax_kind(new.softmax)} softmax with another vocabulary; use "
                        f"--softmax {softmax_kind(old.softmax)} or the same vocabulary")


@torch.no_grad()
def _remap_rows(old: LanguageModel, new: LanguageModel, log) -> None:
    ow, ob = old.softmax.weight, old.softmax.bias
    nw, nb = new.softmax.weight, new.softmax.bias
    src = torch.tensor([old.vocab.index.get(t, -1) for t in new.vocab.tokens])
    kept = src >= 0
    n_new = int((~kept).sum())
    nw[kept] = ow[src[kept]]
    nb[kept] = ob[src[kept]]
    if n_new:
        unk = old.vocab.unk
        nw[~kept] = ow[unk]
        share = math.log(n_new + 1)
        nb[~kept] = ob[unk] - share
        nb[new.vocab.unk] = ob[unk] - share
    log(f"init-from: {int(kept.sum())} softmax rows carried over, {n_new} new tokens initialised "
        "from <UNK>")
