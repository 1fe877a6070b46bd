#!/usr/bin/env bash
# `pip install .` as a newcomer runs it: a fresh virtual environment, PyTorch, then this repository
# installed with build isolation (pip brings pyproject.toml's build requirements, CUTLASS's headers
# among them, into a temporary build environment) with its transformers extra, the package imported
# with its library loaded, and python/tests run against the installed package (the transformers
# integration's tests among them). Without a Hopper GPU the GPU tests report themselves skipped; a
# failed test, or a run in which no test passed, fails the check. .ci/run runs it; it works the
# same on the GPU machine where pip reaches an index.
#
# Usage: scripts/python_install_check.sh [PYTEST_ARGS...]
# Environment:
#   FLASHHOP_DTYPES     kernel selection compiled into the package (unset: bf16 and 64; set empty: no
#   FLASHHOP_HEAD_DIMS  kernels, as CI builds it, the check being of the packaging; tests of kernels left
#                       out report themselves skipped)
#   TORCH_INDEX_URL     index to install torch from (default: pip's own, PyPI, whose Linux torch is a
#                       CUDA build, 5.3 GB installed with its libraries; PyTorch's CPU-only index,
#                       where reachable, is a much smaller download)
#   VENV                folder for the environment (default: a temporary one, removed at the end)
set -Eeuo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FLASHHOP_DTYPES=${FLASHHOP_DTYPES-bf16} FLASHHOP_HEAD_DIMS=${FLASHHOP_HEAD_DIMS-64}
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

work=$(mktemp -d)
venv=${VENV:-$work/venv}
trap 'rm -rf "$work"' EXIT
log="$work/pip_install.log"

stage=""
stage_start=$SECONDS
begin() { stage=$1; stage_start=$SECONDS; echo "python check: $stage"; }
done_stage() { echo "python check: $stage: $((SECONDS - stage_start)) s"; }
trap 'echo "python check: FAILED in \"$stage\" after $((SECONDS - stage_start)) s" >&2' ERR

begin "fresh virtual environment in $venv"
python3 -m venv "$venv"
python="$venv/bin/python"
done_stage

begin "torch and pytest"
"$python" -m pip install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch
"$python" -m pip install --quiet pytest
"$python" -c 'import torch; print("torch", torch.__version__, "| CUDA available:", torch.cuda.is_available())'
done_stage

begin "pip install .[transformers] (build isolation; kernels: dtypes $FLASHHOP_DTYPES, head dims $FLASHHOP_HEAD_DIMS)"
if ! "$python" -m pip install -v "$root[transformers]" >"$log" 2>&1; then
  tail -60 "$log" >&2
  echo "python check: pip install . failed; expected it to build and install flashhop (last lines above)" >&2
  false
fi
grep -E "CUTLASS headers:|Found Python3:" "$log" | sed 's/^ */  /'
done_stage

begin "import flashhop and load its library"
(cd "$work" && "$python" - "$venv" <<'PY'
import pathlib
import sys

import flashhop
from flashhop import _c_api

venv = pathlib.Path(sys.argv[1]).resolve()
package = pathlib.Path(flashhop.__file__).resolve()
assert venv in package.parents, f"imported flashhop from {package}: expected the one installed in {venv}"
library = _c_api._LIBRARY_PATH
assert library.is_file(), f"{library}: expected the package's compiled library"
print(f"  flashhop from {package.parent}, library {library.name} ({library.stat().st_size // 1024} KiB) loaded")
PY
)
done_stage

begin "pytest python/tests against the installed package"
# From outside the repository, so that `import flashhop` finds only the installed package.
set +e
(cd "$work" && "$python" -m pytest -p no:cacheprovider -rs "$root/python/tests" "$@") 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e
summary=$(tail -1 "$work/pytest.log")
if [[ $status -ne 0 ]] || ! grep -qE '[0-9]+ passed' <<<"$summary"; then
  echo "python check: pytest exited $status with \"$summary\": expected exit 0 with tests passed" >&2
  false
fi
done_stage
