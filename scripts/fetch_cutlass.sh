#!/usr/bin/env bash
# Puts the CUTLASS / CuTe headers that flashhop builds against under .deps/cutlass/include, for
# machines that reach no package registry (the GPU machine): run it here, then carry .deps/cutlass
# there and configure with -DCUTLASS_DIR=.deps/cutlass/include (scripts/gpu_run.sh does that itself).
# Only the headers of the Python package nvidia-cutlass are used; its dependencies are not needed.
set -euo pipefail

version=4.2.0.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/.deps/cutlass/include"

if [[ -f $dest/cute/tensor.hpp && -f $dest/cutlass/version.h ]]; then
  echo "CUTLASS headers already in $dest"
  exit 0
fi

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$download" "nvidia-cutlass==$version"

# The wheel is a zip file; its include tree is cutlass_library/source/include/{cute,cutlass}.
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$download" "$dest" <<'PY'
import pathlib, sys, zipfile
download, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
prefix = "cutlass_library/source/include/"
(wheel,) = download.glob("nvidia_cutlass-*.whl")
with zipfile.ZipFile(wheel) as archive:
    for entry in archive.infolist():
        if entry.filename.startswith(prefix) and not entry.is_dir():
            target = dest / entry.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(entry))
PY

grep -E '#define CUTLASS_(MAJOR|MINOR|PATCH) ' "$dest/cutlass/version.h" | tr '\n' ' '
echo
echo "CUTLASS headers in $dest ($(du -sh "$dest" | cut -f1))"
