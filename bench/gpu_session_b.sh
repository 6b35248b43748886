#!/usr/bin/env bash
# GPU machine, part B: cold start side by side (reflex, llama-simple, llama-cpp-python; page cache
# warm and dropped) and warm `reflex bench` on the benchmark files. Waits for the peers' build.
#   usage: bash bench/gpu_session_b.sh OUT MODELS
set -uo pipefail
OUT=$1; MODELS=$2
REPO=$(cd "$(dirname "$0")/.." && pwd)
for i in $(seq 1 120); do [ -x /tmp/peers/llama.cpp/build/bin/llama-simple ] && [ -d /tmp/peers/site/llama_cpp ] && break; sleep 2; done
tail -3 /tmp/peers.log > "$OUT/peers.log" 2>&1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/peers/site
cd /tmp
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf; M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf; M30=$MODELS/qwen3-30b-a3b-shaped-q4_k_m.gguf
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" --llama-simple $LS --runs 5 --both-caches --out "$OUT/cs1" > "$OUT/coldstart.log" 2>&1
python3 "$REPO/bench/coldstart.py" --models "$M06" --runs 5 --system1 --out "$OUT/cs2" > "$OUT/coldstart-system1.log" 2>&1
python3 "$REPO/bench/coldstart.py" --models "$M30" --llama-simple $LS --runs 3 --both-caches --out "$OUT/cs3" > "$OUT/coldstart-30b.log" 2>&1
{ for m in $M06 $M8 $M30; do timeout 90 reflex bench $m -r 10 --decode 32; done; } > "$OUT/warm.log" 2>&1
