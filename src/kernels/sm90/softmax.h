// Online softmax over the key tiles of one query tile, in registers (FlashAttention-2/3 form).
// Each consumer thread holds kRows query rows of S; a row is spread over the 4 threads of a quad.
// Scores stay unscaled; exp2 with the scale folded into log2(e) turns exp into one FFMA + EX2.
// With soft-capping the kept score is tanh(s * softmax_scale / softcap) and the scale is softcap.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashhop::sm90 {

// Reduces `value` over the 4 lanes that share a row of a wgmma accumulator.
template <class Op>
CUTLASS_DEVICE float quad_allreduce(float value, Op op) {
  value = op(value, __shfl_xor_sync(0xffffffff, value, 1));
  value = op(value, __shfl_xor_sync(0xffffffff, value, 2));
  return value;
}

// 2^x by the MUFU unit (ex2.approx, flush-to-zero): exp2f would add range handling that the
// max-subtracted arguments (<= 0, or -inf for masked scores) never need.
CUTLASS_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x and log2(x) by the MUFU unit (rcp.approx: at most 1 ulp; lg2.approx: absolute error about
// 2^-22; both flush denormals, which finalize's row sums, at least 1, never are). The IEEE division
// and logf put a slow-path branch or a polynomial on the chain between a tile's last P V and its
// epilogue (a shorter tile boundary: decision log D32).
CUTLASS_DEVICE float fast_reciprocal(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
CUTLASS_DEVICE float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh by the MUFU unit (tanh.approx.f32, relative error about 2^-11, below bf16's rounding).
CUTLASS_DEVICE float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Soft-capping of a score tile (rows, cols): s -> tanh(s * prescale), prescale = softmax_scale / softcap.
// Masking comes after it, so masked keys still end at -inf.
template <class Scores>
CUTLASS_DEVICE void apply_softcap(Scores& scores, float prescale) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < cute::size(scores); ++i) scores(i) = fast_tanh(scores(i) * prescale);
}

// op over the columns of row m of `scores` (rows, cols) in kChains > 1 interleaved chains of
// dependent instructions, folded at the end (the recipe table says which kernels use them, and why).
template <int kChains, class Scores, class Op>
CUTLASS_DEVICE float interleaved_row_reduce(Scores const& scores, int m, Op op) {
  constexpr int kCols = decltype(cute::size<1>(scores))::value;
  static_assert(kChains > 1 && kChains <= kCols);
  float chain[kChains];
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < kChains; ++c) chain[c] = scores(m, c);
  CUTLASS_PRAGMA_UNROLL
  for (int n = kChains; n < kCols; ++n) chain[n % kChains] = op(chain[n % kChains], scores(m, n));
  CUTLASS_PRAGMA_UNROLL
  for (int c = 1; c < kChains; ++c) chain[0] = op(chain[0], chain[c]);
  return chain[0];
}

// Per key tile factors of the FP8 forward's block scaling (fwd_mainloop.h: tile_factors): the
// kept scores are `score` (> 0) times the computed ones, and P V takes P times 2^p_log2, which the
// row sums leave out (times inv_p = 2^-p_log2). Folded into the softmax's per-row terms, they cost
// no instruction per score. The 16-bit kernels pass none.
struct NoTileFactors {};
struct TileFactors {
  float score;
  float p_log2;
  float inv_p;
};

// kChains: dependency chains of the row max and row sum over a thread's columns (one running
// chain, or interleaved_row_reduce's).
template <int kRows, int kChains>
struct OnlineSoftmax {
  using RowValues = cute::array<float, kRows>;

  // A row's max is raised only when a tile's scores exceed it by more than 2^8 after exp (then
  // exp(s - max) <= 256 stays well inside float and bf16). Between raises O needs no rescale, and
  // rescale() skips a warp whose factors are all 1: almost every tile past the first few (decision log D14).
  static constexpr float kMaxSlackLog2 = 8.f;

  float scale_log2;   // score scale * log2(e)
  float max_slack;    // kMaxSlackLog2 in raw-score units
  RowValues row_max;  // the max subtracted before exp: within max_slack below the running max of the raw scores
  RowValues row_sum;  // running sum of exp, this thread's columns only (reduced in totals)

  CUTLASS_DEVICE explicit OnlineSoftmax(float score_scale_log2)
      : scale_log2(score_scale_log2), max_slack(kMaxSlackLog2 / score_scale_log2) {
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      row_max[m] = -cutlass::platform::numeric_limits<float>::infinity();
      row_sum[m] = 0.f;
    }
  }

  // Row m's max over the quad from this thread's `tile_max` (which includes row_max[m]): raises
  // row_max[m] where the tile passes it by more than max_slack, sets the factor that takes O to
  // the new max, and returns the max to subtract in the exp2 domain.
  template <bool kIsFirst>
  CUTLASS_DEVICE float raise_max(int m, float tile_max, float& o_scale) {
    float const tile_row_max = quad_allreduce(tile_max, [](float a, float b) { return fmaxf(a, b); });
    // From -inf (no visible key yet) any finite max raises it.
    bool const raise = kIsFirst || tile_row_max > row_max[m] + max_slack;
    float const new_max = raise ? tile_row_max : row_max[m];
    // A row with no visible key yet keeps max = -inf; subtract 0 then, so exp2(-inf) = 0, not NaN.
    float const max_scaled =
        new_max == -cutlass::platform::numeric_limits<float>::infinity() ? 0.f : new_max * scale_log2;
    o_scale = raise && !kIsFirst ? fast_exp2(row_max[m] * scale_log2 - max_scaled) : 1.f;
    row_max[m] = new_max;
    return max_scaled;
  }

  // Folds one tile of scores (rows, cols) into the running max and sum, replaces the scores with
  // P = exp(scale * (s - max)) (with TileFactors: s times factors.score, P times 2^p_log2), and
  // returns per row the factor by which O must be rescaled.
  template <bool kIsFirst, class Scores>
  CUTLASS_DEVICE RowValues update(Scores& scores, NoTileFactors = {}) {
    return update_rows<kIsFirst, /*kFactors=*/false>(scores, TileFactors{});
  }
  template <bool kIsFirst, class Scores>
  CUTLASS_DEVICE RowValues update(Scores& scores, TileFactors const& factors) {
    return update_rows<kIsFirst, /*kFactors=*/true>(scores, factors);
  }
  template <bool kIsFirst, bool kFactors, class Scores>
  CUTLASS_DEVICE RowValues update_rows(Scores& scores, TileFactors const& factors) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    RowValues o_scale;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      // Without factors the reduction starts from the running max; with them the tile's max is
      // scaled first (the running max is of kept scores).
      float tile_max = kFactors ? -cutlass::platform::numeric_limits<float>::infinity() : row_max[m];
      if constexpr (kChains == 1) {
        CUTLASS_PRAGMA_UNROLL
        for (int n = 0; n < cute::size<1>(scores); ++n) tile_max = fmaxf(tile_max, scores(m, n));
      } else {
        tile_max = fmaxf(tile_max, interleaved_row_reduce<kChains>(scores, m, [](float a, float b) { return fmaxf(a, b); }));
      }
      float exponent_scale = scale_log2;
      if constexpr (kFactors) {
        tile_max = fmaxf(row_max[m], tile_max * factors.score);
        exponent_scale *= factors.score;
      }
      float const max_scaled = raise_max<kIsFirst>(m, tile_max, o_scale[m]);
      float offset = -max_scaled;
      if constexpr (kFactors) offset += factors.p_log2;
      float tile_sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < cute::size<1>(scores); ++n) {
        scores(m, n) = fast_exp2(fmaf(scores(m, n), exponent_scale, offset));
        if constexpr (kChains == 1) tile_sum += scores(m, n);
      }
      if constexpr (kChains > 1) {
        tile_sum = interleaved_row_reduce<kChains>(scores, m, [](float a, float b) { return a + b; });
      }
      if constexpr (kFactors) tile_sum *= factors.inv_p;
      row_sum[m] = kIsFirst ? tile_sum : fmaf(row_sum[m], o_scale[m], tile_sum);
    }
    return o_scale;
  }

  // update() of a masked tile whose `columns` (mask.h: WarpColumnChunks) say which chunks of
  // columns hold a key that some row of the warp sees: the others stay out of the max and get P = 0
  // without an exponential. Each pass runs over the thread's rows inside a chunk, so that a chunk's
  // branch holds the dependency chains of all rows side by side.
  template <bool kIsFirst, class Scores, class Columns>
  CUTLASS_DEVICE RowValues update(Scores& scores, Columns const& columns) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    static_assert(kChains == 1, "chunks of columns with one chain only");
    constexpr int kPerChunk = Columns::kViewColumnsPerChunk;
    constexpr int kChunks = decltype(cute::size<1>(scores))::value / kPerChunk;
    RowValues tile_max = row_max;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (!columns.live(c)) continue;
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kRows; ++m) {
        CUTLASS_PRAGMA_UNROLL
        for (int n = c * kPerChunk; n < (c + 1) * kPerChunk; ++n) tile_max[m] = fmaxf(tile_max[m], scores(m, n));
      }
    }
    RowValues o_scale, max_scaled, tile_sum;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      max_scaled[m] = raise_max<kIsFirst>(m, tile_max[m], o_scale[m]);
      tile_sum[m] = 0.f;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (columns.live(c)) {
        CUTLASS_PRAGMA_UNROLL
        for (int m = 0; m < kRows; ++m) {
          CUTLASS_PRAGMA_UNROLL
          for (int n = c * kPerChunk; n < (c + 1) * kPerChunk; ++n) {
            scores(m, n) = fast_exp2(fmaf(scores(m, n), scale_log2, -max_scaled[m]));
            tile_sum[m] += scores(m, n);
          }
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int m = 0; m < kRows; ++m) {
          CUTLASS_PRAGMA_UNROLL
          for (int n = c * kPerChunk; n < (c + 1) * kPerChunk; ++n) scores(m, n) = 0.f;
        }
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) row_sum[m] = kIsFirst ? tile_sum[m] : fmaf(row_sum[m], o_scale[m], tile_sum[m]);
    return o_scale;
  }

  static CUTLASS_DEVICE RowValues unit_factors() {
    RowValues ones;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) ones[m] = 1.f;
    return ones;
  }

  // Multiplies each row of O (rows, cols) by its factor; nothing when every factor of the warp is 1.
  template <class Accum>
  CUTLASS_DEVICE static void rescale(Accum&& o, RowValues const& factor) {
    bool changes = false;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) changes |= factor[m] != 1.f;
    if (!__any_sync(0xffffffff, changes)) return;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < cute::size<1>(o); ++n) o(m, n) *= factor[m];
    }
  }

  // What normalising O takes, per row: 1 / sum and the natural-log LSE; score_scale is the scale
  // whose log2(e) multiple this softmax was built with. A row that saw no key gets 0 and -inf.
  // Reads only the row statistics, so that the mainloop can compute them while the tensor cores
  // run the tile's last P V (fwd_mainloop.h, kTotalsUnderLastPV).
  struct RowTotals {
    RowValues inv_sum, lse;
  };
  CUTLASS_DEVICE RowTotals totals(float score_scale) const {
    constexpr float kLn2 = 0.6931471805599453f;
    RowTotals out;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      float const sum = quad_allreduce(row_sum[m], [](float a, float b) { return a + b; });
      bool const empty = !(sum > 0.f);
      out.inv_sum[m] = empty ? 0.f : fast_reciprocal(sum);
      out.lse[m] = empty ? -cutlass::platform::numeric_limits<float>::infinity()
                         : row_max[m] * score_scale + fast_log2(sum) * kLn2;
    }
    return out;
  }

  // Normalises O (rows, cols) by the row sums and returns the LSE per row (as totals).
  template <class Accum>
  CUTLASS_DEVICE RowValues finalize(Accum&& o, float score_scale) const {
    RowTotals const rows = totals(score_scale);
    rescale(o, rows.inv_sum);
    return rows.lse;
  }
};

}  // namespace flashhop::sm90
