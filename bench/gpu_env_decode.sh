#!/bin/bash
# Warm decode of one wheel set (.whl-new, built for sm_90) under several environment settings
# (A/B switches of the kernels' launchers), alternating, in one call on the GPU machine, then
# each setting's greedy output: bench/gpu_wheels_decode.sh with one wheel folder.
# usage: [WHICH=8b] [ROUNDS=2] bash bench/gpu_env_decode.sh "NAME:VAR=VAL VAR=VAL" ...
#   e.g. bash bench/gpu_env_decode.sh "base:" "off:REFLEX_GEMV_STREAM=0"
cfgs=()
for cfg in "$@"; do
  env=${cfg#*:}
  cfgs+=("${cfg%%:*}:.whl-new:${env// /,}")
done
exec bash "$(dirname "$0")/gpu_wheels_decode.sh" "${cfgs[@]}"
