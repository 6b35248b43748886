#!/usr/bin/env bash
# GPU machine, part A: peers build in the background (setsid: survives this command), GPU tests,
# `reflex check` on the Qwen3-0.6B- and Qwen3-30B-A3B-shaped files, benchmark files written.
#   usage: bash bench/gpu_session_a.sh OUT MODELS [PEERDIR]
# Expects the reflex wheels installed and on PATH/PYTHONPATH; PEERDIR made by
# ../shared/tools/peers/prepare.sh (its build lands in /tmp/peers; log /tmp/peers.log).
set -uo pipefail
OUT=$1; MODELS=$2; PEER=${3:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" "$MODELS"
if [ -n "$PEER" ] && [ ! -x /tmp/peers/llama.cpp/build/bin/llama-simple ]; then
  setsid nohup bash "$PEER/build.sh" "$PEER" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
fi
cd /tmp
python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b,30b > "$OUT/make_models.log" 2>&1
MODELS=$MODELS OUT=$OUT GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-240} bash "$REPO/scripts/gpu-tests.sh" > "$OUT/gpu-script.log" 2>&1
timeout 200 reflex check "$MODELS/qwen3-30b-a3b-shaped-q4_k_m.gguf" --steps 2 > "$OUT/check-30b.log" 2>&1
echo "check-30b rc=$?" >> "$OUT/check-30b.log"
