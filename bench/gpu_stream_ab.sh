#!/bin/bash
# The streamed SwiGLU reader (REFLEX_GEMV_STREAM) on the GPU machine: its tests, then warm
# decode with it off and on, alternating (one wheel set, .whl-new), then the 8B's step timeline.
# usage: bash bench/gpu_stream_ab.sh [ROUNDS] [STAGES...]
set -u
R=$(pwd); ROUNDS=${1:-2}; shift; STAGES=${*:-4}
python3 -m pip install -q --no-index --no-deps --target /tmp/N .whl-new/*.whl
export PYTHONPATH=/tmp/N PATH=/tmp/N/bin:$PATH
cd /tmp && python3 $R/bench/make_models.py /tmp/m --which 8b,0.6b > /dev/null
python3 -m pytest -q -x -p no:cacheprovider $R/tests/gpu/test_quant_kernels.py -k "stream or residual_step or staged_limbs" 2>&1 | tail -3
cd $R
for round in $(seq $ROUNDS); do
  for m in /tmp/m/*8b*.gguf; do
    for s in 0 $STAGES; do
      v=$(REFLEX_GEMV_STREAM=$([ $s = 0 ] && echo 0 || echo 1) REFLEX_GEMV_STREAM_STAGES=$s reflex bench $m -r 3 --decode 32 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['decode_ms_per_token']['median'])")
      echo "round $round $(basename $m) stages=$s decode_ms_per_token=$v"
    done
  done
done
