#!/usr/bin/env bash
# GPU machine, one call on a fresh machine, no peers: the tiled matmul of this tree (.whl-new)
# against a core-wheel variant (.whl-var/$V): the GPU tests (not slow), the tiled kernel's TFLOP/s lines of
# the speed report, and the warm 1518-token prefill of the 0.6B, 8B (and, time allowing, 30B-A3B)
# shaped files (and DECODE tokens decoded after it, default 2), variants alternating.
# usage: V=d [DECODE=64] bash bench/gpu_tiled_ab.sh OUT
set -uo pipefail
OUT=${1:?usage: V=variant bash bench/gpu_tiled_ab.sh OUT}; V=${V:?set V, a folder of .whl-var}
REPO=$(cd "$(dirname "$0")/.." && pwd); MODELS=/tmp/reflex-models; mkdir -p "$OUT" "$MODELS"
LOG=$OUT/tiled-ab.log
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/var-$V "$REPO"/.whl-var/$V/*.whl || exit 1
export PATH=/tmp/new/bin:$PATH PYTHONPATH=/tmp/new REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
cd /tmp
python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b,30b > /tmp/make_models.log 2>&1 &
G=$REPO/tests/gpu
say "this tree: tests/gpu (not slow)"
timeout 150 python3 -m pytest "$G" -q -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20 | tee -a "$LOG"; tail -1 "$OUT/gpu-tests.log" | tee -a "$LOG"
for v in $V c; do
  say "variant $v: the tiled kernel's lines"
  PYTHONPATH=$([ $v = c ] && echo /tmp/new || echo /tmp/var-$v:/tmp/new) timeout 60 python3 -m pytest \
    "$G/test_quant_kernels.py::test_large_matrices_and_bandwidth_report" -q -s -p no:cacheprovider 2>&1 \
    | grep -E "TFLOP/s|failed" | grep -E "^(Q8_0|Q4_K|Q6_K|IQ4_XS|F32)|failed" | tee -a "$LOG"
done
wait
prefill() {  # model variant round
  PYTHONPATH=$([ $2 = c ] && echo /tmp/new || echo /tmp/var-$2:/tmp/new) timeout 90 \
    python3 "$REPO/bench/warm_long.py" "$1" "$(basename $1) variant $2 round $3" --decode ${DECODE:-2} 2>&1 \
    | tail -1 | tee -a "$LOG"
}
say "warm 1518-token prefill, variants alternating"
for r in 1 2; do
  for m in qwen3-0.6b-shaped-q8_0 qwen3-8b-shaped-q4_k_m qwen3-30b-a3b-shaped-q4_k_m; do
    [ $SECONDS -gt 330 ] && break 2
    for v in $V c; do prefill "$MODELS/$m.gguf" $v $r; done
  done
done
say "done"
