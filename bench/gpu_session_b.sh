#!/usr/bin/env bash
# GPU machine, part B (same machine, right after part A): the 8B cold-start comparison (page
# cache warm and dropped), first runs on a file without its index, and warm `reflex bench`.
#   usage: bash bench/gpu_session_b.sh OUT MODELS [CLEAN_VENV]
set -uo pipefail
OUT=$1; MODELS=$2; CV=${3:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=${PYTHONPATH:-}:/tmp/peers/site
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
cd /tmp
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf; M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
reflex generate "$M8" "The capital of France is" -n 1 > /dev/null 2>&1  # writes the file's index
EXTRA=(); [ -n "$CV" ] && EXTRA=(--extra "reflex clean venv=env -u PYTHONPATH $CV/bin/reflex generate {model} {prompt} -n 1 --backend cuda")
python3 "$REPO/bench/coldstart.py" --models "$M8" --llama-simple $LS --runs ${RUNS:-5} --both-caches \
  --out "$OUT/cs8" "${EXTRA[@]}" > "$OUT/coldstart-8b.log" 2>&1
tail -8 "$OUT/coldstart-8b.log"
# a file seen for the first time: no index yet (a fresh cache folder per run)
FIRST="sh -c 'XDG_CACHE_HOME=\$(mktemp -d) exec reflex generate \"\$0\" \"\$1\" -n 1 --backend cuda' {model} {prompt}"
python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" --runs 5 --only-extra --extra "reflex first run=$FIRST" \
  --out "$OUT/csfirst" > "$OUT/coldstart-first.log" 2>&1
tail -4 "$OUT/coldstart-first.log"
{ for m in $M06 $M8; do timeout 90 reflex bench $m -r 10 --decode 32; done; } > "$OUT/warm.log" 2>&1
grep -E "BENCH_OK" "$OUT/warm.log"
for i in 1 2 3; do reflex generate "$M06" "The capital of France is" -n 1 --timings 2>&1 | tail -22; done > "$OUT/timings-0.6b.txt"
for i in 1 2; do reflex generate "$M8" "The capital of France is" -n 1 --timings 2>&1 | tail -22; done > "$OUT/timings-8b.txt"
