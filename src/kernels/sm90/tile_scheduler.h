// Tile schedulers of the sm90 forward kernel. A work tile is one 128-row query tile of one head of
// one batch entry. The kernel walks its tiles as
//   for (index = first_tile(); index < params.num_tiles; index = next_tile(params, index)) ...
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

#include <cuda_runtime_api.h>
#include <cutlass/cutlass.h>

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

// Equal tiles (no causal mask), persistent: at most one CTA per SM; CTA c takes tiles c,
// c + gridDim.x, ... Later tiles' loads overlap earlier tiles' epilogues, and no CTA start-up is
// paid per tile. Query tile fastest, so that the CTAs working at the same time share one head's
// K/V in L2.
struct StaticPersistentScheduler {
  struct Params {
    int num_m_blocks, nheads;
    int64_t num_tiles;
  };

  static Params to_params(int num_m_blocks, int nheads, int batch) {
    return {num_m_blocks, nheads, int64_t(num_m_blocks) * nheads * batch};
  }
  static dim3 grid(Params const& params, int num_sms) {
    return dim3(static_cast<unsigned>(params.num_tiles < num_sms ? params.num_tiles : num_sms));
  }
  static CUTLASS_DEVICE int64_t first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int64_t next_tile(Params const&, int64_t index) { return index + gridDim.x; }

  static CUTLASS_DEVICE ForwardTile tile(Params const& params, int64_t index) {
    int const m = static_cast<int>(index % params.num_m_blocks);
    int64_t const head_batch = index / params.num_m_blocks;
    return {m, static_cast<int>(head_batch % params.nheads), static_cast<int>(head_batch / params.nheads)};
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
//    (H200, d = 128 causal, seqlen 1k: 343 -> 362 TFLOP/s with the groups); groups that end inside
//    a round unbalanced the rounds (d = 256 causal 4k: 543 -> 487).
struct CausalScheduler {
  struct Params {
    int num_m_blocks, nheads;
    int64_t num_tiles;
    bool persistent;
    int group_heads;  // persistent: (head, batch) pairs per group; the last group may hold fewer
  };

  // kv_bytes_per_head: the K and V bytes one tile head reads (its share, where heads share K/V).
  static Params to_params(int num_m_blocks, int nheads, int batch, bool persistent, int64_t kv_bytes_per_head,
                          int num_sms, int64_t l2_bytes) {
    Params params{num_m_blocks, nheads, int64_t(nheads) * batch * num_m_blocks, persistent, 0};
    int64_t const heads_batch = int64_t(nheads) * batch;
    int64_t const ctas = grid(params, num_sms).x;
    // The fewest heads whose tiles fill whole rounds: lcm(ctas, num_m_blocks) / num_m_blocks.
    int64_t const round_heads = ctas / std::gcd(ctas, int64_t(num_m_blocks));
    int64_t const fit = l2_bytes / 2 / std::max<int64_t>(kv_bytes_per_head, 1);
    int64_t const group = fit >= round_heads ? fit / round_heads * round_heads : heads_batch;
    params.group_heads = static_cast<int>(std::min(group, heads_batch));
    return params;
  }
  static dim3 grid(Params const& params, int num_sms) {
    int64_t const ctas = params.persistent && params.num_tiles > num_sms ? num_sms : params.num_tiles;
    return dim3(static_cast<unsigned>(ctas));
  }
  static CUTLASS_DEVICE int64_t first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int64_t next_tile(Params const& params, int64_t index) {
    return params.persistent ? index + gridDim.x : INT64_MAX;
  }

  static CUTLASS_DEVICE ForwardTile tile(Params const& params, int64_t index) {
    return tile_of(params, index, gridDim.x);
  }

  // The tile of launch index `index` (block index, or a persistent CTA's walk) among `ctas` CTAs.
  static CUTLASS_HOST_DEVICE ForwardTile tile_of(Params const& params, int64_t index, int64_t ctas) {
    if (!params.persistent) {
      int const m = static_cast<int>(index % params.num_m_blocks);
      int64_t const head_batch = index / params.num_m_blocks;
      return {params.num_m_blocks - 1 - m, static_cast<int>(head_batch % params.nheads),
              static_cast<int>(head_batch / params.nheads)};
    }
    int64_t const round = index / ctas;
    int64_t position = index % ctas;
    bool const full_round = (round + 1) * ctas <= params.num_tiles;  // a partial last round keeps its order
    if (full_round && round % 2 == 1) position = ctas - 1 - position;
    int64_t const rank = round * ctas + position;
    int64_t const group_tiles = int64_t(params.group_heads) * params.num_m_blocks;
    int64_t const group = rank / group_tiles;
    int64_t const in_group = rank % group_tiles;
    int64_t const first_head_batch = group * params.group_heads;
    int64_t const heads_batch = params.num_tiles / params.num_m_blocks;
    int64_t const remaining = heads_batch - first_head_batch;
    int64_t const group_size = remaining < params.group_heads ? remaining : params.group_heads;
    int64_t const head_batch = first_head_batch + in_group % group_size;
    return {params.num_m_blocks - 1 - static_cast<int>(in_group / group_size),
            static_cast<int>(head_batch % params.nheads), static_cast<int>(head_batch / params.nheads)};
  }
};

}  // namespace flashhop::sm90
