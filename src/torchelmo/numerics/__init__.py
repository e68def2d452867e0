"""How the model computes: the LSTM recurrence and its numerics.

* :mod:`.precision` (fp32, tf32, bf16, auto; what the CPU offers), :mod:`.backend` (which
  implementation runs the recurrence), :mod:`.compute` (both, carried by a model);
* :mod:`.cell` (the LSTM cell's step, forward and backward, defined once), :mod:`.lstm` (the
  recurrence: eager paths and the dispatch), :mod:`.bptt` (training's
  backpropagation through time, written out), :mod:`.epilogue` (a step's gates as one compiled
  loop), :mod:`.compiled` (``torch.compile``'s machinery), :mod:`.operands` (bf16 matmul operands
  on the CPU);
* :mod:`.fused`, :mod:`.fused_tiles`, :mod:`.graphs`: the Triton kernels and CUDA graphs.
"""
