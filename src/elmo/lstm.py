"""LSTM with projection, clipping and residuals: both directions of one layer advanced together.

Per direction and layer (no peepholes; ``B`` stored without the forget bias, added here)::

    z   = x_t W_x + h_{t-1} W_h + b                 split into i, j, f, o
    c_t = clip(sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j), cell_clip)
    h_t = clip((sigmoid(o) * tanh(c_t)) W_p, proj_clip)

Parameters carry a leading direction axis of size 2 (0 = forward LM, 1 = backward LM), so one
``bmm`` serves both directions. The backward inputs arrive already reversed per sentence, so
both directions step through the same positions with the same mask.

:func:`lstm_layer_fast` is the production path: one matmul over all time steps for the input
products, a length-sorted batch that shrinks as rows finish, a handful of ops per step.
:func:`lstm_reference` is the slow, obviously-correct path it is tested against.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

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


def _clip(x: torch.Tensor, v: float | None) -> torch.Tensor:
    return x if v is None else x.clamp(-v, v)


def lstm_layer_fast(
    layer: BiLstmLayer,
    x: torch.Tensor,
    lengths: list[int],
    c0: torch.Tensor,
    h0: torch.Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run one layer, both directions.

    Parameters
    ----------
    x : ``(2, B, T, in)`` inputs, direction-stacked, rows sorted by length, descending.
    lengths : B ints, non-increasing.
    c0, h0 : ``(2, B, D)``, ``(2, B, P)`` initial state.

    Returns
    -------
    out ``(2, B, T, P)`` (zeros past each row's length), and the final ``(c, h)``: each row's
    state after its last position (its initial state if its length is 0).
    """
    _, B, T, _ = x.shape
    D, P = layer.lstm_dim, layer.projection_dim
    # The input half of z for every step at once: the big, efficient matmul.
    xw = torch.baddbmm(layer.bias.unsqueeze(1), x.reshape(2, B * T, -1), layer.w_x).view(2, B, T, 4 * D)
    # One unbind and one stack, not a slice per step: under autograd each per-step slice of xw
    # (or write into a preallocated output) costs a full-size zero gradient in the backward pass.
    xs = xw.unbind(2)
    steps: list[torch.Tensor] = []
    c, h = c0, h0
    w_h, w_p = layer.w_h, layer.w_p
    n = B
    for t in range(T):
        while n > 0 and lengths[n - 1] <= t:
            n -= 1
        if n == 0:
            break
        h_n = h if n == B else h[:, :n]
        c_n = c if n == B else c[:, :n]
        z = torch.baddbmm(xs[t] if n == B else xs[t][:, :n], h_n, w_h)
        i, j, f, o = z.chunk(4, dim=-1)
        c_new = _clip(torch.sigmoid(f + FORGET_BIAS) * c_n + torch.sigmoid(i) * torch.tanh(j), cell_clip)
        h_new = _clip(torch.bmm(torch.sigmoid(o) * torch.tanh(c_new), w_p), proj_clip)
        if n == B:
            c, h = c_new, h_new
            steps.append(h_new)
        else:  # finished rows keep their final state; their outputs are zeros
            c = torch.cat([c_new, c[:, n:]], dim=1)
            h = torch.cat([h_new, h[:, n:]], dim=1)
            steps.append(torch.cat([h_new, h_new.new_zeros(2, B - n, P)], dim=1))
    if len(steps) < T:
        steps += [x.new_zeros(2, B, P)] * (T - len(steps))
    out = torch.stack(steps, dim=2) if steps else x.new_zeros(2, B, T, P)
    return out, c, h


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
            for d in range(2):
                W0 = torch.cat([layer.w_x[d], layer.w_h[d]], dim=0)
                if states is None:
                    c, h = seq.new_zeros(D), seq.new_zeros(P)
                else:
                    c, h = states[k][0][d, b], states[k][1][d, b]
                hs = []
                for t in range(L):
                    xt = dir_inputs[d][t]
                    z = torch.cat([xt, h]) @ W0 + layer.bias[d]
                    i, j, f, o = z[:D], z[D:2 * D], z[2 * D:3 * D], z[3 * D:]
                    c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(j)
                    if cell_clip is not None:
                        c = c.clamp(-cell_clip, cell_clip)
                    h = (torch.sigmoid(o) * torch.tanh(c)) @ layer.w_p[d]
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
