"""The recurrence for training on the CPU: a forward that keeps what the backward needs, and
backpropagation through time written out.

Autograd through a per-step loop pays for every step twice over: each step's weight gradient is
a thin matmul (``h_{t-1}^T dz_t``, K = the batch) added into an accumulator, and every
elementwise op records a node. Here the step loop computes only what is sequential (the state
gradients, ``dz_t W_h^T`` and ``dh_t W_p^T``, gate derivatives in autograd's one-pass kernels);
the weight gradients and the input gradient are matmuls over all steps at once (K = steps x rows).

Dimensions: 2 directions, ``B`` rows (sorted by length, descending: step t runs the first
``n_t`` rows), ``T`` steps, ``in`` input, ``D`` cell, ``P`` projection. Buffers of all steps are
time-major ``(2, T, B, .)`` so that a step's rows are one block per direction.

With bf16 operands (:mod:`torchelmo.numerics.operands`) every matmul multiplies bfloat16 tensors: one
product per step over ``[x_t ; h_{t-1}]`` (fp32 precomputes the input products of all steps
instead; in bf16 widening that buffer to fp32 costs what the product does), and ``dz`` is kept
in bf16, rounded once. Gates, cell state, clips and their gradients are fp32 throughout.
"""

from __future__ import annotations

import contextlib

import torch

from . import cell
from .compiled import settings as compiled_settings


class _Matmul:
    """``bmm`` on the operand type: fp32, or bf16 operands with the product returned in fp32."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return w if self.dtype is None else w.to(self.dtype)

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.dtype is None:
            return torch.bmm(a, b)
        return torch.bmm(a.to(self.dtype), b.to(self.dtype)).float()   # .to: no copy when already bf16


def _clip_into(dst: torch.Tensor, x: torch.Tensor, v: float | None) -> None:
    if v is None:
        dst.copy_(x)
    else:
        torch.clamp(x, -v, v, out=dst)


def _zero_padding(buf: torch.Tensor, runs: list[int]) -> torch.Tensor:
    """Zero a time-major ``(2, T, B, .)`` buffer where no row runs: rows n_t.. at step t, and the
    steps after the last run."""
    B = buf.shape[2]
    for t, n in enumerate(runs):
        if n < B:
            buf[:, t, n:].zero_()
    buf[:, len(runs):].zero_()
    return buf


class Recurrence(torch.autograd.Function):
    """One layer, both directions: :func:`torchelmo.numerics.lstm.lstm_layer`'s arithmetic (its forget
    bias folded into ``bias``), with a hand-written backward. ``runs``: the running rows per step,
    all positive, non-increasing."""

    @staticmethod
    def forward(ctx, x, c0, h0, w_x, w_h, bias, w_p, runs, cell_clip, proj_clip, dtype, compiled=None):
        # x (2, B, T, in), c0 (2, B, D), h0 (2, B, P), w_x (2, in, 4D), w_h (2, P, 4D),
        # bias (2, 4D), w_p (2, D, P). compiled: with bf16 operands, the step's elementwise work
        # forward and backward as two compiled loops (torchelmo.numerics.epilogue.compiled_training).
        _, B, T, _ = x.shape
        D, P = w_p.shape[1], w_p.shape[2]
        mm = _Matmul(dtype)
        xt = x.transpose(1, 2).reshape(2, T * B, -1)                              # (2, T B, in)
        wp = mm.weight(w_p)
        if dtype is None:   # the input products of all steps in one matmul
            xw = torch.baddbmm(bias.unsqueeze(1), xt, w_x).view(2, T, B, 4 * D)
        else:   # one product per step over [x_t ; h_{t-1}]: no buffer of all steps' products
            w_xh = torch.cat([w_x, w_h], dim=1).to(dtype)                         # (2, in + P, 4D)
            x16 = xt.to(dtype).view(2, T, B, -1)
            b = bias.unsqueeze(1)
        # Per step, kept as computed: each step's (2, n, .) tensors, which the allocator reuses
        # from one training step to the next (buffers of all steps would be mapped afresh).
        gates: list[torch.Tensor] = []              # i, j, f, o after their nonlinearities
        c_pre: list[torch.Tensor] = []              # cell state before its clip
        h_pre: list[torch.Tensor] = []              # projection before its clip
        # q and out feed matmuls over all steps: buffers, zero where no row runs. q only ever
        # enters matmuls, so it is stored in the operand type.
        q = _zero_padding(x.new_empty(2, T, B, D, dtype=dtype or x.dtype), runs)   # o * tanh(c)
        out = _zero_padding(x.new_empty(2, T, B, P), runs)
        c, h = c0.clone(), h0.clone()
        tanh_c = torch.empty_like(c)                # the eager cell's scratch
        for t, n in enumerate(runs):
            if dtype is None:
                z = torch.baddbmm(xw[:, t, :n], h[:, :n], w_h)
            else:
                z = torch.bmm(torch.cat([x16[:, t, :n], h[:, :n].to(dtype)], dim=-1), w_xh)
            if compiled is not None:
                z, cp = compiled[0](z, b, c[:, :n], q[:, t, :n], cell_clip, True)
            else:
                if dtype is not None:
                    z = z.float().add_(b)
                cp = torch.empty_like(c[:, :n])
                cell.forward_(z, c[:, :n], cell_clip, q[:, t, :n], tanh_c[:, :n], c_pre=cp)
            hp = mm(q[:, t, :n], wp)
            _clip_into(h[:, :n], hp, proj_clip)
            out[:, t, :n] = h[:, :n]
            gates.append(z)
            c_pre.append(cp)
            h_pre.append(hp)
        ctx.save_for_backward(xt, c0, h0, w_x, w_h, w_p, q, out)
        ctx.steps = gates, c_pre, h_pre
        ctx.runs, ctx.clips, ctx.dtype, ctx.compiled = runs, (cell_clip, proj_clip), dtype, compiled
        return out.transpose(1, 2).contiguous(), c, h

    @staticmethod
    def backward(ctx, d_out, d_c, d_h):
        # the compiled loops' settings once for all steps (the forward ran inside the caller's)
        with compiled_settings() if ctx.compiled is not None else contextlib.nullcontext():
            return Recurrence._backward(ctx, d_out, d_c, d_h)

    @staticmethod
    def _backward(ctx, d_out, d_c, d_h):
        xt, c0, h0, w_x, w_h, w_p, q, out = ctx.saved_tensors
        gates, c_pre, h_pre = ctx.steps
        cell_clip, proj_clip = ctx.clips
        mm = _Matmul(ctx.dtype)
        _, T, B, D = q.shape
        w_hT, w_pT = mm.weight(w_h.transpose(1, 2)), mm.weight(w_p.transpose(1, 2))
        d_o = d_out.transpose(1, 2) if d_out is not None else out.new_zeros(out.shape)
        dh = d_h.clone() if d_h is not None else torch.zeros_like(h0)
        dc = d_c.clone() if d_c is not None else torch.zeros_like(c0)
        # dz is stored in the operand type: every matmul it enters (per step and over all steps)
        # takes it in that type, so it is rounded once.
        dz = _zero_padding(q.new_empty(2, T, B, 4 * D, dtype=ctx.dtype or q.dtype), ctx.runs)
        # a step's dz before rounding (eager bf16 gates; compiled ones round as they write)
        dz32 = None if ctx.dtype is None or ctx.compiled is not None else q.new_empty(2, B, 4 * D)
        dhp = _zero_padding(out.new_empty(out.shape), ctx.runs)      # gradient of the projection
        for t in reversed(range(len(ctx.runs))):
            n = ctx.runs[t]
            dhp[:, t, :n] = (dh[:, :n] + d_o[:, t, :n]) * cell.passes(h_pre[t], proj_clip)
            dq = mm(dhp[:, t, :n], w_pT)                                           # (2, n, D)
            cp = c_pre[t]
            if ctx.compiled is not None:
                c_prev = c0[:, :n] if t == 0 else cell.clip(c_pre[t - 1][:, :n], cell_clip)
                ctx.compiled[1](dq, gates[t], cp, c_prev, dc[:, :n], dz[:, t, :n], cell_clip, True)
                dh[:, :n] = mm(dz[:, t, :n], w_hT)
                continue
            c_prev = c0[:, :n] if t == 0 else cell.clip(c_pre[t - 1][:, :n], cell_clip)
            dz_t = dz[:, t, :n] if dz32 is None else dz32[:, :n]
            cell.backward_(dq, gates[t], cp, c_prev, dc[:, :n], cell_clip, dz_t)
            if dz32 is not None:
                dz[:, t, :n] = dz_t                  # rounded to the operand type once
            dh[:, :n] = mm(dz[:, t, :n], w_hT)
        dz = dz.view(2, T * B, -1)
        h_prev = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1).view(2, T * B, -1)
        need = ctx.needs_input_grad
        dx = mm(dz, mm.weight(w_x.transpose(1, 2))).view(2, T, B, -1).transpose(1, 2) if need[0] else None
        dw_x = mm(xt.transpose(1, 2), dz) if need[3] else None
        dw_h = mm(h_prev.transpose(1, 2), dz) if need[4] else None
        dbias = dz.sum(dim=1).float() if need[5] else None   # a bf16 dz sums in fp32, rounds once
        dw_p = mm(q.view(2, T * B, D).transpose(1, 2), dhp.view(2, T * B, -1)) if need[6] else None
        return dx, dc, dh, dw_x, dw_h, dbias, dw_p, None, None, None, None, None
