#!/bin/bash
# The streamed residual-step GEMVs against the tree before them, in one call on the GPU machine:
# warm decode (8B Q4_K_M, 0.6B Q8_0) alternating .whl-main / .whl-new, greedy output of both,
# launch -> first token (0.6B, W1) alternating, then the new wheels' GPU tests.
# usage: [COLD=runs] [TEST_S=seconds] bash bench/gpu_stream_session.sh [ROUNDS]
set -u
R=$(pwd); ROUNDS=${1:-2}
for w in main new; do python3 -m pip install -q --no-index --no-deps --target /tmp/$w .whl-$w/*.whl; done
cd /tmp && PYTHONPATH=/tmp/new python3 $R/bench/make_models.py /tmp/m --which 8b,0.6b > /dev/null
run() { local w=$1; shift; PYTHONPATH=/tmp/$w PATH=/tmp/$w/bin:$PATH "$@"; }
for round in $(seq $ROUNDS); do
  for m in /tmp/m/*.gguf; do
    for w in main new; do
      v=$(run $w reflex bench $m -r 3 --decode 32 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['decode_ms_per_token']['median'])")
      echo "round $round $(basename $m) $w decode_ms_per_token=$v"
    done
  done
done
for m in /tmp/m/*.gguf; do
  for w in main new; do run $w reflex generate $m "The history of the bicycle" -n 48 2>/dev/null | grep -v REFLEX_ | md5sum | sed "s/^/greedy $(basename $m) $w /"; done
done
for i in $(seq ${COLD:-5}); do
  for w in main new; do
    run $w reflex generate /tmp/m/qwen3-0.6b-shaped-q8_0.gguf "Hello there, how" -n 1 2>&1 | grep -o "process_start_to_first_token_ms=[0-9.]*" | sed "s/^/cold $w /"
  done
done
cd /tmp && run new timeout ${TEST_S:-420} python3 -m pytest -q -p no:cacheprovider -m "not slow" $R/tests/gpu 2>&1 | tail -4
