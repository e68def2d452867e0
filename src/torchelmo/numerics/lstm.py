"""LSTM with projection, clipping and residuals: both directions of one layer advanced together.

Per direction and layer (no peepholes; ``B`` stored without the forget bias, added here)::

    z   = x_t W_x + h_{t-1} W_h + b                 split into i, j, f, o
    c_t = clip(sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j), cell_clip)
    h_t = clip((sigmoid(o) * tanh(c_t)) W_p, proj_clip)

Parameters carry a leading direction axis of size 2 (0 = forward LM, 1 = backward LM), so one
``bmm`` serves both directions. The backward inputs arrive already reversed per sentence, so
both directions step through the same positions with the same mask.

:func:`lstm_layer` is the production path: a length-sorted batch that shrinks as rows finish, a
handful of ops per step. Under autograd (:func:`lstm_layer_autograd`) it runs
:class:`~torchelmo.numerics.bptt.Recurrence`: the input products and every weight gradient as one matmul
over all steps, and backpropagation through time written out. Without autograd it works in place, time-major, with no
per-step allocation, in one of two ways chosen by the layer's width:
:func:`lstm_inference_joint` (one matmul per step over ``[x_t ; h_{t-1} ; 1]``) or
:func:`lstm_inference_chunked` (input products of many steps at once). Those are the ``cpu``
backend; :func:`lstm_layer` dispatches to the others (:mod:`torchelmo.numerics.backend`) in one table.
:func:`lstm_reference` is the slow, obviously-correct path they are tested against.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import cell
from .backend import resolve_backend
from .bptt import Recurrence
from .compiled import settings as compiled_settings
from .epilogue import compiled, compiled_training
from .operands import bf16_cached, bf16_operands, bf16_training, padded_rows

FORGET_BIAS = 1.0


class BiLstmLayer(nn.Module):
    """One layer of the two directions' stacks (they share no weights)."""

    def __init__(self, input_dim: int, lstm_dim: int, projection_dim: int) -> None:
        super().__init__()
        self.input_dim, self.lstm_dim, self.projection_dim = input_dim, lstm_dim, projection_dim
        self.w_x = nn.Parameter(torch.empty(2, input_dim, 4 * lstm_dim))
        self.w_h = nn.Parameter(torch.empty(2, projection_dim, 4 * lstm_dim))
        self.bias = nn.Parameter(torch.zeros(2, 4 * lstm_dim))
        self.w_p = nn.Parameter(torch.empty(2, lstm_dim, projection_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Glorot-uniform over the published W_0 = [W_x; W_h], as TF's default initializer.
        a = math.sqrt(6.0 / (self.input_dim + self.projection_dim + 4 * self.lstm_dim))
        nn.init.uniform_(self.w_x, -a, a)
        nn.init.uniform_(self.w_h, -a, a)
        b = math.sqrt(6.0 / (self.lstm_dim + self.projection_dim))
        nn.init.uniform_(self.w_p, -b, b)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, lengths: list[int], c0: torch.Tensor, h0: torch.Tensor,
                cell_clip: float | None, proj_clip: float | None, w_h: torch.Tensor | None = None,
                precision: str = "fp32", backend: str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`lstm_layer` with this layer's weights."""
        return lstm_layer(self, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision, backend)


def lstm_layer(
    layer: BiLstmLayer,
    x: torch.Tensor,
    lengths: list[int],
    c0: torch.Tensor,
    h0: torch.Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    w_h: torch.Tensor | None = None,
    precision: str = "fp32",
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run one layer, both directions.

    Parameters
    ----------
    x : ``(2, B, T, in)`` inputs, direction-stacked, rows sorted by length, descending.
    lengths : B ints, non-increasing (the Triton backends take any order, and a tensor).
    c0, h0 : ``(2, B, D)``, ``(2, B, P)`` initial state.
    w_h : ``(2, P, 4D)`` recurrent matrix to use instead of ``layer.w_h`` (weight drop: one
        dropped copy serves every step of the window).
    precision : ``fp32``, ``tf32`` or ``bf16``: the matmul operands. On a CPU, bf16 multiplies
        bf16 tensors (:mod:`torchelmo.numerics.operands`), the bias added and the gates computed in
        fp32; tf32 is fp32 there.
    backend : ``auto``, ``cpu``, ``triton`` or ``triton+graphs`` (:mod:`torchelmo.numerics.backend`;
        None: its default), or a name :func:`~torchelmo.numerics.backend.resolve_backend` already resolved.

    Returns
    -------
    out ``(2, B, T, P)`` (zeros past each row's length), and the final ``(c, h)``: each row's
    state after its last position (its initial state if its length is 0).
    """
    w_h = layer.w_h if w_h is None else w_h
    backend = resolve_backend(backend, x.device.type, x.shape[2], x.shape[1], layer.lstm_dim, precision)
    return _BACKENDS[backend](layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision)


def _run_cpu(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision, fused=False):
    x = x.to(layer.w_x.dtype)   # under bf16 autocast the inputs may arrive in bfloat16
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, c0, h0, w_h, *layer.parameters())):
        return lstm_layer_autograd(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, fused, precision)
    ops = Operands.pick(precision, x.device.type, layer.w_x.dtype, fused)
    if layer.input_dim + layer.projection_dim <= JOINT_MAX_K:
        return lstm_inference_joint(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, ops)
    return lstm_inference_chunked(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, ops)


def _run_triton(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision):
    from .fused import lstm_layer_fused  # imports Triton: only when this path runs
    return lstm_layer_fused(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision)


def _run_triton_graphs(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision):
    from . import graphs
    if w_h is layer.w_h and graphs.replayable(x):
        return graphs.run_layer(layer, x, lengths, c0, h0, cell_clip, proj_clip, precision)
    return _run_triton(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision)


def _run_cpu_compile(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision):
    with compiled_settings():   # once for the layer's steps, not per compiled call
        return _run_cpu(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, precision, fused=True)


_BACKENDS = {"cpu": _run_cpu, "cpu+compile": _run_cpu_compile, "triton": _run_triton,
             "triton+graphs": _run_triton_graphs}


def lstm_layer_autograd(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, fused=False, precision="fp32"):
    """:func:`lstm_layer` where gradients are needed: backpropagation through time written out
    (:class:`~torchelmo.numerics.bptt.Recurrence`), on bf16 operands under bf16 (:mod:`torchelmo.numerics.operands`);
    ``fused``: there, each step's gates forward and backward as compiled loops where they can be."""
    _, B, T, _ = x.shape
    runs = [n for n in _running_rows(lengths, T) if n > 0]
    if not runs:
        return x.new_zeros(2, B, T, layer.projection_dim), c0, h0
    dtype = torch.bfloat16 if bf16_training(precision, x.device.type, x.dtype) else None
    gates = compiled_training() if fused and dtype is not None else None
    return Recurrence.apply(x, c0, h0, layer.w_x, w_h, _folded_bias(layer), layer.w_p, runs,
                            cell_clip, proj_clip, dtype, gates)


# Inference (no autograd) paths, chosen by the width of the per-step matmul. Measured on CPU:
# for narrow layers (in + P <= JOINT_MAX_K, e.g. the small model's 128 + 128) one matmul per step
# over [x_t ; h_{t-1} ; 1] (K = in + P + 1, the bias as the last weight row) beats a precomputed
# K = in product plus a K = P one; for wide layers (the original's 512 + 512) precomputing the
# input products of many steps at once (M = steps x rows) is faster.
JOINT_MAX_K = 512
# Input products are computed this many bytes' worth of steps at a time: big matmuls, flat memory.
INPUT_CHUNK_BYTES = 64 * 2**20


def _running_rows(lengths: list[int], T: int) -> list[int]:
    """How many rows (a prefix of the length-sorted batch) are still running at each step."""
    n_run, n = [], len(lengths)
    for t in range(T):
        while n > 0 and lengths[n - 1] <= t:
            n -= 1
        n_run.append(n)
    return n_run


class Operands:
    """The matmul operands of the inference paths. The model's dtype: the bias folded into the
    matmul as a weight row. ``bf16`` (:mod:`torchelmo.numerics.operands`): bfloat16 weights cast once,
    activations kept in bf16 buffers, products rounded to bf16; the bias added after in fp32, and
    the gates, cell state and clips fp32."""

    def __init__(self, dtype: torch.dtype, fused: bool = False) -> None:
        self.dtype = dtype
        self.bf16 = dtype == torch.bfloat16
        self.fused = fused   # the gate epilogue compiled (torchelmo.numerics.epilogue) where it can be

    @staticmethod
    def pick(precision: str, device_type: str, model_dtype: torch.dtype, fused: bool = False) -> Operands:
        return Operands(torch.bfloat16 if bf16_operands(precision, device_type, model_dtype) else model_dtype, fused)

    def cell(self, layer: BiLstmLayer, c0: torch.Tensor, cell_clip: float | None) -> _Cell:
        """A step's gates for these operands: the bias added to bf16 products after the matmul."""
        bias = _folded_bias(layer).unsqueeze(1) if self.bf16 else None
        return _Cell(layer, c0, cell_clip, self, bias, compiled() if self.fused else None)

    def weights(self, layer: BiLstmLayer, w_h: torch.Tensor, joint: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``([W_x ; W_h] or W_x, W_p)`` in the operand type: ``(2, in (+ P) (+ 1), 4D)``, ``(2, D, P)``."""
        if not self.bf16:
            bias = _folded_bias(layer).unsqueeze(1)
            return (torch.cat([layer.w_x, w_h, bias] if joint else [layer.w_x, bias], dim=1), layer.w_p)
        if joint:
            w = bf16_cached(layer, "joint", (layer.w_x, w_h), lambda: torch.cat([layer.w_x, w_h], dim=1))
        else:
            w = bf16_cached(layer, "w_x", (layer.w_x,), lambda: layer.w_x)
        return w, bf16_cached(layer, "w_p", (layer.w_p,), lambda: layer.w_p)


class _Cell:
    """The gates of one step: ``c`` is updated for the first n rows, and ``o * tanh(c)`` is
    returned in the operand type. Eager: :func:`torchelmo.numerics.cell.forward_`, in reused buffers; ``fused``
    (:func:`torchelmo.numerics.epilogue.compiled`): one compiled loop. ``bias``: ``(2, 1, 4D)`` to add to
    products that lack it (bf16 operands), else None."""

    def __init__(self, layer: BiLstmLayer, c0: torch.Tensor, cell_clip: float | None, ops: Operands,
                 bias: torch.Tensor | None = None, fused=None) -> None:
        self.D, self.cell_clip, self.bias, self.fused, self.rational = layer.lstm_dim, cell_clip, bias, fused, ops.bf16
        self.c = c0.clone()
        self.c_run = self.c   # fused: the running rows' state, (2, rows of the last step, D)
        if fused is None:
            self.tanh_c = c0.new_empty(c0.shape)
            self.out = c0.new_empty(c0.shape, dtype=ops.dtype) if ops.bf16 else self.tanh_c
            if bias is not None:
                self.z_buf = c0.new_empty(*c0.shape[:2], 4 * self.D)

    def __call__(self, z: torch.Tensor, n: int, z2: torch.Tensor | None = None) -> torch.Tensor:
        """``z``: ``(2, n, 4D)`` the step's product; ``z2``: a second one to add, or None."""
        if self.fused is not None:
            m = self.c_run.shape[1]
            if n < m:   # rows n.. have ended: their state is final
                self.c[:, n:m] = self.c_run[:, n:]
                self.c_run = self.c_run[:, :n].contiguous()
            self.c_run, out = self.fused(z, z2, self.bias, self.c_run, self.cell_clip, self.rational)
            return out
        if self.bias is not None:
            # copy then add in place: a mixed-type add would cast into a fresh temporary first
            z = self.z_buf[:, :n].copy_(z).add_(self.bias)
        if z2 is not None:
            z.add_(z2)
        return cell.forward_(z, self.c[:, :n], self.cell_clip, self.out[:, :n], self.tanh_c[:, :n])

    def final(self) -> torch.Tensor:
        """``(2, B, D)``: each row's cell state after its last step."""
        if self.c_run is not self.c:
            self.c[:, :self.c_run.shape[1]] = self.c_run
        return self.c


def _folded_bias(layer: BiLstmLayer) -> torch.Tensor:
    """``(2, 4D)``: the bias with the forget gate's 1 folded in (sigmoid(f + 1)); differentiable."""
    D = layer.lstm_dim
    forget = torch.zeros(4 * D, dtype=layer.bias.dtype, device=layer.bias.device)
    forget[2 * D:3 * D] = FORGET_BIAS
    return layer.bias + forget


def lstm_inference_joint(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, ops=None):
    """:func:`lstm_layer` without autograd, for narrow layers: one matmul per step over
    ``xh[:, t] = [x_t ; h_{t-1} ; 1]`` (the bias as the last weight row; bf16 :class:`Operands`:
    ``[x_t ; h_{t-1}]``, the bias added after in fp32); step t writes ``h_t`` straight into
    ``xh[:, t + 1]``, where the next step reads it."""
    _, B, T, In = x.shape
    D, P = layer.lstm_dim, layer.projection_dim
    ops = ops or Operands(x.dtype)
    n_run, cell = _running_rows(lengths, T), ops.cell(layer, c0, cell_clip)
    K = In + P + (not ops.bf16)
    w, w_p = ops.weights(layer, w_h, joint=True)                      # (2, K, 4D), (2, D, P)
    # Step-major, so that a step's operand xh[t] is one contiguous (2, B, K) block for the matmul.
    xh = x.new_zeros(T + 1, 2, B, K, dtype=ops.dtype)
    xh[:T, :, :, :In] = x.permute(2, 0, 1, 3)
    xh[0, :, :, In:In + P] = h0
    if not ops.bf16:
        xh[..., In + P] = 1.0
    z_buf = x.new_empty(2 * B * 4 * D, dtype=ops.dtype)   # a step's product, contiguous at any n
    for t in range(T):
        n = n_run[t]
        if n == 0:
            break
        z = torch.bmm(xh[t, :, :n], w, out=z_buf[:2 * n * 4 * D].view(2, n, 4 * D))
        h = xh[t + 1, :, :n, In:In + P]
        torch.bmm(cell(z, n), w_p, out=h)
        if proj_clip is not None:
            h.clamp_(-proj_clip, proj_clip)
    hs = xh[..., In:In + P]                            # (T + 1, 2, B, P): h0, h_1, ..., zeros past the end
    L = torch.tensor(lengths, device=x.device).clamp(max=T)
    h_final = hs[L, :, torch.arange(B, device=x.device)].transpose(0, 1)   # row of length L: slot L
    return hs[1:].permute(1, 2, 0, 3).to(x.dtype), cell.final(), h_final.to(x.dtype)


def lstm_inference_chunked(layer, x, lengths, c0, h0, cell_clip, proj_clip, w_h, ops=None):
    """:func:`lstm_layer` without autograd, for wide layers: the input products of a chunk of
    steps (``INPUT_CHUNK_BYTES`` of them) in one matmul, then ``h_{t-1} W_h`` added per step.
    ``ops``: as in :func:`lstm_inference_joint`."""
    _, B, T, In = x.shape
    D, P = layer.lstm_dim, layer.projection_dim
    ops = ops or Operands(x.dtype)
    n_run, cell = _running_rows(lengths, T), ops.cell(layer, c0, cell_clip)
    xt = x.transpose(1, 2)                             # (2, T, B, in), a view
    out = x.new_zeros(2, T, B, P, dtype=ops.dtype)
    h = h0.to(ops.dtype)
    chunk = max(1, INPUT_CHUNK_BYTES // (2 * B * 4 * D * x.element_size()))
    # [x_t ; 1] of a chunk's steps times [W_x ; b]: the bias comes with the matmul (bf16: added
    # per step in fp32). The buffers are reused from chunk to chunk (no fresh 64 MB allocation).
    w, w_p = ops.weights(layer, w_h, joint=False)                    # (2, in (+ 1), 4D), (2, D, P)
    # bf16: the chunk's product over padded rows, so that its shape recurs (torchelmo.numerics.operands).
    rows = padded_rows(min(chunk, T) * B) if ops.bf16 else min(chunk, T) * B
    x1 = x.new_zeros(2, rows, In + (not ops.bf16), dtype=ops.dtype)
    xw_buf = x.new_empty(2, rows, 4 * D, dtype=ops.dtype)
    if ops.bf16:
        w_h, hw_buf = bf16_cached(layer, "w_h", (w_h,), lambda: w_h), x.new_empty(2 * B * 4 * D, dtype=ops.dtype)
    else:
        x1[..., In] = 1.0
    for t0 in range(0, T, chunk):
        n0 = n_run[t0]
        if n0 == 0:
            break
        t1 = min(T, t0 + chunk)
        M = (t1 - t0) * n0
        x1[:, :M, :In].view(2, t1 - t0, n0, In).copy_(xt[:, t0:t1, :n0])
        Mp = padded_rows(M) if ops.bf16 else M
        xw = torch.bmm(x1[:, :Mp], w, out=xw_buf[:, :Mp])[:, :M].view(2, t1 - t0, n0, 4 * D)
        for t in range(t0, t1):
            n = n_run[t]
            if n == 0:
                break
            if ops.bf16:
                g = cell(xw[:, t - t0, :n], n, torch.bmm(h[:, :n], w_h, out=hw_buf[:2 * n * 4 * D].view(2, n, 4 * D)))
            else:
                g = cell(xw[:, t - t0, :n].baddbmm_(h[:, :n], w_h), n)
            h = out[:, t, :n]
            torch.bmm(g, w_p, out=h)
            if proj_clip is not None:
                h.clamp_(-proj_clip, proj_clip)
    L = torch.tensor(lengths, device=x.device).clamp(max=T)
    rows = torch.arange(B, device=x.device)
    out = out.to(x.dtype)
    h_final = torch.where((L > 0).view(1, B, 1), out[:, (L - 1).clamp(min=0), rows], h0)
    return out.transpose(1, 2), cell.final(), h_final


def lstm_reference(
    layers: list[BiLstmLayer],
    inputs: list[torch.Tensor],
    states: list[tuple[torch.Tensor, torch.Tensor]] | None,
    cell_clip: float | None,
    proj_clip: float | None,
    use_skip_connections: bool,
) -> tuple[list[list[torch.Tensor]], list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Slow reference: each sentence on its own, each direction a plain Python loop over steps,
    with the published formula ``z = [x_t ; h_{t-1}] W_0 + B``.

    Parameters
    ----------
    inputs : B tensors ``(L_b, in)``, the token embeddings of each sentence (markers included).
    states : per layer ``(c (2, B, D), h (2, B, P))`` initial states, or None for zeros.

    Returns
    -------
    per sentence, per layer, ``(L_b, 2P)`` = [forward; backward] outputs, and the final states
    per sentence and layer as ``(c (2, D), h (2, P))``.
    """
    D, P = layers[0].lstm_dim, layers[0].projection_dim
    outs, finals = [], []
    for b, seq in enumerate(inputs):
        L = seq.shape[0]
        sent_out, sent_final = [], []
        dir_inputs = [seq, seq.flip(0)]
        for k, layer in enumerate(layers):
            dir_out, c_fin, h_fin = [], [], []
            bias = _folded_bias(layer)
            for d in range(2):
                W0 = torch.cat([layer.w_x[d], layer.w_h[d]], dim=0)
                if states is None:
                    c, h = seq.new_zeros(D), seq.new_zeros(P)
                else:
                    c, h = states[k][0][d, b], states[k][1][d, b]
                hs = []
                for t in range(L):
                    xt = dir_inputs[d][t]
                    z = torch.cat([xt, h]) @ W0 + bias[d]
                    _, _, c, q = cell.forward(z, c, cell_clip)
                    h = q @ layer.w_p[d]
                    if proj_clip is not None:
                        h = h.clamp(-proj_clip, proj_clip)
                    hs.append(h + xt if (use_skip_connections and k > 0) else h)
                dir_out.append(torch.stack(hs) if hs else seq.new_zeros(0, P))
                c_fin.append(c)
                h_fin.append(h)
            dir_inputs = dir_out
            sent_out.append(torch.cat([dir_out[0], dir_out[1].flip(0)], dim=-1))
            sent_final.append((torch.stack(c_fin), torch.stack(h_fin)))
        outs.append(sent_out)
        finals.append(sent_final)
    return outs, finals
