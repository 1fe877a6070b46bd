#!/usr/bin/env bash
# Copies this machine's GoogleTest (Debian's libgtest-dev: headers, static libraries, CMake package)
# into .deps/gtest, to be carried to the GPU machine, which has none; scripts/gpu_run.sh then
# builds the tests there against it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
libdir=/usr/lib/x86_64-linux-gnu
dest=$root/.deps/gtest
if [[ ! -f $libdir/cmake/GTest/GTestConfig.cmake ]]; then
  echo "no GoogleTest under $libdir (apt-get install libgtest-dev)"
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib/x86_64-linux-gnu/cmake"
cp -r /usr/include/gtest /usr/include/gmock "$dest/include/"
cp "$libdir"/lib{gtest,gtest_main,gmock,gmock_main}.a "$dest/lib/x86_64-linux-gnu/"
# The package's targets locate the headers and libraries relative to their own folder.
cp -r "$libdir/cmake/GTest" "$dest/lib/x86_64-linux-gnu/cmake/"
echo "GoogleTest staged in $dest"
