#!/usr/bin/env bash
# GPU machine, one call on a fresh machine: issue 17's four workloads next to llama-simple built
# with FlashAttention, on this tree's wheels.
#   1. llama-simple's build (FA on, ONLY=simple) starts in the background; the wheels go in; the
#      0.6B, 8B and 30B-A3B files are written (background);
#   2. the GPU tests while it builds (TESTS: pytest paths in order, default tests/gpu; not the slow
#      ones; at most TEST_S seconds, default 170; -v, so a run the limit cuts still names its failures);
#   3. the warm 1518-token prefill of the 0.6B and 8B files with REFLEX_PAIRS=0 and 1
#      (bench/warm_long.py, the median of its 3 repetitions; PREFILL_AB=0 leaves it out);
#   4. W1-W4 (bench/coldstart.py --workloads) on the three files, reflex and llama-simple, 3 runs
#      each, alternating;
#   5. llama-simple's prompt-eval time of the 1518-token prompt and the 30B file's warm prefill;
#   6. warm decode of each file: reflex bench (graphs, two rounds, while llama-simple builds)
#      and, after the workloads, llama-simple's eval time over 32 tokens.
# usage: bash bench/gpu_workloads.sh OUT   (carry .whl-new, .peer, .models); OUT gets
# workloads.log (every summary), gpu-tests.log and coldstart's table.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_workloads.sh OUT}
REPO=$(cd "$(dirname "$0")/.." && pwd); MODELS=/tmp/reflex-models; W=/tmp/workloads
mkdir -p "$OUT" "$MODELS" "$W"; LOG=$OUT/workloads.log
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
[ -x $LS ] || FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers \
  > /tmp/peers.log 2>&1 < /dev/null &
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
export PATH=/tmp/new/bin:$PATH PYTHONPATH=/tmp/new REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
M30=$MODELS/qwen3-30b-a3b-shaped-q4_k_m.gguf
LONGP=$(cd "$REPO/bench" && python3 -c "from coldstart import LONG_PROMPT; print(LONG_PROMPT)")
cd /tmp  # never the source tree: its reflex_core has no kernels for this GPU
setsid nohup python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b,30b > "$W/make_models.log" 2>&1 < /dev/null &
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
warm_long() {  # MODEL LABEL [VAR=value]: the warm 1518-token prefill, one line
  env ${3:-REFLEX_PAIRS=1} timeout 150 python3 "$REPO/bench/warm_long.py" "$1" "$2" 2>&1 | tail -1 | tee -a "$LOG"
}

T=""; for t in ${TESTS:-tests/gpu}; do T="$T $REPO/$t"; done
say "tests: ${TESTS:-tests/gpu}"
timeout ${TEST_S:-170} python3 -m pytest $T -v -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests.log" 2>&1
say "tests exit $?"
grep -E " (FAILED|ERROR)( |$)" "$OUT/gpu-tests.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests.log" | tee -a "$LOG"

while pgrep -f "make_models.py" > /dev/null && [ ! -s "$M8" ]; do sleep 2; done
[ "${PREFILL_AB:-1}" = 1 ] && say "warm 1518-token prefill, REFLEX_PAIRS=0 and 1"
for m in "$M06" "$M8"; do
  [ "${PREFILL_AB:-1}" = 1 ] || break
  warm_long "$m" "$(basename $m) PAIRS=0" REFLEX_PAIRS=0
  warm_long "$m" "$(basename $m) PAIRS=1"
done

while pgrep -f "make_models.py" > /dev/null && [ $SECONDS -lt 360 ]; do sleep 2; done
say "warm decode (reflex bench, graphs; llama-simple's after the workloads), 2 rounds"
for r in 1 2; do
  for m in "$M06" "$M8" "$M30"; do
    timeout 120 reflex bench "$m" -r 5 --decode 32 --json 2> "$W/bench.err" | python3 -c "import json,sys; \
d=json.load(sys.stdin); print('reflex bench $(basename $m): decode ms/token median %.3f' \
% d['decode_ms_per_token']['median'])" 2>&1 | tee -a "$LOG"
  done
done
say "waiting for llama-simple and the 30B file"
while [ ! -x $LS ] && pgrep -f "build.sh" > /dev/null && [ $SECONDS -lt 360 ]; do sleep 3; done
while pgrep -f "make_models.py" > /dev/null && [ $SECONDS -lt 360 ]; do sleep 2; done
tail -1 /tmp/peers.log | tee -a "$LOG"; tail -1 "$W/make_models.log" | tee -a "$LOG"
[ -x $LS ] || { say "no llama-simple"; exit 1; }
say "W1-W4, 0.6B, 8B and 30B-A3B"
timeout 300 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8,$M30" --llama-simple $LS --runs 3 \
  --workloads W1,W2,W3,W4 --out "$W/work" > "$OUT/coldstart-workloads.log" 2>&1
grep -E "^\|" "$OUT/coldstart-workloads.log" | tee -a "$LOG"

for m in "$M06" "$M8" "$M30"; do
  echo "llama-simple $(basename $m), 1518-token prompt: $(timeout 60 $LS -m "$m" -n 1 "$LONGP" 2>&1 \
    | grep -E "prompt eval time" | tr -s ' ')" | tee -a "$LOG"
done
warm_long "$M30" "$(basename $M30) PAIRS=1"
[ "${PREFILL_AB:-1}" = 1 ] && warm_long "$M30" "$(basename $M30) PAIRS=0" REFLEX_PAIRS=0
for m in "$M06" "$M8" "$M30"; do
  echo "llama-simple $(basename $m), warm decode: $(timeout 60 $LS -m "$m" -n 33 "The capital of France is" 2>&1 \
    | grep -E " eval time" | grep -v prompt | tr -s ' ')" | tee -a "$LOG"
done
say "done"
