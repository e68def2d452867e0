"""The gate epilogue of an LSTM step, fused into one loop by ``torch.compile``.

Dimensions: ``n`` running rows, ``D`` cells; both directions stacked on a leading axis of 2.

After a step's matmul, the recurrence's elementwise work (the bias, three sigmoids, two tanh, the
cell update and its clip) is, in eager PyTorch, a pass over memory per operation, and each
sigmoid and tanh a vectorised exp. On a CPU with bf16 matrix units, at the small model's shapes
(``D = 1024``), that work takes about twice the step's bf16 matmul. :func:`compiled` does it in
one pass: :func:`step` as Inductor's C++ code, one vectorised loop over the step's ``(2, n, 4D)``
products. The cell's arithmetic is :mod:`torchelmo.numerics.cell`'s, defined there once.

On bf16 operands (products rounded to bfloat16, about 4e-3 relative) it also replaces sigmoid and
tanh by a rational approximation, exact to 4e-7 in fp32 (:func:`~torchelmo.numerics.cell.rational_tanh`),
which costs a few multiply-adds and one division instead of an exp; over common denominators a
cell's five functions take two divisions (:func:`_rational_cell`, the one form of the cell kept
here, tested against the cell's), a fifth less time for the loop. On fp32 operands it keeps
torch's own sigmoid and tanh: the eager path's numbers but for the order of the additions.

Training on bf16 operands compiles a step's gates too, as two loops: :func:`train_step` (the
gates, the cell state before and after its clip, the projection's input) and
:func:`train_step_backward` (the gradient of the step's product, rounded once to bf16, and of the
cell state), each one pass where the eager ops took a dozen, storing straight into the
recurrence's buffers (:func:`train_step_into`, :func:`train_step_backward_into`).

Where ``torch.compile`` cannot run (:mod:`torchelmo.numerics.compiled`), :func:`compiled` returns None and
the caller keeps its eager ops.
"""

from __future__ import annotations

import functools

import torch

from . import cell
from .compiled import run, usable


def step(z: torch.Tensor, z2: torch.Tensor | None, bias: torch.Tensor | None, c: torch.Tensor,
         cell_clip: float | None, rational: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's gates from its products, unfused (the function :func:`compiled` compiles).

    Parameters
    ----------
    z : ``(2, n, 4D)`` the step's product, gates ``[i, j, f, o]``, fp32 or bfloat16.
    z2 : ``(2, n, 4D)`` a second product to add (the recurrent one, where the input products of
        many steps were computed at once), or None.
    bias : ``(2, 1, 4D)`` fp32, the forget gate's 1 folded in; None where ``z`` has it already.
    c : ``(2, n, D)`` fp32 cell state.
    rational : the cell's rational sigmoid and tanh instead of torch's.

    Returns
    -------
    The new cell state ``(2, n, D)`` fp32 and ``sigmoid(o) * tanh(c)`` ``(2, n, D)`` in ``z``'s dtype.
    """
    zf = z.float()
    if z2 is not None:
        zf = zf + z2.float()
    if bias is not None:
        zf = zf + bias
    if rational:
        return _rational_cell(*zf.chunk(4, dim=-1), c, cell_clip, z.dtype)
    _, _, c, q = cell.forward(zf, c, cell_clip)
    return c, q.to(z.dtype)


def _rational_cell(i, j, f, o, c, cell_clip, dtype):
    """:func:`step`'s cell update with the rational functions as ratios, over common
    denominators: two divisions per cell instead of five. A division costs a fused loop here
    about what a dozen multiply-adds do; the denominators stay below 1e8, far from overflow."""
    ni, di = cell.tanh_ratio(0.5 * i)       # sigmoid(x) = (d + n) / 2d for tanh(x / 2) = n / d
    nj, dj = cell.tanh_ratio(j)
    nf, df = cell.tanh_ratio(0.5 * f)
    no, do = cell.tanh_ratio(0.5 * o)
    dij = di * dj
    c = ((df + nf) * dij * c + (di + ni) * nj * df) / (2.0 * df * dij)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    nc, dc = cell.tanh_ratio(c)
    return c, ((do + no) * nc / (2.0 * do * dc)).to(dtype)


def train_step(z: torch.Tensor, bias: torch.Tensor, c: torch.Tensor, cell_clip: float | None,
               rational: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A training step's gates (what backpropagation keeps), unfused.

    Parameters
    ----------
    z : ``(2, n, 4D)`` the step's bfloat16 product, gates ``[i, j, f, o]``.
    bias : ``(2, 1, 4D)`` fp32, the forget gate's 1 folded in.
    c : ``(2, n, D)`` fp32 cell state.

    Returns
    -------
    The gates after their nonlinearities ``(2, n, 4D)``, the cell state before its clip and after
    it, and ``sigmoid(o) * tanh(c)`` ``(2, n, D)``, all fp32.
    """
    (gi, gj, gf, go), c_pre, c_new, q = cell.forward(z.float() + bias, c, cell_clip, rational)
    return torch.cat([gi, gj, gf, go], dim=-1), c_pre, c_new, q


def train_step_backward(dq: torch.Tensor, gates: torch.Tensor, c_pre: torch.Tensor, c_prev: torch.Tensor,
                        dc: torch.Tensor, cell_clip: float | None, rational: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`train_step`'s gradients, unfused.

    Parameters
    ----------
    dq : ``(2, n, D)`` the gradient of ``sigmoid(o) * tanh(c)``.
    gates, c_pre : what :func:`train_step` returned for this step.
    c_prev : ``(2, n, D)`` the cell state the step started from.
    dc : ``(2, n, D)`` the gradient of the step's clipped cell state from the later steps.

    Returns
    -------
    The gradient of the product ``z`` ``(2, n, 4D)`` in bfloat16 (rounded once: every matmul it
    enters takes it so) and of ``c_prev`` ``(2, n, D)`` fp32.
    """
    dz, dc_prev = cell.backward(dq, gates, c_pre, c_prev, dc, cell_clip, rational)
    return dz.to(torch.bfloat16), dc_prev


def train_step_into(z: torch.Tensor, bias: torch.Tensor, c: torch.Tensor, q: torch.Tensor,
                    cell_clip: float | None, rational: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`train_step` writing into the recurrence's buffers: ``c`` ``(2, n, D)`` becomes the
    clipped cell state, ``q`` ``(2, n, D)`` (a view of the buffer of all steps, in the operand type)
    receives ``sigmoid(o) * tanh(c)``. Returns the gates and the cell state before its clip.
    Compiled, the writes are the fused loop's own stores, not copies after it."""
    gates, c_pre, c_new, q_new = train_step(z, bias, c, cell_clip, rational)
    c.copy_(c_new)
    q.copy_(q_new)
    return gates, c_pre


def train_step_backward_into(dq: torch.Tensor, gates: torch.Tensor, c_pre: torch.Tensor, c_prev: torch.Tensor,
                             dc: torch.Tensor, dz: torch.Tensor, cell_clip: float | None, rational: bool) -> None:
    """:func:`train_step_backward` writing into the recurrence's buffers: ``dz`` ``(2, n, 4D)``
    bfloat16 (a view of the buffer of all steps) receives the product's gradient, and ``dc``
    ``(2, n, D)`` turns from the clipped cell state's gradient into ``c_prev``'s."""
    dz_new, dc_prev = train_step_backward(dq, gates, c_pre, c_prev, dc, cell_clip, rational)
    dz.copy_(dz_new)
    dc.copy_(dc_prev)


def compiled():
    """:func:`step` compiled (``torch.compile``; the running rows' axis dynamic, so one compile
    serves every batch of a layer's shape), or None where it cannot run here."""
    return _run_compiled if usable() else None


def compiled_training():
    """``(forward, backward)``: :func:`train_step_into` and :func:`train_step_backward_into`
    compiled, with rational sigmoid and tanh (bf16 operands), or None where ``torch.compile``
    cannot run here."""
    return (functools.partial(_run, train_step_into),
            functools.partial(_run, train_step_backward_into)) if usable() else None


def _run_compiled(z, z2, bias, c, cell_clip, rational):
    return _run(step, z, z2, bias, c, cell_clip, rational)


def _run(fn, *args):
    """``fn(*args)`` compiled, the running rows dynamic; its last argument, ``rational``, holds
    only there: eager means torch's own sigmoid and tanh (the rational ones are only fast fused)."""
    rows = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() == 3).shape[1]
    dynamic = [(t, 1) for t in args if isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[1] == rows]
    return run(fn, args, lambda: fn(*args[:-1], False), dynamic, "the LSTM's gate epilogue")
