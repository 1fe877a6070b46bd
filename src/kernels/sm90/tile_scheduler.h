// Tile schedulers of the sm90 forward kernel. A work tile is one query tile (block_m rows) of one
// head of one batch entry. The kernel walks its tiles as
//   for (index = first_tile(); index < params.num_tiles; index = next_tile(params, index)) ...
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

#include <cuda_runtime_api.h>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

// Tile indices are 32-bit: a tile is 128 query rows of one head, so 2^31 tiles would need a Q of
// more than 2^31 x 128 x 64 x 2 bytes. Every division by a launch constant goes through a
// precomputed FastDivmod (a multiply and a shift): each CTA maps a tile index to its tile once per
// tile in each warp role, on the path between two tiles (H200, d = 64 causal, seqlen 512: 180
// TFLOP/s with 64-bit divisions, 214 with FastDivmod, in two runs on different machine starts).

// Equal tiles (no causal mask), persistent: at most one CTA per SM; CTA c takes tiles c,
// c + gridDim.x, ... Later tiles' loads overlap earlier tiles' epilogues, and no CTA start-up is
// paid per tile. Query tile fastest, so that the CTAs working at the same time share one head's
// K/V in L2.
struct StaticPersistentScheduler {
  struct Params {
    int num_tiles;
    cutlass::FastDivmod m_blocks;  // divides by the query tiles per head
    cutlass::FastDivmod heads;     // divides by nheads
  };

  static Params to_params(int num_m_blocks, int nheads, int batch) {
    return {num_m_blocks * nheads * batch, cutlass::FastDivmod(num_m_blocks), cutlass::FastDivmod(nheads)};
  }
  static dim3 grid(Params const& params, int num_sms) {
    return dim3(static_cast<unsigned>(std::min(params.num_tiles, num_sms)));
  }
  static CUTLASS_DEVICE int first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int next_tile(Params const&, int index) { return index + gridDim.x; }

  static CUTLASS_HOST_DEVICE ForwardTile tile(Params const& params, int index) {
    int head_batch, m, batch, head;
    params.m_blocks(head_batch, m, index);
    params.heads(batch, head, head_batch);
    return {m, head, batch};
  }
};

// Causal tiles differ in cost (the last query tiles see the most keys), and static striding by the
// SM count in query-tile order deals some CTAs mostly long tiles (H200, bf16, 16k, d = 128: 457
// TFLOP/s against 637 with one CTA per tile). Two modes, chosen per call:
//  - one CTA per tile, longest first within each head: the hardware hands CTAs to SMs as they free
//    up, which balances the tiles, and the CTAs resident together share one head's K/V in L2;
//  - persistent, for short sequences where per-CTA start-up and epilogue dominate: all tiles ranked
//    by cost (query tile from the last, then head and batch), dealt to the CTAs round by round in a
//    snake order (CTA c takes rank c in even rounds and rank G - 1 - c in odd ones), so that a CTA
//    that took a long tile in one round takes a short one in the next. Where it can, the ranking
//    runs per group of (head, batch) pairs whose K/V together fill at most half the L2, each group
//    a whole number of rounds (so every round still deals tiles of falling cost). Ranking all heads
//    at once reads a head's K/V from memory once per query tile when L2 cannot hold all heads
//    (H200, same session: d = 128 causal, seqlen 1k, 319 -> 375 TFLOP/s with the groups); groups
//    that ended inside a round unbalanced the rounds (d = 256 causal 4k: 543 -> 487).
struct CausalScheduler {
  struct Params {
    int num_tiles, heads_batch;
    bool persistent;
    cutlass::FastDivmod m_blocks;        // divides by the query tiles per head
    cutlass::FastDivmod heads;           // divides by nheads
    cutlass::FastDivmod ctas;            // divides by the CTA count (grid size)
    cutlass::FastDivmod group_tiles;     // divides by the tiles of a full group
    cutlass::FastDivmod full_group;      // divides by a full group's (head, batch) pairs (persistent)
    cutlass::FastDivmod last_group;      // divides by the last group's (head, batch) pairs
  };

  // kv_bytes_per_head: the K and V bytes one tile head reads (its share, where heads share K/V).
  static Params to_params(int num_m_blocks, int nheads, int batch, bool persistent, int64_t kv_bytes_per_head,
                          int num_sms, int64_t l2_bytes) {
    int const heads_batch = nheads * batch;
    int const num_tiles = heads_batch * num_m_blocks;
    int const ctas = persistent ? std::min(num_tiles, num_sms) : num_tiles;
    // The fewest heads whose tiles fill whole rounds: lcm(ctas, num_m_blocks) / num_m_blocks.
    int const round_heads = ctas / std::gcd(ctas, num_m_blocks);
    int64_t const fit = l2_bytes / 2 / std::max<int64_t>(kv_bytes_per_head, 1);
    int const group_heads =
        fit >= round_heads ? static_cast<int>(std::min<int64_t>(fit / round_heads * round_heads, heads_batch))
                           : heads_batch;
    int const last_group_heads = heads_batch - (heads_batch - 1) / group_heads * group_heads;
    return {num_tiles,
            heads_batch,
            persistent,
            cutlass::FastDivmod(num_m_blocks),
            cutlass::FastDivmod(nheads),
            cutlass::FastDivmod(ctas),
            cutlass::FastDivmod(group_heads * num_m_blocks),
            cutlass::FastDivmod(group_heads),
            cutlass::FastDivmod(last_group_heads)};
  }
  static dim3 grid(Params const& params, int) { return dim3(static_cast<unsigned>(params.ctas.divisor)); }
  static CUTLASS_DEVICE int first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int next_tile(Params const& params, int index) {
    return params.persistent ? index + params.ctas.divisor : params.num_tiles;
  }

  // The tile of launch index `index` (the block index, or a persistent CTA's walk).
  static CUTLASS_HOST_DEVICE ForwardTile tile(Params const& params, int index) {
    int batch, head;
    if (!params.persistent) {
      int head_batch, m;
      params.m_blocks(head_batch, m, index);
      params.heads(batch, head, head_batch);
      return {params.m_blocks.divisor - 1 - m, head, batch};
    }
    int const ctas = params.ctas.divisor;
    int round, position;
    params.ctas(round, position, index);
    bool const full_round = (round + 1) * ctas <= params.num_tiles;  // a partial last round keeps its order
    if (full_round && round % 2 == 1) position = ctas - 1 - position;
    int group, in_group;
    params.group_tiles(group, in_group, round * ctas + position);
    int const group_heads = params.full_group.divisor;
    int const first_head_batch = group * group_heads;
    bool const last = first_head_batch + group_heads >= params.heads_batch;
    int rank_m, in_group_head;
    (last ? params.last_group : params.full_group)(rank_m, in_group_head, in_group);
    params.heads(batch, head, first_head_batch + in_group_head);
    return {params.m_blocks.divisor - 1 - rank_m, head, batch};
  }
};

}  // namespace flashhop::sm90
