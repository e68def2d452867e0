"""Task-specific combination of the biLM layers.

    ELMo_task(t) = gamma * sum_k softmax(s)_k * E_k(t)

``s`` (one scalar per layer, initialised to 0) and ``gamma`` (initialised to 1) are learned with
the downstream task; ``softmax(s)`` says which layers the task takes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ElmoError, warn
from .bilm import BiLM
from .chars import batch_to_ids


class ScalarMix(nn.Module):
    def __init__(self, num_layers: int, do_layer_norm: bool = False,
                 initial_scalar_parameters: Sequence[float] | None = None, trainable: bool = True) -> None:
        super().__init__()
        init = list(initial_scalar_parameters) if initial_scalar_parameters is not None else [0.0] * num_layers
        if len(init) != num_layers:
            raise ElmoError(f"ScalarMix: {len(init)} initial scalars for {num_layers} layers")
        if not all(isinstance(x, numbers.Real) and math.isfinite(x) for x in init):
            raise ElmoError(f"ScalarMix: initial scalars must be finite numbers, got {init}")
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.tensor(init, dtype=torch.float32), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def forward(self, layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """``layers``: num_layers tensors ``(B, T, F)``; ``mask (B, T)`` needed for layer norm.
        Returns ``(B, T, F)``."""
        if len(layers) != self.num_layers:
            raise ElmoError(f"ScalarMix: got {len(layers)} layers, built for {self.num_layers}")
        w = torch.softmax(self.scalar_parameters, dim=0).to(layers[0].dtype)
        if self.do_layer_norm:
            if mask is None:
                raise ElmoError("ScalarMix: layer norm needs the mask")
            layers = [_masked_layer_norm(t, mask) for t in layers]
        mixed = sum(wk * t for wk, t in zip(w, layers))
        return self.gamma.to(mixed.dtype) * mixed

    def weights(self) -> list[float]:
        """softmax(s) as plain numbers."""
        return torch.softmax(self.scalar_parameters.detach(), 0).tolist()

    def gamma_value(self) -> float:
        return float(self.gamma.detach())

    def l2_penalty(self, coef: float = 0.001) -> torch.Tensor:
        """``coef * ||s||^2``, the paper's regulariser pulling the mix towards an average."""
        return coef * (self.scalar_parameters ** 2).sum()


def _masked_layer_norm(t: torch.Tensor, mask: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    # Mean and variance over batch, time and features, real tokens only.
    m = mask.unsqueeze(-1).to(t.dtype)
    n = m.sum() * t.shape[-1]
    mean = (t * m).sum() / n
    var = (((t - mean) * m) ** 2).sum() / n
    return (t - mean) / torch.sqrt(var + eps)


class Elmo(nn.Module):
    """A biLM plus ``num_output_representations`` scalar mixes sharing one biLM run.

    ``forward`` takes char ids ``(B, T, 50)`` (or a list of tokenised sentences) and returns
    ``{"elmo_representations": [ (B, T, 2P) ] * N, "mask": (B, T)}``. The biLM is frozen unless
    ``requires_grad=True``; dropout (AllenNLP's 0.5) applies to each mixed output in training mode.

    As in AllenNLP, the layers are mixed with the ``<S>``/``</S>`` positions still in (layer norm
    statistics include them) and those are removed afterwards unless ``keep_sentence_boundaries``
    (then the outputs and mask have ``T + 2`` positions). ``vocab_to_cache``: words whose token
    embeddings are computed once; ``forward(word_inputs=ids)`` then takes indices into it (0 is
    padding, so entry 0 is never a word). Char ids of more than 3 dims ``(..., T, 50)`` keep their
    leading dims in the outputs. :class:`torchelmo.integrations.allennlp.Elmo` takes AllenNLP's arguments.
    """

    def __init__(self, bilm: BiLM, num_output_representations: int = 1, dropout: float = 0.5,
                 requires_grad: bool = False, do_layer_norm: bool = False,
                 keep_sentence_boundaries: bool = False,
                 scalar_mix_parameters: Sequence[float] | None = None,
                 vocab_to_cache: Sequence[str] | None = None) -> None:
        super().__init__()
        if not isinstance(bilm, nn.Module):
            raise ElmoError(f"Elmo: the first argument is a BiLM, got {type(bilm).__name__}; for "
                            "Elmo(options_file, weight_file, ...) use torchelmo.integrations.allennlp.Elmo")

        self.check_num_outputs(num_output_representations)
        self.bilm = bilm
        self.keep_sentence_boundaries = keep_sentence_boundaries
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
            raise ElmoError(f"Elmo: dropout must be in [0, 1), got {dropout!r}")
        self.dropout = nn.Dropout(dropout)
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(bilm.num_layers, do_layer_norm, scalar_mix_parameters,
                      trainable=scalar_mix_parameters is None)
            for _ in range(num_output_representations))
        self.requires_grad_bilm(requires_grad)
        self.register_buffer("_vocab_char_ids", None, persistent=False)   # (V, 50): follows .to()
        if vocab_to_cache is not None:
            self.cache_vocab(vocab_to_cache)

    @staticmethod
    def check_num_outputs(n) -> None:
        """``num_output_representations``: an integer, 0 or more (0: no mixes, as AllenNLP allows;
        1.5, -1 and True are errors)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ElmoError(f"Elmo: num_output_representations must be a non-negative integer, got {n!r}")

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "default", *, stateful: bool = False, **kw) -> Elmo:
        return cls(BiLM.from_pretrained(name_or_path, stateful=stateful), **kw)

    @classmethod
    def from_published(cls, options_file, weight_file, *, stateful: bool = False, **kw) -> Elmo:
        return cls(BiLM.from_published(options_file, weight_file, stateful=stateful), **kw)

    def requires_grad_bilm(self, flag: bool) -> None:
        self.bilm.requires_grad_(flag)

    def get_output_dim(self) -> int:
        return self.bilm.output_dim

    def cache_vocab(self, vocab: Sequence[str]) -> None:
        """Word ids index ``vocab`` from now on (0: padding); its token embeddings are precomputed."""
        if isinstance(vocab, str) or len(vocab) < 2:
            raise ElmoError("vocab_to_cache: expected a list of words, entry 0 being padding")
        if not self.bilm.takes_char_ids:
            raise ElmoError(f"vocab_to_cache: a {type(self.bilm).__name__} reads tokens through its own "
                            "lexicons; give the tokens themselves")
        words = list(vocab)
        table = batch_to_ids([words])[0]
        table[0] = 0                                 # id 0 is padding, whatever word sits there
        self._vocab_char_ids = table.to(self.bilm.device)
        with torch.no_grad():
            self.bilm.encoder.build_cache(self._vocab_char_ids[1:])

    def forward(self, inputs: torch.Tensor | list[list[str]] | None = None,
                word_inputs: torch.Tensor | None = None) -> dict:
        if not self.bilm.takes_char_ids:
            if inputs is None or torch.is_tensor(inputs) or word_inputs is not None:
                raise ElmoError(f"Elmo: a {type(self.bilm).__name__} reads tokens through its own lexicons; "
                                "give lists of tokens, not ids")
            lead: tuple[int, ...] = (len(inputs),)
            out = self.bilm.embed_sentences([list(s) for s in inputs], keep_sentence_boundaries=True)
        else:
            char_ids = self._char_ids(inputs, word_inputs)
            lead = tuple(char_ids.shape[:-2])
            # flatten, not reshape(-1, ...): a batch of empty sentences, (B, 0, 50), has no elements
            out = self.bilm(char_ids.flatten(0, -3), keep_sentence_boundaries=True)
        mask = out.mask
        reps = [mix(out.layers, mask) for mix in self.scalar_mixes]
        if not self.keep_sentence_boundaries:
            mask = mask[:, 2:]                       # a row of n tokens: n + 2 positions -> n
            reps = [r[:, 1:-1] for r in reps]
        m = mask.unsqueeze(-1).to(reps[0].dtype) if reps else None
        reps = [self.dropout(r * m).reshape(*lead, *r.shape[-2:]) for r in reps]
        return {"elmo_representations": reps, "mask": mask.reshape(*lead, mask.shape[-1])}

    def _char_ids(self, inputs, word_inputs: torch.Tensor | None) -> torch.Tensor:
        if word_inputs is not None:
            table = self._vocab_char_ids
            if table is None:
                if inputs is None:
                    raise ElmoError("Elmo: word_inputs need vocab_to_cache")
                warn("Elmo: word_inputs ignored: no vocab_to_cache was given")
            elif word_inputs.numel() and (word_inputs.min() < 0 or word_inputs.max() >= len(table)):
                if inputs is None:
                    raise ElmoError(f"Elmo: word id {int(word_inputs.max())} is not in vocab_to_cache "
                                    f"({len(table)} entries)")
            else:   # out-of-vocabulary ids above fall back to the char ids, as in AllenNLP
                return table[word_inputs.to(table.device)]
        if inputs is None:
            raise ElmoError("Elmo: give char ids (inputs) or, with vocab_to_cache, word_inputs")
        if torch.is_tensor(inputs):
            if inputs.dim() < 3:
                raise ElmoError(f"Elmo: char ids must be (..., tokens, 50), got {tuple(inputs.shape)}")
            return inputs
        return batch_to_ids(inputs)   # host ids: BiLM.forward copies only the distinct tokens
