#!/usr/bin/env bash
# shellcheck disable=SC2317  # the stage_* functions are called by name, through run_stage
# The one script for the GPU machine: configure and build, GPU tests, flashhop-bench over the peers
# sweep with --check, PyTorch SDPA peers in the same run, and a SASS / ptxas summary of the kernels.
#
# Usage: scripts/gpu_run.sh [STAGE...]
#   stages, run in the order given (default: build test bench peers features sanitize sass)
#     build   cmake -G Ninja (-DFLASHHOP_PTXAS_VERBOSE=ON) and build with every core
#     test      the gtest binary, in one process (ctest would start one process, and one CUDA
#               context, per test), then tools/check_wgmma_operands.py on the kernels' SASS
#     bench     flashhop-bench --sweep peers --check --json
#     peers     tools/peers_sdpa.py, merged with the bench JSON when it exists; with FA3's forward when
#               scripts/fetch_peers.sh has put its wheel under .deps/peers (installed into BUILD_DIR)
#     backward  flashhop-bench --sweep peers --bwd, then tools/backward_bench.py (flashhop's backward
#               through PyTorch beside SDPA's cuDNN and FA2 backward, and FA3's, built first from the
#               source that shared/peers/prepare_fa3_source.sh puts under .deps/fa3src, when there)
#               (not in the default list)
#     features  flashhop-bench --sweep features (windows, softcap, head dims 96 / 192), --check then timed
#     gqa       flashhop-bench --sweep gqa (GQA decode and short queries, --pack-gqa on and off), --check
#               then timed, and tools/peers_sdpa.py --sweep gqa merged with it (not in the default list)
#     sanitize  compute-sanitizer memcheck and racecheck on a subset of the GPU tests
#     profile   ncu of the configurations in PROFILE_CONFIGS, flashhop's and, with the FA3 wheel,
#               FA3's (tools/fa3_launch.py) (not in the default list)
#     sass      cuobjdump --dump-sass of the kernel objects: instruction counts; ptxas -v lines
# Environment:
#   OUT                 where the logs go (set on the device machine; default ./gpu_out)
#   FLASHHOP_COMMIT     commit to record when the tree travels without .git
#   BUILD_DIR           build folder (default build-gpu)
#   SKIP_BUILD=1        take BUILD_DIR as it is (e.g. a build carried from another machine)
#   CUTLASS_DIR         CUTLASS include dir (default .deps/cutlass/include from scripts/fetch_cutlass.sh
#                       when present; else CMake finds or pip-installs the headers itself)
#   FLASHHOP_DTYPES     e.g. "bf16"   restrict the compiled kernels (default: all)
#   FLASHHOP_HEAD_DIMS  e.g. "128"
#   BENCH_ARGS          flashhop-bench flags (default "--sweep peers $TIMING"); the bench stage runs them
#                       twice: with --check (correctness; no warm-up by time), then timed alone for bench.json
#   PEERS_ARGS          flags for peers_sdpa.py (default "$TIMING")
#   TIMING              warm-up and timed calls of every timed stage, flashhop and peers alike
#                       (default "--warmup 100 --warmup-ms 2000 --iters 500")
#   PROFILE_CONFIGS     flashhop-bench shapes for the profile stage, ';'-separated (default: the short
#                       shapes where flashhop trails cuDNN: d 128 non-causal 512, d 64 and d 128 causal 512)
# Files under $OUT (few, flat): summary.txt, build.log, test.log, bench.log, bench.json, backward.log,
# backward.json, backward_peers.log, backward_peers.json, fa3_build.log, peers.log,
# peers.json, features.log, features.json, gqa.log, gqa.json, gqa_peers.log, gqa_peers.json,
# sanitize.log, profile.log (+ profile_N[_fa3].ncu-rep / .csv), sass_check.log, sass_summary.txt, smi.csv;
# and all of them again in all_logs.tar.gz.
# A failed stage is recorded and the next one still runs; the exit status is non-zero if any failed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/gpu_out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
# Long warm-up and many timed calls for flashhop and the peers alike: a 10 + 50 call window timed
# right after the GEMM caught the GPU in a passing state that slowed short flashhop kernels by up to
# 30% but not the peers; and the GPU, held at its power limit, keeps higher clocks for up to a
# second after lighter work, so every configuration warms up for at least 2 s before it is timed,
# whatever ran before it (docs/PERFORMANCE.md).
TIMING=${TIMING:---warmup 100 --warmup-ms 2000 --iters 500}
BENCH_ARGS=${BENCH_ARGS:---sweep peers $TIMING}
PEERS_ARGS=${PEERS_ARGS:-$TIMING}
PROFILE_CONFIGS=${PROFILE_CONFIGS:---batch 32 --seqlen 512 --nheads 16 --head-dim 128;--batch 32 --seqlen 512 --nheads 32 --head-dim 64 --causal;--batch 32 --seqlen 512 --nheads 16 --head-dim 128 --causal}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(build test bench peers features sanitize sass)

summary="$OUT/summary.txt"
: >"$summary"
failed=0
note() { echo "$*" | tee -a "$summary"; }
demangle() {
  if command -v cu++filt >/dev/null; then cu++filt; elif command -v c++filt >/dev/null; then c++filt; else cat; fi
}

note "flashhop gpu_run.sh $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
note "commit: ${FLASHHOP_COMMIT:-$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null || echo 'unknown (no git here; set FLASHHOP_COMMIT)')}"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
note "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
note "cmake: $(cmake --version 2>/dev/null | head -1); ninja $(ninja --version 2>/dev/null); $(nproc) cores"
note "stages: ${stages[*]}; BUILD_DIR=$BUILD_DIR SKIP_BUILD=${SKIP_BUILD:-0}"

# Runs one stage function, timing it and recording its status.
run_stage() {
  local name=$1 start=$SECONDS from
  from=$(date '+%H:%M:%S')
  echo "=== $name"
  if "stage_$name"; then
    note "stage $name: ok ($((SECONDS - start)) s from $from)"
  else
    note "stage $name: FAILED ($((SECONDS - start)) s from $from)"
    failed=1
  fi
}

stage_build() {
  local log="$OUT/build.log"
  if [[ ${SKIP_BUILD:-0} == 1 ]]; then
    note "build skipped (SKIP_BUILD=1): using $BUILD_DIR as it is"
    [[ -x $BUILD_DIR/tools/flashhop-bench ]]
    return
  fi
  local args=(-S "$root" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHHOP_PTXAS_VERBOSE=ON)
  local cutlass=${CUTLASS_DIR:-$root/.deps/cutlass/include}
  if [[ -f $cutlass/cute/tensor.hpp ]]; then
    args+=(-DCUTLASS_DIR="$cutlass")
  else
    note "no CUTLASS headers at $cutlass: CMake looks for nvidia-cutlass itself, which needs pip access" \
         "(offline: run scripts/fetch_cutlass.sh where pip works and bring .deps/cutlass)"
  fi
  # GoogleTest staged by scripts/stage_gtest.sh (the GPU machine has none of its own).
  local gtest=$root/.deps/gtest/lib/x86_64-linux-gnu/cmake/GTest
  [[ -f $gtest/GTestConfig.cmake ]] && args+=(-DGTest_DIR="$gtest")
  [[ -n ${FLASHHOP_DTYPES:-} ]] && args+=(-DFLASHHOP_DTYPES="$FLASHHOP_DTYPES")
  [[ -n ${FLASHHOP_HEAD_DIMS:-} ]] && args+=(-DFLASHHOP_HEAD_DIMS="$FLASHHOP_HEAD_DIMS")
  # The tests need GoogleTest, which the GPU machine may lack: then build without them and say so.
  if ! cmake "${args[@]}" -DFLASHHOP_BUILD_TESTS=ON >"$log" 2>&1; then
    if grep -q GTest "$log"; then
      note "GoogleTest not found here: configuring without tests (carry a prebuilt BUILD_DIR to run them)"
      cmake "${args[@]}" -DFLASHHOP_BUILD_TESTS=OFF >>"$log" 2>&1 || { tail -30 "$log"; return 1; }
    else
      tail -30 "$log"
      return 1
    fi
  fi
  cmake --build "$BUILD_DIR" --parallel "$(nproc)" 2>&1 | tee -a "$log" |
    { grep -E '^\[|error|FAILED' || true; } | tail -40
}

stage_test() {
  local log="$OUT/test.log" binary="$BUILD_DIR/tests/flashhop_tests" status=0
  [[ -x $binary ]] || { note "no test binary at $binary (GoogleTest missing at configure time?)"; return 1; }
  "$binary" --gtest_brief=1 2>&1 | tee "$log" | tail -40
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  # The kernels' SASS: no write to a register that an in-flight wgmma reads (77: no cuobjdump).
  python3 "$root/tools/check_wgmma_operands.py" "$BUILD_DIR/libflashhop.a" >"$OUT/sass_check.log" 2>&1
  local sass=$?
  tail -1 "$OUT/sass_check.log"
  [[ $sass -eq 0 || $sass -eq 77 ]] || status=1
  return "$status"
}

# Two passes: --check first; then the timing that bench.json records, back to back like the peers'
# (the CPU check between configurations lets the GPU idle, which raised short-sequence figures by up
# to 20-30% on an H200 and made them incomparable with the peers').
stage_bench() {
  local log="$OUT/bench.log"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  "$BUILD_DIR/tools/flashhop-bench" $BENCH_ARGS --check --warmup-ms 0 >"$log" 2>&1 || { tail -40 "$log"; return 1; }
  grep -cE 'check PASS' "$log" | sed 's/^/checks passed: /'
  echo "=== timing pass" >>"$log"
  # shellcheck disable=SC2086
  "$BUILD_DIR/tools/flashhop-bench" $BENCH_ARGS --json "$OUT/bench.json" 2>&1 | tee -a "$log" | tail -45
}

# The backward over the peers grid: flashhop-bench --bwd (timed, JSON), then tools/backward_bench.py,
# flashhop's backward through PyTorch beside SDPA's cuDNN and FA2 backward in one run (needs the
# Python package: scripts/python_gpu_check.sh installs it; without it that half reports the import error).
stage_backward() {
  local log="$OUT/backward.log" status=0
  # shellcheck disable=SC2086  # TIMING is a list of flags
  "$BUILD_DIR/tools/flashhop-bench" --sweep peers --bwd $TIMING --json "$OUT/backward.json" >"$log" 2>&1 || status=1
  tail -40 "$log"
  install_fa3_source
  # shellcheck disable=SC2086
  python3 "$root/tools/backward_bench.py" --json "$OUT/backward_peers.json" >"$OUT/backward_peers.log" 2>&1 || status=1
  tail -40 "$OUT/backward_peers.log"
  return "$status"
}

stage_features() {
  local log="$OUT/features.log"
  # shellcheck disable=SC2086  # TIMING is a list of flags
  "$BUILD_DIR/tools/flashhop-bench" --sweep features $TIMING --check --warmup-ms 0 >"$log" 2>&1 ||
    { tail -40 "$log"; return 1; }
  grep -cE 'check PASS' "$log" | sed 's/^/checks passed: /'
  echo "=== timing pass" >>"$log"
  # shellcheck disable=SC2086
  "$BUILD_DIR/tools/flashhop-bench" --sweep features $TIMING --json "$OUT/features.json" 2>&1 |
    tee -a "$log" | tail -20
}

# As stage_features, then the SDPA peers of the same shapes; the stage fails if either part does.
stage_gqa() {
  local log="$OUT/gqa.log" status=0
  # shellcheck disable=SC2086
  "$BUILD_DIR/tools/flashhop-bench" --sweep gqa $TIMING --check --warmup-ms 0 >"$log" 2>&1 ||
    { tail -40 "$log"; return 1; }
  grep -cE 'check PASS' "$log" | sed 's/^/checks passed: /'
  echo "=== timing pass" >>"$log"
  # shellcheck disable=SC2086
  "$BUILD_DIR/tools/flashhop-bench" --sweep gqa $TIMING --json "$OUT/gqa.json" 2>&1 |
    tee -a "$log" | tail -20 || status=1
  local merge=()
  install_fa3
  [[ -f $OUT/gqa.json ]] && merge=(--flashhop-json "$OUT/gqa.json")
  # shellcheck disable=SC2086  # PEERS_ARGS is a list of flags
  python3 "$root/tools/peers_sdpa.py" --sweep gqa --json "$OUT/gqa_peers.json" "${merge[@]}" $PEERS_ARGS 2>&1 |
    tee "$OUT/gqa_peers.log" || status=1
  return "$status"
}

# Small shapes of every head dim and mask, and d = 64's and 128's wide-band kernels (memcheck), and
# the multi-tile persistent shapes, whose CTAs hand Q's buffer over between tiles, at head dims whose
# O has a buffer of its own (96, 192 x 128), whose O goes through Q's buffer (192), and with three
# consumer warpgroups (64, and its wide-band kernel) (racecheck); each unpacked and with packed GQA
# rows; d = 256 without a mask on few keys (its 64-key tiles, O through Q's buffer); and d = 128
# on the shape whose CTAs walk the most tiles (query heads packed), runs of them loading nothing
# under the causal mask (racecheck). The shapes whose last round is split
# (split_round.h; d <= 128 without a mask, packed decoding's only round): memcheck, and racecheck
# of the one-row tiles', d = 64's only round and packed decoding. quantize_fp8: partial tiles of
# every scaling and head dim, and the edge cases (memcheck); the per-block and per-head kernels'
# shared sign masks, warp maxima and group descale over many tiles (racecheck).
stage_sanitize() {
  local log="$OUT/sanitize.log" binary="$BUILD_DIR/tests/flashhop_tests" status=0
  : >"$log"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$binary" --gtest_brief=1 \
    --gtest_filter='Grid/ForwardGpu.*/bf16_*_b2_sq113_sk113_h4_kv2:Grid/ForwardGpu.*/bf16_*_b4_sq1000_sk300_h8_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_*_b1_sq113_sk257_h6_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_*_b4_sq300_sk500_h16_kv2:WideBand/ForwardGpuWideBand.*/bf16_*_b1_sq777_sk4900_h3_kv1:WideBand/ForwardGpuWideBand.*/bf16_*_b1_sq300_sk2600_h3_kv3:SplitRound/ForwardGpu.*/bf16_d64_*:SplitRound/ForwardGpu.*/bf16_d96_*:SplitRound/ForwardGpu.*/bf16_d128_*:PackGqaSplit/ForwardGpuPackGqa.*/bf16_*_full_*:ShortQueries/ForwardGpuShortQueries.*/bf16_*:Grid/BackwardGpu.*/bf16_*_b2_sq113_sk113_h4_kv2:Grid/BackwardGpu.*/bf16_d128_causal_b2_sq300_sk500_h8_kv2_deterministic:Grid/QuantizeGpu.*/*_s129_*:QuantizeGpuEdges.*' \
    >>"$log" 2>&1 || status=1
  compute-sanitizer --tool racecheck --error-exitcode 9 "$binary" --gtest_brief=1 \
    --gtest_filter='Grid/ForwardGpu.*/bf16_d64_*_b4_sq1000_sk300_h8_kv2:Grid/ForwardGpu.*/bf16_d96_*_b4_sq1000_sk300_h8_kv2:Grid/ForwardGpu.*/bf16_d192x128_*_b4_sq1000_sk300_h8_kv2:Grid/ForwardGpu.*/bf16_d192_*_b4_sq1000_sk300_h8_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_d64_*_b4_sq300_sk500_h16_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_d96_*_b4_sq300_sk500_h16_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_d192x128_*_b4_sq300_sk500_h16_kv2:PackGqa/ForwardGpuPackGqa.*/bf16_d192_*_b4_sq300_sk500_h16_kv2:WideBand/ForwardGpuWideBand.*/bf16_d64_causal_b2_sq1000_sk5000_h16_kv2:Grid/ForwardGpu.*/bf16_d256_full_b4_sq1000_sk300_h8_kv2:Grid/ForwardGpu.*/bf16_d128_full_b6_sq400_sk100_h32_kv8:Grid/ForwardGpu.*/bf16_d128_causal_b6_sq400_sk100_h32_kv8:SplitRound/ForwardGpu.*/bf16_d128_full_b4_sq1_sk1152_h37_kv37:SplitRound/ForwardGpu.*/bf16_d64_full_b1_sq100_sk9000_h4_kv4:PackGqaSplit/ForwardGpuPackGqa.*/bf16_d64_full_b3_sq1_sk9000_h8_kv2:ShortQueries/ForwardGpuShortQueries.*/bf16_d128_full_*:ShortQueries/ForwardGpuShortQueries.*/bf16_d128_causal_*:Grid/BackwardGpu.MatchesReference/bf16_d*_causal_b2_sq113_sk113_h4_kv2:Grid/BackwardGpu.MatchesReference/bf16_d128_softcap_b1_sq255_sk1000_h2_kv2:Grid/QuantizeGpu.*/*_s1000_per_block*:Grid/QuantizeGpu.*/*_s1000_per_head*' \
    >>"$log" 2>&1 || status=1
  grep -E 'ERROR SUMMARY|PASSED|FAILED' "$log"
  return "$status"
}

# FA3's wheel from .deps/peers (scripts/fetch_peers.sh), unpacked (a wheel is a zip archive; none of its
# listed dependencies is needed to run it but torch, which is there) into BUILD_DIR/peers-python, which
# goes onto PYTHONPATH for the peers.
install_fa3() {
  local target wheels=("$root"/.deps/peers/fa3_fwd-*.whl)
  local wheel=${wheels[0]}
  target=$(realpath -m "$BUILD_DIR/peers-python")
  if [[ ! -f $wheel ]]; then
    note "no FA3 wheel under .deps/peers: the FA3 column reads n/a (scripts/fetch_peers.sh fetches it)"
    return 0
  fi
  [[ -d $target/fa3_fwd ]] ||
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$target" ||
    { note "FA3 wheel $wheel did not install"; return 0; }
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
}

# FlashAttention-3 with its backward (the wheel has only the forward), built in place from the source
# that shared/peers/prepare_fa3_source.sh puts under .deps/fa3src: bf16, d 64 / 128 / 256, the
# features the backward table does not use left out; about 140 s on 16 cores, log in fa3_build.log.
install_fa3_source() {
  local src=$root/.deps/fa3src/hopper
  if [[ ! -f $src/setup.py ]]; then
    note "no FA3 source under .deps/fa3src: the backward's FA3 column reads n/a" \
         "(shared/peers/prepare_fa3_source.sh prepares it)"
    return 0
  fi
  if ! compgen -G "$src/flash_attn_3/_C*.so" >/dev/null; then
    (
      cd "$src" || exit 1
      for feature in FP16 SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA CLUSTER HDIM96 HDIM192 HDIMDIFF64 \
                     HDIMDIFF192 SM80 FP8 VARLEN; do
        export "FLASH_ATTENTION_DISABLE_$feature=TRUE"
      done
      MAX_JOBS=12 NVCC_THREADS=2 FLASH_ATTENTION_OFFLINE_BUILD=1 python3 setup.py build_ext --inplace
    ) >"$OUT/fa3_build.log" 2>&1 || { note "FA3's build failed (fa3_build.log): the FA3 column reads n/a"; return 0; }
  fi
  export PYTHONPATH="$src:$src/flash_attn_3${PYTHONPATH:+:$PYTHONPATH}"
}

stage_peers() {
  local merge=()
  install_fa3
  [[ -f $OUT/bench.json ]] && merge=(--flashhop-json "$OUT/bench.json")
  # shellcheck disable=SC2086  # PEERS_ARGS is a list of flags
  python3 "$root/tools/peers_sdpa.py" --json "$OUT/peers.json" "${merge[@]}" $PEERS_ARGS 2>&1 |
    tee "$OUT/peers.log"
}

# ncu (--clock-control none: the card keeps its own clocks) of one forward launch after warm-up, for
# each configuration in PROFILE_CONFIGS (flashhop-bench flags, ';'-separated): throughput, pipe
# use, stall reasons and memory traffic in profile.log; per-instruction stall sampling in
# profile_N.csv (ncu's source page), summarised into profile.log by tools/sass_hotspots.py; the
# reports themselves as profile_N.ncu-rep. Where the FA3 wheel is installed (install_fa3), FA3's
# forward on the same configuration (tools/fa3_launch.py) likewise, as profile_N_fa3.
stage_profile() {
  local log="$OUT/profile.log" status=0 config configs n=0 fa3=0
  command -v ncu >/dev/null || { note "ncu not found: no profile"; return 1; }
  install_fa3
  python3 -c 'import fa3_fwd_interface' 2>/dev/null && fa3=1
  : >"$log"
  # Profiles the 11th launch of the kernels matching $2 in the command $3...; reports under $1.
  profile_launch() {
    local report=$1 kernel=$2
    shift 2
    ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 10 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
      --import-source yes -f -o "$report" "$@" >>"$log" 2>&1 || return 1
    ncu --import "$report.ncu-rep" --page details >>"$log" 2>&1 || return 1
    ncu --import "$report.ncu-rep" --page source --csv --print-source sass >"$report.csv" 2>>"$log" &&
      python3 "$root/tools/sass_hotspots.py" "$report.csv" >>"$log" 2>&1
  }
  IFS=';' read -ra configs <<<"$PROFILE_CONFIGS"
  for config in "${configs[@]}"; do
    n=$((n + 1))
    echo "### $n: flashhop-bench $config" | tee -a "$log"
    # shellcheck disable=SC2086  # config is a list of flags
    profile_launch "$OUT/profile_$n" forward_kernel "$BUILD_DIR/tools/flashhop-bench" $config --warmup 20 --iters 5 ||
      status=1
    if [[ $fa3 -eq 1 ]]; then
      echo "### $n: FA3 (tools/fa3_launch.py) $config" | tee -a "$log"
      # shellcheck disable=SC2086
      profile_launch "$OUT/profile_${n}_fa3" device_kernel python3 "$root/tools/fa3_launch.py" $config || status=1
    fi
  done
  grep -E '^### |Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|^stall reasons' \
    "$log" | head -60
  return "$status"
}

# Per kernel function: counts of the instructions that show the design is in the machine code.
#   HGMMA       warpgroup MMA (wgmma)          UTMALDG / UTMASTG  TMA loads / stores
#   USETMAXREG  register reallocation          BAR.SYNC / BAR.ARV barriers (named ones carry an id)
#   SYNCS       mbarrier operations            LDL / STL          local memory (spills)
stage_sass() {
  local report="$OUT/sass_summary.txt"
  local status=0 objects
  if ! command -v cuobjdump >/dev/null; then
    note "cuobjdump not found: no SASS counts (ptxas lines only)"
    status=1
    objects=()
  else
    mapfile -t objects < <(find "$BUILD_DIR/CMakeFiles/flashhop.dir/src/kernels" -name '*.o' 2>/dev/null | sort)
  fi
  {
    echo "SASS instruction counts per kernel function ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    if [[ $status -eq 0 && ${#objects[@]} -eq 0 ]]; then
      echo "no kernel objects under $BUILD_DIR/CMakeFiles/flashhop.dir/src/kernels"
    fi
    local object
    for object in "${objects[@]}"; do
      echo
      echo "## ${object#"$BUILD_DIR"/}"
      cuobjdump --dump-sass "$object" | awk '
        function report() {
          if (name != "")
            printf "%s\n  HGMMA %d  UTMALDG %d  UTMASTG %d  USETMAXREG %d  BAR.SYNC %d  BAR.ARV %d  SYNCS %d  LDL %d  STL %d\n",
                   name, c["HGMMA"], c["UTMALDG"], c["UTMASTG"], c["USETMAXREG"], c["BAR.SYNC"],
                   c["BAR.ARV"], c["SYNCS"], c["LDL"], c["STL"]
          split("", c)
        }
        /Function :/ { report(); name = $3; next }
        # An instruction line: /*address*/ [@predicate] OPCODE.modifiers operands ;
        $1 ~ /^\/\*[0-9a-f]+\*\/$/ {
          i = ($2 ~ /^@/) ? 3 : 2
          split($i, p, ".")
          if (p[1] ~ /^(HGMMA|UTMALDG|UTMASTG|USETMAXREG|SYNCS|LDL|STL)$/) c[p[1]]++
          else if (p[1] == "BAR" && (p[2] == "SYNC" || p[2] == "ARV")) c["BAR." p[2]]++
        }
        END { report() }' | demangle
    done
    echo
    echo "ptxas -v (from build.log): registers, shared memory, stack frame, spills"
    grep -E 'ptxas (info|warning)|bytes stack frame|spill' "$OUT/build.log" 2>/dev/null ||
      echo "no ptxas lines (build skipped or FLASHHOP_PTXAS_VERBOSE off)"
  } >"$report" 2>&1
  head -60 "$report"
  return "$status"
}

# The GPU's SM clock, power and temperature every 100 ms while the stages run, beside the
# stages' start times in summary.txt: what the timings ran at.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 >"$OUT/smi.csv" 2>&1 &
smi_pid=$!
for stage in "${stages[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    note "unknown stage '$stage' (build test bench backward peers features gqa sanitize profile sass)"
    failed=1
    continue
  fi
  run_stage "$stage"
done
kill "$smi_pid" 2>/dev/null

echo
cat "$summary"
if [[ -f $OUT/peers.log ]]; then
  sed -n '/^| d | causal/,$p' "$OUT/peers.log"
elif [[ -f $OUT/bench.log ]]; then
  sed -n '/^| d (x dv) | mask/,$p' "$OUT/bench.log"
fi
# Everything once more in one archive, for a transport that returns only a few files of $OUT.
tar czf "$OUT/all_logs.tar.gz" -C "$OUT" --exclude=all_logs.tar.gz . 2>/dev/null
exit $failed
