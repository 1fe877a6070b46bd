// The parts of a split tile (split_round.h) meet here. The tile's first part in key order merges:
// it is always the last part of its CTA (a CTA's run is contiguous and no longer than a tile, so a
// run that holds a tile's first key tile ends within the tile, or holds all of it, unsplit), so it
// ends with the other parts that end their CTAs' runs, while the tile's last part, often the first
// part of a CTA with one more to go, ends early. Every other part's consumer warpgroup writes its
// normalised O and row LSEs to the workspace, counts itself in the tile's counter and goes on
// without waiting for the count; the merging warpgroup waits until the counter holds every other
// part, then merges them with its own O, still in registers: O = sum over parts of
// exp(lse_p - lse) O_p with lse = log sum exp(lse_p), and goes on to store O and LSE as a whole
// tile would. The parts are summed in key order, so outputs are bitwise identical from run to run.
// The wait assumes that the CTAs of the persistent grid (one or two per SM) run at the same time,
// as the grid is sized to; a part never waits for a part of a lower CTA index than its own.
#pragma once

#include <cuda/atomic>
#include <cute/tensor.hpp>

#include "kernels/sm90/barriers.h"
#include "kernels/sm90/gmma_utils.h"
#include "kernels/sm90/split_round.h"

namespace flashhop::sm90 {

template <int kHeadDimV, int kConsumers>
struct SplitCombine {
  static constexpr int kPartialFloats = SplitWorkspace::partial_floats(kHeadDimV);
  static constexpr int kValuesPerThread = kHeadDimV / 2;  // of O, per thread of a 64-row warpgroup tile

  struct Params {
    int* counters;    // (split tile, consumer warpgroup), zero at launch
    float* partials;  // (slot, consumer warpgroup, kPartialFloats)
  };

  static Params to_params(void* workspace, SplitRound const& plan) {
    if (!plan.splits()) return {nullptr, nullptr};
    auto* const bytes = static_cast<unsigned char*>(workspace);
    return {reinterpret_cast<int*>(bytes),
            reinterpret_cast<float*>(bytes + SplitWorkspace::counter_bytes(plan, kConsumers))};
  }

  // This warpgroup's part `part` of CTA slot `slot` (SplitRound::slot), with its normalised O in
  // o_accum and its rows' LSE in lse; `rows`: how many of the warpgroup's 64 rows exist (warps
  // whose rows all lie past them neither write nor merge). Returns whether the caller is to store
  // the tile: then o_accum and lse hold the merge of all its parts.
  template <class OAccum, class RowValues>
  static CUTLASS_DEVICE bool merge(Params const& params, SplitRound const& plan, SplitRound::Part const& part,
                                   int slot, int rows, OAccum& o_accum, RowValues& lse, int thread_idx,
                                   int consumer) {
    using namespace cute;
    SplitRound::Parts const parts = plan.parts_of(part.tile);
    if (parts.count == 1) return true;  // the part is the whole tile
    Tensor o = rowcol_view(o_accum);    // (rows, cols)
    constexpr int kRows = decltype(size<0>(o))::value;
    constexpr int kCols = decltype(size<1>(o))::value;
    static_assert(kRows == SplitWorkspace::kRowsPerThread && kRows * kCols == kValuesPerThread,
                  "one 64-row wgmma accumulator per warpgroup");
    static_assert(kCols % 4 == 0, "O moves in float4 units");
    int const t = thread_idx % kThreadsPerWarpGroup;
    // Whether the warp holds a row that exists: in the wgmma accumulator, warp w holds rows 16 w to
    // 16 w + 15. Decoding fills 4 of 64 rows (4-head groups), all in warp 0: the other warps move
    // nothing. Decided per warp by a vote: a per-thread branch makes ptxas keep the kernel's wgmma
    // descriptors in vector registers (an R2UR pair per wgmma in every key-tile step: decision log D59).
    bool const has_rows = __any_sync(0xffffffffu, 16 * (t / 32) < rows);
    // Values of a thread are interleaved with the other threads' in float4 units, so that each
    // warp moves 512 contiguous bytes per instruction.
    auto const o_at = [&](float* partial, int m, int n4) {
      return reinterpret_cast<float4*>(partial) + (m * kCols / 4 + n4) * kThreadsPerWarpGroup + t;
    };
    auto const lse_at = [&](float* partial, int m) {
      return partial + kValuesPerThread * kThreadsPerWarpGroup + m * kThreadsPerWarpGroup + t;
    };
    auto const partial_of = [&](int s) { return params.partials + (s * kConsumers + consumer) * kPartialFloats; };
    auto const slot_of = [&](int p) {
      return SplitRound::slot(parts.first_cta + p, p == 0 && parts.first_is_second ? 1 : 0);
    };
    int* const counter = params.counters + part.tile * kConsumers + consumer;

    if (slot != slot_of(0)) {
      if (has_rows) {
        float* const mine = partial_of(slot);
        CUTLASS_PRAGMA_UNROLL
        for (int m = 0; m < kRows; ++m) {
          CUTLASS_PRAGMA_UNROLL
          for (int n4 = 0; n4 < kCols / 4; ++n4) {
            *o_at(mine, m, n4) = make_float4(o(m, 4 * n4), o(m, 4 * n4 + 1), o(m, 4 * n4 + 2), o(m, 4 * n4 + 3));
          }
          *lse_at(mine, m) = lse[m];
        }
      }
      // The warpgroup's writes precede thread 0's count (the barrier), which releases them at the
      // device scope: thread 0 waits for them to be written, but not for the count. The release
      // fence delays the CTA's next part, whose first wgmma waits for warp 0 (decision log D128);
      // the parts that do not merge never wait for one another.
      sync_epilogue(consumer);
      if (t == 0) cuda::atomic_ref<int, cuda::thread_scope_device>(*counter).fetch_add(1, cuda::memory_order_release);
      return false;
    }
    if (t == 0) {
      cuda::atomic_ref<int, cuda::thread_scope_device> const arrived(*counter);
      while (arrived.load(cuda::memory_order_acquire) != parts.count - 1) {
      }
    }
    // The other parts' writes, acquired by thread 0, are visible to the warpgroup past the barrier;
    // read them past L1.
    sync_epilogue(consumer);
    if (!has_rows) return true;
    // Each load is a trip to L2 under the kernel's own DRAM traffic (slow: decision log D128). So
    // the other parts' LSEs go in batches of kLseBatch whose loads are issued together, with a
    // running max and sum: lse = max + log(sum of exp(lse_p - max)). Then O = sum of
    // exp(lse_p - lse) O_p, this part's O first, then one part at a time (two parts' O in
    // registers make ptxas spill). The merge's form: decision log D58.
    constexpr int kLseBatch = 4;
    float const kMinusInf = -cutlass::platform::numeric_limits<float>::infinity();
    float lse_max[kRows], sum[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) lse_max[m] = lse[m], sum[m] = lse[m] == kMinusInf ? 0.f : 1.f;
    for (int p0 = 1; p0 < parts.count; p0 += kLseBatch) {
      float part_lse[kLseBatch][kRows];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kLseBatch; ++j) {
        CUTLASS_PRAGMA_UNROLL
        for (int m = 0; m < kRows; ++m) {
          part_lse[j][m] = p0 + j < parts.count ? __ldcg(lse_at(partial_of(slot_of(p0 + j)), m)) : kMinusInf;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) {
        float batch_max = lse_max[m];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kLseBatch; ++j) batch_max = fmaxf(batch_max, part_lse[j][m]);
        if (batch_max == kMinusInf) continue;  // no key seen yet
        float batch_sum = sum[m] * expf(lse_max[m] - batch_max);  // 0 while lse_max is -inf
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kLseBatch; ++j) {
          if (part_lse[j][m] != kMinusInf) batch_sum += expf(part_lse[j][m] - batch_max);
        }
        lse_max[m] = batch_max;
        sum[m] = batch_sum;
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      float const own_lse = lse[m];
      lse[m] = sum[m] > 0.f ? lse_max[m] + logf(sum[m]) : kMinusInf;
      float const weight = own_lse == kMinusInf ? 0.f : expf(own_lse - lse[m]);
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < kCols; ++n) o(m, n) *= weight;
    }
    for (int p = 1; p < parts.count; ++p) {
      float* const partial = partial_of(slot_of(p));
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) {
        float const part_lse = __ldcg(lse_at(partial, m));
        float const weight = part_lse == kMinusInf ? 0.f : expf(part_lse - lse[m]);
        CUTLASS_PRAGMA_UNROLL
        for (int n4 = 0; n4 < kCols / 4; ++n4) {
          float4 const v = __ldcg(o_at(partial, m, n4));
          o(m, 4 * n4) = fmaf(weight, v.x, o(m, 4 * n4));
          o(m, 4 * n4 + 1) = fmaf(weight, v.y, o(m, 4 * n4 + 1));
          o(m, 4 * n4 + 2) = fmaf(weight, v.z, o(m, 4 * n4 + 2));
          o(m, 4 * n4 + 3) = fmaf(weight, v.w, o(m, 4 * n4 + 3));
        }
      }
    }
    return true;
  }
};

}  // namespace flashhop::sm90
