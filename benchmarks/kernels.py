"""The fused kernels compiled for real GPU targets, on any machine: the compiler's resource report.

Triton compiles ahead of time for a named target without a GPU, with the ``ptxas`` and
``cuobjdump`` its wheel ships. For every launch shape :func:`torchelmo.numerics.fused_tiles.launch_tiles` picks
(the published model shapes at several batch sizes) and every precision, this prints and records
registers per thread, local-memory (spill) bytes, shared memory, and the matrix instructions in
the machine code: ``HGMMA`` (Hopper's warpgroup tensor-core MMA), ``HMMA`` (tensor-core MMA), or
only ``FFMA`` (plain fp32 fused multiply-adds, as the exact fp32 mode must be).

    python benchmarks/kernels.py --out results/kernels.json
    python benchmarks/kernels.py --cc 80 --rows 16 256 --check

With ``--check`` it exits 1 when any kernel spills, needs more shared memory than consumer
Ampere/Ada GPUs give a program (99 KiB), or uses the wrong kind of arithmetic for its precision.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)   # compile for the GPU, not the CPU interpreter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from torchelmo.numerics import fused, fused_tiles

SHAPES = {"small": (1024, 128), "original": (4096, 512)}     # LSTM units, projection
SMS = {80: 108, 86: 84, 89: 128, 90: 132}                     # A100, RTX 3090, RTX 4090, H100/H200
SHARED_LIMIT = 99 * 1024
INTS = {"t", "T", "B", "D", "P", "g_dir", "g_t", "c_prev_dir", "c_prev_b"}   # and the s_* strides
FLOATS = {"cell_clip", "proj_clip"}
PRECISIONS = {"fp32": 0, "tf32": 1, "bf16": 2}
MATRIX_OPS = ("HGMMA", "HMMA", "FFMA")


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def tools_present() -> bool:
    return all(os.access(_tool(n), os.X_OK) for n in ("ptxas", "cuobjdump"))


def _signature(fn, constexprs: dict) -> dict:
    return {a: "constexpr" if a in constexprs else "i32" if a in INTS or a.startswith("s_") else "fp32" if a in FLOATS
            else "*i32" if a == "lengths" else "*fp32" for a in fn.arg_names}


def compile_report(fn, constexprs: dict, warps: int, cc: int) -> dict:
    """Compile one kernel for compute capability ``cc``; its resources and matrix instructions."""
    src = ASTSource(fn=fn, signature=_signature(fn, constexprs), constexprs=constexprs)
    # FMA contraction as torchelmo.numerics.fused launches them.
    options = {"num_warps": warps, "enable_fp_fusion": True}
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    ops = collections.Counter(re.findall(r"\b(" + "|".join(MATRIX_OPS) + r")\b", sass))
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "spill_bytes": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "shared_bytes": kernel.metadata.shared,
            **{op: ops.get(op, 0) for op in MATRIX_OPS}}


def launches(cc: int, rows: list[int]) -> dict:
    """Every distinct (kernel, constants, warps) the library launches for the given batch sizes,
    with the shapes that use it."""
    found: dict = {}
    for shape, (D, P) in SHAPES.items():
        for B in rows:
            for prec_name, prec in PRECISIONS.items():
                gates, proj = fused_tiles.launch_tiles(B, D, P, SMS[cc], prec_name)
                variants = [(fused._gates_bwd, gates, dict(CLIP_C=True, CLIP_P=True, CLIP_PREV=True)),
                            (fused._rec_bwd, proj, {})]
                for save in (False, True):
                    variants += [(fused._gates_fwd, gates, dict(CLIP=True, SAVE=save)),
                                 (fused._proj_fwd, proj, dict(CLIP=True, SAVE=save))]
                for fn, tiles, flags in variants:
                    cols = "BD" if "BD" in fn.arg_names else "BN"
                    consts = dict(PREC=prec, EMULATE_BF16=False, **flags, BM=tiles.bm, BK=tiles.bk,
                                  **{cols: tiles.bn})
                    key = (cc, fn.__name__, tuple(sorted(consts.items())), tiles.warps)
                    entry = found.setdefault(key, dict(
                        cc=cc, kernel=fn.__name__.lstrip("_"), precision=prec_name, warps=tiles.warps,
                        tiles=[tiles.bm, tiles.bn], save=flags.get("SAVE"), consts=consts, used_by=[]))
                    entry["used_by"].append(f"{shape} B={B}")
    return found


def _compiled(entry: dict) -> dict:
    fn = getattr(fused, "_" + entry["kernel"])
    row = {k: v for k, v in entry.items() if k != "consts"}
    row.update(compile_report(fn, entry["consts"], entry["warps"], entry["cc"]))
    row["problems"] = problems(row)
    return row


def problems(row: dict) -> list[str]:
    out = []
    if row["spill_bytes"]:
        out.append(f"spills {row['spill_bytes']} bytes to local memory")
    if row["shared_bytes"] > SHARED_LIMIT:
        out.append(f"needs {row['shared_bytes']} bytes of shared memory (> {SHARED_LIMIT})")
    tensor_ops = row["HGMMA"] + row["HMMA"]
    if row["precision"] == "fp32" and tensor_ops:
        out.append("exact fp32 uses tensor-core instructions")
    if row["precision"] != "fp32" and not tensor_ops:
        out.append(f"{row['precision']} has no tensor-core instructions")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", type=int, nargs="+", default=[90], choices=sorted(SMS),
                    help="compute capabilities to compile for (90: H100/H200, 80: A100)")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256, 1024],
                    help="batch sizes (rows) whose launch tiles to compile")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="compiler processes")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 on spills, shared memory over "
                    "99 KiB, or the wrong arithmetic for a precision")
    args = ap.parse_args(argv)
    if not tools_present():
        print(f"error: Triton's ptxas/cuobjdump not found under {_tool('')}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    entries = [e for cc in args.cc for e in launches(cc, args.rows).values()]
    # Compilation is CPU-bound and independent per kernel; processes (not forks of a process
    # that has imported torch) share it out.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        rows = list(pool.map(_compiled, entries))
    for row in rows:
        print(f"sm_{row['cc']} {row['kernel']:<10} {row['precision']:<4} {row['tiles'][0]:>2}x{row['tiles'][1]:<2} "
              f"w{row['warps']} save={'-' if row['save'] is None else str(row['save']):<5} "
              f"regs {row['registers']:>3} spill {row['spill_bytes']:>4} smem {row['shared_bytes']:>6} "
              + " ".join(f"{op} {row[op]}" for op in MATRIX_OPS)
              + (f"  PROBLEM: {'; '.join(row['problems'])}" if row["problems"] else ""))
    bad = [r for r in rows if r["problems"]]
    print(f"{len(rows)} kernels compiled in {time.perf_counter() - started:.0f} s with Triton "
          f"{triton.__version__}; {len(bad)} with problems")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "command": "python benchmarks/kernels.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]), "kernels": rows}, f, indent=1)
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
