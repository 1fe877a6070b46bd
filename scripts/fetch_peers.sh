#!/usr/bin/env bash
# Puts the wheel of FlashAttention-3's forward (PyPI fa3-fwd: a forward-only build of FlashAttention-3's
# hopper/ sources with CUDA 13.0 against PyTorch's stable ABI) under .deps/peers, for the GPU machine,
# which reaches no package registry: run it here, then carry .deps/peers there; scripts/gpu_run.sh
# installs it for the peers stages, and tools/peers_sdpa.py times it beside PyTorch SDPA's backends.
# The wheel is pinned by version and checksum.
set -euo pipefail

version=0.0.3
sha256=44d26c6cfc69dde5a0f9c6bebbccbb96ed20e97bc8b9ddda638b0bf62e91b93d
wheel="fa3_fwd-$version-cp39-abi3-manylinux_2_24_x86_64.whl"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/.deps/peers"

if [[ -f $dest/$wheel ]] && echo "$sha256  $dest/$wheel" | sha256sum --check --quiet; then
  echo "FA3 wheel already in $dest"
  exit 0
fi
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_24_x86_64 \
  --python-version 3.11 -d "$dest" "fa3-fwd==$version"
echo "$sha256  $dest/$wheel" | sha256sum --check --quiet
echo "FA3 wheel in $dest ($(du -sh "$dest/$wheel" | cut -f1))"
