#!/usr/bin/env bash
# GPU machine, one call: the contract-v2 check (issue 11). Installs two sets of wheels side by
# side -- .whl-base (the commit before the change) and .whl-new (this tree, plus gguf for the
# tests) -- runs the GPU tests and `reflex check` with the new one, then times launch -> exit of
# both on the same files, alternating run by run (bench/coldstart.py --only-extra).
#   usage: bash bench/gpu_session_contract.sh OUT [RUNS]
set -uo pipefail
OUT=${1:?usage: gpu_session_contract.sh OUT [RUNS]}; RUNS=${2:-7}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODELS=/tmp/reflex-models; mkdir -p "$OUT" "$MODELS"
for v in base new; do
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/$v "$REPO"/.whl-$v/*.whl || exit 1
done
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
( PYTHONPATH=/tmp/new python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b \
    > "$OUT/make_models.log" 2>&1 ) &
MM=$!
cd /tmp  # never import reflex_core from the source tree
PYTHONPATH=/tmp/new /tmp/new/bin/reflex smoke | tee -a "$OUT/gpu.txt"
PYTHONPATH=/tmp/new REFLEX_BENCH_MODELS=$MODELS timeout 400 python3 -m pytest "$REPO/tests/gpu" \
  -q -p no:cacheprovider -rs --durations=8 > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"
wait $MM; tail -2 "$OUT/make_models.log"
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf; M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
PYTHONPATH=/tmp/new timeout 120 /tmp/new/bin/reflex check "$M06" > "$OUT/check-0.6b.log" 2>&1
tail -1 "$OUT/check-0.6b.log"
cmd() {  # the reflex of one install, with its own cache folder (each writes its own index)
  echo "env XDG_CACHE_HOME=/tmp/cache-$1 PYTHONPATH=/tmp/$1 /tmp/$1/bin/reflex $2"
}
for m in "$M06" "$M8"; do  # first runs: page cache, each version's index
  for v in base new; do for i in 1 2; do
    eval "$(cmd $v "generate $m 'The capital of France is' -n 1 --backend cuda")" > /dev/null 2>&1
  done; done
done
sleep 2
GEN="generate {model} {prompt} -n 1 --backend cuda"
PYTHONPATH=/tmp/new python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" --runs "$RUNS" --only-extra \
  --extra "before=$(cmd base "$GEN")" --extra "after=$(cmd new "$GEN")" \
  --out "$OUT/cold" > "$OUT/coldstart.log" 2>&1
tail -12 "$OUT/coldstart.log"
S1="system1 {model} {prompt} --backend cuda --candidate ' Paris' --candidate ' London' --candidate ' Berlin'"
PYTHONPATH=/tmp/new python3 "$REPO/bench/coldstart.py" --models "$M06" --runs "$RUNS" --only-extra \
  --extra "before system1=$(cmd base "$S1")" --extra "after system1=$(cmd new "$S1")" \
  --out "$OUT/cold-s1" > "$OUT/coldstart-system1.log" 2>&1
tail -6 "$OUT/coldstart-system1.log"
for m in "$M06" "$M8"; do for v in base new; do for i in 1 2; do
  echo "== $v $(basename "$m")"; eval "$(cmd $v "generate $m 'The capital of France is' -n 1 --backend cuda --timings")"
done; done; done > "$OUT/timings.txt" 2>&1
