#!/bin/bash
# Two wheel sets (.whl-main, .whl-new) in one call on the GPU machine: warm decode (8B Q4_K_M,
# 0.6B Q8_0) alternating, greedy output of both, launch -> first token (0.6B, W1) alternating
# (bench/gpu_wheels_decode.sh), then the new wheels' GPU tests.
# usage: [COLD=runs] [TEST_S=seconds] bash bench/gpu_stream_session.sh [ROUNDS]
set -u
R=$(pwd)
WHICH=8b,0.6b ROUNDS=${1:-2} COLD=${COLD:-5} bash "$R/bench/gpu_wheels_decode.sh" \
  "main:.whl-main:" "new:.whl-new:"
cd /tmp && PYTHONPATH=/tmp/site-_whl_new timeout "${TEST_S:-420}" python3 -m pytest -q \
  -p no:cacheprovider -m "not slow" "$R/tests/gpu" 2>&1 | tail -4
