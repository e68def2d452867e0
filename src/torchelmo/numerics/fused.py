"""The LSTMP recurrence as two Triton kernels per time step, forward and backward.

The input products ``xw = x W_x + b`` of all steps are one big matmul done beforehand (in
autograd, by the caller); what is left is sequential, and runs here, both directions in the same
launches (grid axis 2 is the direction)::

    step t, kernel 1:  z = xw_t + h_{t-1} W_h          (matmul; the four gates of a block of
                       c_t = clip(sigmoid(f + 1) c_{t-1} + sigmoid(i) tanh(j))   units at once)
                       g_t = sigmoid(o) tanh(c_t)
    step t, kernel 2:  h_t = clip(g_t W_p)             (matmul; clip and masking in the epilogue)

Rows whose length is <= t keep their state and output zeros, so a batch needs no sorting and the
time loop has no host synchronisation.

Dimensions (the letters of every shape below; direction-major)::

    2   the directions (grid axis 2: d = 0 forward, 1 backward)
    T   time steps            B   rows (sentences)
    D   LSTM units            G = 4D   the gates i, j, f, o side by side
    P   projection (state) size
    BM, BD, BN, BK   a program's rows, units, output columns and reduction step

The caller's tensors (``xw``, ``w_h``, ``w_p``, the initial cell state, the output gradient) are
read through their strides (``s_<buffer>_<dim>``; the last dimension's stride must be 1), so a
view needs no copy; the buffers made here are contiguous. The backward pass mirrors the forward
(two kernels per step, from the last step down); the weight gradients are then two large
matmuls over all steps.

Precision (:mod:`torchelmo.numerics.precision`): ``fp32`` computes every product in IEEE fp32; ``tf32`` lets the
matmuls use TF32 tensor cores; ``bf16`` rounds matmul operands to bfloat16. The cell state, the
gates and all accumulation stay fp32 in every mode.

Triton ships with the CUDA builds of PyTorch. On CPU the kernels run under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported), which is how they are tested without
a GPU; the interpreter has no bfloat16 matmul, so there ``bf16`` rounds the operands and
multiplies in fp32, the same numbers up to summation order.
"""

from __future__ import annotations

import torch

from ..runtime import copy_to
from .backend import fused_fits
from .fused_tiles import launch_tiles, sm_count
from .precision import PRECISIONS

try:
    import triton
    import triton.language as tl
except ImportError:   # the CPU install has no Triton; the CUDA builds of PyTorch bring it
    triton = None

# The matmul arithmetic of a launch (the kernels' PREC): IEEE fp32, TF32 tensor cores, bf16
# operands with fp32 accumulation, or float64 (gradient checks).
FP32, TF32, BF16, FP64 = 0, 1, 2, 3
_PREC_CODE = {"fp32": FP32, "tf32": TF32, "bf16": BF16}


def available() -> bool:
    return triton is not None


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (decided at import)."""
    return triton is not None and type(_gates_fwd).__name__ == "InterpretedFunction"


if triton is not None:

    @triton.jit
    def _tanh(x):
        # Triton has no portable tanh; this form is exact to fp32 rounding for |x| < 44
        # and saturates correctly beyond.
        return 2.0 * tl.sigmoid(2.0 * x) - 1.0

    @triton.jit
    def _mma(a, b, acc, PREC: tl.constexpr, EMULATE_BF16: tl.constexpr):
        """``acc + a @ b`` in the launch's arithmetic: PREC 0 IEEE fp32, 1 TF32, 2 bf16 operands
        (fp32 accumulation), 3 float64 (module constants FP32, TF32, BF16, FP64)."""
        if PREC == 3:   # float64, for gradient checks: plain products, no tensor cores needed
            return acc + tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        if PREC == 2:
            if EMULATE_BF16:
                return acc + tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32),
                                    input_precision="ieee")
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        if PREC == 1:
            return tl.dot(a, b, acc, input_precision="tf32")
        return tl.dot(a, b, acc, input_precision="ieee")

    @triton.jit
    def _tile(B, N, BM: tl.constexpr, BN: tl.constexpr):
        """This program's direction, its block of rows and of columns (of N), and their bounds."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        m_ok, n_ok = rm < B, rn < N
        return tl.program_id(2), rm, rn, m_ok, n_ok, m_ok[:, None] & n_ok[None, :]

    @triton.jit
    def _running(lengths, rm, m_ok, t):
        """Which rows are still inside their sentence at step t."""
        return t < tl.load(lengths + rm, mask=m_ok, other=0)

    @triton.jit
    def _clip(x, v):
        return tl.minimum(tl.maximum(x, -v), v)

    @triton.jit(do_not_specialize=["t"])
    def _gates_fwd(xw, h, w_h, c, g, gates, c_pre, lengths, t, T, B, D, P, s_xw_d, s_xw_t, s_xw_b,
                   s_wh_d, s_wh_k, g_dir, g_t, cell_clip,
                   CLIP: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr,
                   EMULATE_BF16: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr):
        """z = xw_t + h W_h for rows [BM block] x units [BD block], all four gates; then the cell.

        xw (2, T, B, G) input products; h (2, B, P) state read; w_h (2, P, G) (both through their
        strides); c (2, B, D) cell,
        updated in place for running rows; g (2, [T,] B, D) o * tanh(c) out (``g_dir``, ``g_t``:
        its direction and step strides, ``g_t`` 0 when one buffer serves every step); with SAVE,
        gates (2, T, B, G) and c_pre (2, T, B, D) for the backward pass; lengths (B,) int32.
        """
        tl.static_assert(BM >= 16 and BD >= 16 and BK >= 16)   # tl.dot's smallest tiles
        d, rm, ru, m_ok, u_ok, mu = _tile(B, D, BM, BD)
        G = 4 * D
        acc_i = tl.zeros((BM, BD), xw.dtype.element_ty)
        acc_j = tl.zeros((BM, BD), xw.dtype.element_ty)
        acc_f = tl.zeros((BM, BD), xw.dtype.element_ty)
        acc_o = tl.zeros((BM, BD), xw.dtype.element_ty)
        for k0 in range(0, P, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < P
            hk = tl.load(h + d * B * P + rm[:, None] * P + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wp = w_h + d * s_wh_d + rk[:, None] * s_wh_k + ru[None, :]
            wm = k_ok[:, None] & u_ok[None, :]
            acc_i = _mma(hk, tl.load(wp, mask=wm, other=0.0), acc_i, PREC, EMULATE_BF16)
            acc_j = _mma(hk, tl.load(wp + D, mask=wm, other=0.0), acc_j, PREC, EMULATE_BF16)
            acc_f = _mma(hk, tl.load(wp + 2 * D, mask=wm, other=0.0), acc_f, PREC, EMULATE_BF16)
            acc_o = _mma(hk, tl.load(wp + 3 * D, mask=wm, other=0.0), acc_o, PREC, EMULATE_BF16)
        row = (d * T + t) * B + rm[:, None]
        zp = xw + d * s_xw_d + t * s_xw_t + rm[:, None] * s_xw_b + ru[None, :]
        i = tl.sigmoid(acc_i + tl.load(zp, mask=mu, other=0.0))
        j = _tanh(acc_j + tl.load(zp + D, mask=mu, other=0.0))
        f = tl.sigmoid(acc_f + tl.load(zp + 2 * D, mask=mu, other=0.0) + 1.0)
        o = tl.sigmoid(acc_o + tl.load(zp + 3 * D, mask=mu, other=0.0))
        cp = c + d * B * D + rm[:, None] * D + ru[None, :]
        pre = f * tl.load(cp, mask=mu, other=0.0) + i * j
        c_new = pre
        if CLIP:
            c_new = _clip(pre, cell_clip)
        active = _running(lengths, rm, m_ok, t)
        tl.store(cp, c_new, mask=mu & active[:, None])
        tl.store(g + d * g_dir + t * g_t + rm[:, None] * D + ru[None, :], o * _tanh(c_new), mask=mu)
        if SAVE:
            sp = gates + row * G + ru[None, :]
            tl.store(sp, i, mask=mu)
            tl.store(sp + D, j, mask=mu)
            tl.store(sp + 2 * D, f, mask=mu)
            tl.store(sp + 3 * D, o, mask=mu)
            tl.store(c_pre + row * D + ru[None, :], pre, mask=mu)

    @triton.jit(do_not_specialize=["t"])
    def _proj_fwd(g, w_p, h, out, h_pre, lengths, t, T, B, D, P, s_wp_d, s_wp_k, g_dir, g_t, proj_clip,
                  CLIP: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr,
                  EMULATE_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """h_t = clip(g_t W_p): the new state of running rows, and the step's output.

        g (2, [T,] B, D) as the gate kernel wrote it; w_p (2, D, P) (strided); h (2, B, P) state, updated
        in place for running rows; out (2, T, B, P) zeros past each row's length; with SAVE,
        h_pre (2, T, B, P) the unclipped projection.
        """
        tl.static_assert(BM >= 16 and BN >= 16 and BK >= 16)
        d, rm, rn, m_ok, n_ok, mn = _tile(B, P, BM, BN)
        acc = tl.zeros((BM, BN), g.dtype.element_ty)
        for k0 in range(0, D, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < D
            gk = tl.load(g + d * g_dir + t * g_t + rm[:, None] * D + rk[None, :],
                         mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wk = tl.load(w_p + d * s_wp_d + rk[:, None] * s_wp_k + rn[None, :], mask=k_ok[:, None] & n_ok[None, :],
                         other=0.0)
            acc = _mma(gk, wk, acc, PREC, EMULATE_BF16)
        hv = acc
        if CLIP:
            hv = _clip(acc, proj_clip)
        active = _running(lengths, rm, m_ok, t)[:, None]
        tl.store(h + d * B * P + rm[:, None] * P + rn[None, :], hv, mask=mn & active)
        row = (d * T + t) * B + rm[:, None]
        tl.store(out + row * P + rn[None, :], tl.where(active, hv, 0.0), mask=mn)
        if SAVE:
            tl.store(h_pre + row * P + rn[None, :], acc, mask=mn)

    @triton.jit(do_not_specialize=["t"])
    def _gates_bwd(dh, dout, h_pre, w_p, gates, c_pre, c_prev, dc, dz, dh_pre, lengths,
                   t, T, B, D, P, s_do_d, s_do_t, s_do_b, s_wp_d, s_wp_k, c_prev_dir, c_prev_b,
                   cell_clip, proj_clip,
                   CLIP_C: tl.constexpr, CLIP_P: tl.constexpr, CLIP_PREV: tl.constexpr,
                   PREC: tl.constexpr, EMULATE_BF16: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr):
        """Step t backward to the gates: dg = dh_pre W_p^T, then dz (= d xw_t) and dc_{t-1}.

        dh (2, B, P) gradient of the state h_t; dout (2, T, B, P) of the outputs (strided); w_p
        (2, D, P) (strided); h_pre, gates, c_pre as the forward saved them; c_prev (2, [T,] B, D)
        the cell before step t (``c_prev_dir``, ``c_prev_b``: its direction and row strides); dc
        (2, B, D) gradient of c_t in, of c_{t-1} out;
        dz (2, T, B, G) out; dh_pre (2, T, B, P) out (the projection's input gradient).
        """
        tl.static_assert(BM >= 16 and BD >= 16 and BK >= 16)
        d, rm, ru, m_ok, u_ok, mu = _tile(B, D, BM, BD)
        active = _running(lengths, rm, m_ok, t)
        row = (d * T + t) * B + rm[:, None]
        acc = tl.zeros((BM, BD), dh.dtype.element_ty)
        for k0 in range(0, P, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < P
            mk = m_ok[:, None] & k_ok[None, :]
            g = tl.load(dh + d * B * P + rm[:, None] * P + rk[None, :], mask=mk, other=0.0)
            g += tl.load(dout + d * s_do_d + t * s_do_t + rm[:, None] * s_do_b + rk[None, :], mask=mk, other=0.0)
            if CLIP_P:   # clamp passes the gradient where -clip <= h_pre <= clip
                hp = tl.load(h_pre + row * P + rk[None, :], mask=mk, other=0.0)
                g = tl.where(tl.abs(hp) <= proj_clip, g, 0.0)
            g = tl.where(active[:, None], g, 0.0)
            if tl.program_id(1) == 0:
                tl.store(dh_pre + row * P + rk[None, :], g, mask=mk)
            wt = tl.load(w_p + d * s_wp_d + ru[None, :] * s_wp_k + rk[:, None], mask=k_ok[:, None] & u_ok[None, :],
                         other=0.0)
            acc = _mma(g, wt, acc, PREC, EMULATE_BF16)
        G = 4 * D
        sp = gates + row * G + ru[None, :]
        i = tl.load(sp, mask=mu, other=0.0)
        j = tl.load(sp + D, mask=mu, other=0.0)
        f = tl.load(sp + 2 * D, mask=mu, other=0.0)
        o = tl.load(sp + 3 * D, mask=mu, other=0.0)
        pre = tl.load(c_pre + row * D + ru[None, :], mask=mu, other=0.0)
        c_new = pre
        if CLIP_C:
            c_new = _clip(pre, cell_clip)
        cprev = tl.load(c_prev + d * c_prev_dir + rm[:, None] * c_prev_b + ru[None, :], mask=mu, other=0.0)
        if CLIP_PREV:
            cprev = _clip(cprev, cell_clip)
        tc = _tanh(c_new)
        dcp = dc + d * B * D + rm[:, None] * D + ru[None, :]
        dc_in = tl.load(dcp, mask=mu, other=0.0)
        dcell = dc_in + acc * o * (1.0 - tc * tc)
        if CLIP_C:
            dcell = tl.where(tl.abs(pre) <= cell_clip, dcell, 0.0)
        a = active[:, None]
        tl.store(dcp, tl.where(a, dcell * f, dc_in), mask=mu)
        zp = dz + row * G + ru[None, :]
        tl.store(zp, tl.where(a, dcell * j * i * (1.0 - i), 0.0), mask=mu)
        tl.store(zp + D, tl.where(a, dcell * i * (1.0 - j * j), 0.0), mask=mu)
        tl.store(zp + 2 * D, tl.where(a, dcell * cprev * f * (1.0 - f), 0.0), mask=mu)
        tl.store(zp + 3 * D, tl.where(a, acc * tc * o * (1.0 - o), 0.0), mask=mu)

    @triton.jit(do_not_specialize=["t"])
    def _rec_bwd(dz, w_h, dh, lengths, t, T, B, D, P, s_wh_d, s_wh_k,
                 PREC: tl.constexpr, EMULATE_BF16: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """dh_{t-1} = dz_t W_h^T for running rows; finished rows pass their gradient through.

        dz (2, T, B, G); w_h (2, P, G) (strided); dh (2, B, P) updated in place.
        """
        tl.static_assert(BM >= 16 and BN >= 16 and BK >= 16)
        d, rm, rn, m_ok, n_ok, mn = _tile(B, P, BM, BN)
        G = 4 * D
        row = (d * T + t) * B + rm[:, None]
        acc = tl.zeros((BM, BN), dz.dtype.element_ty)
        for k0 in range(0, G, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < G
            a = tl.load(dz + row * G + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(w_h + d * s_wh_d + rn[None, :] * s_wh_k + rk[:, None], mask=k_ok[:, None] & n_ok[None, :],
                         other=0.0)
            acc = _mma(a, wt, acc, PREC, EMULATE_BF16)
        active = _running(lengths, rm, m_ok, t)[:, None]
        p = dh + d * B * P + rm[:, None] * P + rn[None, :]
        tl.store(p, tl.where(active, acc, tl.load(p, mask=mn, other=0.0)), mask=mn)


def _flags(precision: str, dtype: torch.dtype) -> dict:
    # float64 (gradient checks) has no reduced-precision form. Multiply-adds contract to FMA, as
    # Triton's default has been: named here so the numbers stay when that default changes.
    prec = FP64 if dtype == torch.float64 else _PREC_CODE[precision]
    return dict(PREC=prec, EMULATE_BF16=interpreted(), enable_fp_fusion=True)


def _unit_inner(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last dimension is unit-stride (any view of a contiguous tensor's
    leading dimensions), which is all the kernels need; else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _forward(xw, w_h, w_p, c0, h0, lengths, cell_clip, proj_clip, precision, save):
    """The time loop; with ``save``, also what the backward pass needs (gates, pre-clip cell and
    projection values, ``g``), else a single ``g`` buffer reused by every step."""
    _, T, B, G = xw.shape
    D, P = G // 4, h0.shape[-1]
    xw, w_h, w_p = _unit_inner(xw), _unit_inner(w_h), _unit_inner(w_p)
    c, h = c0.clone(memory_format=torch.contiguous_format), h0.clone(memory_format=torch.contiguous_format)
    out = xw.new_empty(2, T, B, P)
    if save:
        g = xw.new_empty(2, T, B, D)
        gates, c_pre, h_pre = xw.new_empty(2, T, B, G), xw.new_empty(2, T, B, D), xw.new_empty(2, T, B, P)
        g_dir, g_t = T * B * D, B * D
    else:
        g = xw.new_empty(2, B, D)
        gates = c_pre = h_pre = g
        g_dir, g_t = B * D, 0
    flags = _flags(precision, xw.dtype)
    gt, pt = launch_tiles(B, D, P, sm_count(xw.device), precision)
    cc, pc = (cell_clip or 0.0), (proj_clip or 0.0)
    for t in range(T):
        _gates_fwd[gt.grid(B, D)](
            xw, h, w_h, c, g, gates, c_pre, lengths, t, T, B, D, P, *xw.stride()[:3], *w_h.stride()[:2],
            g_dir, g_t, cc,
            CLIP=cell_clip is not None, SAVE=save, BM=gt.bm, BD=gt.bn, BK=gt.bk, num_warps=gt.warps, **flags)
        _proj_fwd[pt.grid(B, P)](
            g, w_p, h, out, h_pre, lengths, t, T, B, D, P, *w_p.stride()[:2], g_dir, g_t, pc,
            CLIP=proj_clip is not None, SAVE=save, BM=pt.bm, BN=pt.bn, BK=pt.bk, num_warps=pt.warps, **flags)
    saved = (xw, w_h, w_p, c0, h0, lengths, out, g, gates, c_pre, h_pre) if save else None
    return out, c, h, saved


class FusedRecurrence(torch.autograd.Function):
    """``(xw (2, T, B, 4D), w_h (2, P, 4D), w_p (2, D, P), c0 (2, B, D), h0 (2, B, P))`` ->
    ``out (2, T, B, P), c (2, B, D), h (2, B, P)``; ``lengths (B,)`` int32 on the same device."""

    @staticmethod
    def forward(ctx, xw, w_h, w_p, c0, h0, lengths, cell_clip, proj_clip, precision):
        out, c, h, saved = _forward(xw, w_h, w_p, c0, h0, lengths, cell_clip, proj_clip, precision, save=True)
        ctx.save_for_backward(*saved)
        ctx.clips, ctx.precision = (cell_clip, proj_clip), precision
        return out, c, h

    @staticmethod
    def backward(ctx, d_out, d_c, d_h):
        xw, w_h, w_p, c0, h0, lengths, out, g, gates, c_pre, h_pre = ctx.saved_tensors
        cell_clip, proj_clip = ctx.clips
        _, T, B, G = xw.shape
        D, P = G // 4, h0.shape[-1]
        d_out = torch.zeros_like(out) if d_out is None else _unit_inner(d_out)
        dc = torch.zeros_like(c0) if d_c is None else d_c.clone(memory_format=torch.contiguous_format)
        dh = torch.zeros_like(h0) if d_h is None else d_h.clone(memory_format=torch.contiguous_format)
        dz = xw.new_empty(2, T, B, G)   # contiguous whatever the strides of xw
        dh_pre, c0 = torch.empty_like(h_pre), _unit_inner(c0)
        flags = _flags(ctx.precision, xw.dtype)
        gt, pt = launch_tiles(B, D, P, sm_count(xw.device), ctx.precision)
        cc, pc = (cell_clip or 0.0), (proj_clip or 0.0)
        for t in range(T - 1, -1, -1):
            # c_{t-1}: clip(c_pre[t-1]) for rows running at t (they ran at t-1 too), else c0.
            c_prev = c_pre[:, t - 1] if t > 0 else c0
            _gates_bwd[gt.grid(B, D)](
                dh, d_out, h_pre, w_p, gates, c_pre, c_prev, dc, dz, dh_pre, lengths,
                t, T, B, D, P, *d_out.stride()[:3], *w_p.stride()[:2], *c_prev.stride()[:2], cc, pc,
                CLIP_C=cell_clip is not None, CLIP_P=proj_clip is not None,
                CLIP_PREV=cell_clip is not None and t > 0, BM=gt.bm, BD=gt.bn, BK=gt.bk,
                num_warps=gt.warps, **flags)
            _rec_bwd[pt.grid(B, P)](dz, w_h, dh, lengths, t, T, B, D, P, *w_h.stride()[:2],
                                    BM=pt.bm, BN=pt.bn, BK=pt.bk, num_warps=pt.warps, **flags)
        # Weight gradients: every step's contribution in one matmul each.
        h_prev = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1)          # (2, T, B, P)
        d_wh = torch.bmm(h_prev.reshape(2, T * B, P).transpose(1, 2), dz.view(2, T * B, G))
        d_wp = torch.bmm(g.view(2, T * B, D).transpose(1, 2), dh_pre.view(2, T * B, P))
        return dz, d_wh, d_wp, dc, dh, None, None, None, None


def fused_recurrence(xw: torch.Tensor, w_h: torch.Tensor, w_p: torch.Tensor, c0: torch.Tensor,
                     h0: torch.Tensor, lengths: torch.Tensor, cell_clip: float | None,
                     proj_clip: float | None, precision: str = "fp32"
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the recurrence; see :class:`FusedRecurrence` for shapes. Differentiable."""
    if triton is None:
        raise RuntimeError("the fused recurrence needs Triton (it comes with the CUDA builds of PyTorch)")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not fused_fits(*xw.shape[1:3], xw.shape[-1] // 4):
        raise ValueError(f"the fused recurrence indexes with 32-bit offsets: {tuple(xw.shape)} is too large")
    args = (xw, w_h, w_p, c0, h0, lengths.to(torch.int32), cell_clip, proj_clip, precision)
    if torch.is_grad_enabled() and any(t.requires_grad for t in args[:5]):
        return FusedRecurrence.apply(*args)
    # Inference: nothing kept for a backward pass (autograd would ask for it even under no_grad).
    return _forward(*args, save=False)[:3]


# -- the layer on this recurrence (the ``triton`` backend of :func:`torchelmo.numerics.lstm.lstm_layer`) ----
def lstm_layer_fused(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision):
    """:func:`torchelmo.numerics.lstm.lstm_layer` through :func:`fused_recurrence` (differentiable):
    ``x (2, B, T, in)``, rows in any order, ``lengths`` a list or tensor."""
    _, B, T, In = x.shape
    D = layer.lstm_dim
    # Time-major input products for all steps in one matmul (autograd handles W_x, b and x).
    xt = x.transpose(1, 2).reshape(2, T * B, In)
    dt = fused_state_dtype(layer)
    xw = torch.baddbmm(layer.bias.unsqueeze(1), xt, layer.w_x).view(2, T, B, 4 * D).to(dt)
    out, c, h = fused_recurrence(xw, w_h.to(dt), layer.w_p.to(dt), c0.to(dt), h0.to(dt),
                                 device_lengths(lengths, x.device), cell_clip, proj_clip, precision)
    return out.transpose(1, 2), c, h


def fused_state_dtype(layer) -> torch.dtype:
    """State and accumulation dtype: fp32 (fp64 for gradient checks), whatever autocast or a bf16
    model hands in (reduced precision is the kernels' matmul operands only)."""
    return torch.float64 if layer.w_x.dtype == torch.float64 else torch.float32


def device_lengths(lengths: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Row lengths as int32 on ``device`` for the kernels; a list goes over from pinned memory."""
    if isinstance(lengths, torch.Tensor):
        return lengths.to(device=device, dtype=torch.int32)
    return copy_to(torch.tensor(lengths, dtype=torch.int32), device)
