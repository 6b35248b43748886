#!/bin/sh
# Build the wheels the runtime image installs (the Dockerfile's builder stage runs this): the
# core, whose CUDA kernels nvcc compiles here (REFLEX_CUDA_ARCH empty: SASS for every GPU
# generation the toolkit knows from sm_80 on, plus PTX of the newest for later GPUs; sm_XX: that
# one, plus its PTX -- reflex_core/_build.py), and each plugin in REFLEX_PLUGINS, with its own
# kernels. tests/test_deploy_image.py runs it too, with REFLEX_SKIP_CUDA=1.
#
#   scripts/build-wheels.sh OUT_DIR
#   REFLEX_PLUGINS="qwen3 qwen3_moe"   folders of plugins/ to build (default: all of them)
#   PYTHON=python3                     the interpreter whose pip builds them
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
plugins=${REFLEX_PLUGINS-$(cd plugins && ls -d -- */ | tr -d /)}
set -- .
for p in $plugins; do
  [ -f "plugins/$p/pyproject.toml" ] || {
    echo "error: REFLEX_PLUGINS names $p, which is no folder of plugins/ ($(cd plugins && ls -d -- */ | tr -d / | tr '\n' ' '))" >&2
    exit 1
  }
  set -- "$@" "plugins/$p"
done
"$py" -m pip wheel --no-deps --wheel-dir "$out" "$@"
