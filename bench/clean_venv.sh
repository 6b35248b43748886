#!/usr/bin/env bash
# A venv holding reflex and its runtime dependencies only (click, pluggy, tokenizers,
# cuda-bindings), for cold-start benchmarks that should not pay for unrelated packages' .pth
# files at interpreter start (on the GPU machine's image `python -c pass` is ~65 ms, ~14 ms in
# such a venv). The dependencies are linked from the current interpreter's site-packages (the
# GPU machine has no network); reflex is installed from wheels, compiled (.pyc) like pip does.
#   usage: bash bench/clean_venv.sh DEST WHEEL...
set -euo pipefail
DEST=$1; shift
PY=${PY:-python3}
SP=$("$PY" -c "import cuda.bindings, os; print(os.path.dirname(os.path.dirname(os.path.dirname(cuda.bindings.__file__))))")
"$PY" -m venv --without-pip "$DEST"
VSP=$("$DEST/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for pat in cuda cuda_bindings-*.dist-info cuda_pathfinder cuda_pathfinder-*.dist-info \
           tokenizers tokenizers-*.dist-info click click-*.dist-info pluggy pluggy-*.dist-info; do
  for f in "$SP"/$pat; do [ -e "$f" ] && ln -sfn "$f" "$VSP/"; done
done
env -u PYTHONPATH "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --ignore-installed \
  --prefix "$DEST" "$@"
sed -i "1s|.*|#!$DEST/bin/python|" "$DEST/bin/reflex"
echo "clean venv: $DEST ($(ls "$VSP" | wc -l) entries in $VSP)"
