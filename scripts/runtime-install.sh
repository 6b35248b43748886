#!/bin/sh
# The runtime image's install step (the Dockerfile's runtime stage runs this; so does
# tests/test_deploy_image.py, in a fresh venv with nvcc hidden from PATH): a venv at PREFIX with
# the prebuilt wheels of the core and of the plugins in REFLEX_PLUGINS, and their dependencies
# from PyPI as wheels only. Nothing is compiled (no nvcc, no CUDA toolkit: the kernels are in
# the wheels, and cuda-bindings needs only the driver's libcuda, which the NVIDIA container
# runtime mounts from the host). Modules are byte-compiled here: a read-only root file system
# could not cache them, and every cold start would compile them again.
#
#   scripts/runtime-install.sh PREFIX WHEEL_DIR
#   REFLEX_PLUGINS="qwen3 qwen3_moe"   plugin folders to install (default: every plugin wheel)
#   PYTHON=python3                     the venv's interpreter
set -eu
[ $# -eq 2 ] || { echo "usage: $0 PREFIX WHEEL_DIR" >&2; exit 2; }
prefix=$1
wheels=$2
py=${PYTHON:-python3}
die() { echo "error: $*" >&2; exit 1; }

plugins=${REFLEX_PLUGINS-$(cd "$wheels" && ls -- reflex_infer_*-*.whl 2>/dev/null | sed 's/^reflex_infer_\(.*\)-[^-]*-[^-]*-[^-]*-[^-]*\.whl$/\1/')}
set --
for f in "$wheels"/reflex_infer-*.whl; do
  [ -e "$f" ] && set -- "$@" "$f"
done
[ $# -eq 1 ] || die "expected one core wheel (reflex_infer-*.whl) in $wheels, found $#"
for p in $plugins; do
  n=$#
  for f in "$wheels/reflex_infer_$p"-*.whl; do
    [ -e "$f" ] && set -- "$@" "$f"
  done
  [ $# -eq $((n + 1)) ] || die "expected one wheel of plugin $p (reflex_infer_$p-*.whl) in $wheels"
done

"$py" -m venv "$prefix"
"$prefix/bin/python" -m pip install --only-binary=:all: "$@"
# The plugins load (entry points, imports): a broken install fails here, not at the first run.
cache=$(mktemp -d)
XDG_CACHE_HOME=$cache "$prefix/bin/reflex" plugins
rm -rf "$cache"
