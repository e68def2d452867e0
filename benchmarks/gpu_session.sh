#!/usr/bin/env bash
# Every GPU check in one call, shortest first, each stage under its own time limit:
#   the CUDA tests of the fused path, benchmarks/gpu.py, each precision's error on real sentences.
# Run from the repository root, with the CUDA build of PyTorch and Triton installed, the source
# on PYTHONPATH, UD EWT train and dev in bench-data/ and the test fixtures in
# bench-data/shared/fixtures/ (or ../shared beside the checkout):
#   OUT=/tmp/gpu bash benchmarks/gpu_session.sh
# Logs and JSON go to $OUT (default results/).
set -uo pipefail
OUT=${OUT:-results}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d ../shared ] || export ELMO_SHARED=$PWD/bench-data/shared
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_fused.py tests/test_encoder.py \
    tests/test_compat.py tests/test_mix.py \
    2>&1 | tee "$OUT/tests.log" | tail -25
timeout 420 python3 benchmarks/gpu.py --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
DEV=bench-data/en_ewt-ud-dev.conllu
[ -f "$DEV" ] || DEV=../shared/data/pos/ud-english-ewt/en_ewt-ud-dev.conllu
timeout 120 python3 benchmarks/precision.py --device cuda --data "$DEV" --out "$OUT/precision_cuda.json" \
    2>&1 | tee "$OUT/precision.log" | tail -12
