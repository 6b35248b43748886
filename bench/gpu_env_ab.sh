#!/usr/bin/env bash
# GPU machine, one call on a fresh machine: an A/B of two settings of one environment switch in
# this tree's wheels, next to llama-simple (FA on, built here in the background):
#   1. tests/gpu (not slow), or the pytest paths in TESTS ("none": no tests);
#   2. per setting, each kernel's cost per decode token: Nsight Compute times every kernel of a run
#      that decodes 1 + N tokens and of one that decodes 1, bench/ncu_by_kernel.py takes the
#      second from the first and divides by N (Reflex eager: the kernels its graphs replay);
#   3. with LLAMA_NCU=1, llama-simple's kernels per decode token the same way (its graph nodes
#      one by one): where a token's time goes in each engine;
#   4. warm decode, reflex bench (graphs) per setting alternating, and llama-simple's, 3 rounds.
#   usage: A="REFLEX_GEMV_XQ=0" B="REFLEX_GEMV_XQ=1" bash bench/gpu_env_ab.sh OUT [WHICH]
#   (A=X=1 B=X=1, any variable: no A/B, one setting twice)
#   WHICH: bench/make_models.py names, default 8b-iq4_xs. Needs .whl-new, .peer, .models carried.
#   NCU_STEP=0 leaves out step 2 (NCU_TOP=N: its N costliest kernels, NCU_BY_GRID=1: each
#   grid size apart), PEERS=0 llama-simple (its build and steps 3-4's llama runs), DECODE=0
#   step 4;
#   LONG=1 adds 5. the warm 1518-token prefill and the decode after it (bench/warm_long.py) per
#   setting alternating, 2 rounds, and (LONG_NCU=1) each kernel's share of one 1518-token
#   prefill per setting (ncu); KDETAIL=REGEX: Nsight Compute's sections (speed of light, pipes,
#   warp states, instructions) for one launch of the kernels matching REGEX in setting B's prefill.
set -uo pipefail
OUT=${1:?usage: A=VAR=x B=VAR=y bash bench/gpu_env_ab.sh OUT [WHICH]}; WHICH=${2:-8b-iq4_xs}
A=${A:?A=VAR=value}; B=${B:?B=VAR=value}
REPO=$(cd "$(dirname "$0")/.." && pwd); MODELS=/tmp/reflex-models; W=/tmp/envab
mkdir -p "$OUT" "$MODELS" "$W"; LOG=$OUT/env-ab.log
LS=/tmp/peers/llama.cpp/build/bin/llama-simple; N=4; PROMPT="The capital of France is"
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
[ -x $LS ] || [ "${PEERS:-1}" = 0 ] || FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers \
  > /tmp/peers.log 2>&1 < /dev/null &
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
export PATH=/tmp/new/bin:$PATH PYTHONPATH=/tmp/new REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
cd /tmp  # never the source tree: its reflex_core has no kernels for this GPU
python3 "$REPO/bench/make_models.py" "$MODELS" --which "$WHICH" > "$W/make_models.log" 2>&1 &
MM=$!
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
if [ "${TESTS:-}" != none ]; then
  say "tests: ${TESTS:-tests/gpu}"
  T=""; for t in ${TESTS:-tests/gpu}; do T="$T $REPO/$t"; done
  timeout 200 python3 -m pytest $T -v -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  grep -E " (FAILED|ERROR)( |$)" "$OUT/gpu-tests.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests.log" | tee -a "$LOG"
fi
wait $MM; tail -2 "$W/make_models.log" >> "$LOG"
models=$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench'); import make_models as m; \
print(' '.join(m.MODELS[w][0] for w in '$WHICH'.split(',')))")
NCU="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
bench() {  # SETTING FILE: reflex bench's decode median under env SETTING
  env $1 timeout 120 reflex bench "$MODELS/$2" -r 5 --decode 32 --json 2> "$W/bench.err" | python3 -c "import json,sys; \
d=json.load(sys.stdin); print('reflex bench $2 [$1]: decode ms/token median %.3f, prefill %.2f ms, system1 %.2f ms' \
% (d['decode_ms_per_token']['median'], d['prefill_ms']['median'], d['system1_ms']['median']))" 2>&1 | tee -a "$LOG"
}
for f in $models; do
  reflex generate "$MODELS/$f" "$PROMPT" -n 1 > /dev/null 2>&1 || say "reflex failed on $f"
  for s in "$A" "$B"; do
    [ "${NCU_STEP:-1}" = 0 ] && continue
    say "per decode token (ncu, eager) [$s]: $f"
    for n in 1 $((N + 1)); do
      env $s REFLEX_CUDA_GRAPHS=0 timeout 200 $NCU reflex generate "$MODELS/$f" "$PROMPT" -n $n --backend cuda \
        > "$W/rx-$n.csv" 2> "$W/rx.err" || tail -3 "$W/rx.err" | tee -a "$LOG"
    done
    python3 "$REPO/bench/ncu_by_kernel.py" "$W/rx-$((N + 1)).csv" ${NCU_TOP:-10} --minus "$W/rx-1.csv" --per $N \
      ${NCU_BY_GRID:+--by-grid} | tee -a "$LOG"
  done
done
say "waiting for llama-simple"
while [ ! -x $LS ] && pgrep -f "build.sh" > /dev/null && [ $SECONDS -lt 400 ]; do sleep 3; done
tail -1 /tmp/peers.log | tee -a "$LOG"
if [ "${LLAMA_NCU:-0}" = 1 ] && [ -x $LS ]; then
  for f in $models; do
    say "llama-simple, per decode token (ncu): $f"
    for n in 1 $((N + 1)); do
      timeout 150 $NCU $LS -m "$MODELS/$f" -n $n "$PROMPT" > "$W/ll-$n.csv" 2> "$W/ll.err" \
        || tail -3 "$W/ll.err" | tee -a "$LOG"
    done
    python3 "$REPO/bench/ncu_by_kernel.py" "$W/ll-$((N + 1)).csv" 14 --minus "$W/ll-1.csv" --per $N | tee -a "$LOG"
  done
fi
[ "${DECODE:-1}" = 1 ] && say "warm decode, settings and llama-simple alternating"
for r in 1 2 3; do
  [ "${DECODE:-1}" = 1 ] || break
  for f in $models; do
    bench "$A" $f; bench "$B" $f
    [ -x $LS ] && echo "llama-simple $f: $(timeout 60 $LS -m "$MODELS/$f" -n 33 "$PROMPT" 2>&1 \
      | grep -E " eval time" | grep -v prompt | tr -s ' ')" | tee -a "$LOG"
  done
done
if [ "${LONG:-0}" = 1 ]; then
  LONGP=$(cd "$REPO/bench" && python3 -c "from coldstart import LONG_PROMPT; print(LONG_PROMPT)")
  for f in $models; do
    for s in "$A" "$B"; do
      [ "${LONG_NCU:-0}" = 1 ] || continue
      say "one 1518-token prefill (ncu, every kernel) [$s]: $f"
      env $s timeout 200 $NCU reflex generate "$MODELS/$f" "$LONGP" -n 1 --backend cuda > "$W/long.csv" 2> "$W/long.err" \
        || tail -3 "$W/long.err" | tee -a "$LOG"
      python3 "$REPO/bench/ncu_by_kernel.py" "$W/long.csv" 12 | tee -a "$LOG"
    done
    if [ -n "${KDETAIL:-}" ]; then
      say "ncu sections, one launch matching $KDETAIL [$B]: $f"
      env $B timeout 200 ncu --clock-control none --kernel-name "regex:$KDETAIL" --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
        reflex generate "$MODELS/$f" "$LONGP" -n 1 --backend cuda > "$OUT/kdetail-$f.txt" 2>&1
      grep -E "reflex_|Duration|Throughput|Pipe|Issue|Stall|Eligible|Occupancy|Registers|Executed Ipc|Warp Cycles|smsp__pcsamp" \
        "$OUT/kdetail-$f.txt" | head -60 | tee -a "$LOG"
    fi
  done
  say "warm 1518-token prefill, settings alternating"
  for r in 1 2; do
    for f in $models; do
      for s in "$A" "$B"; do
        env $s timeout 150 python3 "$REPO/bench/warm_long.py" "$MODELS/$f" "$f [$s] round $r" 2>&1 | tail -1 | tee -a "$LOG"
      done
    done
  done
fi
say "done"
