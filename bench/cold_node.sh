#!/usr/bin/env bash
# GPU machine, ONE call (issue 19 item 4): a cold node -- the page cache dropped before every
# launch, as on a fresh node reading the model from disk for the first time.
#   0. llama-simple's build (FA on, as users run it; ~250 s) starts in the background unless a
#      warm machine still has it, the files are written meanwhile; the build is waited for;
#   1. the disk alone, machine quiet: dd with and without iflag=direct, then
#      bench/readahead_probe.py (O_DIRECT on 1 and 16 threads, the prefetcher alone at 1/8/16
#      threads, its cost on a warm cache, the cold-path stand-in);
#   2. launch -> first token, page cache dropped before every run, engines alternating:
#      reflex, reflex with one readahead thread, llama-simple; 0.6B and 8B files; medians of RUNS;
#   3. `reflex generate --timings` with the page cache dropped (the readahead and upload notes:
#      upload method=registered shows the pinning took the 2 MiB folios).
#   usage: bash bench/cold_node.sh OUT      (RUNS=5 by default)
# About 7.5 minutes with the build, 3.5 without: give the call the 600 s limit.
# Needs .peer (../shared/tools/peers/prepare.sh) and .whl-new (wheels of this tree) carried with
# the call. Everything goes to OUT/cold_node.log; the summary tables to stdout.
set -uo pipefail
OUT=${1:?usage: cold_node.sh OUT}; RUNS=${RUNS:-5}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODELS=/tmp/reflex-models; mkdir -p "$OUT" "$MODELS"
LS=/tmp/peers/llama.cpp/build/bin/llama-simple
M06=$MODELS/qwen3-0.6b-shaped-q8_0.gguf; M8=$MODELS/qwen3-8b-shaped-q4_k_m.gguf
LOG=$OUT/cold_node.log
PROMPT="The capital of France is"
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

if [ ! -x $LS ]; then
  FA=ON ONLY=simple setsid nohup bash "$REPO/.peer/build.sh" "$REPO/.peer" /tmp/peers > /tmp/peers.log 2>&1 < /dev/null &
  BUILD=$!
fi
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/new "$REPO"/.whl-new/*.whl || exit 1
export PYTHONPATH=/tmp/new PATH=/tmp/new/bin:$PATH
cd /tmp  # never import reflex_core from the source tree
say "files"
python3 "$REPO/bench/make_models.py" "$MODELS" --which 0.6b,8b > "$OUT/make_models.log" 2>&1 \
  || { tail -5 "$OUT/make_models.log"; exit 1; }
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r; nproc
  free -g | head -2; findmnt -T "$MODELS"; lsblk -o NAME,SIZE,ROTA,MODEL,SCHED
  for q in /sys/block/*/queue; do
    case $q in */loop*|*/zram*) continue;; esac
    echo "$q read_ahead_kb=$(cat $q/read_ahead_kb) max_sectors_kb=$(cat $q/max_sectors_kb) nr_requests=$(cat $q/nr_requests)"
  done
  echo "THP enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" >> "$LOG"
say "0. waiting for llama-simple's build"
[ -n "${BUILD:-}" ] && { timeout 330 tail --pid="$BUILD" -f /dev/null; tail -2 /tmp/peers.log | tee -a "$LOG"; }
[ -x $LS ] || { say "no llama-simple: reflex alone"; LS=; }

say "1. the disk alone (dd, 2 runs each, page cache dropped before each)"
for f in "$M06" "$M8"; do
  for i in 1 2; do
    for flags in "bs=64M iflag=direct" "bs=1M"; do
      drop; echo "$(basename "$f") dd $flags: $(timeout 60 dd if="$f" of=/dev/null $flags 2>&1 | tail -1)" | tee -a "$LOG"
    done
  done
done
timeout 180 python3 "$REPO/bench/readahead_probe.py" "$M06" "$M8" --runs 2 --threads 1,8,16 \
  --rows direct,readahead,warm,pipeline --out "$OUT/probe.json" >> "$LOG" 2>&1
grep -E "GB, chunk|^\| (direct|readahead|warm|pipeline)" "$LOG"

say "2. launch -> first token, page cache dropped before every run"
for m in "$M06" "$M8"; do reflex generate "$m" "$PROMPT" -n 1 > /dev/null 2>&1; done  # the indexes
timeout 200 python3 "$REPO/bench/coldstart.py" --models "$M06,$M8" ${LS:+--llama-simple $LS} --runs "$RUNS" \
  --drop-cache --out "$OUT/cold" \
  --extra "reflex 1 readahead thread=env REFLEX_READAHEAD_THREADS=1 reflex generate {model} {prompt} -n 1 --backend cuda" \
  >> "$LOG" 2>&1
grep -E "^\| (model|qwen3)" "$LOG"

say "3. --timings, page cache dropped"
for m in "$M06" "$M8"; do
  for i in 1 2; do
    drop
    echo "-- $(basename "$m") run $i" >> "$LOG"
    reflex generate "$m" "$PROMPT" -n 1 --backend cuda --timings >> "$LOG" 2>&1
  done
done
grep -E "^-- |readahead:|upload:|wait for the upload|first token" "$LOG" | tail -24
say "done"
