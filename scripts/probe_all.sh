#!/usr/bin/env bash
# The full probing run (issue 5) on a trained model: POS, WSD and NER, each on the model and on
# the random-weights control. Writes results/probe.json, results/probe/report.md, results/probe.log
# and the figures of docs/probing.md (docs/probing/*.png).
#
# usage: scripts/probe_all.sh MODEL_DIR [DATA_DIR] [CORPUS_FILE ...]
#   MODEL_DIR    the biLM to probe (native or published layout)
#   DATA_DIR     folder in the layout of ../shared/data (default ../shared/data)
#   CORPUS_FILE  the text the biLM was trained on, one sentence per line, for the static-embedding
#                NER baseline (default: PTB train + WikiText-2 valid under DATA_DIR)
# env: ELMO_PROBE_CACHE (feature cache, default ~/.cache/elmo/probe), THREADS (default 1: the probes are small ops; raise it on an idle machine),
#      RESULTS (default results), FIGURES (default docs/probing), PROBE_ARGS (extra options for
#      `elmo probe all`, e.g. "--limit 200 --limit-semcor 500 --ner-limit 200" for a smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: scripts/probe_all.sh MODEL_DIR [DATA_DIR] [CORPUS_FILE ...]}
DATA=${2:-../shared/data}
shift $(( $# >= 2 ? 2 : 1 ))
CORPUS=("$@")
if [ ${#CORPUS[@]} -eq 0 ]; then
  CORPUS=("$DATA/lm/ptb/ptb.train.txt" "$DATA/lm/wikitext-2-valid-test/wiki.valid.tokens")
  echo "probe_all: no corpus given; static embeddings from ${CORPUS[*]}" >&2
fi
PY=${PYTHON:-.venv/bin/python}
RESULTS=${RESULTS:-results}
FIGURES=${FIGURES:-docs/probing}
OUT=$RESULTS/probe
CACHE=${ELMO_PROBE_CACHE:-$HOME/.cache/elmo/probe}
mkdir -p "$OUT" "$FIGURES"
rm -f "$OUT/results.json"   # a fresh run: results of an earlier model must not mix in
start=$(date +%s)
"$PY" -m elmo.cli probe all --model "$MODEL" --data "$DATA" --out "$OUT" --cache "$CACHE" \
    --threads "${THREADS:-1}" --corpus "${CORPUS[@]}" ${PROBE_ARGS:-} | tee "$RESULTS/probe.log"
cp "$OUT/results.json" "$RESULTS/probe.json"
cp "$OUT"/*.png "$FIGURES/"
echo "probe_all: done in $(( $(date +%s) - start )) s: $RESULTS/probe.json, $OUT/report.md, $FIGURES/*.png" \
  | tee -a "$RESULTS/probe.log"
