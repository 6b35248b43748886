#!/usr/bin/env bash
# GPU machine, one call on a fresh machine: where a warm decode token's time goes, Reflex next to
# llama-simple (FA on, built here in the background) on the same files. Nsight Compute times every
# kernel of a run that decodes 1 + N tokens and of one that decodes 1; bench/ncu_by_kernel.py
# takes the second from the first and divides by N: each kernel's cost per decode token.
# Reflex runs eager (REFLEX_CUDA_GRAPHS=0: the same kernels its graphs replay); llama.cpp's graph
# nodes are profiled one by one. Then both engines' warm decode as they run (graphs).
#   usage: bash bench/gpu_decode_gap.sh OUT [WHICH]   WHICH: bench/make_models.py names,
#   default 8b-iq4_xs; TESTS: pytest paths run first (default tests/gpu/test_core_kernels.py).
# Needs .whl-new, .peer and .models/vocab carried.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_decode_gap.sh OUT [WHICH]}; WHICH=${2:-8b-iq4_xs}
REPO=$(cd "$(dirname "$0")/.." && pwd); MODELS=/tmp/reflex-models; W=/tmp/gap
mkdir -p "$OUT" "$MODELS" "$W"; LOG=$OUT/gap.log
LS=/tmp/peers/llama.cpp/build/bin/llama-simple; N=4; PROMPT="The capital of France is"
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
[ -x $LS ] || FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers \
  > /tmp/peers.log 2>&1 < /dev/null &
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
export PATH=/tmp/new/bin:$PATH PYTHONPATH=/tmp/new REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
cd /tmp
python3 "$REPO/bench/make_models.py" "$MODELS" --which "$WHICH" > "$W/make_models.log" 2>&1 &
MM=$!
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
if [ "${TESTS:-}" != none ]; then
  say "tests: ${TESTS:-tests/gpu/test_core_kernels.py}"
  (timeout 120 python3 -m pytest $(for t in ${TESTS:-tests/gpu/test_core_kernels.py}; do echo "$REPO/$t"; done) -q -p no:cacheprovider \
    -m "not slow" > "$OUT/gpu-tests.log" 2>&1)
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests.log" | tee -a "$LOG"
fi
wait $MM; tail -3 "$W/make_models.log" >> "$LOG"
NCU="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
by_kernel() {  # TAG: per-token table from $W/TAG-1.csv and $W/TAG-n.csv
  python3 "$REPO/bench/ncu_by_kernel.py" "$W/$1-n.csv" 16 --minus "$W/$1-1.csv" --per $N | tee -a "$LOG"
}
models=$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench'); import make_models as m; \
print(' '.join(m.MODELS[w][0] for w in '$WHICH'.split(',')))")
for f in $models; do
  m=$MODELS/$f
  reflex generate "$m" "$PROMPT" -n 1 > /dev/null 2>&1 || say "reflex failed on $f"
  say "reflex, per decode token (ncu, eager): $f"
  for n in 1 $((N + 1)); do
    REFLEX_CUDA_GRAPHS=0 timeout 200 $NCU reflex generate "$m" "$PROMPT" -n $n --backend cuda \
      > "$W/rx-$f-$([ $n = 1 ] && echo 1 || echo n).csv" 2> "$W/rx.err" || tail -3 "$W/rx.err" | tee -a "$LOG"
  done
  by_kernel "rx-$f"
done
say "waiting for llama-simple"
while [ ! -x $LS ] && pgrep -f "build.sh" > /dev/null && [ $SECONDS -lt 420 ]; do sleep 3; done
tail -1 /tmp/peers.log | tee -a "$LOG"
[ -x $LS ] || { say "no llama-simple"; exit 1; }
for f in $models; do
  m=$MODELS/$f
  say "llama-simple, per decode token (ncu): $f"
  for n in 1 $((N + 1)); do
    timeout 150 $NCU $LS -m "$m" -n $n "$PROMPT" > "$W/ll-$f-$([ $n = 1 ] && echo 1 || echo n).csv" 2> "$W/ll.err" \
      || tail -3 "$W/ll.err" | tee -a "$LOG"
  done
  by_kernel "ll-$f"
  say "warm decode as they run: reflex bench (graphs), llama-simple's eval time"
  timeout 120 reflex bench "$m" -r 5 --decode 32 --json 2> /dev/null | python3 -c "import json,sys; \
d=json.load(sys.stdin); print('reflex bench $f decode ms/token median %.3f' % d['decode_ms_per_token']['median'])" \
    | tee -a "$LOG"
  for i in 1 2 3; do
    echo "llama-simple $f: $(timeout 60 $LS -m "$m" -n 33 "$PROMPT" 2>&1 | grep -E " eval time" | tr -s ' ')" | tee -a "$LOG"
  done
done
say "done"
