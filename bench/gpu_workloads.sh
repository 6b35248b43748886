#!/usr/bin/env bash
# GPU machine, two calls on one warm machine (the second within the first's idle window): issue
# 17's four workloads next to llama-simple built with FlashAttention, on this tree's wheels or a
# variant of the core wheel.
#   bash bench/gpu_workloads.sh OUT a -- llama-simple's build (FA on, ONLY=simple) starts in the
#        background; the wheels go in (.whl-new -> /tmp/new; with VAR=v, .whl-var/v's core wheel ->
#        /tmp/var-v, plugins from /tmp/new); the 0.6B, 8B and 30B-A3B files are written; the GPU
#        tests run (TESTS: pytest paths, default tests/gpu, not the slow ones; on the variant
#        when VAR is set, with XH_TESTS also on this tree); then the warm 1518-token prefill
#        (bench/warm_long.py, its 3 repetitions' median; ROUNDS rounds alternating, default 1) with
#        REFLEX_XH=0, this tree and the variant.
#   bash bench/gpu_workloads.sh OUT b -- [USE=v: the variant's core] the 30B file's warm prefill;
#        llama-simple's prompt-eval time of the 1518-token prompt on the three files;
#        W1-W4 (bench/coldstart.py --workloads) on the three files, reflex and llama-simple, 3
#        runs each, alternating.
# Needs .whl-new, .peer, .models (and .whl-var/VAR) carried. OUT gets workloads-PHASE.log.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_workloads.sh OUT a|b}; PHASE=${2:?phase a or b}
REPO=$(cd "$(dirname "$0")/.." && pwd); MODELS=/tmp/reflex-models; W=/tmp/workloads
mkdir -p "$OUT" "$MODELS" "$W"; LOG=$OUT/workloads-$PHASE.log
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
export PATH=/tmp/new/bin:$PATH REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
M30=$MODELS/qwen3-30b-a3b-shaped-q4_k_m.gguf
LONGP=$(cd "$REPO/bench" && python3 -c "from coldstart import LONG_PROMPT; print(LONG_PROMPT)")
cd /tmp  # never the source tree: its reflex_core has no kernels for this GPU
warm_long() {  # MODEL LABEL [env...]: the warm 1518-token prefill, one line
  local m=$1 label=$2; shift 2
  env "$@" timeout 150 python3 "$REPO/bench/warm_long.py" "$m" "$label" 2>&1 | tail -1 | tee -a "$LOG"
}

if [ "$PHASE" = a ]; then
  [ -x $LS ] || FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers \
    > /tmp/peers.log 2>&1 < /dev/null &
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
  MAIN="PYTHONPATH=/tmp/new"; CAND=$MAIN
  if [ -n "${VAR:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/var-$VAR \
      "$REPO"/.whl-var/$VAR/reflex_infer-*.whl || exit 1
    CAND="PYTHONPATH=/tmp/var-$VAR:/tmp/new"
  fi
  setsid nohup python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b,30b > "$W/make_models.log" 2>&1 < /dev/null &
  MM=$!
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
  T=""; for t in ${TESTS:-tests/gpu}; do T="$T $REPO/$t"; done
  say "tests [${CAND}]: ${TESTS:-tests/gpu}"
  env $CAND timeout 200 python3 -m pytest $T -q -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests.log" | tee -a "$LOG"
  if [ -n "${VAR:-}" ] && [ -n "${XH_TESTS:-}" ]; then
    say "tests [$MAIN]: $XH_TESTS"
    T=""; for t in $XH_TESTS; do T="$T $REPO/$t"; done
    env $MAIN timeout 60 python3 -m pytest $T -q -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests-main.log" 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests-main.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests-main.log" | tee -a "$LOG"
  fi
  while kill -0 $MM 2> /dev/null && [ ! -s "$M8" ]; do sleep 2; done
  say "warm 1518-token prefill: REFLEX_XH=0, this tree, the variant"
  for r in $(seq ${ROUNDS:-1}); do
    for m in "$M06" "$M8"; do
      warm_long "$m" "$(basename $m) XH=0 round $r" $MAIN REFLEX_XH=0
      warm_long "$m" "$(basename $m) tree round $r" $MAIN
      [ -n "${VAR:-}" ] && warm_long "$m" "$(basename $m) variant $VAR round $r" $CAND
    done
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = b ]; then
  export PYTHONPATH=/tmp/new
  [ -n "${USE:-}" ] && export PYTHONPATH=/tmp/var-$USE:/tmp/new
  say "this phase's reflex_core: $PYTHONPATH"
  while pgrep -f "make_models.py" > /dev/null && [ $SECONDS -lt 120 ]; do sleep 2; done
  tail -3 "$W/make_models.log" | tee -a "$LOG"
  warm_long "$M30" "$(basename $M30) this build"
  say "waiting for llama-simple"
  while [ ! -x $LS ] && pgrep -f "build.sh" > /dev/null && [ $SECONDS -lt 300 ]; do sleep 3; done
  tail -1 /tmp/peers.log | tee -a "$LOG"
  [ -x $LS ] || { say "no llama-simple"; exit 1; }
  for m in "$M06" "$M8" "$M30"; do
    echo "llama-simple $(basename $m), 1518-token prompt: $(timeout 60 $LS -m "$m" -n 1 "$LONGP" 2>&1 \
      | grep -E "prompt eval time" | tr -s ' ')" | tee -a "$LOG"
  done
  say "W1-W4, 0.6B, 8B and 30B-A3B"
  timeout 330 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8,$M30" --llama-simple $LS --runs 3 \
    --workloads W1,W2,W3,W4 --out "$W/work" > "$OUT/workloads.log" 2>&1
  grep -E "^\|" "$OUT/workloads.log" | tee -a "$LOG"
  say "done"
  exit 0
fi
echo "unknown phase $PHASE" >&2
exit 2
