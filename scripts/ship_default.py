"""Ship a trained model as the package's embedded default: the biLM only (no softmax), float32.

    .venv/bin/python scripts/ship_default.py runs/default/best results/default_model.json

Writes src/torchelmo/default_model/{config.json, model.safetensors, MODEL_CARD.md}, and checks that
the shipped copy gives exactly the trained model's outputs and stays under the 30 MB budget.
"""

import json
import sys
from pathlib import Path

import torch

from torchelmo import BiLM

LIMIT = 30 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "torchelmo" / "default_model"


def main(model_dir: str, ppl_json: str) -> None:
    model = BiLM.from_pretrained(model_dir)
    model.save_pretrained(OUT)
    size = sum(p.stat().st_size for p in OUT.iterdir() if p.name != "MODEL_CARD.md")
    assert size <= LIMIT, f"shipped model is {size / 2**20:.1f} MiB, over the 30 MiB budget"
    shipped = BiLM.from_pretrained("default")
    probe = [["The", "shipped", "model", "matches", "."], ["Ein", "Test", "😀"]]
    with torch.no_grad():
        for a, b in zip(model.embed_sentences(probe).layers, shipped.embed_sentences(probe).layers):
            assert torch.equal(a, b)
    ppl = json.loads(Path(ppl_json).read_text())
    train = json.loads((Path(model_dir) / "training.json").read_text())
    sources = (ROOT / "runs" / "default_corpus" / "SOURCES.md")
    n_params = sum(p.numel() for p in model.parameters())
    card = CARD.format(
        params=f"{n_params:,}", size=f"{size / 2**20:.1f}", cfg=json.dumps(model.config.to_options()),
        sources=sources.read_text() if sources.exists() else "(see scripts/prepare_default_corpus.py)",
        ppl=json.dumps(ppl, indent=2), train=json.dumps(train.get("train", train), indent=2)[:3000])
    (OUT / "MODEL_CARD.md").write_text(card)
    print(f"shipped {n_params:,} parameters, {size / 2**20:.1f} MiB, to {OUT}")


CARD = """# The embedded default model

A small ELMo biLM trained by this project, shipped inside the package so that `elmo embed` and
`BiLM.from_pretrained("default")` work offline on a fresh machine. It is far smaller and trained
on far less text than the published models: use a published model (`elmo info --list`) when
quality matters; use this one for trying the library, tests and pipelines.

- Parameters: {params} (biLM only; the training softmax is not shipped), {size} MiB, float32.
- Shapes (published options schema): `{cfg}`

## Training data (cased, openly licensed; no test split used)

{sources}

## How it was trained

```
MAX_STEPS=2400 THREADS=1 scripts/train_default.sh
.venv/bin/python scripts/ship_default.py runs/default/best results/default_model.json
```

Sentence batches from the zero state (the way the library runs the biLM), Adam lr 2e-3 with
100 warm-up steps and a cosine decay to 0, dropout 0.3, global-norm clipping 10, full softmax over the vocabulary; see
`scripts/train_default.sh` and `docs/training.md`.

Training record (from the run's `training.json`):

```json
{train}
```

## Perplexity on the validation set (UD EWT dev, per token, both directions)

```json
{ppl}
```

## Licences

The weights are derived from the corpora above: MASC (permissive), UD English EWT (CC BY-SA 4.0),
WikiText-2 (CC BY-SA 3.0), WNUT-17 (CC BY 4.0). Share-alike terms of CC BY-SA apply to
redistribution of the model.
"""

if __name__ == "__main__":
    main(*sys.argv[1:3])
