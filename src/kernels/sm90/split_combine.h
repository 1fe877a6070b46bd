// The parts of a split tile (split_round.h) meet here: each consumer warpgroup of each part writes
// its normalised O and row LSEs to the workspace and counts itself in the tile's counter; the
// warpgroup that counts last merges every part, O = sum over parts of exp(lse_p - lse) O_p with
// lse = log sum exp(lse_p), and goes on to store O and LSE as a whole tile would. The merge reads
// the parts in key order, its own from the workspace too, so the result does not depend on which
// part finished last (outputs are bitwise identical from run to run).
#pragma once

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
  // o_accum and its rows' LSE in lse. Returns whether the caller is to store the tile: then o_accum
  // and lse hold the merge of all its parts. `last_flag`: an int in shared memory of this warpgroup.
  template <class OAccum, class RowValues>
  static CUTLASS_DEVICE bool merge(Params const& params, SplitRound const& plan, SplitRound::Part const& part,
                                   int slot, int& last_flag, OAccum& o_accum, RowValues& lse, int thread_idx,
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
    // Values of a thread are interleaved with the other threads' in float4 units, so that each
    // warp moves 512 contiguous bytes per instruction.
    auto const o_at = [&](float* partial, int m, int n4) {
      return reinterpret_cast<float4*>(partial) + (m * kCols / 4 + n4) * kThreadsPerWarpGroup + t;
    };
    auto const lse_at = [&](float* partial, int m) {
      return partial + kValuesPerThread * kThreadsPerWarpGroup + m * kThreadsPerWarpGroup + t;
    };
    auto const partial_of = [&](int s) { return params.partials + (s * kConsumers + consumer) * kPartialFloats; };

    float* const mine = partial_of(slot);
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int n4 = 0; n4 < kCols / 4; ++n4) {
        *o_at(mine, m, n4) = make_float4(o(m, 4 * n4), o(m, 4 * n4 + 1), o(m, 4 * n4 + 2), o(m, 4 * n4 + 3));
      }
      *lse_at(mine, m) = lse[m];
    }
    // Every thread's writes reach the device scope before the warpgroup counts itself in.
    __threadfence();
    sync_epilogue(consumer);
    if (t == 0) {
      int const arrived = atomicAdd(params.counters + part.tile * kConsumers + consumer, 1);
      last_flag = arrived == parts.count - 1;
    }
    sync_epilogue(consumer);
    bool const last = last_flag != 0;
    if (!last) return false;
    // The other parts' writes, fenced before their counts, are visible after ours; read them past L1.
    __threadfence();
    auto const slot_of = [&](int p) {
      return SplitRound::slot(parts.first_cta + p, p == 0 && parts.first_is_second ? 1 : 0);
    };
    float const kMinusInf = -cutlass::platform::numeric_limits<float>::infinity();
    float lse_max[kRows], sum[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) lse_max[m] = kMinusInf, sum[m] = 0.f;
    for (int p = 0; p < parts.count; ++p) {
      float* const partial = partial_of(slot_of(p));
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) lse_max[m] = fmaxf(lse_max[m], __ldcg(lse_at(partial, m)));
    }
    for (int p = 0; p < parts.count; ++p) {
      float* const partial = partial_of(slot_of(p));
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) {
        float const part_lse = __ldcg(lse_at(partial, m));
        if (part_lse != kMinusInf) sum[m] += expf(part_lse - lse_max[m]);
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) lse[m] = sum[m] > 0.f ? lse_max[m] + logf(sum[m]) : kMinusInf;
    for (int p = 0; p < parts.count; ++p) {
      float* const partial = partial_of(slot_of(p));
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) {
        float const part_lse = __ldcg(lse_at(partial, m));
        float const weight = part_lse == kMinusInf ? 0.f : expf(part_lse - lse[m]);
        CUTLASS_PRAGMA_UNROLL
        for (int n4 = 0; n4 < kCols / 4; ++n4) {
          float4 const v = __ldcg(o_at(partial, m, n4));
          float const base = p == 0 ? 0.f : 1.f;
          o(m, 4 * n4) = fmaf(weight, v.x, base * o(m, 4 * n4));
          o(m, 4 * n4 + 1) = fmaf(weight, v.y, base * o(m, 4 * n4 + 1));
          o(m, 4 * n4 + 2) = fmaf(weight, v.z, base * o(m, 4 * n4 + 2));
          o(m, 4 * n4 + 3) = fmaf(weight, v.w, base * o(m, 4 * n4 + 3));
        }
      }
    }
    return true;
  }
};

}  // namespace flashhop::sm90
