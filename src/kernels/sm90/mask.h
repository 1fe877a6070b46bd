// Masks of the sm90 forward kernel as small policies. For a query tile (the queries first_query ..
// last_query) a mask answers which key tiles it visits and which of those need masking (KeyBlocks),
// and for a query which keys it sees (RowKeys). The mainloop starts on one key tile
// (KeyBlocks::first: a whole one where it can) and then walks the others downwards: first the tiles
// cut by the right edge of the visible band (the causal diagonal, the end of the keys), then whole
// tiles, then the tiles cut by its left edge (a sliding window). Host-callable, for the tests.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

namespace flashhop::sm90 {

// Key tiles of one query tile: [begin, end) are visited; tiles >= right_masked_from and tiles
// < left_masked_below need masking, the others are wholly visible to every row of the tile.
struct KeyBlocks {
  int begin, end;
  int right_masked_from, left_masked_below;
  CUTLASS_HOST_DEVICE bool empty() const { return end <= begin; }
  // The key tile a tile's walk starts with; the walk then runs down from end - 1, past it. The
  // first softmax is the one step with no P V of its own warpgroup to overlap, so it starts on a
  // whole tile (no masking code) where the last tile is masked and a whole one exists, the
  // highest; else on end - 1.
  CUTLASS_HOST_DEVICE int first() const {
    int const whole_end = end < right_masked_from ? end : right_masked_from;
    int const whole_begin = begin > left_masked_below ? begin : left_masked_below;
    return whole_end > whole_begin && whole_end < end ? whole_end - 1 : end - 1;
  }
};

// Keys [begin, end) are visible to one query row.
struct RowKeys {
  int begin, end;
};

// Every key visible; only keys at and past seqlen_k (the partial last key tile, which TMA filled
// with zeros) are masked.
struct NoMask {
  static constexpr bool kIsLocal = false;

  int seqlen_q, seqlen_k;

  template <int kBlockN>
  CUTLASS_HOST_DEVICE KeyBlocks key_blocks(int /*first_query*/, int /*last_query*/) const {
    return {0, cute::ceil_div(seqlen_k, kBlockN), seqlen_k / kBlockN, 0};
  }
  CUTLASS_HOST_DEVICE RowKeys row_keys(int /*query*/) const { return {0, seqlen_k}; }
};

// A band around the diagonal, aligned to the bottom-right corner: query row i sees keys j with
// i + offset - window_left <= j <= i + offset + window_right, offset = seqlen_k - seqlen_q.
// Causal attention is the band (unbounded, 0); the host writes an unbounded side, and any wider one,
// as the width that just reaches past the keys (window_left <= seqlen_k, window_right <= seqlen_q).
// Then every value below lies in [-seqlen_q, seqlen_q + seqlen_k + kBlockM], which validation keeps
// within 32 bits.
struct LocalMask {
  static constexpr bool kIsLocal = true;

  int seqlen_q, seqlen_k;
  int window_left, window_right;  // in [0, seqlen_k] and [0, seqlen_q]

  // First and one-past-last key row `row` could see, before clipping to [0, seqlen_k).
  CUTLASS_HOST_DEVICE int band_begin(int row) const { return row + (seqlen_k - seqlen_q) - window_left; }
  CUTLASS_HOST_DEVICE int band_end(int row) const { return row + (seqlen_k - seqlen_q) + window_right + 1; }
  CUTLASS_HOST_DEVICE int clip(int key) const { return key < 0 ? 0 : (key > seqlen_k ? seqlen_k : key); }

  // Queries past seqlen_q in the last query tile are computed but never stored; they count too.
  template <int kBlockN>
  CUTLASS_HOST_DEVICE KeyBlocks key_blocks(int first_query, int last_query) const {
    int const key_begin = clip(band_begin(first_query));
    int const key_end = clip(band_end(last_query));
    if (key_end <= key_begin) return {0, 0, 0, 0};
    KeyBlocks blocks;
    blocks.begin = key_begin / kBlockN;
    blocks.end = cute::ceil_div(key_end, kBlockN);
    // Tile n is whole on the right when even the first query sees its last key (clipping to
    // seqlen_k also marks the partial last key tile).
    blocks.right_masked_from = clip(band_end(first_query)) / kBlockN;
    // Tile n is whole on the left when even the last query sees its first key.
    blocks.left_masked_below = cute::ceil_div(clip(band_begin(last_query)), kBlockN);
    return blocks;
  }
  CUTLASS_HOST_DEVICE RowKeys row_keys(int row) const {
    return {clip(band_begin(row)), clip(band_end(row))};
  }
};

// Sets the scores of invisible keys to -inf. scores_rowcol: (rows, cols) view of the thread's S
// fragment; coords_rowcol: the same view of an identity tensor giving (row, col) within the tile;
// query_of(m): the query of the thread's row m (of the rowcol view).
template <class Mask, class Scores, class Coords, class QueryOf>
CUTLASS_DEVICE void apply_mask(Mask const& mask, Scores& scores_rowcol, Coords const& coords_rowcol,
                               QueryOf const& query_of, int col_offset) {
  CUTLASS_PRAGMA_UNROLL
  for (int m = 0; m < cute::size<0>(scores_rowcol); ++m) {
    // The row's visible keys, shifted into the tile's column coordinates.
    RowKeys const keys = mask.row_keys(query_of(m));
    int const begin = keys.begin - col_offset, end = keys.end - col_offset;
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < cute::size<1>(scores_rowcol); ++n) {
      int const col = cute::get<1>(coords_rowcol(m, n));
      if (col < begin || col >= end) scores_rowcol(m, n) = -cutlass::platform::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace flashhop::sm90
