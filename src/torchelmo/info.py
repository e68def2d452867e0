"""``elmo info MODEL``: what a model is (shapes, parameter counts) and the published registry."""

from __future__ import annotations

import json

from .bilm import BiLM
from .weights import REGISTRY


def add_subcommand(sub) -> None:
    p = sub.add_parser("info", help="describe a model (or list the published models)")
    p.add_argument("model", nargs="?", default="default",
                   help="model directory, published name, or 'default' (the embedded model)")
    p.add_argument("--list", action="store_true", help="list the published models and their URLs")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list:
        for name, entry in REGISTRY.items():
            print(f"{name}\n  {entry['options']}\n  {entry['weights']}")
        return 0
    model = BiLM.from_pretrained(args.model)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": str(args.model), "parameters": n, "output_dim": model.output_dim,
                      "layers": model.num_layers, "options": model.config.to_options()}, indent=2))
    return 0
