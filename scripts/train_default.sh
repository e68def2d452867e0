#!/usr/bin/env bash
# The embedded default model: a small biLM on cased, openly licensed text from ../shared/data
# (MASC, UD EWT train, WikiText-2 valid, WNUT-17 train; validation UD EWT dev; no test split).
# Resumable: run it again after any interruption.
#
#   scripts/train_default.sh        # THREADS=2, MAX_STEPS=... as needed
#
# Writes runs/default_corpus/ (the prepared corpus, not committed), runs/default/ (checkpoint,
# metrics, best/, model/, published/) and results/default_model.json (validation perplexity).
# Shipping it (src/torchelmo/default_model/: config.json + model.safetensors <= 30 MB + MODEL_CARD.md)
# is a separate, reviewed step; see docs/training.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORPUS=${CORPUS:-runs/default_corpus}
RUN=${RUN:-runs/default}
RESULTS=${RESULTS:-results}
THREADS=${THREADS:-1}
MAX_STEPS=${MAX_STEPS:-2400}   # ~1,250 tokens a step: ~3 epochs of the 970k-token corpus (80 min on one core)
mkdir -p "$RUN" "$RESULTS"
[ -f "$CORPUS/valid.txt" ] || $PY scripts/prepare_default_corpus.py "$CORPUS"
[ -f "$RUN/vocab.txt" ] || $PY -m torchelmo.cli vocab "$CORPUS/train/*.txt" -o "$RUN/vocab.txt" --min-count 3
# Sentence batches: the library runs the biLM statelessly (each sentence from the zero state,
# wrapped in <S> </S>), so the default model is trained exactly that way.
$PY -m torchelmo.cli train --resume --out "$RUN" \
    --train "$CORPUS/train/*.txt" --valid "$CORPUS/valid.txt" --vocab "$RUN/vocab.txt" \
    --model cpu --softmax full --batching sentence --batch-tokens 1280 \
    --optimizer adam --lr 2e-3 --lr-schedule cosine --warmup-steps 100 --dropout 0.3 --clip-norm 10 \
    --max-steps "$MAX_STEPS" --eval-every 400 --checkpoint-every 200 --log-every 100 \
    --threads "$THREADS" --no-progress 2>&1 | tee -a "$RUN/train.log"
$PY -m torchelmo.cli perplexity "$RUN/best" "$CORPUS/valid.txt" --threads "$THREADS" \
    --json "$RESULTS/default_model.json"
