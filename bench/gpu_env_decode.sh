#!/bin/bash
# Warm decode of one wheel set under several environment settings (a quicker A/B than
# bench/gpu_env_ab.sh: no peers, no Nsight), alternating, in one call on the
# GPU machine (A/B switches of the kernels' launchers), then each setting's greedy output.
# usage: [WHICH=8b] [ROUNDS=2] bash bench/gpu_env_decode.sh "NAME:VAR=VAL VAR=VAL" ...
#   e.g. bash bench/gpu_env_decode.sh "base:" "off:REFLEX_GEMV_STREAM=0"
# The wheels are .whl-new (built for sm_90); models from bench/make_models.py.
set -u
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/new .whl-new/*.whl
export PYTHONPATH=/tmp/new PATH=/tmp/new/bin:$PATH
cd /tmp && python3 $R/bench/make_models.py /tmp/m --which ${WHICH:-8b} > /dev/null
for round in $(seq ${ROUNDS:-2}); do
  for m in /tmp/m/*.gguf; do
    for cfg in "$@"; do
      v=$(env ${cfg#*:} reflex bench $m -r 3 --decode 32 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['decode_ms_per_token']['median'])")
      echo "round $round $(basename $m) ${cfg%%:*} decode_ms_per_token=$v"
    done
  done
done
for m in /tmp/m/*.gguf; do
  for cfg in "$@"; do
    env ${cfg#*:} reflex generate $m "The history of the bicycle" -n 48 2>/dev/null | grep -v REFLEX_ | md5sum | sed "s/^/greedy $(basename $m) ${cfg%%:*} /"
  done
done
