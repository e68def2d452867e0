"""The context-free token encoder: characters -> char-CNN -> highway -> projection (E0)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..numerics.compiled import run, usable
from ..numerics.operands import bf16_cached, bf16_operands, bf16_training, linear, mm, padded_rows, product
from ..runtime import copy_to
from .chars import PAD_CHAR
from .config import ElmoConfig

PAD_ID = PAD_CHAR + 1  # shifted id of the padding character


class TokenPlan(NamedTuple):
    """The distinct tokens of a batch: ``unique (U, 50)`` in ascending order of character length,
    ``inverse`` (the batch's shape) indexing it, and ``groups``, the ``(length, count)`` runs."""

    unique: torch.Tensor
    inverse: torch.Tensor
    groups: list[tuple[int, int]]

    def to(self, device: torch.device) -> TokenPlan:
        return TokenPlan(copy_to(self.unique, device), copy_to(self.inverse, device), self.groups)


def plan_tokens(char_ids: torch.Tensor) -> TokenPlan:
    """Find the distinct rows of host char ids ``(..., 50)`` with numpy: on a GPU, sorting
    a few thousand 100-byte rows on the host is cheaper than the device sorts it replaces."""
    shape, C = char_ids.shape[:-1], char_ids.shape[-1]
    rows = np.ascontiguousarray(char_ids.reshape(-1, C).numpy())
    nonpad = rows != PAD_ID
    lengths = np.where(nonpad.any(1), C - np.argmax(nonpad[:, ::-1], axis=1), 0)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * C))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(lengths[first], kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    runs, counts = np.unique(lengths[first][order], return_counts=True)
    return TokenPlan(torch.from_numpy(rows[first[order]]),
                     torch.from_numpy(rank[inverse.ravel()].reshape(shape)),
                     list(zip(runs.tolist(), counts.tolist())))


class _Layout(NamedTuple):
    """What a batch's windows depend on besides the tensors: ``C`` characters per token, the
    filters' ``widths``, and ``width_of (F,)``, each filter's width."""

    C: int
    widths: list[int]
    width_of: torch.Tensor


def _first_max(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(count, n, F)`` -> the maximum over ``n`` and its first position, both ``(count, F)``:
    ``torch.max(y, dim=1)``'s numbers, as a maximum and a minimum over ``n`` that a compiled loop
    vectorises across ``F``. (NaN has no position: it gets the last.)"""
    n = y.shape[1]
    top = y.amax(dim=1, keepdim=True)
    pos = torch.arange(n, device=y.device).view(1, n, 1)
    return top.squeeze(1), torch.where(y == top, pos, n - 1).amin(dim=1)


def _max_at(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_first_max` compiled; eager, ``torch.max`` (whose kernel for a middle axis is ten
    times slower than this loop, and the eager form of this loop slower again)."""
    return run(_first_max, (y,), lambda: tuple(y.max(dim=1)), [(y, 0), (y, 1)], "the char-CNN's max-pool")


def _pool_into(y: torch.Tensor, bias: torch.Tensor, has_pad: torch.Tensor, pad_value: torch.Tensor,
               out: torch.Tensor) -> None:
    """A length group's max-pool into ``out`` ``(count, F)``: ``y`` ``(count, n, F)`` the windows'
    products; ``has_pad`` ``(F,)`` whether the all-padding window, of value ``pad_value`` ``(F,)``,
    is among a filter's windows too. The bias is the same at every position: max(y + b) = max(y) + b
    (rounding is monotone), added after the max, on ``(count, F)`` instead of ``(count, n, F)``."""
    m = y.amax(dim=1) + bias
    out.copy_(torch.where(has_pad, torch.maximum(m, pad_value), m))


def _positions(groups: list[tuple[int, int]], layout: _Layout) -> list[int]:
    """The window positions computed for each group: those that touch a real character (one
    for an empty token), and none that starts past the narrowest filter's last."""
    return [max(1, min(L, layout.C - min(layout.widths) + 1)) for L, _ in groups]


def _window_max(emb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pad_win: torch.Tensor,
                groups: list[tuple[int, int]], layout: _Layout, keep: bool = False, fused: bool = False):
    """The char-CNN's max over window positions, for tokens sorted by length.

    Parameters
    ----------
    emb : ``(N, C + w_max - 1, E)`` the tokens' character embeddings, extended with padding.
    weight : ``(w_max * E, F)`` the filters stacked; ``emb``, ``weight`` and ``pad_win`` in the
        operand type.
    bias : ``(F,)``.
    pad_win : ``(1, w_max * E)`` an all-padding window.
    groups : the ``(length, count)`` runs of the rows.
    keep : also return what :class:`_WindowMax` needs for the gradients.
    fused : at inference on bf16 CPU operands, each group's max-pool as a compiled loop.

    Returns
    -------
    ``(N, F)`` in ``bias``'s type; with ``keep``: every computed window ``(R, w_max * E)`` (rows
    padded to :func:`padded_rows`, zero there), the winning position of each group's tokens
    ``(count, F)``, and where the all-padding window won ``(N, F)``.
    """
    N, _, E = emb.shape
    C, widths, width_of = layout
    w_max, F_total = max(widths), weight.shape[1]
    if weight.dtype == bias.dtype:
        pad_value = torch.addmm(bias, pad_win, weight)[0]
    else:   # bf16 operands: the product rounded to bf16, as every window's below
        pad_value = torch.mm(pad_win, weight)[0] + bias
    n_pos = _positions(groups, layout)
    # Inference on bf16 operands: each group's max-pool is one compiled loop, in place of torch's
    # maximum over the middle axis (slow for that axis) and the small ops after it.
    pooled = fused and not keep and weight.dtype == torch.bfloat16 and emb.device.type == "cpu" and usable()
    if keep:
        wins = emb.new_zeros(padded_rows(sum(n * count for n, (_, count) in zip(n_pos, groups))), w_max * E)
        winners, pad_won = [], torch.empty(N, F_total, dtype=torch.bool, device=emb.device)
    out = bias.new_empty(N, F_total)
    start = row = 0
    for (L, count), n in zip(groups, n_pos):
        stop = start + count
        win = emb[start:stop, : n + w_max - 1].unfold(1, w_max, 1).transpose(2, 3)  # (count, n, w_max, E)
        if keep:
            win = wins[row:row + count * n].view_as(win).copy_(win)
            row += count * n
        y = mm(win.reshape(-1, w_max * E), weight).view(count, n, F_total)
        # Width w has windows at starts 0 .. C - w only.
        valid = torch.arange(n, device=emb.device).unsqueeze(1) <= (C - width_of)
        if not bool(valid.all()):
            y = y.masked_fill(~valid, float("-inf"))
        # All-padding windows exist for width w iff the token leaves room for one: L + w <= C.
        has_pad = (L + width_of) <= C
        if keep:
            top, at = _max_at(y)
            winners.append(at)
            m = top + bias
            won = pad_won[start:stop]
            torch.logical_and(has_pad, pad_value > m, out=won)
            torch.where(won, pad_value, m, out=out[start:stop])
        elif pooled:
            args = (y, bias, has_pad, pad_value, out[start:stop])
            run(_pool_into, args, functools.partial(_pool_into, *args), [(y, 0), (y, 1), (args[-1], 0)],
                "the char-CNN's max-pool")
        else:
            _pool_into(y, bias, has_pad, pad_value, out[start:stop])
        start = stop
    if keep:
        return out, wins, winners, pad_won
    return (out,)


class _WindowMax(torch.autograd.Function):
    """:func:`_window_max` with its backward written out, for training on the CPU.

    Through autograd, each length group's max-pool backward built masks over all its windows'
    products, and each group's write into the output copied the whole output's gradient again:
    about a fifth of a bf16 training step. Here the forward keeps only each maximum's position;
    the backward scatters the gradient to those windows and multiplies once over all groups.
    ``dtype``: the operand type of the products (the parameters stay in their own)."""

    @staticmethod
    def forward(ctx, emb, weight, bias, pad_win, groups, layout, dtype):
        # emb (N, C + w_max - 1, E), weight (w_max * E, F), bias (F,), pad_win (1, w_max * E)
        w = weight.to(dtype)
        out, wins, winners, pad_won = _window_max(emb.to(dtype), w, bias, pad_win.to(dtype), groups, layout, keep=True)
        ctx.save_for_backward(wins, w, pad_win.to(dtype), pad_won)
        ctx.winners, ctx.groups, ctx.layout, ctx.shape = winners, groups, layout, emb.shape
        return out

    @staticmethod
    def backward(ctx, g):
        # g (N, F): the gradient of the maxima
        wins, w, pad_win, pad_won = ctx.saved_tensors
        N, Cx, E = ctx.shape
        n_pos = _positions(ctx.groups, ctx.layout)
        w_max, F_total = w.shape[0] // E, w.shape[1]
        acc = g.dtype                                              # the parameters' type
        g_pad = torch.where(pad_won, g, 0).sum(0)                 # (F,) reaching the all-padding window
        g_win = g.masked_fill(pad_won, 0).to(w.dtype)
        # The product's gradient: each token's and filter's one winning window.
        dy = wins.new_zeros(wins.shape[0], F_total)                # (R, F)
        start = row = 0
        for (_, count), n, at in zip(ctx.groups, n_pos, ctx.winners):
            dy[row:row + count * n].view(count, n, F_total).scatter_(1, at.unsqueeze(1), g_win[start:start + count].unsqueeze(1))
            start, row = start + count, row + count * n
        need = ctx.needs_input_grad
        d_emb = d_weight = d_pad = None
        if need[0]:
            d_wins = mm(dy, w.t()).to(acc)                          # (R, w_max * E)
            d_emb = torch.zeros(N, Cx, E, dtype=acc, device=g.device)
            start = row = 0
            for (_, count), n in zip(ctx.groups, n_pos):
                d = d_wins[row:row + count * n].view(count, n, w_max, E).transpose(2, 3)  # (count, n, E, w_max)
                d_emb[start:start + count, : n + w_max - 1] += torch.ops.aten.unfold_backward(
                    d, [count, n + w_max - 1, E], 1, w_max, 1)
                start, row = start + count, row + count * n
        if need[1]:   # the windows' part, and the all-padding window's
            d_weight = mm(wins.t(), dy).to(acc).addr_(pad_win[0].to(acc), g_pad)
        if need[3]:
            d_pad = (w.to(acc) @ g_pad).unsqueeze(0)                # (1, w_max * E)
        return d_emb, d_weight, g.sum(0) if need[2] else None, d_pad, None, None, None


def highway_mix(transform: torch.Tensor, carry: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The highway's output from its two products (bias included), the definition every form
    follows: ``g * relu(transform) + (1 - g) * x`` with ``g = sigmoid(carry)``, computed as
    ``x + g * (relu(transform) - x)`` (fewer passes). All ``(N, dim)``; TorchScript-compatible
    (the exported graph calls it)."""
    return torch.addcmul(x, torch.sigmoid(carry), torch.relu(transform) - x)


def highway_mix_(transform: torch.Tensor, carry: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`highway_mix` in the products' memory (no autograd): the same operations, in place."""
    t = transform.relu_().sub_(x)
    return torch.addcmul(x, carry.sigmoid_(), t, out=t)


def _highway_fused(p: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`highway_mix` from the bfloat16 product before the bias, ``p (N, 2 dim)`` (transform,
    carry), ``bias (2 dim,)``, ``x (N, dim)`` fp32 -> ``(N, dim)`` fp32: the compiled loop."""
    transform, carry = (p.float() + bias).split(x.shape[-1], dim=-1)
    return highway_mix(transform, carry, x)


class Highway(nn.Module):
    """``g = sigmoid(x W_carry + b_carry)``; ``y = g * relu(x W_transform + b_transform) + (1 - g) * x``.

    The published "carry" gate gates the transformed branch. Both products run as one matmul.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, 2 * dim)  # rows [0, dim): transform, [dim, 2 dim): carry

    def forward(self, x: torch.Tensor, fused: bool = False, precision: str | None = None) -> torch.Tensor:
        """``(N, dim)`` -> ``(N, dim)``; ``precision``: the model's, resolved (``fp32``, ``tf32``,
        ``bf16``; None: fp32); ``fused``: at inference on bf16 CPU operands, one compiled loop."""
        if fused and bf16_operands(precision, x.device.type, x.dtype) and usable():
            # One compiled loop from the bf16 product to the output, in place of a pass over the
            # product per eager op (cast, bias, relu, sigmoid, mix).
            p = product(self.proj, x, precision)                        # (N, 2 dim) bfloat16
            return run(_highway_fused, (p, self.proj.bias, x), lambda: _highway_fused(p, self.proj.bias, x),
                       [(p, 0), (x, 0)], "the highway")
        transform, carry = linear(self.proj, x, precision).split(self.dim, dim=-1)
        if torch.is_grad_enabled() or transform.dtype != x.dtype:
            return highway_mix(transform, carry, x)
        # Without autograd, in the product's own memory: each temporary of a batch's distinct
        # tokens is megabytes, and the passes over fresh ones cost about what the bf16 product does.
        # (Not where autocast returns a lower-precision product: the sum stays in x's type.)
        return highway_mix_(transform, carry, x)


class CharCNNEncoder(nn.Module):
    """Maps character ids to token embeddings.

    Input ``(..., 50)`` shifted char ids, output ``(..., P)``. E0 of a token depends only on
    its own characters, so a batch's distinct tokens are encoded once each (``forward``), and a
    vocabulary can be precomputed (:meth:`build_cache`).
    """

    # The id that fills a token's row after its characters (another model family sets its own).
    pad_id: int = PAD_ID

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.config = config
        self.char_embed = nn.Embedding(config.n_characters, config.char_embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.char_embed_dim, n, w) for w, n in config.filters)
        self.highways = nn.ModuleList(Highway(config.n_filters) for _ in range(config.n_highway))
        self.proj = nn.Linear(config.n_filters, config.projection_dim)
        self._act = torch.relu if config.activation == "relu" else torch.tanh
        self._act_ = torch.relu_ if config.activation == "relu" else torch.tanh_
        self._cache: dict[tuple[int, ...], int] | None = None
        self._cache_table: torch.Tensor | None = None

    def encode_tokens(self, ids: torch.Tensor, groups: list[tuple[int, int]] | None = None,
                      fused: bool = False, precision: str | None = None) -> torch.Tensor:
        """``(N, 50)`` -> ``(N, P)``, no deduplication, no cache. ``groups``: when the rows are
        already in ascending order of character length, its ``(length, count)`` runs (see
        :func:`plan_tokens`), which spares the device a sort and a synchronisation. ``fused``:
        the compiled inference loops (max-pool, highway) where the operands are bf16 on a CPU
        (the model's backend ``cpu+compile``). ``precision``: the model's, resolved (``fp32``,
        ``tf32``, ``bf16``; None: fp32): bf16 multiplies bf16 tensors on a CPU
        (:mod:`torchelmo.numerics.operands`)."""
        h = self._conv_max(ids, groups, fused, precision)     # (N, n_filters)
        h = self._act(h) if torch.is_grad_enabled() else self._act_(h)
        for hw in self.highways:
            h = hw(h, fused, precision)
        return linear(self.proj, h, precision)

    def conv_reference(self, ids: torch.Tensor) -> torch.Tensor:
        """``(N, 50)`` -> ``(N, n_filters)``: the char-CNN as written (every width, every position)."""
        x = self.char_embed(ids).transpose(1, 2)             # (N, E, 50)
        return self._act(torch.cat([conv(x).amax(dim=-1) for conv in self.convs], dim=-1))

    def _conv_max(self, ids: torch.Tensor, groups: list[tuple[int, int]] | None = None,
                  fused: bool = False, precision: str | None = None) -> torch.Tensor:
        """Max over positions of every filter's valid cross-correlation, before the activation.

        The same windows as :meth:`conv_reference`, computed with less work:

        * all widths in one matmul: each window of the widest filter is flattened to
          ``(w_max * E)`` and multiplied by the filters stacked (narrower ones zero-padded);
        * only windows that touch a real character: a token is its characters followed by
          padding, and every all-padding window of a width has the same value, computed once.
          Tokens are grouped by length so each group computes just its own positions.

        In CPU training the backward pass is written out (:class:`_WindowMax`).
        """
        N, C = ids.shape
        widths = [conv.kernel_size[0] for conv in self.convs]
        w_max, E = max(widths), self.config.char_embed_dim
        pad_id = ids.new_full((), self.pad_id)
        bias = torch.cat([conv.bias for conv in self.convs])
        layout = _Layout(C, widths, torch.tensor([w for w, n in zip(widths, self.config.filters) for _ in range(n[1])],
                                                 device=ids.device))
        order = None
        if groups is None:
            # Length = one past the last non-padding character.
            pos = torch.arange(1, C + 1, device=ids.device)
            lengths = ((ids != self.pad_id) * pos).amax(dim=1)         # (N,)
            order = torch.argsort(lengths)
            ids = ids[order]
            bounds = torch.unique_consecutive(lengths[order], return_counts=True)
            groups = list(zip(bounds[0].tolist(), bounds[1].tolist()))
        pad_emb = self.char_embed(pad_id.view(1))                        # (1, E)
        # Extend past the end so every start position has a full w_max window; windows that
        # reach past C are invalid for the wider filters and masked.
        emb = torch.cat([self.char_embed(ids), pad_emb.expand(N, w_max - 1, E)], dim=1)  # (N, C + w_max - 1, E)
        pad_win = pad_emb.repeat(1, w_max)                               # (1, w_max * E): an all-padding window
        trains = torch.is_grad_enabled() and (emb.requires_grad or any(
            p.requires_grad for conv in self.convs for p in (conv.weight, conv.bias)))
        if trains and ids.device.type == "cpu":
            dtype = torch.bfloat16 if bf16_training(precision, "cpu", bias.dtype) else bias.dtype
            out = _WindowMax.apply(emb, self._stacked_filters(), bias, pad_win, groups, layout, dtype)
        else:
            weight = self._filters(ids.device.type, precision)           # (w_max * E, F)
            out = _window_max(emb.to(weight.dtype), weight, bias, pad_win.to(weight.dtype), groups, layout,
                              fused=fused)[0]
        if order is None:
            return out
        result = torch.empty_like(out)
        result[order] = out
        return result

    def _stacked_filters(self) -> torch.Tensor:
        """Every width's filters stacked ``(w_max * E, F)``: row k * E + e holds offset k, channel
        e; zeros past a filter's width."""
        widths = [conv.kernel_size[0] for conv in self.convs]
        w_max = max(widths)
        weight = torch.cat([F.pad(conv.weight, (0, w_max - w)) for conv, w in zip(self.convs, widths)])
        return weight.permute(2, 1, 0).reshape(w_max * self.config.char_embed_dim, self.config.n_filters)

    def _filters(self, device_type: str, precision: str | None) -> torch.Tensor:
        """:meth:`_stacked_filters` outside CPU training, in the operand type (:mod:`torchelmo.numerics.operands`:
        at inference on bf16 operands, cast once and cached)."""
        if bf16_operands(precision, device_type, self.char_embed.weight.dtype):
            return bf16_cached(self, "filters", tuple(conv.weight for conv in self.convs), self._stacked_filters)
        return self._stacked_filters()

    def forward(self, char_ids: torch.Tensor, plan: TokenPlan | None = None, fused: bool = False,
                precision: str | None = None) -> torch.Tensor:
        """``(B, T, 50)`` -> ``(B, T, P)``; padded positions (all-zero ids) give zeros.

        ``plan``: the batch's distinct tokens found on the host (:func:`plan_tokens`), already on
        this module's device; ``char_ids`` may then stay on the host. ``fused``, ``precision``:
        see :meth:`encode_tokens`."""
        B, T, C = char_ids.shape
        if B * T == 0:
            return self.proj.weight.new_zeros(B, T, self.config.projection_dim)
        if plan is None:
            uniq, inverse = torch.unique(char_ids.reshape(-1, C), dim=0, return_inverse=True)
            emb = self._encode_unique(uniq, None, fused, precision)
        else:
            uniq, inverse = plan.unique, plan.inverse
            emb = self._encode_unique(uniq, plan.groups, fused, precision)
        out = emb[inverse].view(B, T, -1)
        mask = copy_to(char_ids[..., 0] > 0, out.device)
        return out * mask.unsqueeze(-1).to(out.dtype)

    # -- token-embedding cache ---------------------------------------------------------------------
    def _cache_usable(self) -> bool:
        # A cache holds detached values: never use it where gradients should reach the encoder.
        return self._cache is not None and not (
            torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()))

    def _encode_unique(self, uniq: torch.Tensor, groups: list[tuple[int, int]] | None = None,
                       fused: bool = False, precision: str | None = None) -> torch.Tensor:
        if not self._cache_usable():
            return self.encode_tokens(uniq, groups, fused, precision)
        assert self._cache is not None and self._cache_table is not None
        rows = [self._cache.get(tuple(r)) for r in uniq.tolist()]
        hit = [i for i, r in enumerate(rows) if r is not None]
        miss = [i for i, r in enumerate(rows) if r is None]
        table = self._cache_table.to(device=uniq.device, dtype=self.proj.weight.dtype)
        out = table.new_empty(len(rows), table.shape[1])
        if hit:
            out[hit] = table[[rows[i] for i in hit]]
        if miss:
            out[miss] = self.encode_tokens(uniq[miss], fused=fused, precision=precision)
        return out

    @torch.no_grad()
    def build_cache(self, char_ids: torch.Tensor, batch_size: int = 4096) -> None:
        """Precompute embeddings of a vocabulary given as ``(V, 50)`` char ids."""
        table = torch.cat([self.encode_tokens(char_ids[i:i + batch_size])
                           for i in range(0, len(char_ids), batch_size)])
        self._cache = {tuple(r): i for i, r in enumerate(char_ids.tolist())}
        self._cache_table = table

    def clear_cache(self) -> None:
        self._cache, self._cache_table = None, None
