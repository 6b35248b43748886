#!/usr/bin/env bash
# GPU machine, part A of the side-by-side: start the peers' build (background, setsid), write
# the benchmark files, run the GPU tests and `reflex check`, then -- once the peers are built --
# the 0.6B cold-start comparison (page cache warm and dropped) and system1.
#   usage: bash bench/gpu_session_a.sh OUT MODELS PEERDIR [CLEAN_VENV]
# Expects reflex installed (compiled) and on PATH/PYTHONPATH; PEERDIR made by
# ../shared/tools/peers/prepare.sh (the build lands in /tmp/peers, log /tmp/peers.log).
set -uo pipefail
OUT=$1; MODELS=$2; PEER=$3; CV=${4:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" "$MODELS"
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
if [ ! -x $LS ]; then
  setsid nohup bash "$PEER/build.sh" "$PEER" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
fi
cd /tmp
python3 "$REPO/bench/make_models.py" "$MODELS" --which ${WHICH:-0.6b,8b} > "$OUT/make_models.log" 2>&1
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf
REFLEX_BENCH_MODELS=$MODELS timeout 300 python3 -m pytest "$REPO/tests/gpu" -q -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
tail -2 "$OUT/gpu-tests.log"
timeout 120 reflex check "$M06" > "$OUT/check-0.6b.log" 2>&1; tail -1 "$OUT/check-0.6b.log"
for i in $(seq 1 200); do [ -x $LS ] && [ -d /tmp/peers/site/llama_cpp ] && break; sleep 2; done
tail -3 /tmp/peers.log > "$OUT/peers.log" 2>&1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/peers/site
EXTRA=(); [ -n "$CV" ] && EXTRA=(--extra "reflex clean venv=env -u PYTHONPATH $CV/bin/reflex generate {model} {prompt} -n 1 --backend cuda")
reflex generate "$M06" "The capital of France is" -n 1 > /dev/null 2>&1  # writes the file's index
python3 "$REPO/bench/coldstart.py" --models "$M06" --llama-simple $LS --runs ${RUNS:-7} --both-caches \
  --out "$OUT/cs06" "${EXTRA[@]}" > "$OUT/coldstart-0.6b.log" 2>&1
EXTRA=(); [ -n "$CV" ] && EXTRA=(--extra "reflex clean venv system1=env -u PYTHONPATH $CV/bin/reflex system1 {model} {prompt} --candidate ' Paris' --candidate ' London' --candidate ' Berlin'")
python3 "$REPO/bench/coldstart.py" --models "$M06" --runs ${RUNS:-7} --system1 --out "$OUT/cs06s1" "${EXTRA[@]}" > "$OUT/coldstart-system1.log" 2>&1
tail -8 "$OUT/coldstart-0.6b.log"; tail -3 "$OUT/coldstart-system1.log"
