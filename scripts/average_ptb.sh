#!/usr/bin/env bash
# Checkpoint averaging for a finished scripts/train_ptb.sh run: average the last K kept checkpoints
# for each K in KS, pick K by *validation* perplexity, then score that model on the test set.
#
#   RUN=runs/ptb scripts/average_ptb.sh     # needs RUN/checkpoints/ (train_ptb.sh KEEP=N)
#
# Writes RUN/avg<K>/ (LM dirs), RUN/average.json (every K's validation perplexity) and
# RESULTS/ptb.json + RESULTS/ptb_sentence.json for the chosen model (forward perplexity decides
# the choice, since the target is forward).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PTB=${PTB:-../shared/data/lm/ptb}
RUN=${RUN:-runs/ptb}
SNAPS=${SNAPS:-$RUN/checkpoints}
RESULTS=${RESULTS:-results}
THREADS=${THREADS:-2}
KS=${KS:-"1 2 4 6 8 12"}
mapfile -t ALL < <(ls "$SNAPS"/*.pt | sort)
[ "${#ALL[@]}" -gt 0 ] || { echo "average_ptb.sh: no checkpoints in $SNAPS" >&2; exit 1; }
for K in $KS; do
    [ "$K" -le "${#ALL[@]}" ] || continue
    if [ ! -f "$RUN/avg$K/valid.json" ]; then
        $PY -m elmo.cli average "${ALL[@]: -$K}" -o "$RUN/avg$K"
        $PY -m elmo.cli perplexity "$RUN/avg$K" "$PTB/ptb.valid.txt" --mode stream --batch-size 20 \
            --threads "$THREADS" --json "$RUN/avg$K/valid.json" > /dev/null
    fi
done
BEST=$($PY - "$RUN" $KS <<'PY'
import json, os, sys
run, ks = sys.argv[1], sys.argv[2:]
rows = {k: json.load(open(f"{run}/avg{k}/valid.json")) for k in ks if os.path.isfile(f"{run}/avg{k}/valid.json")}
table = {k: {"valid_ppl_forward": r["ppl_forward"], "valid_ppl_backward": r["ppl_backward"]} for k, r in rows.items()}
best = min(rows, key=lambda k: rows[k]["ppl_forward"])
json.dump({"checkpoints_averaged": table, "chosen_k": int(best)}, open(f"{run}/average.json", "w"), indent=2)
for k, r in table.items():
    print(f"last {k:>2} checkpoints: valid ppl forward {r['valid_ppl_forward']:.2f} backward {r['valid_ppl_backward']:.2f}",
          file=sys.stderr)
print(best)
PY
)
MODEL="$RUN/avg$BEST"
echo "chosen: the mean of the last $BEST checkpoints ($MODEL)" >&2
$PY -m elmo.cli perplexity "$MODEL" "$PTB/ptb.test.txt" --mode stream --batch-size 20 \
    --threads "$THREADS" --json "$MODEL/test_stream.json" > /dev/null
$PY -m elmo.cli perplexity "$MODEL" "$PTB/ptb.test.txt" --mode sentence \
    --threads "$THREADS" --json "$RESULTS/ptb_sentence.json" > /dev/null
$PY - "$RUN" "$MODEL" "$BEST" "$RESULTS" "${ALL[@]: -$BEST}" <<'PY'
import json, sys
run, model, k, results, sources = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
r = json.load(open(f"{model}/test_stream.json"))
v = json.load(open(f"{model}/valid.json"))
out = {"params": r["params"], "test_ppl_forward": r["ppl_forward"], "test_ppl_backward": r["ppl_backward"],
       "test_ppl_mean": r["ppl_mean"], "test_tokens": r["tokens"], "eval": "stream, 20 rows, state carried",
       "model_dir": model, "model": f"element-wise mean of the last {k} checkpoints (elmo average)",
       "averaged": sources,
       "valid": {"valid_ppl_forward": v["ppl_forward"], "valid_ppl_backward": v["ppl_backward"],
                 "valid_ppl_mean": v["ppl_mean"], "valid_tokens": v["tokens"]},
       "selection": f"{run}/average.json (k chosen by validation forward perplexity)"}
json.dump(out, open(f"{results}/ptb.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
