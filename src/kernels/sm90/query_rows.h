// Where the rows of a query tile come from. A work tile is kBlockM consecutive "tile rows" of one
// (tile head, batch) pair:
//  - unpacked, the tile head is a query head, and tile row p is query p of it;
//  - with the query heads of a KV group packed (GQA, PackGqa), the tile head is the KV head, and
//    tile row p is query p / g of query head tile_head * g + p % g, g = nheads / nheads_kv. For a
//    short seqlen_q the g heads together fill the tile, and the CTA reads their shared K/V once.
// Masks see queries, so a packed tile's rows span the queries first_query(m) .. last_query(m).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernels/sm90/fwd_recipe.h"

namespace flashhop::sm90 {

template <bool kPackGqa>
struct QueryRows {
  int rows;                       // tile rows per tile head: seqlen_q, or seqlen_q * g packed
  int heads_per_kv_head;          // g
  cutlass::FastDivmod group;      // divides by g

  struct Row {
    int query, head;  // sequence index and query head
  };

  static QueryRows make(int seqlen_q, int nheads, int nheads_kv) {
    int const g = nheads / nheads_kv;
    return {static_cast<int>(tile_rows_per_head(seqlen_q, nheads, nheads_kv, kPackGqa)), g, cutlass::FastDivmod(g)};
  }
  static int tile_heads(int nheads, int nheads_kv) { return tile_heads_of(nheads, nheads_kv, kPackGqa); }

  // Tile rows of seqlen_q queries (a variable-length batch's sequence).
  CUTLASS_HOST_DEVICE int rows_of(int seqlen_q) const { return kPackGqa ? seqlen_q * heads_per_kv_head : seqlen_q; }

  CUTLASS_DEVICE int query(int tile_row) const { return kPackGqa ? group.divide(tile_row) : tile_row; }
  CUTLASS_DEVICE Row locate(int tile_row, int tile_head) const {
    if constexpr (kPackGqa) {
      int query, in_group;
      group(query, in_group, tile_row);
      return {query, tile_head * heads_per_kv_head + in_group};
    } else {
      return {tile_row, tile_head};
    }
  }
  CUTLASS_DEVICE int kv_head(int tile_head) const {
    return kPackGqa ? tile_head : group.divide(tile_head);
  }
};

}  // namespace flashhop::sm90
