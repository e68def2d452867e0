"""The LSTM cell's step, defined once: its forward and its backward.

Dimensions: ``...`` leading axes (directions, rows), ``D`` cells. ``z (..., 4D)`` is the step's
product with the bias (the forget gate's 1 folded in), blocks ``[i, j, f, o]``::

    c_pre = sigmoid(f) * c_prev + sigmoid(i) * tanh(j)
    c     = clip(c_pre, cell_clip)
    q     = sigmoid(o) * tanh(c)           the projection's input: h = clip(q W_p, proj_clip)

:func:`forward` and :func:`backward` are the definitions: functional, TorchScript-compatible. The
compiled loops (:mod:`torchelmo.numerics.epilogue`), the reference LSTM, the exported graph
(:mod:`torchelmo.integrations.onnx`) call them, and the Triton kernels are tested against them.
:func:`forward_` and :func:`backward_` are the eager paths' form: the same operations in the same
order, in the caller's buffers (allocating a step's tensors costs the eager loop a tenth more at
the small model's width, three times as much at the original's); tests hold them bitwise equal.

The activations are torch's, or (``rational=True``) a rational approximation to 4e-7
(:func:`rational_tanh`): multiply-adds and a division, which a fused loop runs in a fraction of
the time of an exp; eager it is slower than torch's, so only the compiled loops ask for it.
"""

import torch

# The order of a product's four blocks: the model's, and the exported graph's (the three
# sigmoids contiguous, so that one call covers them).
GATES = "ijfo"
GATES_EXPORT = "ifoj"

# tanh(x) = x P(x^2) / Q(x^2) on [-9, 9] (beyond it tanh is 1 to fp32's precision), P of degree
# 6 and Q of degree 3 in x^2, fitted by weighted least squares on 40,000 points with Lawson's
# reweighting toward the minimax fit: relative error 7e-9 in float64, 4e-7 absolute evaluated in
# float32 (torch.tanh: 3e-8). Tested against float64 tanh.
TANH_P = (0.9999999933844501, 0.1308401136604667, 0.00310395766303075, 1.1154324360702114e-05,
          -2.0225296586421406e-08, 5.277985432985965e-11, -8.488812603447551e-14)
TANH_Q = (1.0, 0.46417338466822, 0.024495184069802323, 0.0002546147385667568)
TANH_LIMIT = 9.0
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = TANH_P
_Q0, _Q1, _Q2, _Q3 = TANH_Q


def tanh_ratio(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, d)`` with ``tanh(x) = n / d`` (to 4e-7), ``d`` in [1, 334]. The polynomials by
    Estrin's scheme (pairs ``a + b s``, then pairs of those with ``s^2``, ``s^4``): a chain of
    three dependent multiply-adds instead of Horner's six, which a fused loop otherwise waits on."""
    x = x.clamp(-TANH_LIMIT, TANH_LIMIT)
    s = x * x
    s2 = s * s
    p = (_P0 + _P1 * s) + (_P2 + _P3 * s) * s2 + ((_P4 + _P5 * s) + _P6 * s2) * (s2 * s2)
    q = (_Q0 + _Q1 * s) + (_Q2 + _Q3 * s) * s2
    return x * p, q


@torch.jit.unused   # scripted (the exported graph): torch's functions only
def rational_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh to 4e-7 in fp32, by multiply-adds and one division."""
    n, d = tanh_ratio(x)
    return n / d


@torch.jit.unused
def rational_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid(x) = (1 + tanh(x / 2)) / 2, to 2e-7."""
    return 0.5 * rational_tanh(0.5 * x) + 0.5


def sigmoid(x: torch.Tensor, rational: bool = False) -> torch.Tensor:
    return rational_sigmoid(x) if rational else torch.sigmoid(x)


def tanh(x: torch.Tensor, rational: bool = False) -> torch.Tensor:
    return rational_tanh(x) if rational else torch.tanh(x)


def sigmoid_grad(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``grad * y * (1 - y)`` for ``y = sigmoid(z)``, in one pass (autograd's own kernel)."""
    return torch.ops.aten.sigmoid_backward(grad, y)


def tanh_grad(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``grad * (1 - y^2)`` for ``y = tanh(z)``, in one pass."""
    return torch.ops.aten.tanh_backward(grad, y)


def clip(x: torch.Tensor, v: float | None) -> torch.Tensor:
    return x if v is None else x.clamp(-v, v)


def passes(x: torch.Tensor, v: float | None) -> torch.Tensor | float:
    """Where :func:`clip` lets the gradient through (``clamp``'s rule: inside or on the bound)."""
    return 1.0 if v is None else (x.abs() <= v).to(x.dtype)


def forward(z: torch.Tensor, c: torch.Tensor, cell_clip: float | None, rational: bool = False,
            order: str = "ijfo"
            ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor,
                       torch.Tensor]:
    """One step.

    Parameters
    ----------
    z : ``(..., 4D)`` fp32 product with the bias, blocks in ``order`` (:data:`GATES` or
        :data:`GATES_EXPORT`).
    c : ``(..., D)`` fp32 cell state the step starts from.
    rational : :func:`rational_sigmoid` and :func:`rational_tanh` instead of torch's.

    Returns
    -------
    The gates after their nonlinearities ``(gi, gj, gf, go)``, each ``(..., D)``; the cell state
    before its clip and after it; ``q = sigmoid(o) * tanh(c)``; all fp32.
    """
    D = c.shape[-1]
    if order == "ifoj":   # GATES_EXPORT (TorchScript takes no str globals)
        s, j = torch.split(z, [3 * D, D], dim=-1)
        gi, gf, go = torch.split(sigmoid(s, rational), D, dim=-1)
        gj = tanh(j, rational)
    else:   # the sigmoid of f and o as one block, as forward_ takes it (a kernel's tail differs by size)
        i, j, fo = torch.split(z, [D, D, 2 * D], dim=-1)
        gi, gj = sigmoid(i, rational), tanh(j, rational)
        gf, go = torch.split(sigmoid(fo, rational), D, dim=-1)
    c_pre = torch.addcmul(gf * c, gi, gj)              # gf c + gi gj
    c_new = clip(c_pre, cell_clip)
    return (gi, gj, gf, go), c_pre, c_new, go * tanh(c_new, rational)


def backward(dq: torch.Tensor, gates: torch.Tensor, c_pre: torch.Tensor, c_prev: torch.Tensor,
             dc: torch.Tensor, cell_clip: float | None, rational: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`forward` (order :data:`GATES`).

    Parameters
    ----------
    dq : ``(..., D)`` the gradient of ``q``.
    gates : ``(..., 4D)`` the gates :func:`forward` returned, concatenated; ``c_pre`` ``(..., D)``
        its cell state before the clip.
    c_prev : ``(..., D)`` the cell state the step started from.
    dc : ``(..., D)`` the gradient of the step's clipped cell state from the later steps.

    Returns
    -------
    The gradient of ``z`` ``(..., 4D)`` and of ``c_prev`` ``(..., D)``, fp32.
    """
    gi, gj, gf, go = gates.chunk(4, dim=-1)
    tc = tanh(clip(c_pre, cell_clip), rational)
    dcp = tanh_grad(dq * go, tc) + dc
    if cell_clip is not None:
        dcp = dcp * passes(c_pre, cell_clip)
    dz = torch.cat([sigmoid_grad(dcp * gj, gi), tanh_grad(dcp * gi, gj), sigmoid_grad(dcp * c_prev, gf),
                    sigmoid_grad(dq * tc, go)], dim=-1)
    return dz, dcp * gf


def forward_(z: torch.Tensor, c: torch.Tensor, cell_clip: float | None, q: torch.Tensor, tanh_c: torch.Tensor,
             c_pre: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`forward` in the caller's buffers (torch's activations, order :data:`GATES`).

    ``z (..., 4D)`` becomes the gates; ``c (..., D)`` the new, clipped cell state; ``c_pre``
    ``(..., D)``, where given, receives the state before its clip; ``tanh_c (..., D)`` fp32 is
    scratch; ``q (..., D)`` (any float type) receives ``sigmoid(o) * tanh(c)`` and is returned.
    """
    D = c.shape[-1]
    z[..., :D].sigmoid_()
    z[..., 2 * D:].sigmoid_()                           # f and o together
    z[..., D:2 * D].tanh_()
    i, j, f, o = z.chunk(4, dim=-1)
    c.mul_(f).addcmul_(i, j)
    if c_pre is not None:
        c_pre.copy_(c)
    if cell_clip is not None:
        c.clamp_(-cell_clip, cell_clip)
    return torch.mul(o, torch.tanh(c, out=tanh_c), out=q)


def backward_(dq: torch.Tensor, gates: torch.Tensor, c_pre: torch.Tensor, c_prev: torch.Tensor,
              dc: torch.Tensor, cell_clip: float | None, dz: torch.Tensor) -> None:
    """:func:`backward` in the caller's buffers (torch's activations): ``dz (..., 4D)`` fp32
    receives the gradient of the product, and ``dc (..., D)`` turns from the clipped cell state's
    gradient into ``c_prev``'s."""
    gi, gj, gf, go = gates.chunk(4, dim=-1)
    tc = torch.tanh(clip(c_pre, cell_clip))
    dcp = tanh_grad(dq * go, tc).add_(dc)
    if cell_clip is not None:
        dcp.mul_(passes(c_pre, cell_clip))
    di, dj, df, do = dz.chunk(4, dim=-1)
    torch.ops.aten.sigmoid_backward.grad_input(dcp * gj, gi, grad_input=di)
    torch.ops.aten.tanh_backward.grad_input(dcp * gi, gj, grad_input=dj)
    torch.ops.aten.sigmoid_backward.grad_input(dcp * c_prev, gf, grad_input=df)
    torch.ops.aten.sigmoid_backward.grad_input(dq * tc, go, grad_input=do)
    torch.mul(dcp, gf, out=dc)
