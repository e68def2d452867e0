"""``elmo info [MODEL]``: what a model is (shapes, parameter counts) and what precision this
machine runs fast; ``--list``: the names ``from_pretrained`` takes (``default``, the published
models and their aliases)."""

from __future__ import annotations

import json
from pathlib import Path

from ..model import folders
from ..model.bilm import BiLM
from ..model.registry import ALIASES, REGISTRY
from ..numerics.backend import support_line as backend_line
from ..numerics.precision import support_line

# The embedded default model, from its model card (default_model/MODEL_CARD.md: the training
# shards) and results/default_model.json (validation perplexity); tests check both.
DEFAULT_MODEL_FACTS = {
    "training_tokens": 916_810,
    "corpus": "MASC, UD English EWT, WikiText-2 and WNUT-17",
    "valid_ppl": 178.8,
    "valid_set": "UD English EWT dev",
}


def default_model_line(parameters: int) -> str:
    """One line saying what the default model is and what to use instead for real work."""
    f = DEFAULT_MODEL_FACTS
    return (f"default: a small biLM shipped in the package ({parameters / 1e6:.1f}M parameters), "
            f"trained on {f['training_tokens'] / 1e6:.2f}M tokens ({f['corpus']}), validation "
            f"perplexity {f['valid_ppl']} ({f['valid_set']}). Fine for trying the library; for real "
            "work use a published model (elmo info --list)")


def list_models() -> list[str]:
    """The lines of ``elmo info --list``."""
    lines = [default_model_line(_parameters(BiLM.from_pretrained("default")))]
    alias_of = {name: alias for alias, name in ALIASES.items()}
    for name, entry in REGISTRY.items():
        alias = f" (alias: {alias_of[name]})" if name in alias_of else ""
        lines += [f"{name}{alias}: published", f"  options: {entry['options']}",
                  f"  weights: {entry['weights']}"]
    return lines


def _parameters(model: BiLM) -> int:
    return sum(p.numel() for p in model.parameters())


def add_subcommand(sub) -> None:
    p = sub.add_parser("info", help="describe a model (or list the models by name)")
    p.add_argument("model", nargs="?", default="default",
                   help="model directory, published name or alias, or 'default' (the embedded model)")
    p.add_argument("--list", action="store_true",
                   help="list the model names: default, the published models, their aliases and URLs")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list:
        print("\n".join(list_models()))
        return 0
    model = BiLM.from_pretrained(args.model)
    n = _parameters(model)
    if str(args.model) == "default":
        print(default_model_line(n))
    where = Path(args.model)
    layout = {"layout": folders.describe(where)} if str(args.model) != "default" and where.is_dir() else {}
    print(json.dumps({"model": str(args.model), **layout, "parameters": n, "output_dim": model.output_dim,
                      "layers": model.num_layers, "options": model.config.to_options(),
                      "machine": support_line(), "backend": backend_line()}, indent=2))
    return 0
