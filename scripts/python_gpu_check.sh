#!/usr/bin/env bash
# The Python package on the GPU machine: `pip install .` of this tree (offline: no build isolation,
# no index), then its pytest suite against the installed package.
#
# Usage: scripts/python_gpu_check.sh [PYTEST_ARGS...]
# Environment:
#   OUT                 where the logs go (default ./gpu_out): python_install.log, pytest.log
#   CUTLASS_DIR         CUTLASS include dir (default .deps/cutlass/include, from scripts/fetch_cutlass.sh)
#   FLASHHOP_DTYPES     e.g. "bf16"  restrict the compiled kernels (default: all); tests of
#   FLASHHOP_HEAD_DIMS  e.g. "128"   kernels left out report themselves skipped
#   PYTEST_WHEELS       wheels of pytest and its dependencies, used when python3 lacks pytest
#                       (default .deps/wheels; make it where pip works with
#                       `python3 -m pip download --dest .deps/wheels pytest`)
# The package goes into a temporary --target folder, put on PYTHONPATH for the tests; nothing is
# installed into the machine's Python. The kernels build in build-python/<dtypes>_<head dims>/, kept
# between runs; one folder per kernel selection, so that none inherits another's CMake cache.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/gpu_out}
mkdir -p "$OUT"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT
install_log="$OUT/python_install.log"
: >"$install_log"
offline=(--no-build-isolation --no-deps --no-index --target "$target")

selection="${FLASHHOP_DTYPES:-all}_${FLASHHOP_HEAD_DIMS:-all}"
config=(-C build-dir="build-python/${selection//;/,}")
cutlass=${CUTLASS_DIR:-$root/.deps/cutlass/include}
if [[ -f $cutlass/cute/tensor.hpp ]]; then
  config+=(-C cmake.define.CUTLASS_DIR="$(cd "$cutlass" && pwd)")
else
  echo "no CUTLASS headers at $cutlass: CMake looks for nvidia-cutlass itself, which needs pip access" |
    tee -a "$install_log"
fi
[[ -n ${FLASHHOP_DTYPES:-} ]] && config+=(-C cmake.define.FLASHHOP_DTYPES="$FLASHHOP_DTYPES")
[[ -n ${FLASHHOP_HEAD_DIMS:-} ]] && config+=(-C cmake.define.FLASHHOP_HEAD_DIMS="$FLASHHOP_HEAD_DIMS")

echo "=== pip install . ($(python3 -c 'import torch; print("torch", torch.__version__)' 2>&1))"
start=$SECONDS
if ! python3 -m pip install -v "${offline[@]}" "${config[@]}" "$root" >>"$install_log" 2>&1; then
  tail -40 "$install_log"
  echo "pip install failed ($((SECONDS - start)) s); log: $install_log"
  exit 1
fi
echo "installed in $((SECONDS - start)) s"

if ! python3 -c 'import pytest' 2>/dev/null; then
  wheels=${PYTEST_WHEELS:-$root/.deps/wheels}
  echo "=== pytest from $wheels"
  python3 -m pip install "${offline[@]}" --find-links "$wheels" pytest >>"$install_log" 2>&1 ||
    { tail -20 "$install_log"; echo "no pytest here and none installable from $wheels"; exit 1; }
fi

echo "=== pytest python/tests"
export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -p no:cacheprovider -rs "$root/python/tests" "$@" 2>&1 | tee "$OUT/pytest.log" | tail -60
exit "${PIPESTATUS[0]}"
