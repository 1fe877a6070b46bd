// Masks of the sm90 forward kernel as small policies. Each answers three questions for a query
// tile: how many key tiles it visits ([0, n_block_end)), from which key tile on scores need masking
// (the loop walks key tiles downwards, so the masked ones come first), and how to mask a score tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

namespace flashhop::sm90 {

// Masks keys at and past seqlen_k (the partial last key tile; TMA filled those rows with zeros).
struct NoMask {
  static constexpr bool kIsCausal = false;

  int seqlen_q, seqlen_k;

  template <int kBlockM, int kBlockN>
  CUTLASS_DEVICE int n_block_end(int /*m_block*/) const {
    return cute::ceil_div(seqlen_k, kBlockN);
  }
  template <int kBlockM, int kBlockN>
  CUTLASS_DEVICE int first_masked_n_block(int /*m_block*/) const {
    return seqlen_k / kBlockN;
  }
  // Key column `col` is visible from query row `row` (both global indices).
  CUTLASS_DEVICE bool visible(int /*row*/, int col) const { return col < seqlen_k; }
};

// Bottom-right aligned causal: query row i sees keys j <= i + (seqlen_k - seqlen_q).
struct CausalMask {
  static constexpr bool kIsCausal = true;

  int seqlen_q, seqlen_k;

  CUTLASS_DEVICE int diagonal_offset() const { return seqlen_k - seqlen_q; }

  template <int kBlockM, int kBlockN>
  CUTLASS_DEVICE int n_block_end(int m_block) const {
    // Last key the tile's bottom valid row sees, plus one; <= 0 when every row is masked.
    int const key_end = cute::min((m_block + 1) * kBlockM, seqlen_q) + diagonal_offset();
    return cute::min(cute::ceil_div(seqlen_k, kBlockN), key_end <= 0 ? 0 : cute::ceil_div(key_end, kBlockN));
  }
  template <int kBlockM, int kBlockN>
  CUTLASS_DEVICE int first_masked_n_block(int m_block) const {
    // The tile's top row sees keys up to m_block * kBlockM + offset: tiles past that are cut.
    int const top_row_last_key = m_block * kBlockM + diagonal_offset();
    int const diagonal = top_row_last_key < 0 ? 0 : (top_row_last_key + 1) / kBlockN;
    return cute::min(diagonal, seqlen_k / kBlockN);
  }
  CUTLASS_DEVICE bool visible(int row, int col) const {
    return col < seqlen_k && col <= row + diagonal_offset();
  }
};

// Sets masked scores to -inf. scores_rowcol: (rows, cols) view of the thread's S fragment;
// coords_rowcol: the same view of an identity tensor giving (row, col) within the tile.
template <class Mask, class Scores, class Coords>
CUTLASS_DEVICE void apply_mask(Mask const& mask, Scores& scores_rowcol, Coords const& coords_rowcol,
                               int row_offset, int col_offset) {
  CUTLASS_PRAGMA_UNROLL
  for (int m = 0; m < cute::size<0>(scores_rowcol); ++m) {
    int const row = row_offset + cute::get<0>(coords_rowcol(m, 0));
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < cute::size<1>(scores_rowcol); ++n) {
      int const col = col_offset + cute::get<1>(coords_rowcol(m, n));
      if (!mask.visible(row, col)) scores_rowcol(m, n) = -cutlass::platform::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace flashhop::sm90
