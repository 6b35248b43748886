#!/usr/bin/env bash
# GPU test pass on an NVIDIA machine, against the INSTALLED reflex packages:
#   reflex smoke; pytest tests/gpu (every kernel vs its NumPy twin, whole models GPU vs CPU,
#   reflex check on a Qwen3-0.6B-shaped file). Logs go to ${OUT:-./gpu-logs}.
#   MODELS=dir  where the synthetic benchmark GGUFs are written/reused (default /tmp/reflex-models)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"
MODELS=${MODELS:-/tmp/reflex-models}; mkdir -p "$MODELS"
PY=${PY:-python3}
cd /tmp  # never import reflex_core from the source tree
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$OUT/gpu.txt"
reflex smoke | tee -a "$OUT/gpu.txt"
"$PY" "$REPO/bench/make_models.py" "$MODELS" --which 0.6b > "$OUT/make_models.log" 2>&1
REFLEX_BENCH_MODELS=$MODELS timeout "${GPU_TEST_TIMEOUT:-1500}" "$PY" -m pytest "$REPO/tests/gpu" \
  -q -rs -p no:cacheprovider --durations=15 2>&1 | tee "$OUT/gpu-tests.log"
reflex check "$MODELS/qwen3-0.6b-shaped-q8_0.gguf" 2>&1 | tee "$OUT/check-0.6b.log"
