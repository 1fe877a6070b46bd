// Tile schedulers of the sm90 forward kernel. A work tile is one query tile (block_m rows) of one
// head of one batch entry. Each CTA walks a sequence of tile indices, from first_tile() while the
// index is below num_tiles: statically strided (next_tile), or taken from a queue in global memory
// and handed to the CTA's roles through a TileRing (CausalScheduler with `queue`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

#include <cuda_runtime_api.h>
#include <cutlass/arch/barrier.h>
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
// TFLOP/s against 637 with one CTA per tile). Two modes, both persistent (one CTA per SM), chosen
// per call (ForwardParams::tile_queue):
//  - a queue, for long sequences: the tiles in launch order, head by head and longest first within
//    each head, each CTA taking its next index from a counter in global memory (`tile_counter`,
//    zeroed before the launch) as it nears the end of a tile, which balances the tiles; the CTAs working at
//    the same time share one head's K/V in L2. Against one CTA per tile (which balances alike
//    through the hardware's block dispatch), each CTA's later tiles load while its earlier ones
//    end, and no CTA start-up is paid per tile;
//  - a static snake, for short sequences (measured faster there than one CTA per tile, tile_config.h): all tiles ranked
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
    int* tile_counter;  // the queue's next index minus gridDim.x, or null for the static snake
    cutlass::FastDivmod m_blocks;        // divides by the query tiles per head
    cutlass::FastDivmod heads;           // divides by nheads
    cutlass::FastDivmod ctas;            // divides by the CTA count (grid size)
    cutlass::FastDivmod group_tiles;     // divides by the tiles of a full group
    cutlass::FastDivmod full_group;      // divides by a full group's (head, batch) pairs (snake)
    cutlass::FastDivmod last_group;      // divides by the last group's (head, batch) pairs
  };

  // kv_bytes_per_head: the K and V bytes one tile head reads (its share, where heads share K/V).
  // tile_counter: the queue's counter (4 bytes of workspace, zero at launch), or null.
  static Params to_params(int num_m_blocks, int nheads, int batch, int* tile_counter, int64_t kv_bytes_per_head,
                          int num_sms, int64_t l2_bytes) {
    int const heads_batch = nheads * batch;
    int const num_tiles = heads_batch * num_m_blocks;
    int const ctas = std::min(num_tiles, num_sms);
    // The fewest heads whose tiles fill whole rounds: lcm(ctas, num_m_blocks) / num_m_blocks.
    int const round_heads = ctas / std::gcd(ctas, num_m_blocks);
    int64_t const fit = l2_bytes / 2 / std::max<int64_t>(kv_bytes_per_head, 1);
    int const group_heads =
        fit >= round_heads ? static_cast<int>(std::min<int64_t>(fit / round_heads * round_heads, heads_batch))
                           : heads_batch;
    int const last_group_heads = heads_batch - (heads_batch - 1) / group_heads * group_heads;
    return {num_tiles,
            heads_batch,
            tile_counter,
            cutlass::FastDivmod(num_m_blocks),
            cutlass::FastDivmod(nheads),
            cutlass::FastDivmod(ctas),
            cutlass::FastDivmod(group_heads * num_m_blocks),
            cutlass::FastDivmod(group_heads),
            cutlass::FastDivmod(last_group_heads)};
  }
  static dim3 grid(Params const& params, int) { return dim3(static_cast<unsigned>(params.ctas.divisor)); }
  static CUTLASS_DEVICE int first_tile() { return blockIdx.x; }
  // The static snake's stride; the queue's next index is taken with take_next_tile.
  static CUTLASS_DEVICE int next_tile(Params const& params, int index) { return index + params.ctas.divisor; }
  static CUTLASS_DEVICE int take_next_tile(Params const& params) {
    return params.ctas.divisor + atomicAdd(params.tile_counter, 1);
  }

  // The tile of index `index` in the CTA's walk.
  static CUTLASS_HOST_DEVICE ForwardTile tile(Params const& params, int index) {
    int batch, head;
    if (params.tile_counter != nullptr) {
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

// Hands the queue's tile indices from the thread that takes them (producer thread 0) to the CTA's
// other roles. Slot t % 2 holds the index of the tile after the CTA's t-th tile (t from 0), written
// once the taker has issued the t-th tile's loads, a few key tiles before the consumers need it
// (when their last S GEMM of that tile retires). `full` completes once the index is written (one
// arrival), `empty` once every reader has read it; the taker reuses a slot once the readers emptied
// it.
struct TileRing {
  static constexpr int kSlots = 2;
  int next[kSlots];
  cutlass::arch::ClusterBarrier full[kSlots];
  cutlass::arch::ClusterBarrier empty[kSlots];

  // One thread, before the CTA synchronises; `readers`: the threads that take every index.
  CUTLASS_DEVICE void init(int readers) {
    for (int slot = 0; slot < kSlots; ++slot) {
      full[slot].init(1);
      empty[slot].init(readers);
    }
  }
  // The accesses to `next` are volatile so that they stay between the barrier instructions (asm
  // volatile statements, which declare no memory effects); the barriers order them across threads.
  CUTLASS_DEVICE void publish(int t, int index) {
    int const slot = t % kSlots, use = t / kSlots;
    if (use > 0) empty[slot].wait((use - 1) % 2);
    *static_cast<int volatile*>(&next[slot]) = index;
    full[slot].arrive();
  }
  CUTLASS_DEVICE int take(int t) {
    int const slot = t % kSlots, use = t / kSlots;
    full[slot].wait(use % 2);
    int const index = *static_cast<int volatile*>(&next[slot]);
    empty[slot].arrive();
    return index;
  }
};

}  // namespace flashhop::sm90
