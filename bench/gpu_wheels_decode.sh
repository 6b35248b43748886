#!/bin/bash
# Warm decode of several wheel sets, each under its own environment settings, alternating, in
# one call on the GPU machine (an A/B of two builds, e.g. main's and a branch's, or of launcher
# switches: bench/gpu_env_decode.sh), then each setting's greedy output.
# usage: [WHICH=8b] [ROUNDS=2] [TIMELINE=NAME] [COLD=N] \
#          bash bench/gpu_wheels_decode.sh "NAME:DIR:VAR=VAL,VAR=VAL" ...
#   e.g. bash bench/gpu_wheels_decode.sh "main:.whl-main:" "new:.whl-new:" \
#          "new-off:.whl-new:REFLEX_GEMV_STREAM=0"
# DIR: a folder of wheels built for sm_90 (carried to the machine), installed once each into its
# own folder (/tmp/site-<DIR, other characters than letters and digits as _>: .whl-new's is
# /tmp/site-_whl_new). Models from bench/make_models.py. TIMELINE: also bench/graph_timeline.py
# of the first file under that setting and the first one. COLD: then N launches -> first token
# (W1) of each setting, alternating, on the 0.6B file where WHICH has it (else the first file).
set -u
R=$(pwd)
declare -A SITE
for cfg in "$@"; do
  IFS=: read -r name dir env <<< "$cfg"
  if [ -z "${SITE[$dir]:-}" ]; then
    SITE[$dir]=/tmp/site-$(echo "$dir" | tr -c 'a-zA-Z0-9\n' _)
    python3 -m pip install -q --no-index --no-deps --target "${SITE[$dir]}" "$R/$dir"/*.whl || exit 1
  fi
done
first=${1%%:*}
cd /tmp && PYTHONPATH=${SITE[$(echo "$1" | cut -d: -f2)]} python3 "$R/bench/make_models.py" /tmp/m \
  --which "${WHICH:-8b}" > /dev/null || exit 1
run() {  # run NAME:DIR:ENV COMMAND...: the command under that setting's wheels and environment
  local name dir env site
  IFS=: read -r name dir env <<< "$1"; shift
  site=${SITE[$dir]}
  env PYTHONPATH="$site" PATH="$site/bin:$PATH" $(echo "$env" | tr , ' ') "$@"
}
for round in $(seq "${ROUNDS:-2}"); do
  for m in /tmp/m/*.gguf; do
    for cfg in "$@"; do
      v=$(run "$cfg" reflex bench "$m" -r 3 --decode 32 --json 2>/dev/null \
          | python3 -c "import json,sys; print(json.load(sys.stdin)['decode_ms_per_token']['median'])")
      echo "round $round $(basename "$m") ${cfg%%:*} decode_ms_per_token=$v"
    done
  done
done
for m in /tmp/m/*.gguf; do
  for cfg in "$@"; do
    run "$cfg" reflex generate "$m" "The history of the bicycle" -n 48 2>/dev/null | grep -v REFLEX_ \
      | md5sum | sed "s/^/greedy $(basename "$m") ${cfg%%:*} /"
  done
done
if [ -n "${TIMELINE:-}" ]; then
  m=$(ls /tmp/m/*.gguf | head -1)
  for cfg in "$@"; do
    name=${cfg%%:*}
    [ "$name" = "$first" ] || [ "$name" = "$TIMELINE" ] || continue
    run "$cfg" python3 "$R/bench/graph_timeline.py" "$m" "$name" --top 10 2>&1 | grep -v -i warn | tail -12
  done
fi
if [ "${COLD:-0}" -gt 0 ]; then
  m=$(ls /tmp/m/*0.6b*.gguf 2>/dev/null | head -1); m=${m:-$(ls /tmp/m/*.gguf | head -1)}
  for i in $(seq "$COLD"); do
    for cfg in "$@"; do
      run "$cfg" reflex generate "$m" "Hello there, how" -n 1 2>&1 \
        | grep -o "process_start_to_first_token_ms=[0-9.]*" | sed "s/^/cold $(basename "$m") ${cfg%%:*} /"
    done
  done
fi
