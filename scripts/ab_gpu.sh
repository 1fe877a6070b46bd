#!/usr/bin/env bash
# Same-session A/B of source trees on the GPU machine (METHOD: predict, change, measure side by side).
#
# Usage (on the GPU machine, from the repository root): scripts/ab_gpu.sh NAME...
#   Each NAME is a tarball .deps/ab/NAME.tar.gz of a source tree, made on the build machine with
#   `git archive --format=tar.gz -o .deps/ab/NAME.tar.gz <commit>`; carry .deps/ab, .deps/cutlass
#   and .deps/gtest. The first NAME is the base. Each tree is built (bf16, flashhop-bench only) in
#   parallel under /tmp/ab/NAME; each runs CHECK_ARGS with --check (a failing tree is dropped); then
#   tools/ab_bench.py times the survivors with BENCH_ARGS over ROUNDS interleaved rounds.
#   A tree with a folder .deps/ab/NAME.bin is not built: its flashhop-bench.gz (and
#   flashhop_tests.gz, for TEST_VARIANT) are taken from there, built on the build machine (same
#   toolkit) and gzipped (a fifth of the size, for the carry limit) to save the GPU machine's time;
#   their head dims are whatever they were built with.
# Environment:
#   HDIMS [64;128;256]         FLASHHOP_HEAD_DIMS of every tree; HDIMS_<NAME> overrides it per tree
#   JOBS_<NAME>                ninja jobs of one tree (default: 16 shared evenly)
#   CHECK_ARGS                 default "--sweep peers --causal --iters 3 --warmup 1"; CHECK_ARGS_<NAME>
#                              overrides it per tree (one built without some head dims)
#   BENCH_ARGS                 default "--sweep peers --causal --warmup 50 --iters 200"
#   ROUNDS [2]
#   TEST_VARIANT="NAME..."     also build and run the GoogleTest binary of these trees (TEST_FILTER;
#                              TEST_FILTER_<NAME> overrides it per tree)
#   RACE_FILTER                with TEST_VARIANT: compute-sanitizer racecheck of these tests
#   OUT                        logs (the tool library's $OUT on the GPU machine): build_NAME.log, check_NAME.log, test_NAME.log, race_NAME.log, sass_NAME.log,
#                              ab.txt and runs/ (default ./ab_out)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
HDIMS=${HDIMS:-"64;128;256"}
CHECK_ARGS=${CHECK_ARGS:-"--sweep peers --causal --iters 3 --warmup 1"}
BENCH_ARGS=${BENCH_ARGS:-"--sweep peers --causal --warmup 50 --iters 200"}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$root/ab_out}
mkdir -p "$OUT"
names=("$@")
jobs=$(( 16 / ${#names[@]} + 1 ))
start=$(date +%s)
for n in "${names[@]}"; do
  (
    mkdir -p "/tmp/ab/$n" && tar -xzf ".deps/ab/$n.tar.gz" -C "/tmp/ab/$n"
    if [[ -d .deps/ab/$n.bin ]]; then
      mkdir -p "/tmp/ab/$n/build/tools" "/tmp/ab/$n/build/tests"
      gunzip -c ".deps/ab/$n.bin/flashhop-bench.gz" >"/tmp/ab/$n/build/tools/flashhop-bench"
      chmod +x "/tmp/ab/$n/build/tools/flashhop-bench"
      if [[ -f .deps/ab/$n.bin/flashhop_tests.gz ]]; then
        gunzip -c ".deps/ab/$n.bin/flashhop_tests.gz" >"/tmp/ab/$n/build/tests/flashhop_tests"
        chmod +x "/tmp/ab/$n/build/tests/flashhop_tests"
      fi
      echo "build $n: prebuilt"
      exit 0
    fi
    hd_var=HDIMS_$n; hd=${!hd_var:-$HDIMS}
    jobs_var=JOBS_$n; jobs=${!jobs_var:-$jobs}
    tests=OFF; targets=flashhop-bench
    [[ " ${TEST_VARIANT:-} " == *" $n "* ]] && tests=ON && targets="flashhop-bench flashhop_tests"
    FLASHHOP_DTYPES=bf16 FLASHHOP_HEAD_DIMS="$hd" cmake -S /tmp/ab/$n -B /tmp/ab/$n/build -G Ninja \
      -DCUTLASS_DIR=$root/.deps/cutlass/include -DFLASHHOP_BUILD_TESTS=$tests -DFLASHHOP_PTXAS_VERBOSE=ON \
      -DGTest_DIR=$root/.deps/gtest/lib/x86_64-linux-gnu/cmake/GTest >/dev/null
    ninja -C /tmp/ab/$n/build -j$jobs $targets >"$OUT/build_$n.log" 2>&1
    echo "build $n rc=$? $(( $(date +%s) - start )) s"
  ) &
done
wait
for tv in ${TEST_VARIANT:-}; do
  t=/tmp/ab/$tv/build/tests/flashhop_tests
  filter_var=TEST_FILTER_$tv; filter=${!filter_var:-${TEST_FILTER:-*}}
  timeout 450 "$t" --gtest_brief=1 --gtest_filter="$filter" >"$OUT/test_$tv.log" 2>&1
  echo "test $tv rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_$tv.log" | tr '\n' ' ') $(( $(date +%s) - start )) s"
  grep "^\[  FAILED  \]" "$OUT/test_$tv.log" | head -5
  python3 "$root/tools/check_wgmma_operands.py" "$t" >"$OUT/sass_$tv.log" 2>&1
  echo "SASS check $tv rc=$? $(tail -1 "$OUT/sass_$tv.log")"
  if [[ -n ${RACE_FILTER:-} ]]; then
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" --gtest_brief=1 \
      --gtest_filter="$RACE_FILTER" >"$OUT/race_$tv.log" 2>&1
    echo "racecheck $tv rc=$? $(tail -1 "$OUT/race_$tv.log")  $(( $(date +%s) - start )) s"
  fi
done
survivors=()
for n in "${names[@]}"; do
  bin=/tmp/ab/$n/build/tools/flashhop-bench
  [[ -x $bin ]] || { echo "no binary for $n"; continue; }
  check_var=CHECK_ARGS_$n
  timeout 150 $bin ${!check_var:-$CHECK_ARGS} --check >"$OUT/check_$n.log" 2>&1
  rc=$?
  echo "check $n rc=$rc $(grep -c " pass |" "$OUT/check_$n.log") pass $(grep -c FAIL "$OUT/check_$n.log") FAIL  $(( $(date +%s) - start )) s"
  [[ $rc -eq 0 ]] && survivors+=("$n=$bin")
done
python3 /tmp/ab/${names[0]}/tools/ab_bench.py --rounds "$ROUNDS" --bench-args "$BENCH_ARGS" --out "$OUT/runs" \
  "${survivors[@]}" 2>&1 | tee "$OUT/ab.txt"
echo "total $(( $(date +%s) - start )) s"
