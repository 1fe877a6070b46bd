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

// Query tiles [begin, end) hold a query that sees some key of a key tile (the backward's walk).
struct QueryBlocks {
  int begin, end;
  CUTLASS_HOST_DEVICE bool empty() const { return end <= begin; }
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
  CUTLASS_HOST_DEVICE bool sees_whole_tile(int /*first_query*/, int /*rows*/, int /*first_key*/, int /*keys*/) const {
    return true;
  }
  // The query tiles that see keys [first_key, last_key] (last_key < seqlen_k): all of them.
  template <int kBlockM>
  CUTLASS_HOST_DEVICE QueryBlocks query_blocks(int /*first_key*/, int /*last_key*/) const {
    return {0, cute::ceil_div(seqlen_q, kBlockM)};
  }
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
  // Whether each of queries [first_query, first_query + rows) sees each of keys [first_key,
  // first_key + keys): the last query's band starts at or before the first key, and the first
  // query's ends after the last.
  CUTLASS_HOST_DEVICE bool sees_whole_tile(int first_query, int rows, int first_key, int keys) const {
    return band_begin(first_query + rows - 1) <= first_key && band_end(first_query) >= first_key + keys;
  }
  // The query tiles with a query that sees one of keys [first_key, last_key] (last_key < seqlen_k):
  // queries i with band_begin(i) <= last_key and band_end(i) > first_key, within [0, seqlen_q).
  template <int kBlockM>
  CUTLASS_HOST_DEVICE QueryBlocks query_blocks(int first_key, int last_key) const {
    int const offset = seqlen_k - seqlen_q;
    int const first = cute::max(first_key - offset - window_right, 0);
    int const last = cute::min(last_key - offset + window_left, seqlen_q - 1);
    if (last < first) return {0, 0};
    return {first / kBlockM, last / kBlockM + 1};
  }
};

// The columns of one warp's rows of a score tile, in chunks of kChunk keys: which chunks hold a key
// that some row of the warp sees (live) and which hold only keys that every row sees (whole), as
// ranges of chunks, the same in every lane. A chunk that is not live needs neither masking nor
// exponentials (its P is 0); a whole one needs no masking. In the (rows, cols) view of a wgmma
// accumulator a thread holds two adjacent columns of every group of 8 (gmma_utils.h), so column n
// of the view lies in the tile's columns [8 (n / 2), 8 (n / 2) + 8), and chunk c is the view's
// columns [c kChunk / 4, (c + 1) kChunk / 4).
template <int kChunk>
struct WarpColumnChunks {
  int live_begin, live_end;
  int whole_begin, whole_end;
  static constexpr int kViewColumnsPerChunk = kChunk / 4;  // columns of the (rows, cols) view, below
  CUTLASS_DEVICE bool live(int chunk) const { return chunk >= live_begin && chunk < live_end; }
  CUTLASS_DEVICE bool whole(int chunk) const { return chunk >= whole_begin && chunk < whole_end; }
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

// apply_mask for one warp's rows of a band (LocalMask), chunk by chunk (WarpColumnChunks): masks
// only the live chunks that are not whole and returns the chunks, for the softmax to skip the
// others. All 32 lanes of the warp take part. On a causal diagonal of 128 x 128 a warp's 16 rows
// see at most half of the chunks in the upper warpgroup, and each warp's rows cut one or two of them.
template <int kChunk, class Mask, class Scores, class Coords, class QueryOf>
CUTLASS_DEVICE WarpColumnChunks<kChunk> apply_mask_by_chunks(Mask const& mask, Scores& scores_rowcol,
                                                             Coords const& coords_rowcol, QueryOf const& query_of,
                                                             int col_offset) {
  constexpr int kRows = decltype(cute::size<0>(scores_rowcol))::value;
  constexpr int kCols = decltype(cute::size<1>(scores_rowcol))::value;
  constexpr int kPerChunk = WarpColumnChunks<kChunk>::kViewColumnsPerChunk;
  constexpr int kChunks = kCols / kPerChunk;
  static_assert(kChunk % 8 == 0 && kCols % kPerChunk == 0, "chunks of whole column groups of 8");
  // Each row's visible keys in the tile's columns; over the warp, the lowest and highest begin and end.
  int begin[kRows], end[kRows];
  int begin_min = 0, begin_max = 0, end_min = 0, end_max = 0;
  CUTLASS_PRAGMA_UNROLL
  for (int m = 0; m < kRows; ++m) {
    RowKeys const keys = mask.row_keys(query_of(m));
    begin[m] = keys.begin - col_offset;
    end[m] = keys.end - col_offset;
    begin_min = m == 0 ? begin[m] : cute::min(begin_min, begin[m]);
    begin_max = m == 0 ? begin[m] : cute::max(begin_max, begin[m]);
    end_min = m == 0 ? end[m] : cute::min(end_min, end[m]);
    end_max = m == 0 ? end[m] : cute::max(end_max, end[m]);
  }
  begin_min = __reduce_min_sync(0xffffffff, begin_min);
  begin_max = __reduce_max_sync(0xffffffff, begin_max);
  end_min = __reduce_min_sync(0xffffffff, end_min);
  end_max = __reduce_max_sync(0xffffffff, end_max);
  // Clamped to the tile's columns before dividing, so that every quotient rounds as meant.
  auto const clamp = [](int col) { return cute::max(0, cute::min(col, kChunks * kChunk)); };
  WarpColumnChunks<kChunk> chunks;
  chunks.live_begin = clamp(begin_min) / kChunk;
  chunks.live_end = (clamp(end_max) + kChunk - 1) / kChunk;
  chunks.whole_begin = (clamp(begin_max) + kChunk - 1) / kChunk;
  chunks.whole_end = clamp(end_min) / kChunk;
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    if (!chunks.live(c) || chunks.whole(c)) continue;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int n = c * kPerChunk; n < (c + 1) * kPerChunk; ++n) {
        int const col = cute::get<1>(coords_rowcol(m, n));
        if (col < begin[m] || col >= end[m]) scores_rowcol(m, n) = -cutlass::platform::numeric_limits<float>::infinity();
      }
    }
  }
  return chunks;
}

}  // namespace flashhop::sm90
