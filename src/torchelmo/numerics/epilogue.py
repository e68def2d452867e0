"""The gate epilogue of an LSTM step, fused into one loop by ``torch.compile``.

Dimensions: ``n`` running rows, ``D`` cells; both directions stacked on a leading axis of 2.

After a step's matmul, the recurrence's elementwise work (the bias, three sigmoids, two tanh, the
cell update and its clip) is, in eager PyTorch, a pass over memory per operation, and each
sigmoid and tanh a vectorised exp. On a CPU with bf16 matrix units, at the small model's shapes
(``D = 1024``), that work takes about twice the step's bf16 matmul. :func:`compiled` does it in
one pass: :func:`step` as Inductor's C++ code, one vectorised loop over the step's ``(2, n, 4D)``
products.

On bf16 operands (products rounded to bfloat16, about 4e-3 relative) it also replaces sigmoid and
tanh by a rational approximation, exact to 4e-7 in fp32 (:func:`rational_tanh`), which costs a
few multiply-adds and one division instead of an exp; over common denominators a cell's five
functions take two divisions (:func:`_rational_cell`), a fifth less time for the loop. On fp32
operands it keeps torch's own sigmoid and tanh: the eager path's numbers but for the order of
the additions.

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

from .compiled import run, usable

# tanh(x) = x P(x^2) / Q(x^2) on [-9, 9] (beyond it tanh is 1 to fp32's precision), P of degree
# 6 and Q of degree 3 in x^2, fitted here by weighted least squares on 40,000 points with Lawson's
# reweighting toward the minimax fit: relative error 7e-9 in float64, 4e-7 absolute evaluated in
# float32 (torch.tanh: 3e-8). Tested against float64 tanh.
TANH_P = (0.9999999933844501, 0.1308401136604667, 0.00310395766303075, 1.1154324360702114e-05,
          -2.0225296586421406e-08, 5.277985432985965e-11, -8.488812603447551e-14)
TANH_Q = (1.0, 0.46417338466822, 0.024495184069802323, 0.0002546147385667568)
TANH_LIMIT = 9.0


def _poly(coefficients: tuple[float, ...], s: torch.Tensor) -> torch.Tensor:
    """``sum_k coefficients[k] * s^k`` by Estrin's scheme: pairs ``a + b s``, then pairs of those
    with ``s^2``, ``s^4``: a chain of about log2 of the degree dependent steps instead of Horner's
    one per degree, which the fused loop's multiply-adds otherwise wait on."""
    terms: list = [a + b * s for a, b in zip(coefficients[::2], coefficients[1::2])]
    if len(coefficients) % 2:
        terms.append(coefficients[-1])      # a number, only ever the last term: paired as ``hi``
    power = s * s
    while len(terms) > 1:
        paired = [lo + hi * power for lo, hi in zip(terms[::2], terms[1::2])]
        terms = paired + terms[len(paired) * 2:]
        power = power * power
    return terms[0]


def _tanh_ratio(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, d)`` with ``tanh(x) = n / d`` (to 4e-7), ``d`` in [1, 334]."""
    x = x.clamp(-TANH_LIMIT, TANH_LIMIT)
    s = x * x
    return x * _poly(TANH_P, s), _poly(TANH_Q, s)


def rational_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh to 4e-7 in fp32, by multiply-adds and one division (for a fused loop; eager it is slow)."""
    n, d = _tanh_ratio(x)
    return n / d


def rational_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid(x) = (1 + tanh(x / 2)) / 2, to 2e-7."""
    return 0.5 * rational_tanh(0.5 * x) + 0.5


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
    rational : :func:`rational_sigmoid` and :func:`rational_tanh` instead of torch's.

    Returns
    -------
    The new cell state ``(2, n, D)`` fp32 and ``sigmoid(o) * tanh(c)`` ``(2, n, D)`` in ``z``'s dtype.
    """
    zf = z.float()
    if z2 is not None:
        zf = zf + z2.float()
    if bias is not None:
        zf = zf + bias
    i, j, f, o = zf.chunk(4, dim=-1)
    if rational:
        return _rational_cell(i, j, f, o, c, cell_clip, z.dtype)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    return c, (torch.sigmoid(o) * torch.tanh(c)).to(z.dtype)


def _rational_cell(i, j, f, o, c, cell_clip, dtype):
    """:func:`step`'s cell update with the rational functions as ratios, over common
    denominators: two divisions per cell instead of five. A division costs a fused loop here
    about what a dozen multiply-adds do; the denominators stay below 1e8, far from overflow."""
    ni, di = _tanh_ratio(0.5 * i)           # sigmoid(x) = (d + n) / 2d for tanh(x / 2) = n / d
    nj, dj = _tanh_ratio(j)
    nf, df = _tanh_ratio(0.5 * f)
    no, do = _tanh_ratio(0.5 * o)
    dij = di * dj
    c = ((df + nf) * dij * c + (di + ni) * nj * df) / (2.0 * df * dij)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    nc, dc = _tanh_ratio(c)
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
    sigmoid, tanh = (rational_sigmoid, rational_tanh) if rational else (torch.sigmoid, torch.tanh)
    i, j, f, o = (z.float() + bias).chunk(4, dim=-1)
    gi, gj, gf, go = sigmoid(i), tanh(j), sigmoid(f), sigmoid(o)
    c_pre = gf * c + gi * gj
    c_new = c_pre if cell_clip is None else c_pre.clamp(-cell_clip, cell_clip)
    return torch.cat([gi, gj, gf, go], dim=-1), c_pre, c_new, go * tanh(c_new)


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
    tanh = rational_tanh if rational else torch.tanh
    gi, gj, gf, go = gates.chunk(4, dim=-1)
    inside = c_pre if cell_clip is None else c_pre.clamp(-cell_clip, cell_clip)
    tc = tanh(inside)
    dcp = dq * go * (1 - tc * tc) + dc
    if cell_clip is not None:   # clamp's rule: the gradient passes inside and on the bound
        dcp = dcp * (c_pre.abs() <= cell_clip)
    dz = torch.cat([dcp * gj * gi * (1 - gi), dcp * gi * (1 - gj * gj), dcp * c_prev * gf * (1 - gf),
                    dq * tc * go * (1 - go)], dim=-1)
    return dz.to(torch.bfloat16), dcp * gf


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
