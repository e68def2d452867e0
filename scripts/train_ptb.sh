#!/usr/bin/env bash
# PTB (Mikolov) biLM of < 6M parameters (softmax included), to forward test perplexity <= 92.3
# (Kim et al. 2016, LSTM-Char-Small). Resumable: run it again after any interruption.
#
#   scripts/train_ptb.sh            # THREADS=2 to use both cores, MAX_STEPS=... to change the budget
#
# Writes runs/ptb/ (checkpoint, checkpoints/, metrics.jsonl, train.log, best/, model/, published/)
# and results/ptb.json (+ results/ptb_sentence.json: the same model scored sentence by sentence).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PTB=${PTB:-../shared/data/lm/ptb}
RUN=${RUN:-runs/ptb}
RESULTS=${RESULTS:-results}
THREADS=${THREADS:-1}
MAX_STEPS=${MAX_STEPS:-40000}   # 32 x 20 tokens a step: ~28 epochs of PTB train; the lr follows a cosine to 0 at MAX_STEPS
LR=${LR:-2e-3}
WARMUP=${WARMUP:-200}
SEED=${SEED:-0}
KEEP=${KEEP:-12}                # keep the last KEEP checkpoints for scripts/average_ptb.sh
CKPT_EVERY=${CKPT_EVERY:-500}
OPTIMIZER=${OPTIMIZER:-adam}    # sgd + SCHEDULE=constant + LR_DECAY=0.5: Kim et al.'s recipe
SCHEDULE=${SCHEDULE:-cosine}
LR_DECAY=${LR_DECAY:-1}         # lr factor after a validation (every EVAL_EVERY steps) without improvement
EVAL_EVERY=${EVAL_EVERY:-1000}
CLIP=${CLIP:-10}
WEIGHT_DROP=${WEIGHT_DROP:-0}   # DropConnect on the recurrent matrices (AWD-LSTM)
REG=()
[ "${VARIATIONAL:-0}" = 1 ] && REG=(--variational-dropout)   # one dropout mask per window
# INIT_FROM=runs/ptb/best continues a finished run with a fresh cosine cycle (a warm restart);
# the model, softmax included, is loaded and the optimizer starts anew.
INIT=()
[ -n "${INIT_FROM:-}" ] && INIT=(--init-from "$INIT_FROM")
mkdir -p "$RUN" "$RESULTS"
[ -f "$RUN/vocab.txt" ] || $PY -m elmo.cli vocab "$PTB/ptb.train.txt" -o "$RUN/vocab.txt"
# <unk> is an ordinary token (its characters are the input, its own vocab entry the target), as in
# Kim et al.; every PTB test word is in the train vocabulary, so <UNK> is never a target.
$PY -m elmo.cli train --resume --out "$RUN" \
    --train "$PTB/ptb.train.txt" --valid "$PTB/ptb.valid.txt" --vocab "$RUN/vocab.txt" \
    --model cpu --softmax full --batching stream --batch-size 32 --unroll 20 --state-reset 0.1 \
    --optimizer "$OPTIMIZER" --lr "$LR" --lr-schedule "$SCHEDULE" --lr-decay "$LR_DECAY" --warmup-steps "$WARMUP" \
    --seed "$SEED" "${INIT[@]}" --dropout "${DROPOUT:-0.5}" --weight-drop "$WEIGHT_DROP" "${REG[@]}" --clip-norm "$CLIP" \
    --max-steps "$MAX_STEPS" --eval-every "$EVAL_EVERY" --eval-mode stream --eval-batch-size 20 \
    --checkpoint-every "$CKPT_EVERY" --keep-checkpoints "$KEEP" --patience 6 --log-every 100 --threads "$THREADS" --no-progress \
    2>&1 | tee -a "$RUN/train.log"
# Test perplexity as word-level LM papers count it: per token over the whole test set as one
# stream per row (state carried), every </S> (<eos>) prediction included: 82,430 tokens.
$PY -m elmo.cli perplexity "$RUN/best" "$PTB/ptb.test.txt" --mode stream --batch-size 20 \
    --threads "$THREADS" --json "$RUN/test_stream.json" > /dev/null
$PY -m elmo.cli perplexity "$RUN/best" "$PTB/ptb.test.txt" --mode sentence \
    --threads "$THREADS" --json "$RESULTS/ptb_sentence.json" > /dev/null
$PY - "$RUN" "$RESULTS" <<'PY'
import json, sys
run = sys.argv[1]
r = json.load(open(f"{run}/test_stream.json"))
t = json.load(open(f"{run}/best/training.json"))
out = {"params": r["params"], "test_ppl_forward": r["ppl_forward"], "test_ppl_backward": r["ppl_backward"],
       "test_ppl_mean": r["ppl_mean"], "test_tokens": r["tokens"], "eval": "stream, 20 rows, state carried",
       "model_dir": f"{run}/best", "best_step": t.get("train", {}).get("steps"),
       "valid": t.get("train", {}).get("valid")}
json.dump(out, open(f"{sys.argv[2]}/ptb.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
