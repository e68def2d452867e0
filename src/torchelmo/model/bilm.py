"""The bidirectional language model: token encoder + forward and backward LSTM stacks.

Layers returned for each token t (P = projection size)::

    E0 = [e_t ; e_t]             the char-CNN token embedding, duplicated     (B, T, 2P)
    Ek = [fwd_k(t) ; bwd_k(t)]   k = 1 .. n_layers                            (B, T, 2P)

Each sentence is wrapped in ``<S> ... </S>`` before the LSTMs (as the published models were
trained); those two positions are removed from the output unless asked for.

State: by default every sentence starts from the zero state, so a sentence's output does not
depend on its batch mates or on what ran before (up to float32 rounding, about 3e-6: the batch
shape changes the order of additions). ``stateful=True`` reproduces the original
implementations exactly: the final ``(c, h)`` of batch row r is the initial state of row r in
the next batch (rows beyond the stored ones start from zero); :meth:`reset_states` forgets it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ElmoError
from ..numerics.backend import resolve_backend
from ..numerics.compute import ComputeSettings
from ..numerics.lstm import BiLstmLayer
from ..runtime import check_allocation, copy_to
from . import folders, hub, registry, weights
from .chars import BOS_IDS, BOS_TOKEN, EOS_IDS, EOS_TOKEN, batch_to_ids, word_to_char_ids
from .config import ElmoConfig
from .encoder import CharCNNEncoder, plan_tokens

State = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: c (2, B, D), h (2, B, P)


@dataclass
class BiLMOutput:
    layers: list[torch.Tensor]   # n_layers + 1 tensors, each (B, T, 2P); zeros at padded positions
    mask: torch.Tensor           # (B, T) bool, True at real tokens


@dataclass(frozen=True)
class Regularisation:
    """What training masks (nothing at evaluation).

    ``dropout`` on each LSTM layer's input (bilm-tf's placement; the residual adds the dropped
    input back) and, in the LM, on the top output; ``variational_dropout``: one mask per row and
    window, shared over time (Gal & Ghahramani 2016); ``weight_drop``: DropConnect on each
    recurrent matrix, one mask per window (AWD-LSTM).
    """

    dropout: float = 0.0
    variational_dropout: bool = False
    weight_drop: float = 0.0

    def __post_init__(self) -> None:
        for name in ("dropout", "weight_drop"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ElmoError(f"{name} must be in [0, 1), got {p}")


# What each direction reads. A sentence w1 .. wn is wrapped in <S> ... </S>; the forward LM reads
# it left to right, the backward LM right to left, and position t's output predicts position t + 1.
def lm_sequences(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """``[<S>, w1 .. wn, </S>]`` and ``[</S>, wn .. w1, <S>]``: the forward and backward LMs' views."""
    return [BOS_TOKEN, *tokens, EOS_TOKEN], [EOS_TOKEN, *reversed(tokens), BOS_TOKEN]


def add_sentence_boundaries(char_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, T, 50)`` char ids of sentences -> ``(B, T + 2, 50)`` with ``<S>`` first and ``</S>``
    after each row's last token (the tensor form of :func:`lm_sequences`' forward view)."""
    device = char_ids.device
    return with_boundaries(char_ids, lengths.to(device), torch.tensor(BOS_IDS, device=device),
                           torch.tensor(EOS_IDS, device=device))


def with_boundaries(char_ids: torch.Tensor, lengths: torch.Tensor, bos: torch.Tensor, eos: torch.Tensor
                    ) -> torch.Tensor:
    """:func:`add_sentence_boundaries` with the marker ids ``bos``, ``eos`` ``(50,)`` given: no
    global constants and no in-place writes, so TorchScript and ONNX export take it as it is."""
    B, T, C = char_ids.shape
    pos = torch.arange(T + 2, device=char_ids.device).unsqueeze(0)                 # (1, T + 2)
    ids = torch.cat([bos.view(1, 1, C).expand(B, 1, C), char_ids, char_ids.new_zeros(B, 1, C)], dim=1)
    return torch.where((pos == (lengths + 1).unsqueeze(1)).unsqueeze(-1), eos.view(1, 1, C), ids)


def reversal_index(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, T)``: position t of a row of length L reads ``L - 1 - t`` (``t`` past the end)."""
    t = torch.arange(T, device=lengths.device).unsqueeze(0)
    L = lengths.unsqueeze(1)
    return torch.where(t < L, L - 1 - t, t)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Reverse each row of ``x (..., B, T, F)`` within its own length; padding stays in place.
    ``index``: :func:`reversal_index` of ``lengths``, when the caller reuses it.

    It is its own inverse, which is how backward outputs are re-aligned.
    """
    if index is None:
        index = reversal_index(lengths.to(x.device), x.shape[-2])
    return x.gather(-2, index.unsqueeze(-1).expand(x.shape))


def sequence_dropout(x: torch.Tensor, p: float, variational: bool) -> torch.Tensor:
    """Dropout of ``x (..., T, F)``; ``variational``: one mask per row and feature, shared by all T steps."""
    if not variational:
        return nn.functional.dropout(x, p, True)
    mask = x.new_empty(*x.shape[:-2], 1, x.shape[-1]).bernoulli_(1.0 - p).div_(1.0 - p)
    return x * mask


def _with_carried(init: State, carried: State) -> State:
    """``init`` with its first rows replaced by the carried state's."""
    for (c0, h0), (cs, hs) in zip(init, carried):
        n = min(c0.shape[1], cs.shape[1])
        c0[:, :n], h0[:, :n] = cs[:, :n].to(c0), hs[:, :n].to(h0)
    return init


def _carried(final: State, carried: State | None) -> State:
    """The state to carry after a batch: its final state, and beyond its rows (a smaller batch)
    the rows carried before."""
    B = final[0][0].shape[1]
    if carried is None or carried[0][0].shape[1] <= B:
        return [(c.detach(), h.detach()) for c, h in final]
    return [(torch.cat([c.detach(), cs[:, B:]], 1), torch.cat([h.detach(), hs[:, B:]], 1))
            for (c, h), (cs, hs) in zip(final, carried)]


def _check_char_ids(char_ids: torch.Tensor, n_characters: int) -> None:
    # An id out of range would index past the embedding (a crash) or, if negative, silently wrap.
    if char_ids.dtype.is_floating_point or char_ids.dtype.is_complex or char_ids.dtype == torch.bool:
        raise ElmoError(f"BiLM: char ids must be integers (from batch_to_ids), got dtype {char_ids.dtype}")
    if char_ids.numel() == 0:   # sentences without tokens
        return
    lo, hi = int(char_ids.min()), int(char_ids.max())
    if lo < 0 or hi >= n_characters:
        raise ElmoError(f"BiLM: char ids must be in 0..{n_characters - 1}, got values in {lo}..{hi}")


def _row_order(lengths: torch.Tensor, fused: bool):
    """How :meth:`BiLM.run_stacks` orders a batch's rows: ``(rows, unsort, lengths to run)``;
    ``fused``: for a Triton backend."""
    if fused:
        # The fused kernels mask finished rows themselves: no sort, and the lengths stay on the
        # device (no synchronisation).
        def same(t: torch.Tensor) -> torch.Tensor:
            return t
        return same, same, lengths
    # Sorted by length once, each step works on a shrinking prefix of the batch.
    order = torch.argsort(lengths, descending=True, stable=True)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(len(order), device=order.device)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t[:, order]

    def unsort(t: torch.Tensor) -> torch.Tensor:
        return t[:, inv]
    return rows, unsort, lengths[order].tolist()


class BiLM(nn.Module, ComputeSettings):
    # forward takes batch_to_ids' char ids; a model with its own lexicons (ELMoForManyLangs')
    # takes tokens through embed_sentences only.
    takes_char_ids = True

    def __init__(self, config: ElmoConfig, stateful: bool = False,
                 regularisation: Regularisation | None = None, precision: str = "fp32",
                 backend: str | None = None) -> None:
        super().__init__()
        check_allocation(4 * config.num_parameters(), f"a biLM of {config.num_parameters():,} parameters")
        self.config = config
        self.encoder = CharCNNEncoder(config)
        P, D = config.projection_dim, config.lstm_dim
        self.layers = nn.ModuleList(BiLstmLayer(P, D, P) for _ in range(config.n_layers))
        self.stateful = stateful
        self.regularisation = regularisation or Regularisation()   # applied in training mode only
        self._state: State | None = None
        self._init_compute(precision, backend)   # see torchelmo.numerics.compute

    dropout = property(lambda self: self.regularisation.dropout)
    variational_dropout = property(lambda self: self.regularisation.variational_dropout)
    weight_drop = property(lambda self: self.regularisation.weight_drop)

    @property
    def output_dim(self) -> int:
        return self.config.output_dim

    @property
    def num_layers(self) -> int:
        """Number of representations E0 .. E_L (n_layers + 1)."""
        return self.config.num_layers_out

    # -- state -----------------------------------------------------------------------------------
    def reset_states(self) -> None:
        self._state = None

    def zero_state(self, batch_size: int, ref: torch.Tensor) -> State:
        D, P = self.config.lstm_dim, self.config.projection_dim
        return [(ref.new_zeros(2, batch_size, D), ref.new_zeros(2, batch_size, P))
                for _ in self.layers]

    def _initial_state(self, B: int, ref: torch.Tensor) -> State:
        init = self.zero_state(B, ref)
        return _with_carried(init, self._state) if self.stateful and self._state is not None else init

    def _store_state(self, final: State) -> None:
        self._state = _carried(final, self._state)

    # -- the two stacks --------------------------------------------------------------------------
    def run_stacks(self, x: torch.Tensor, lengths: torch.Tensor, state: State | None = None
                   ) -> tuple[list[torch.Tensor], State]:
        """Both LSTM stacks over direction-stacked inputs.

        Parameters
        ----------
        x : ``(2, B, T, P)``: [0] the forward LM's input sequence, [1] the backward LM's (already
            in reading order, i.e. reversed), each row valid up to ``lengths[b]``.
        lengths : ``(B,)`` long.
        state : initial state, per layer ``c (2, B, D), h (2, B, P)``; zeros if None.

        Returns
        -------
        per layer ``(2, B, T, P)`` outputs (in each direction's reading order), and the final state.
        """
        if state is None:
            state = self.zero_state(x.shape[1], x)
        cfg = self.config
        kernel = self.resolved_precision().kernel
        backend = self._resolved_backend(x.device.type, x.shape[2], x.shape[1])
        rows, unsort, run_lengths = _row_order(lengths, backend.startswith("triton"))
        h_in = rows(x)
        outs, final = [], []
        for k, layer in enumerate(self.layers):
            if self.training and self.dropout > 0:
                h_in = sequence_dropout(h_in, self.dropout, self.variational_dropout)
            w_h = None
            if self.training and self.weight_drop > 0:
                w_h = nn.functional.dropout(layer.w_h, self.weight_drop, True)
            c0, h0 = state[k]
            out, c, h = layer(h_in, run_lengths, rows(c0), rows(h0), cfg.cell_clip, cfg.proj_clip,
                              w_h, kernel, backend)
            if cfg.use_skip_connections and k > 0:
                out = out + h_in
            outs.append(out)
            final.append((unsort(c), unsort(h)))
            h_in = out
        return [unsort(o) for o in outs], final

    def contextualise(self, e: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Token embeddings through both stacks (carrying the state when :attr:`stateful`), into
        the layers ``[e; e]``, ``[fwd_k; bwd_k]``: the tail of :meth:`forward`, shared by models
        whose token encoder takes other inputs. Call it inside :meth:`precision_scope`.

        Parameters
        ----------
        e : ``(B, T, P)`` token embeddings, sentence boundaries included, row ``b`` valid up to
            ``lengths[b]``.
        lengths : ``(B,)`` long.

        Returns
        -------
        ``n_layers + 1`` tensors ``(B, T, 2P)``, not masked: padded positions hold whatever
        ``e`` holds there (layer 0) or zeros.
        """
        x = torch.stack([e, reverse_padded(e, lengths)])          # (2, B, T, P)
        init = self._initial_state(e.shape[0], e) if self.stateful else None
        outs, final = self.run_stacks(x, lengths, init)
        if self.stateful:
            self._store_state(final)
        layers = [torch.cat([e, e], dim=-1)]
        for out in outs:
            layers.append(torch.cat([out[0], reverse_padded(out[1], lengths)], dim=-1))
        return layers

    def run_tokens(self, char_ids: torch.Tensor, token_index: torch.Tensor, lengths: torch.Tensor,
                   state: State | None = None, groups: list[tuple[int, int]] | None = None
                   ) -> tuple[list[torch.Tensor], State]:
        """:meth:`run_stacks` over sequences given as ``token_index (2, B, T)``, indices into
        ``char_ids (U, 50)`` of distinct tokens (-1 at padding): the LM's training input, in which
        each distinct token is encoded once. ``groups``: see :meth:`CharCNNEncoder.encode_tokens`."""
        pad = token_index < 0
        with self.precision_scope():
            emb = self.encoder.encode_tokens(char_ids, groups, self._fused(), self.resolved_precision().name)  # (U, P)
            x = emb[token_index.clamp(min=0)].masked_fill(pad.unsqueeze(-1), 0.0)  # (2, B, T, P)
            return self.run_stacks(x, lengths, state)

    # -- public API ------------------------------------------------------------------------------
    def forward(self, char_ids: torch.Tensor, keep_sentence_boundaries: bool = False) -> BiLMOutput:
        """Parameters: ``char_ids (B, T, 50)`` from :func:`torchelmo.batch_to_ids` (no ``<S>``/``</S>``),
        on the model's device or on the host (then, for a GPU model, the distinct tokens are
        found on the host and only they are copied: no device sort, no synchronisation).

        Returns :class:`BiLMOutput` with layers ``(B, T, 2P)`` (``T + 2`` with the boundaries kept).
        """
        if char_ids.dim() != 3 or char_ids.shape[-1] != self.config.max_characters_per_token:
            raise ElmoError(f"BiLM: expected char ids of shape (batch, tokens, "
                            f"{self.config.max_characters_per_token}), got {tuple(char_ids.shape)}")
        B, T, C = char_ids.shape
        if B == 0:
            raise ElmoError("BiLM: empty batch (no sentences)")
        _check_char_ids(char_ids, self.config.n_characters)
        device = self.device
        mask = char_ids[..., 0] > 0
        lengths = mask.sum(1)
        ids = add_sentence_boundaries(char_ids, lengths)
        plan = None
        if char_ids.device.type == "cpu":
            # Host ids: the distinct tokens found with numpy (on a CPU, 3x faster than
            # torch.unique over rows); for a GPU model only they are copied over.
            plan = plan_tokens(ids)
            if device.type != "cpu":
                plan = plan.to(device)
                mask, lengths = copy_to(mask, device), copy_to(lengths, device)
        full_len = lengths + 2
        full_mask = torch.arange(T + 2, device=device).unsqueeze(0) < full_len.unsqueeze(1)

        # A frozen biLM (every weight without requires_grad, as Elmo keeps it) gives outputs that
        # need no gradient path: it runs the inference paths, under autograd too.
        with self.precision_scope(), torch.set_grad_enabled(self._trains()):
            e = self.encoder(ids, plan, self._fused(), self.resolved_precision().name)   # (B, T+2, P)
            e = e.to(self.encoder.proj.weight.dtype)                                     # autocast may give bf16
            layers = self.contextualise(e, full_len)
        if keep_sentence_boundaries:
            m = full_mask.unsqueeze(-1).to(e.dtype)
            return BiLMOutput([layer * m for layer in layers], full_mask)
        m = mask.unsqueeze(-1).to(e.dtype)
        return BiLMOutput([layer[:, 1:T + 1] * m for layer in layers], mask)

    def embed_sentences(self, sentences: list[list[str]], **kw) -> BiLMOutput:
        """Convenience: tokens in, layers out, on this model's device (the char ids go over as
        :meth:`forward` moves host ids: only the batch's distinct tokens)."""
        return self(batch_to_ids(sentences), **kw)

    @property
    def device(self) -> torch.device:
        return self.encoder.proj.weight.device

    def _trains(self) -> bool:
        """Whether a forward pass here needs a gradient path: autograd on and a weight that wants one."""
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _resolved_backend(self, device_type: str, T: int = 1, B: int = 1) -> str:
        """:attr:`backend` resolved for ``T`` steps of ``B`` rows; training is a long run by nature,
        otherwise :attr:`long_run` says whether compiling pays."""
        return resolve_backend(self._backend, device_type, T, B, self.config.lstm_dim,
                               self.resolved_precision().kernel, self.long_run or self._trains())

    def _fused(self) -> bool:
        """Whether the token encoder's compiled inference loops run: where the recurrence's
        backend resolves to ``cpu+compile``."""
        return self._resolved_backend(self.device.type) == "cpu+compile"

    # -- loading and saving ----------------------------------------------------------------------
    @classmethod
    def from_published(cls, options_file: str | Path, weight_file: str | Path, **kw) -> BiLM:
        """A model from published ``options.json`` + HDF5 weights (paths or URLs)."""
        return _load_published(cls, options_file, weight_file, **kw)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "default", **kw) -> BiLM:
        """Load a model by registry name or alias (downloaded once, then cached), ``"default"``
        (the model shipped in the package), a directory (native, published, ELMoForManyLangs' or
        a training run's: :mod:`torchelmo.model.folders` finds which), or a Hugging Face Hub id
        ``owner/name[@revision]`` (see :mod:`torchelmo.model.hub`)."""
        return _load_pretrained(cls, name_or_path, **kw)

    @classmethod
    def seed_published(cls, name: str, options_file: str | Path, weight_file: str | Path) -> tuple[Path, Path]:
        """Put a published model's two files (``name``: a registry name or alias) into the cache
        as its downloads, for a machine without network: checked together first (the weights
        must load into the options' shapes), so that neither is cached alone or beside another
        model's. Returns the cached paths."""
        return registry.seed_published(name, options_file, weight_file,
                                       lambda config, path: weights.load_published_weights(cls(config), path))

    def save_pretrained(self, out_dir: str | Path, dtype: str = "float32", **card) -> Path:
        """Write the native format: ``config.json`` (published options schema) + ``model.safetensors``,
        and a model card ``README.md`` (``card``: :func:`torchelmo.model.hub.model_card`'s fields), ready
        to upload to the Hugging Face Hub. ``dtype``: the weights on disk, ``float32``,
        ``float16`` or ``bfloat16`` (half the size; :meth:`from_pretrained` computes in fp32)."""
        out = weights.save_native(self, out_dir, dtype=dtype)
        hub.write_model_card(self, out, **card)
        return out

    def export_published(self, out_dir: str | Path, name: str = "elmo") -> tuple[Path, Path]:
        """Write ``<name>_options.json`` + ``<name>_weights.hdf5`` that bilm-tf/AllenNLP can read."""
        return weights.export_published(self, out_dir, name)

    @torch.no_grad()
    def cache_token_embeddings(self, vocab: list[str]) -> None:
        """Precompute E0 for ``vocab`` (e.g. a task's training vocabulary); other tokens still work."""
        ids = torch.tensor([word_to_char_ids(w) for w in vocab], dtype=torch.long, device=self.device)
        self.encoder.build_cache(ids)


def _load_published(cls: type[BiLM], options_file: str | Path, weight_file: str | Path, **kw) -> BiLM:
    config = ElmoConfig.from_json_file(weights.cached_path(options_file, kind="json"))
    weight_path = weights.cached_path(weight_file, kind="hdf5")   # found before the model is allocated
    model = cls(config, **kw)
    weights.load_published_weights(model, weight_path)
    return model.eval()


def _load_pretrained(cls: type[BiLM], name_or_path: str | Path, **kw) -> BiLM:
    name = str(name_or_path)
    registry.check_model_name(name)
    path = registry.default_model_dir() if name == "default" else Path(name)
    if path.is_dir():
        return folders.find(path).load(cls, path, **kw)
    if registry.is_published(name):
        # A download is kept only once this model class has read every dataset of it.
        check = lambda config, path: weights.load_published_weights(cls(config), path)  # noqa: E731
        options, weight_file = registry.resolve_published(name, check)
        try:
            return cls.from_published(options, weight_file, **kw)
        except ElmoError as e:   # both came from the cache: seeded separately, from two models
            raise ElmoError(f"{name}: its cached options and weights do not fit together ({e}); put both "
                            f"in the cache again with BiLM.seed_published") from None
    return _load_pretrained(cls, hub.resolve(name), **kw)   # a Hub id, or the error listing every name


def _load_native(cls: type[BiLM], path: Path, **kw) -> BiLM:
    weights.require_native_weights(path)   # before the model is allocated
    model = cls(ElmoConfig.from_json_file(path / weights.CONFIG_NAME), **kw)
    weights.load_native(model, path)
    return model.eval()


def _load_run(cls: type[BiLM], path: Path, **kw) -> BiLM:
    """A training run's model: the final one (``model/``), or before the run ends the best so far."""
    for sub in folders.RUN_MODEL_DIRS:
        if (path / sub).is_dir():
            return _load_native(cls, path / sub, **kw)
    raise ElmoError(f"{path}: a training run without a model yet (its first validation writes "
                    f"{folders.RUN_MODEL_DIRS[1]}/, its end {folders.RUN_MODEL_DIRS[0]}/)")


folders.register(folders.Layout(
    "native", f"{weights.CONFIG_NAME} + {weights.WEIGHTS_NAME}", order=10, load=_load_native,
    # whatever is there: its reader says what is wrong
    matches=lambda p: os.path.lexists(p / weights.CONFIG_NAME) or os.path.lexists(p / weights.WEIGHTS_NAME)))
folders.register(folders.Layout(
    "published", "*options.json + *weights*.hdf5", order=20,
    matches=lambda p: registry.find_published_files(p) is not None,
    load=lambda cls, p, **kw: cls.from_published(*registry.find_published_files(p), **kw)))
folders.register(folders.Layout(
    "training run", f"{folders.RUN_CONFIG_NAME} with {' or '.join(d + '/' for d in folders.RUN_MODEL_DIRS)}",
    order=30, matches=lambda p: os.path.lexists(p / folders.RUN_CONFIG_NAME), load=_load_run))
