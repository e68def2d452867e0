"""Launch shapes of the fused recurrence's kernels (:mod:`torchelmo.numerics.fused`): how many rows and
columns each program takes, its reduction step and warps, for a batch on a GPU with a given
number of multiprocessors. Pure arithmetic, so the benchmarks can plan launches for any GPU."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class Tiles(NamedTuple):
    """One kernel's launch shape: rows and columns per program, reduction step, warps."""
    bm: int
    bn: int
    bk: int
    warps: int

    def grid(self, B: int, N: int) -> tuple[int, int, int]:
        return (-(-B // self.bm), -(-N // self.bn), 2)


# Program sizes (rows x columns) above which the sm_80 or sm_90 compile spills registers to local
# memory: a gate-kernel program holds four fp32 accumulators, and exact fp32 keeps its operands
# in registers too. The same report (benchmarks/kernels.py) shows which gate programs need eight
# warps: 64-row ones, and from 2048 elements (1024 in exact fp32). Reduction steps of 32 keep every program's shared memory under the
# 99 KiB consumer Ampere and Ada GPUs allow.
_CAPS = {"fp32": (1024, 2048), "tf32": (2048, 4096), "bf16": (2048, 4096)}   # gates, projection
_EIGHT_WARPS = {"fp32": 1024, "tf32": 2048, "bf16": 2048}
_BK = 32


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def _tiles(B: int, N: int, sms: int, cap: int) -> tuple[int, int]:
    """The largest tile (at most 64 x 64 and ``cap`` elements; at least 16 x 16 for tl.dot)
    that still gives the GPU's ``sms`` multiprocessors a program each: a time step is too short
    for a few big programs to hide their latency. Halving the larger side first keeps the
    operands' re-reads (rows x N/bn + weights x B/bm) least."""
    bm, bn = min(64, _pow2(B)), min(64, _pow2(N))

    def halve(bm, bn):
        return (bm, bn // 2) if bn >= bm and bn > 16 else (bm // 2, bn)

    while bm * bn > cap:
        bm, bn = halve(bm, bn)
    while 2 * -(-B // bm) * -(-N // bn) < sms and (bm > 16 or bn > 16):
        bm, bn = halve(bm, bn)
    return bm, bn


def launch_tiles(B: int, D: int, P: int, sms: int, precision: str) -> tuple[Tiles, Tiles]:
    """Tiles of the gate kernels (columns are units, ``D``) and of the projection and recurrent
    gradient kernels (columns are ``P``), for ``B`` rows on a GPU with ``sms`` multiprocessors."""
    gate_cap, proj_cap = _CAPS[precision]
    bm, bd = _tiles(B, D, sms, gate_cap)
    pm, pn = _tiles(B, P, sms, proj_cap)
    return Tiles(bm, bd, _BK, 8 if bm == 64 or bm * bd >= _EIGHT_WARPS[precision] else 4), Tiles(pm, pn, _BK, 4)


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":   # the interpreter: any count; this one is an H100's
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
