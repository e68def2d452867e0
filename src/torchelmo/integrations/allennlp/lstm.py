"""``allennlp.modules.lstm_cell_with_projection.LstmCellWithProjection`` and
``allennlp.modules.elmo_lstm.ElmoLstm``: AllenNLP's constructor arguments, parameter names,
inputs, outputs and carried state, each step computed by torchelmo's cell
(:func:`torchelmo.numerics.cell.forward`).

Their state dicts are AllenNLP's (``forward_layer_l.input_linearity.weight``, ...: the keys under
``_elmo_lstm.`` in :mod:`.state_dict`'s table), so checkpoints move both ways; a torchelmo
:class:`~torchelmo.BiLM`'s stacks give the same outputs from the same weights (the tests hold
them to it). Dimensions: ``B`` rows, ``T`` steps, ``D`` cells (``cell_size``), ``P`` the
projection (``hidden_size``), ``L`` layers.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...errors import ElmoError
from ...model.bilm import reverse_padded
from ...model.layout import swap_gates
from ...numerics import cell


def _block_orthogonal(weight: torch.Tensor, rows: int) -> None:
    """Each block of ``rows`` rows an orthogonal matrix (AllenNLP initialises per gate)."""
    with torch.no_grad():
        for start in range(0, weight.shape[0], rows):
            nn.init.orthogonal_(weight[start:start + rows])


class LstmCellWithProjection(nn.Module):
    """One direction of an ELMo LSTM layer: projected, clipped, with recurrent dropout.

    Parameters: ``input_linearity`` ``(4D, in)``, ``state_linearity`` ``(4D, P)`` with its bias
    (the forget gate's 1 included), ``state_projection`` ``(P, D)``; gate rows in AllenNLP's
    order i, f, j, o. ``go_forward=False`` reads each row from its last step back.
    """

    def __init__(self, input_size: int, hidden_size: int, cell_size: int, go_forward: bool = True,
                 recurrent_dropout_probability: float = 0.0, memory_cell_clip_value: float | None = None,
                 state_projection_clip_value: float | None = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.cell_size = input_size, hidden_size, cell_size
        self.go_forward = go_forward
        self.recurrent_dropout_probability = recurrent_dropout_probability
        self.memory_cell_clip_value = memory_cell_clip_value
        self.state_projection_clip_value = state_projection_clip_value
        self.input_linearity = nn.Linear(input_size, 4 * cell_size, bias=False)
        self.state_linearity = nn.Linear(hidden_size, 4 * cell_size, bias=True)
        self.state_projection = nn.Linear(cell_size, hidden_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _block_orthogonal(self.input_linearity.weight, self.cell_size)
        _block_orthogonal(self.state_linearity.weight, self.cell_size)
        with torch.no_grad():
            self.state_linearity.bias.zero_()
            self.state_linearity.bias[self.cell_size:2 * self.cell_size] = 1.0   # the forget gate

    def forward(self, inputs: torch.Tensor, batch_lengths: list[int],
                initial_state: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Parameters: ``inputs (B, T, in)`` with rows sorted by length, longest first;
        ``batch_lengths``: B ints; ``initial_state``: ``(h (1, B, P), c (1, B, D))`` or zeros.

        Returns ``(B, T, P)`` outputs (zeros past each row's length) and the final
        ``(h (1, B, P), c (1, B, D))``: each row's state after its last step.
        """
        B, T, _ = inputs.shape
        lengths = [int(n) for n in batch_lengths]
        if len(lengths) != B or any(a < b for a, b in zip(lengths, lengths[1:])) or (lengths and lengths[0] > T):
            raise ElmoError(f"LstmCellWithProjection: batch_lengths must be {B} lengths, longest first and at "
                            f"most {T}, got {lengths}")
        D, P = self.cell_size, self.hidden_size
        if initial_state is None:
            h, c = inputs.new_zeros(B, P), inputs.new_zeros(B, D)
        else:
            h, c = initial_state[0].squeeze(0), initial_state[1].squeeze(0)
        n = torch.tensor(lengths, dtype=torch.long)
        x = inputs if self.go_forward else reverse_padded(inputs, n)
        # AllenNLP's gate rows i, f, j, o -> the cell's blocks i, j, f, o.
        w_x = swap_gates(self.input_linearity.weight, D).T                      # (in, 4D)
        w_h = swap_gates(self.state_linearity.weight, D).T                      # (P, 4D)
        bias = swap_gates(self.state_linearity.bias, D)                         # (4D,)
        xz = x @ w_x                                                            # (B, T, 4D)
        mask = None
        if self.training and self.recurrent_dropout_probability > 0:
            p = self.recurrent_dropout_probability
            mask = (torch.rand_like(h) > p).to(h.dtype) / (1.0 - p)
        steps = []
        for t in range(T):
            k = sum(1 for m in lengths if m > t)     # the rows still running (sorted: a prefix)
            z = xz[:k, t] + h[:k] @ w_h + bias
            _, _, c_k, q = cell.forward(z, c[:k], self.memory_cell_clip_value)
            h_k = cell.clip(self.state_projection(q), self.state_projection_clip_value)
            if mask is not None:
                h_k = h_k * mask[:k]
            h, c = torch.cat([h_k, h[k:]]), torch.cat([c_k, c[k:]])
            steps.append(torch.cat([h_k, h_k.new_zeros(B - k, P)]))
        out = torch.stack(steps, 1) if steps else inputs.new_zeros(B, 0, P)
        if not self.go_forward:
            out = reverse_padded(out, n)
        return out, (h.unsqueeze(0), c.unsqueeze(0))


class ElmoLstm(nn.Module):
    """ELMo's two stacks, each direction stacked on its own, with skip connections from the
    second layer on, and AllenNLP's carried state: ``_states = (h (L, B, 2P), c (L, B, 2D))``,
    row r of a batch starting where row r of the previous batch ended (a row that was padding
    throughout keeps its old state; a row beyond the previous batch starts from zero).
    """

    def __init__(self, input_size: int, hidden_size: int, cell_size: int, num_layers: int,
                 requires_grad: bool = False, recurrent_dropout_probability: float = 0.0,
                 memory_cell_clip_value: float | None = None,
                 state_projection_clip_value: float | None = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.cell_size = input_size, hidden_size, cell_size
        self.num_layers, self.requires_grad = num_layers, requires_grad
        self.stateful = True
        self._states: tuple[torch.Tensor, torch.Tensor] | None = None
        self.forward_layers, self.backward_layers = [], []
        size = input_size
        for i in range(num_layers):
            for go_forward, kept in ((True, self.forward_layers), (False, self.backward_layers)):
                layer = LstmCellWithProjection(size, hidden_size, cell_size, go_forward,
                                               recurrent_dropout_probability, memory_cell_clip_value,
                                               state_projection_clip_value)
                self.add_module(f"{'forward' if go_forward else 'backward'}_layer_{i}", layer)
                kept.append(layer)
            size = hidden_size

    def reset_states(self, mask: torch.Tensor | None = None) -> None:
        """Forget the carried state (``mask (B,)``: only where it is True)."""
        if mask is None or self._states is None:
            self._states = None
            return
        keep = (~mask.bool()).to(self._states[0].dtype).view(1, -1, 1)
        self._states = tuple(s * keep for s in self._states)   # type: ignore[assignment]

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Parameters: ``inputs (B, T, in)``, ``mask (B, T)`` (each row's valid steps first).
        Returns ``(L, B, T, 2P)``: ``[forward; backward]`` per layer, zeros past each row."""
        B, T = mask.shape
        lengths = mask.long().sum(-1)
        order = torch.sort(lengths, descending=True, stable=True).indices
        restore = torch.empty_like(order)
        restore[order] = torch.arange(B, device=order.device)
        valid = int((lengths > 0).sum())
        out = inputs.new_zeros(self.num_layers, B, T, 2 * self.hidden_size)
        if valid:
            rows = order[:valid]
            state = self._initial_states(B, rows)
            seq, final = self._layers(inputs[rows], lengths[rows].tolist(), state)
            out[:, rows] = seq
            self._update_states(final, rows, B)
        return out

    def _layers(self, x: torch.Tensor, lengths: list[int], state: tuple[torch.Tensor, torch.Tensor] | None):
        """Both stacks over sorted rows; returns ``(L, n, T, 2P)`` and the final ``(h, c)``."""
        P, D = self.hidden_size, self.cell_size
        fwd = bwd = x
        outs, hs, cs = [], [], []
        for i, (f_layer, b_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            f_state = b_state = None
            if state is not None:
                h, c = state[0][i:i + 1], state[1][i:i + 1]
                f_state, b_state = (h[..., :P], c[..., :D]), (h[..., P:], c[..., D:])
            f_out, (f_h, f_c) = f_layer(fwd, lengths, f_state)
            b_out, (b_h, b_c) = b_layer(bwd, lengths, b_state)
            if i > 0:
                f_out, b_out = f_out + fwd, b_out + bwd
            fwd, bwd = f_out, b_out
            outs.append(torch.cat([f_out, b_out], -1))
            hs.append(torch.cat([f_h, b_h], -1))
            cs.append(torch.cat([f_c, b_c], -1))
        return torch.stack(outs), (torch.cat(hs), torch.cat(cs))

    def _initial_states(self, B: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._states is None:
            return None
        grown = []
        for s in self._states:
            if s.shape[1] < B:
                s = torch.cat([s, s.new_zeros(s.shape[0], B - s.shape[1], s.shape[2])], 1)
            grown.append(s[:, :B][:, rows])
        return grown[0], grown[1]

    def _update_states(self, final: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor, B: int) -> None:
        new = []
        for s in final:
            full = s.new_zeros(s.shape[0], B, s.shape[2])
            full[:, rows] = s
            new.append(full.detach())
        if self._states is None:
            self._states = (new[0], new[1])
            return
        used = torch.zeros(B, dtype=torch.bool, device=new[0].device)
        used[rows] = True
        kept = []
        for old, s in zip(self._states, new):
            width = max(old.shape[1], B)
            merged = old.new_zeros(old.shape[0], width, old.shape[2])
            merged[:, :old.shape[1]] = old
            merged[:, :B] = torch.where(used.view(1, -1, 1), s, merged[:, :B])
            kept.append(merged)
        self._states = (kept[0], kept[1])
