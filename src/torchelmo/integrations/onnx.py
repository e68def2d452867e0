"""Export the biLM for serving: TorchScript and ONNX.

The exported graph takes character ids ``(B, T, 50)`` (as :func:`torchelmo.batch_to_ids` makes
them; all-zero rows are padding) and returns the layer stack ``(L, B, T, 2P)`` (E0 .. E_n, zeros
at padding) and the mask ``(B, T)``; batch size and length are dynamic. It computes what
:class:`~torchelmo.model.bilm.BiLM` computes in evaluation mode from the zero state, in a form the
compilers accept:

* the char-CNN as one product of every token's flattened character windows with all filters,
  each distinct token once (the eager encoder groups tokens by length, which has no static form);
* both LSTM directions as one loop over time, the rows sorted longest first inside the graph
  (and restored at the end) so that step t runs the prefix of rows still going, as the eager
  path does, with the lengths as tensors rather than Python integers.

The module is compiled with ``torch.jit.script``, so the time loop stays a loop. ONNX goes
through the TorchScript-based exporter (``dynamo=False``), which turns that scripted loop into
an ONNX ``Loop`` with a dynamic trip count; a traced or ``torch.export``-ed graph would fix the
length, or need the loop rewritten as a higher-order op.

An ELMoForManyLangs model (:class:`ExportableManyLangs`) takes its own lexicons' ids instead,
word ids, char ids and lengths, ``<bos>``/``<eos>`` included, and keeps them in the output.

Weights are read through the published layout (``torchelmo.model.weights``), the one description of
a biLM's parameters that every format shares, so this module does not depend on how the eager
layers store them.
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ElmoError
from ..io.fileio import atomic_path, write_error
from ..model import weights
from ..model.bilm import BiLM, reversal_index, reverse_padded, with_boundaries
from ..model.chars import BOS_IDS, EOS_IDS, batch_to_ids
from ..model.encoder import PAD_ID, highway_mix
from ..model.manylangs import ManyLangsBiLM
from ..numerics import cell
from ..numerics.lstm import FORGET_BIAS  # the published B leaves the forget gate's 1 out, as bilm-tf does

FORMATS = ("onnx", "torchscript")
SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript"}
OUTPUT_NAMES = ["layers", "mask"]
OPSET = 17
# 13: the first opset whose loop-carried tensors the exporter can type; 20: the last the
# TorchScript-based exporter supports.
MIN_OPSET, MAX_OPSET = 13, 20


class _LstmLayer(nn.Module):
    """One layer, each direction d in 0 (forward), 1 (backward) its own 2-D matrices:
    ``w0_d (in + P, 4D)`` (the published ``[W_x ; W_h]``), ``b_d (4D,)`` (forget bias folded in),
    ``wp_d (D, P)``. Two-dimensional constant weights are what ONNX Runtime packs once when the
    session loads; a direction-stacked (2, K, N) weight it would pack again on every step. The
    gate columns are reordered from the model's ``[i, j, f, o]`` to ``[i, f, o, j]``
    (:data:`~torchelmo.numerics.cell.GATES_EXPORT`), so that one sigmoid and one tanh cover a
    step's gates."""

    def __init__(self, w0: torch.Tensor, b: torch.Tensor, w_p: torch.Tensor) -> None:
        super().__init__()
        D = w_p.shape[1]
        b = b.clone()
        b[:, 2 * D:3 * D] += FORGET_BIAS
        order = torch.cat([torch.arange(0, D), torch.arange(2 * D, 4 * D), torch.arange(D, 2 * D)])
        w0, b = w0[..., order], b[..., order]
        self.w0_0, self.w0_1 = nn.Parameter(w0[0].contiguous()), nn.Parameter(w0[1].contiguous())
        self.b_0, self.b_1 = nn.Parameter(b[0].contiguous()), nn.Parameter(b[1].contiguous())
        self.wp_0, self.wp_1 = nn.Parameter(w_p[0].contiguous()), nn.Parameter(w_p[1].contiguous())


class ExportableBiLM(nn.Module):
    """The biLM's inference computation, scriptable and exportable (float32, zero initial state)."""

    # Constants to the compiler: the branches on them are resolved at compile time.
    __constants__ = ("cell_clip", "proj_clip", "use_cell_clip", "use_proj_clip", "skip", "relu", "n_filters",
                     "widest", "narrowest", "pad_id", "zero_pads", "cell_dim", "proj_dim")

    def __init__(self, bilm: BiLM) -> None:
        super().__init__()
        cfg = bilm.config
        a = {name: torch.from_numpy(get()) for name, _, get, _ in weights._published_layout(bilm)}
        E, n = cfg.char_embed_dim, cfg.n_filters
        self.cell_clip = float(cfg.cell_clip or 0.0)
        self.proj_clip = float(cfg.proj_clip or 0.0)
        self.use_cell_clip = cfg.cell_clip is not None
        self.use_proj_clip = cfg.proj_clip is not None
        self.skip = bool(cfg.use_skip_connections)
        self.relu = cfg.activation == "relu"
        self.n_filters = n
        self.cell_dim, self.proj_dim = cfg.lstm_dim, cfg.projection_dim
        self.pad_id = PAD_ID
        self.zero_pads = True    # id 0: a padded token position's characters
        # Row 0 (a padded token position's id) stays zero, as in the eager model.
        self.char_embed = nn.Parameter(torch.cat([torch.zeros(1, E), a["char_embed"]]))
        # Every width's filters as one (widest * E + widest - 1, n) matrix, so that one product
        # of flattened widest windows serves every width (as in the eager encoder). Row k * E + e
        # holds offset k, channel e, zeros past a filter's width. Width w has no window starting
        # past C - w; a window starting r places past C - widest carries a one in extra feature r,
        # whose row is -1e30 for the filters that lack that start (w > widest - r), so that their
        # max never picks it (a mask inside the product rather than a pass over its output).
        self.widest = max(w for w, _ in cfg.filters)
        self.narrowest = min(w for w, _ in cfg.filters)
        taps = torch.cat([F.pad(a[f"CNN/W_cnn_{i}"][0], (0, 0, 0, 0, 0, self.widest - w))
                          for i, (w, _) in enumerate(cfg.filters)], dim=-1).reshape(self.widest * E, n)
        width = torch.tensor([w for w, c in cfg.filters for _ in range(c)])
        r = torch.arange(1, self.widest).unsqueeze(1)
        mask = torch.where(width.unsqueeze(0) > self.widest - r, -1e30, 0.0)          # (widest - 1, n)
        self.conv_w = nn.Parameter(torch.cat([taps, mask]).contiguous())
        self.conv_b = nn.Parameter(torch.cat([a[f"CNN/b_cnn_{i}"] for i in range(len(cfg.filters))]))
        self.highways = nn.ModuleList()
        for k in range(cfg.n_highway):
            hw = nn.Linear(n, 2 * n)   # rows [0, n): transform, [n, 2n): carry
            hw.weight = nn.Parameter(torch.cat([a[f"CNN_high_{k}/W_transform"].T,
                                                a[f"CNN_high_{k}/W_carry"].T]).contiguous())
            hw.bias = nn.Parameter(torch.cat([a[f"CNN_high_{k}/b_transform"], a[f"CNN_high_{k}/b_carry"]]))
            self.highways.append(hw)
        self.proj = nn.Linear(n, cfg.projection_dim)
        self.proj.weight = nn.Parameter(a["CNN_proj/W_proj"].T.contiguous())
        self.proj.bias = nn.Parameter(a["CNN_proj/b_proj"])
        self.lstm = nn.ModuleList()
        for k in range(cfg.n_layers):
            cell = [f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell" for d in range(2)]
            self.lstm.append(_LstmLayer(torch.stack([a[f"{c}/W_0"] for c in cell]),
                                        torch.stack([a[f"{c}/B"] for c in cell]),
                                        torch.stack([a[f"{c}/W_P_0"] for c in cell])))
        self.register_buffer("bos", torch.tensor(BOS_IDS, dtype=torch.long), persistent=False)
        self.register_buffer("eos", torch.tensor(EOS_IDS, dtype=torch.long), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` char ids of tokens -> ``(N, P)`` token embeddings."""
        return self.proj(self.char_features(ids))

    def char_features(self, ids: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` char ids of tokens -> ``(N, n_filters)``: the char-CNN and the highways.

        Every window that starts at or before the longest token's end: a later window holds
        nothing but padding, the same value as the one starting there. Width w's windows start
        at 0 .. C - w only; later starts (when a token nearly fills C) are masked by the weights."""
        N, C = ids.shape
        real = ids != self.pad_id
        if self.zero_pads:
            real = real & (ids > 0)
        longest = real.sum(dim=1).max()
        n_pos = int(torch.clamp(longest, max=C - self.narrowest)) + 1
        span = n_pos + self.widest - 1
        x = F.embedding(ids[:, :min(span, C)], self.char_embed)                  # (N, C', E)
        x = F.pad(x, [0, 0, 0, span - x.shape[1]])                               # (N, span, E)
        taps = (torch.arange(n_pos, device=ids.device).unsqueeze(1)
                + torch.arange(self.widest, device=ids.device).unsqueeze(0)).reshape(-1)
        windows = x.index_select(1, taps).reshape(N, n_pos, -1)                  # (N, n_pos, widest * E)
        past = (torch.arange(n_pos, device=ids.device).unsqueeze(1) - (C - self.widest)
                == torch.arange(1, self.widest, device=ids.device).unsqueeze(0)).to(x.dtype)  # (n_pos, widest - 1)
        windows = torch.cat([windows, past.expand(N, n_pos, self.widest - 1)], dim=-1)
        y = torch.mm(windows.view(N * n_pos, -1), self.conv_w).view(N, n_pos, self.n_filters)
        # max(y + b) = max(y) + b: the bias on (N, n) rather than (N, n_pos, n).
        h = y.amax(dim=1) + self.conv_b
        h = torch.relu(h) if self.relu else torch.tanh(h)
        for hw in self.highways:
            y = hw(h)
            h = highway_mix(y[:, :self.n_filters], y[:, self.n_filters:], h)
        return h

    def run_layer(self, layer: _LstmLayer, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x (2, B, S, in)`` -> ``(2, B, S, P)``, zeros past each row's length; rows sorted by
        ``lengths (B,)``, longest first. Step t runs only the rows still going (a prefix of the
        batch, shrinking as rows end), as the eager path does; both directions' inputs are in
        reading order with padding last, so a row's valid steps are a prefix."""
        B, S = x.shape[1], x.shape[2]
        D = self.cell_dim
        # One product per step over [x_t ; h_{t-1}] of the running rows only, as the eager path
        # does for narrow layers: inputs at padding positions are never multiplied (precomputing
        # every position's input product did that, at about twice the cost on ragged batches).
        # The loop body is kept to few ONNX nodes (each costs ONNX Runtime a dispatch per step):
        # split sizes are constants, and the ended rows keep their last output instead of being
        # padded with zeros (the caller masks them).
        xt = x.permute(2, 0, 1, 3)                                          # (S, 2, B, in)
        running = (lengths.unsqueeze(0) > torch.arange(S, device=x.device).unsqueeze(1)).sum(1)   # (S,)
        c = x.new_zeros(2, B, D)
        h = x.new_zeros(2, B, self.proj_dim)
        steps: list[torch.Tensor] = []
        for t in range(S):
            n = int(running[t])
            c = c.narrow(1, 0, n)                                            # narrow: one ONNX Slice
            a = torch.cat([xt[t].narrow(1, 0, n), h.narrow(1, 0, n)], dim=-1)  # (2, n, in + P)
            z = torch.stack([torch.addmm(layer.b_0, a[0], layer.w0_0), torch.addmm(layer.b_1, a[1], layer.w0_1)])
            _, _, c, q = cell.forward(z, c, self.cell_clip if self.use_cell_clip else None, False, cell.GATES_EXPORT)
            hn = torch.stack([torch.mm(q[0], layer.wp_0), torch.mm(q[1], layer.wp_1)])
            if self.use_proj_clip:
                hn = hn.clamp(-self.proj_clip, self.proj_clip)
            h = torch.cat([hn, h.narrow(1, n, B - n)], dim=1)              # (2, B, P)
            steps.append(h)
        return torch.stack(steps, dim=2)

    def forward(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = char_ids.shape
        mask = char_ids[:, :, 0] > 0
        # Longest row first (the recurrence then runs a shrinking prefix of rows); restored at the end.
        lengths, order = torch.sort(mask.sum(dim=1), descending=True)
        char_ids = char_ids.index_select(0, order)
        ids = with_boundaries(char_ids, lengths, self.bos, self.eos)             # (B, T + 2, C)
        pos = torch.arange(T + 2, device=char_ids.device).unsqueeze(0)          # (1, T + 2)
        full = pos < (lengths + 2).unsqueeze(1)                                  # (B, T + 2)
        tokens, where, slot = self.distinct(ids, full)
        e = self.place(self.encode(tokens), where, slot, full)                    # (B, T + 2, P)
        stack = self.contextualise(e, lengths + 2)[:, :, 1:T + 1].index_select(1, torch.argsort(order))
        # unsqueeze, not view(1, B, T, 1): in ONNX a 0 in a reshape target copies the input's size.
        return stack * mask.unsqueeze(0).unsqueeze(-1).to(stack.dtype), mask

    def distinct(self, ids: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The distinct tokens of the real positions, ``ids (B, S, C)``, ``full (B, S)`` (True at
        real positions) -> ``tokens (N, C)``, ``where (V,)`` (each real position's token) and
        ``slot (B * S,)`` (each position's index among the real ones; V at padding). Only real
        positions go through the char-CNN, each distinct token once (ONNX Unique), as in the
        eager encoder."""
        C = ids.shape[2]
        valid = full.reshape(-1)
        tokens, where = torch.unique(ids.reshape(-1, C).index_select(0, valid.nonzero().squeeze(1)),
                                     sorted=True, return_inverse=True, dim=0)
        slot = torch.where(valid, valid.long().cumsum(0) - 1, torch.full_like(valid, where.shape[0], dtype=torch.long))
        return tokens, where, slot

    def place(self, feats: torch.Tensor, where: torch.Tensor, slot: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        """Per-token ``feats (N, F)`` back at their positions: ``(B, S, F)``, zeros at padding."""
        enc = feats.index_select(0, where)                                        # (V, F)
        return torch.cat([enc, enc.new_zeros(1, enc.shape[1])]).index_select(0, slot).view(full.shape[0], full.shape[1], -1)

    def contextualise(self, e: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``e (B, S, P)`` of rows sorted by ``lengths (B,)``, longest first ->
        the layer stack ``(L, B, S, 2P)``: ``[e; e]``, then each layer's ``[forward; backward]``."""
        S = e.shape[1]
        # Each row reversed within its own length: the backward LM's reading order (an involution).
        rev = reversal_index(lengths, S)
        x = torch.stack([e, reverse_padded(e, lengths, rev)])                     # (2, B, S, P)
        layers = [torch.cat([e, e], dim=-1)]
        for k, layer in enumerate(self.lstm):
            out = self.run_layer(layer, x, lengths)
            if self.skip and k > 0:
                out = out + x
            layers.append(torch.cat([out[0], reverse_padded(out[1], lengths, rev)], dim=-1))
            x = out
        return torch.stack(layers)


class ExportableManyLangs(ExportableBiLM):
    """An ELMoForManyLangs model's inference computation (:class:`~torchelmo.model.manylangs.ManyLangsBiLM`),
    scriptable and exportable: ``word_ids (B, T)``, ``char_ids (B, T, C)`` and ``lengths (B,)``
    as its own lexicons make them (:meth:`ManyLangsVocab.batch
    <torchelmo.model.manylangs.vocab.ManyLangsVocab.batch>`, ``<bos>``/``<eos>`` included) ->
    ``layers (L, B, T, 2P)`` (zeros past each row's length) and ``mask (B, T)``, from the zero
    state. A model without word embeddings ignores ``word_ids``."""

    __constants__ = (*ExportableBiLM.__constants__, "has_words")

    def __init__(self, bilm: BiLM) -> None:
        super().__init__(bilm)
        enc = bilm.encoder
        # Their character lexicon has no padding row 0: the whole table, and only <pad> pads.
        self.char_embed = nn.Parameter(enc.char_embed.weight.detach().clone())
        self.pad_id, self.zero_pads = int(enc.pad_id), False
        self.has_words = enc.word_embed is not None
        self.word_embed = nn.Parameter(enc.word_embed.weight.detach().clone() if self.has_words else torch.zeros(1, 0))
        self.requires_grad_(False)

    def forward(self, word_ids: torch.Tensor, char_ids: torch.Tensor,  # type: ignore[override]
                lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = char_ids.shape[1]
        mask = torch.arange(T, device=char_ids.device).unsqueeze(0) < lengths.unsqueeze(1)   # (B, T)
        lengths, order = torch.sort(lengths, descending=True)
        char_ids = char_ids.index_select(0, order)
        full = mask.index_select(0, order)
        tokens, where, slot = self.distinct(char_ids, full)
        h = self.place(self.char_features(tokens), where, slot, full)           # (B, T, n_filters)
        if self.has_words:
            h = torch.cat([F.embedding(word_ids.index_select(0, order), self.word_embed), h], dim=-1)
        stack = self.contextualise(self.proj(h), lengths).index_select(1, torch.argsort(order))
        return stack * mask.unsqueeze(0).unsqueeze(-1).to(stack.dtype), mask


# Mixed lengths (padding, a token past the 50-character limit) to check an export against.
CHECK_SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Hello", "!"], [],
                   ["Pneumonoultramicroscopicsilicovolcanoconiosis-is-a-very-long-token", "x"]]


def inputs_for(bilm: BiLM, sentences: list[list[str]]) -> dict[str, torch.Tensor]:
    """The exported graph's inputs for ``sentences``, by name: ``char_ids`` (:func:`batch_to_ids`),
    or for an ELMoForManyLangs model ``word_ids``, ``char_ids`` and ``lengths`` from its lexicons
    (``word_ids`` zeros for a model without word embeddings)."""
    if isinstance(bilm, ManyLangsBiLM):
        word_ids, char_ids, lengths = bilm.vocab.batch([bilm.vocab.sentence(s) for s in sentences])
        if word_ids is None:
            word_ids = torch.zeros(char_ids.shape[:2], dtype=torch.long)
        return {"word_ids": word_ids, "char_ids": char_ids, "lengths": lengths}
    return {"char_ids": batch_to_ids(sentences)}


def exportable(bilm: BiLM) -> torch.jit.ScriptModule:
    """The biLM as a scripted module: ``char_ids (B, T, 50) -> (layers (L, B, T, 2P), mask (B, T))``
    (an ELMoForManyLangs model: :class:`ExportableManyLangs`)."""
    if bilm.stateful:
        raise ElmoError("export: a stateful biLM carries state between batches; the export "
                        "starts every sentence from the zero state (load the model without stateful=True)")
    with warnings.catch_warnings():
        # Deprecated in favour of torch.export, which cannot keep a loop of dynamic length.
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script((ExportableManyLangs if isinstance(bilm, ManyLangsBiLM) else ExportableBiLM)(bilm))


def format_for(out: str | Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise ElmoError(f"export: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        return fmt
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise ElmoError(f"export: {out}: cannot tell the format from the suffix "
                        f"({', '.join(SUFFIXES)}); give --format {'|'.join(FORMATS)}")
    return SUFFIXES[suffix]


def _write_onnx(module: torch.jit.ScriptModule, example: dict[str, torch.Tensor], out, opset: int) -> None:
    axes = {"word_ids": {0: "batch", 1: "tokens"}, "char_ids": {0: "batch", 1: "tokens"}, "lengths": {0: "batch"},
            "layers": {1: "batch", 2: "tokens"}, "mask": {0: "batch", 1: "tokens"}}
    dynamic = {name: axes[name] for name in [*example, *OUTPUT_NAMES]}
    with warnings.catch_warnings():
        # The TorchScript-based exporter is the one that keeps the scripted time loop (see the
        # module docstring); its deprecation notice is not the user's concern.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(module, tuple(example.values()), str(out), dynamo=False, input_names=list(example),
                          output_names=OUTPUT_NAMES, dynamic_axes=dynamic, opset_version=opset)


def run_exported(path: str | Path, inputs: torch.Tensor | dict[str, torch.Tensor], fmt: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run an exported file (TorchScript with torch, ONNX with onnxruntime) on CPU; ``inputs``:
    the char ids, or every input by name in the graph's order (:func:`inputs_for`)."""
    fmt = format_for(path, fmt)
    inputs = inputs if isinstance(inputs, dict) else {"char_ids": inputs}
    if fmt == "torchscript":
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", DeprecationWarning)   # torch.jit.load: as in exportable
            layers, mask = torch.jit.load(str(path), map_location="cpu")(*inputs.values())
        return layers, mask
    try:
        import onnxruntime
    except ImportError:
        raise ElmoError("running an ONNX model needs onnxruntime: pip install 'torchelmo[export]'") from None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # The exporter drops an input the graph does not use (word_ids without word embeddings).
    feed = {i.name: inputs[i.name].cpu().numpy() for i in session.get_inputs()}
    layers, mask = session.run(OUTPUT_NAMES, feed)
    return torch.from_numpy(layers), torch.from_numpy(mask)


def max_difference(bilm: BiLM, path: str | Path, fmt: str | None = None,
                   sentences: list[list[str]] | None = None) -> float:
    """Largest absolute difference between an exported file's layers and the eager model's."""
    inputs = inputs_for(bilm, sentences or CHECK_SENTENCES)
    eager = dict(inputs)
    if isinstance(bilm, ManyLangsBiLM) and bilm.encoder.word_embed is None:
        eager["word_ids"] = None
    # The export computes in float32: compare with the eager model in fp32, then restore it.
    was_training, precision = bilm.training, bilm.precision
    try:
        bilm.precision = "fp32"
        with torch.no_grad():
            ref = bilm.eval()(*(None if t is None else t.to(bilm.device) for t in eager.values()))
    finally:
        bilm.train(was_training)
        bilm.precision = precision
    layers, mask = run_exported(path, inputs, fmt)
    if not torch.equal(mask, ref.mask.cpu()):
        return float("inf")
    return float((layers - torch.stack(ref.layers).float().cpu()).abs().max())


def export(model: BiLM | str | Path, out: str | Path, format: str | None = None, *,
           verify: bool = True, opset: int = OPSET, device: torch.device | str | None = None) -> float | None:
    """Write ``model`` (a :class:`BiLM` or anything :meth:`BiLM.from_pretrained` accepts, then
    moved to ``device``) to ``out`` as TorchScript or ONNX (``format``, or from the suffix: .onnx,
    .pt, .ts).

    With ``verify``, the written file is run on sentences of mixed lengths and compared with the
    eager model; returns that largest difference (None for ONNX without onnxruntime installed),
    and raises :class:`ElmoError` if it exceeds 1e-4.

    As every writer of the library: ``out`` is checked before any work, the file is written
    under a temporary name beside it, and it replaces ``out`` only when complete and verified; a
    failure, an interrupt or a kill leaves a previous ``out`` as it was.
    """
    fmt = format_for(out, format)
    if fmt == "onnx" and not MIN_OPSET <= opset <= MAX_OPSET:
        raise ElmoError(f"export: ONNX opset {opset} is not supported (use {MIN_OPSET} to {MAX_OPSET})")
    if fmt == "onnx" and not _has("onnx"):   # before any work, not a traceback at the end
        raise ElmoError("export: writing ONNX needs the onnx package: pip install 'torchelmo[export]'")
    with atomic_path(out) as tmp:
        bilm = model if isinstance(model, BiLM) else BiLM.from_pretrained(model)
        if device is not None:
            bilm = bilm.to(device)
        module = exportable(bilm)
        try:
            if fmt == "torchscript":
                # Serialised in memory first: a full disk then fails one Python write (a clean
                # error) instead of aborting the interpreter inside torch's C++ writer.
                data = io.BytesIO()
                torch.jit.save(module, data)
                tmp.write_bytes(data.getvalue())
            else:
                _write_onnx(module, inputs_for(bilm, CHECK_SENTENCES), tmp, opset)
        except OSError as e:
            raise write_error(out, e, "cannot write the export") from None
        if not verify or (fmt == "onnx" and not _has("onnxruntime")):
            return None
        diff = max_difference(bilm, tmp, fmt)
        if not diff <= 1e-4:
            raise ElmoError(f"export: {out} would differ from the eager model by {diff:.3g} (over 1e-4); "
                            "nothing was written")
    return diff


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
