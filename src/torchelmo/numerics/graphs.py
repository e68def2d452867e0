"""CUDA graphs of the fused LSTM layer at inference: a whole layer replays as one launch.

The fused recurrence (:mod:`torchelmo.numerics.fused`) launches two small kernels per time step. Launched
one by one from Python, each costs host time that can exceed its GPU time, and the GPU idles in
between. A CUDA graph records a layer's launches (the input matmul and every step) once per
shape and replays them with one call.

Shapes are bucketed: rows up to a multiple of :data:`ROWS`, steps up to a multiple of
:data:`STEPS`. Padded rows get length 0 and every padded step lies past every length, so the
kernels' masking keeps them out of the results. Graphs hold their inputs and outputs as static
buffers, share one memory pool per device, and hold references to the weights they read (a moved
or replaced weight makes a new graph); at most :data:`MAX_GRAPHS` are kept, the least recently
used dropped first.

The ``triton+graphs`` backend (:mod:`torchelmo.numerics.backend`; off by default until a GPU run measures
it). Used only where autograd and autocast are off and the layer runs on CUDA.
"""

from __future__ import annotations

import collections

import torch

from .backend import fused_fits
from .fused import device_lengths, fused_state_dtype, lstm_layer_fused

ROWS, STEPS, MAX_GRAPHS = 16, 8, 32
_graphs: collections.OrderedDict = collections.OrderedDict()
_pools: dict = {}


def replayable(x: torch.Tensor) -> bool:
    """Whether a fused layer on input ``x`` can replay through a graph: on CUDA, with autograd
    and autocast off."""
    return x.is_cuda and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cuda")


def _round_up(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


class LayerGraph:
    """One layer's fused inference for one bucketed shape ``(2, B, T, in)``, recorded."""

    def __init__(self, layer, shape, dtype, device, cell_clip, proj_clip, precision) -> None:
        _, B, _, _ = shape
        D, P = layer.lstm_dim, layer.projection_dim
        self.x = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(B, dtype=torch.int32, device=device)
        self.c0 = torch.zeros(2, B, D, dtype=fused_state_dtype(layer), device=device)
        self.h0 = torch.zeros(2, B, P, dtype=fused_state_dtype(layer), device=device)
        # References keep the weights' memory from being reused while the graph reads it.
        self.weights = tuple(p.detach() for p in (layer.w_x, layer.w_h, layer.bias, layer.w_p))
        args = (layer, self.x, self.lengths, self.c0, self.h0, cell_clip, proj_clip, layer.w_h, precision)
        # A first run outside the capture compiles the kernels and sets up cuBLAS.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            lstm_layer_fused(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        if device not in _pools:
            _pools[device] = torch.cuda.graph_pool_handle()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=_pools[device]):
            self.out, self.c, self.h = lstm_layer_fused(*args)

    def __call__(self, x, lengths, c0, h0):
        _, B, T, _ = x.shape
        self.x[:, :B, :T].copy_(x)
        self.lengths[:B].copy_(device_lengths(lengths, self.lengths.device))
        self.lengths[B:].zero_()
        self.c0[:, :B].copy_(c0)
        self.h0[:, :B].copy_(h0)
        self.graph.replay()
        # Copies: the static outputs are overwritten by the next replay.
        return self.out[:, :B, :T].clone(), self.c[:, :B].clone(), self.h[:, :B].clone()


def run_layer(layer, x, lengths, c0, h0, cell_clip, proj_clip, precision):
    """:func:`torchelmo.numerics.fused.lstm_layer_fused` at inference through a cached graph (the eager
    path where the bucketed shape exceeds the kernels' 32-bit offsets)."""
    _, B, T, In = x.shape
    Bb, Tb = _round_up(B, ROWS), _round_up(T, STEPS)
    if not fused_fits(Tb, Bb, layer.lstm_dim):
        return lstm_layer_fused(layer, x, lengths, c0, h0, cell_clip, proj_clip, layer.w_h, precision)
    weights = (layer.w_x, layer.w_h, layer.bias, layer.w_p)
    key = (x.device, x.dtype, Bb, Tb, In, cell_clip, proj_clip, precision,
           *((p.data_ptr(), p.dtype) for p in weights))
    graph = _graphs.pop(key, None)
    if graph is None:
        while len(_graphs) >= MAX_GRAPHS:
            _graphs.popitem(last=False)
        graph = LayerGraph(layer, (2, Bb, Tb, In), x.dtype, x.device, cell_clip, proj_clip, precision)
    _graphs[key] = graph
    return graph(x, lengths, c0, h0)


def clear() -> None:
    """Drop every recorded graph (their memory returns to the pool)."""
    _graphs.clear()
