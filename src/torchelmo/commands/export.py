"""``elmo export``: the biLM as ONNX or TorchScript (:func:`torchelmo.integrations.onnx.export`)."""

from __future__ import annotations

from ..integrations.onnx import FORMATS, MAX_OPSET, MIN_OPSET, OPSET, export, format_for
from ..runtime import add_device_args, apply_device_args
from ..signals import Interrupts, mark_done


def add_subcommand(sub) -> None:
    p = sub.add_parser("export", help="export the biLM to ONNX or TorchScript for serving",
                       description="Write the biLM (char ids (B, T, 50) in; layers (L, B, T, 2P) and "
                                   "mask (B, T) out; dynamic batch and length) as ONNX or TorchScript. "
                                   "An ELMoForManyLangs model takes its own lexicons' ids (docs/export.md).")
    p.add_argument("model", help="model directory, published name, Hub id, or 'default'")
    p.add_argument("out", help="output file (.onnx, .pt or .ts unless --format is given)")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from OUT's suffix)")
    p.add_argument("--opset", type=int, default=OPSET,
                   help=f"ONNX opset version, {MIN_OPSET} to {MAX_OPSET} (default {OPSET})")
    p.add_argument("--no-verify", action="store_true",
                   help="skip running the written file against the eager model")
    add_device_args(p)   # where the eager model runs for the check; the file itself is device-free
    p.set_defaults(func=run)


def run(args) -> int:
    fmt = format_for(args.out, args.format)
    device = apply_device_args(args)
    with Interrupts():   # SIGTERM unwinds like Ctrl-C: the temporary file goes, OUT stays as it was
        diff = export(args.model, args.out, fmt, verify=not args.no_verify, opset=args.opset, device=device)
        mark_done()
    if args.no_verify:
        note = "not verified"
    elif diff is None:
        note = "not verified (install onnxruntime: pip install 'torchelmo[export]')"
    else:
        note = f"matches the eager model (max |diff| {diff:.1e})"
    print(f"wrote {args.out} ({fmt}); {note}")
    return 0
