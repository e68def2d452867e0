#!/usr/bin/env bash
# The full probing run (issue 5) on a trained model: POS, WSD and NER, each on the model and on
# the random-weights control. Writes RESULTS/probe/{results.json,report.md,*.png} (the numbers and
# figures of docs/probing.md) and the run's log, RESULTS/probe.log.
#
# usage: scripts/probe_all.sh MODEL_DIR [DATA_DIR] [CORPUS_FILE ...]
#   MODEL_DIR    the biLM to probe (native or published layout)
#   DATA_DIR     folder in the layout of ../shared/data (default ../shared/data)
#   CORPUS_FILE  the text the biLM was trained on, one sentence per line, for the static-embedding
#                NER baseline (default: PTB train + WikiText-2 valid under DATA_DIR)
# env: RESULTS (default results: the committed report, which this script replaces),
#      ELMO_PROBE_CACHE (feature cache, read by `elmo probe`; default ~/.cache/elmo/probe),
#      THREADS (default 1: the probes are small ops; raise it on an idle machine),
#      PROBE_ARGS (extra options for `elmo probe all`, e.g. "--limit 200 --limit-semcor 500
#      --ner-limit 200" for a smoke test; give it another RESULTS)
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
OUT=$RESULTS/probe
LOG=$RESULTS/probe.log
mkdir -p "$OUT"
rm -f "$OUT/results.json" "$OUT/LABEL" "$OUT/TOKENS"   # a fresh run: results of an earlier model must not mix in
start=$(date +%s)
"$PY" -m torchelmo.cli probe all --model "$MODEL" --data "$DATA" --out "$OUT" \
    --threads "${THREADS:-1}" --corpus "${CORPUS[@]}" ${PROBE_ARGS:-} | tee "$LOG"
echo "probe_all: done in $(( $(date +%s) - start )) s: $OUT/results.json, $OUT/report.md, $OUT/*.png" \
  | tee -a "$LOG"
