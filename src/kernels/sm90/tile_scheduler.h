// Tile schedulers of the sm90 forward kernel. A work tile is one query tile (block_m rows) of one
// head of one batch entry. Each CTA walks a sequence of tile indices, from first_tile() while
// has_tile(): statically strided (StaticPersistentScheduler::next_tile), or taken from a queue in
// global memory and handed to the CTA's roles through a TileRing (CausalScheduler). And the order
// of the backward kernel's CTAs, one per key tile (BackwardOrder).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernels/sm90/split_round.h"
#include "kernels/sm90/varlen.h"

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

// Tile indices are 32-bit: a tile is 128 query rows of one head, so 2^31 tiles would need a Q of
// more than 2^31 x 128 x 64 x 2 bytes. Every division by a launch constant goes through a
// precomputed FastDivmod (a multiply and a shift): each CTA maps a tile index to its tile once per
// tile in each warp role, on the path between two tiles, where 64-bit divisions (subroutines)
// cost short tiles much of their time (decision log D123).

// Equal tiles (no causal mask), persistent: at most one CTA per SM; CTA c takes tiles c,
// c + gridDim.x, ... Later tiles' loads overlap earlier tiles' epilogues, and no CTA start-up is
// paid per tile. Query tile fastest, so that the CTAs working at the same time share one head's
// K/V in L2. With a split round (split_round.h), whole tiles stop at split.whole_tiles and each
// CTA then computes its one or two parts of the last tiles, indices num_tiles + SplitRound::slot.
// Every index past a CTA's last is kNoTile.
struct StaticPersistentScheduler {
  static constexpr int kNoTile = -1;

  struct Params {
    int num_tiles;
    cutlass::FastDivmod m_blocks;  // divides by the query tiles per head
    cutlass::FastDivmod heads;     // divides by nheads
    SplitRound split;
  };

  // key_tiles: of every tile; split: which round to split (the kernel's policy, where the
  // workspace holds it).
  static Params to_params(int num_m_blocks, int nheads, int batch, int num_sms, int key_tiles, SplitPolicy split) {
    int const num_tiles = num_m_blocks * nheads * batch;
    return {num_tiles, cutlass::FastDivmod(num_m_blocks), cutlass::FastDivmod(nheads),
            SplitRound::plan(num_tiles, key_tiles, num_sms, split)};
  }
  static dim3 grid(Params const& params, int) { return dim3(static_cast<unsigned>(params.split.ctas)); }

  static CUTLASS_HOST_DEVICE bool has_tile(Params const&, int index) { return index != kNoTile; }
  static CUTLASS_HOST_DEVICE bool is_part(Params const& params, int index) { return index >= params.num_tiles; }
  // CTA cta's first index, and the one after `index`. kSplits: whether the kernel splits a round
  // at all (else the parts' code is left out, and with it the registers it takes).
  template <bool kSplits>
  static CUTLASS_HOST_DEVICE int first_tile(Params const& params, int cta) {
    return cta < params.split.whole_tiles ? cta : first_part<kSplits>(params, cta);
  }
  template <bool kSplits>
  static CUTLASS_HOST_DEVICE int next_tile(Params const& params, int cta, int index) {
    if (!kSplits || !is_part(params, index)) {
      int const next = index + params.split.ctas;
      return next < params.split.whole_tiles ? next : first_part<kSplits>(params, cta);
    }
    bool const second = index - params.num_tiles == SplitRound::slot(cta, 1);
    return !second && params.split.part(cta, 1).exists ? index + 1 : kNoTile;
  }

  // Part index -> (CTA, k).
  static CUTLASS_HOST_DEVICE SplitRound::Part part(Params const& params, int index) {
    int const slot = index - params.num_tiles;
    return params.split.part(slot / 2, slot % 2);
  }

  static CUTLASS_HOST_DEVICE ForwardTile tile(Params const& params, int index) {
    if (is_part(params, index)) index = params.split.whole_tiles + part(params, index).tile;
    int head_batch, m, batch, head;
    params.m_blocks(head_batch, m, index);
    params.heads(batch, head, head_batch);
    return {m, head, batch};
  }

 private:
  template <bool kSplits>
  static CUTLASS_HOST_DEVICE int first_part(Params const& params, int cta) {
    return kSplits && params.split.splits() ? params.num_tiles + SplitRound::slot(cta, 0) : kNoTile;
  }
};

// Causal and window tiles differ in cost (the last query tiles see the most keys), so they are not
// dealt statically: static striding by the SM count in query-tile order deals some CTAs mostly long
// tiles (decision log D3). A queue instead: the tiles in order head by head, longest (last query
// tile) first within each head; one CTA per SM, each taking its next index from a counter in
// global memory (`tile_counter`, zeroed before the launch) a few key tiles before it ends a tile,
// so the tiles balance as with one CTA per tile (the hardware's block dispatch), and the CTAs
// working at the same time share a few heads' K/V in L2.
// Against one CTA per tile, a CTA's next tile loads while its last one ends, and no CTA start-up is
// paid per tile (decision log D124). The next index is taken near a tile's end, once producer
// thread 0 has issued the tile's last loads, rather than as the tile starts: taken at the start, a
// CTA would reserve its next tile a whole tile early, while CTAs that free up sooner could have
// taken it (decision log D125). The consumers, which need it when their last S GEMM of the tile
// retires, read it from the TileRing.
//
// The tail group: head by head, the CTAs that take the last head's long tiles are those that freed
// up first, and they end up to a whole long tile after the others, which have nothing left to take.
// The queue's last `tail_heads` heads are therefore interleaved, longest first across them (rank 0
// of each, then rank 1, ...), so the run ends on the shortest tiles of all of them. The group is as
// many heads as it takes to hold about four long tiles per CTA (enough work to even out CTAs that
// entered it up to a long tile apart), but no more than the heads whose K/V fill kTailGroupL2Percent of L2:
// its tiles run side by side and read their K/V from L2. A simulation of the queue
// (tools/simulate_queue.py: 132 CTAs, a tile costing its key tiles plus two) puts head by head
// well short of a perfect balance for d = 128 and 256 causal from 1k to 8k (the peers grid), and
// the tail group close to it; the timings agree (decision log D126).
// Exception: when a head's query tiles number about a multiple of the CTAs, head by head already
// balances (in the simulation too): with as many tiles as CTAs, the CTA that took rank i frees up
// when the one of rank nm - 1 - i is due, so each CTA's tiles pair up into equal sums. There the
// group only costs, so tail_group_heads makes it one head (decision log D127): within ctas / 16
// query tiles of a multiple of the CTAs.
struct CausalScheduler {
  // The share of the device's L2 cache that the tail group's K/V may fill (48 MiB of the H200's 60).
  static constexpr int kTailGroupL2Percent = 80;

  struct Params {
    int num_tiles;
    int* tile_counter;               // the count of indices taken from the queue so far
    cutlass::FastDivmod m_blocks;    // divides by the query tiles per head
    cutlass::FastDivmod heads;       // divides by nheads
    int ctas;                        // the grid size
    int tail_start;                  // the index of the tail group's first tile
    int tail_first_head;             // its first (head, batch) pair, as batch x nheads + head
    cutlass::FastDivmod tail_heads;  // divides by the heads of the tail group
  };

  // Heads of the tail group, of head_batches (heads x batch) each of num_m_blocks query tiles, over
  // ctas CTAs (all three at least 1). kv_bytes: the K and V of one KV head, read by heads_per_kv
  // consecutive heads; l2_bytes: the device's L2 cache.
  static int tail_group_heads(int num_m_blocks, int head_batches, int ctas, std::int64_t kv_bytes,
                              int heads_per_kv, std::int64_t l2_bytes) {
    int const slack = ctas / 16, over = num_m_blocks % ctas;
    if (num_m_blocks + slack >= ctas && (over <= slack || over >= ctas - slack)) return 1;
    int const balance = (4 * ctas + num_m_blocks - 1) / num_m_blocks;
    std::int64_t const kv_heads_in_l2 =
        std::max<std::int64_t>(1, l2_bytes * kTailGroupL2Percent / 100 / std::max<std::int64_t>(kv_bytes, 1));
    // Each bound is at least 1.
    return static_cast<int>(std::min<std::int64_t>({balance, kv_heads_in_l2 * heads_per_kv, head_batches}));
  }

  // tile_counter: 4 bytes of workspace, zero at launch. kv_bytes, heads_per_kv and l2_bytes: as in
  // tail_group_heads.
  static Params to_params(int num_m_blocks, int nheads, int batch, int* tile_counter, int num_sms,
                          std::int64_t kv_bytes, int heads_per_kv, std::int64_t l2_bytes) {
    int const head_batches = nheads * batch;
    int const num_tiles = num_m_blocks * head_batches;
    int const ctas = std::min(num_tiles, num_sms);
    int const tail = tail_group_heads(num_m_blocks, head_batches, ctas, kv_bytes, heads_per_kv, l2_bytes);
    return {num_tiles,
            tile_counter,
            cutlass::FastDivmod(num_m_blocks),
            cutlass::FastDivmod(nheads),
            ctas,
            (head_batches - tail) * num_m_blocks,
            head_batches - tail,
            cutlass::FastDivmod(tail)};
  }
  static dim3 grid(Params const& params, int) { return dim3(static_cast<unsigned>(params.ctas)); }
  // CTA c starts with tile c; the queue hands out the indices from the grid size on.
  static CUTLASS_DEVICE int first_tile(Params const&) { return blockIdx.x; }
  static CUTLASS_HOST_DEVICE bool has_tile(Params const& params, int index) { return index < params.num_tiles; }
  static CUTLASS_HOST_DEVICE bool is_part(Params const&, int) { return false; }
  static CUTLASS_DEVICE int take_next_tile(Params const& params) {
    return params.ctas + atomicAdd(params.tile_counter, 1);
  }

  static CUTLASS_HOST_DEVICE ForwardTile tile(Params const& params, int index) {
    int head_batch, rank;  // rank 0: the head's last query tile
    if (index < params.tail_start) {
      params.m_blocks(head_batch, rank, index);
    } else {
      int in_group;
      params.tail_heads(rank, in_group, index - params.tail_start);
      head_batch = params.tail_first_head + in_group;
    }
    int batch, head;
    params.heads(batch, head, head_batch);
    return {params.m_blocks.divisor - 1 - rank, head, batch};
  }
};

// A variable-length batch's tile (varlen.h): the tile, where its sequence lies, and which of the
// query tile's splits by keys it is.
struct VarlenTile : ForwardTile {
  SequenceSpan span;
  int split;
};

// Variable-length batches: a queue as CausalScheduler's, over the tile list that
// varlen_prepare_kernel wrote (varlen.h): the sequences with the most keys first, each head by
// head, the longest query tile of a head first, so that the run ends on the shortest tiles; a
// query tile's splits by keys (ForwardParams::num_splits) follow one another. The grid is sized by
// the bound on the tiles; the list holds how many there are.
struct VarlenScheduler {
  struct Params {
    int* list;                      // VarlenTileList
    int batch;
    int ctas;        // the grid size
    int tile_heads;  // query heads, or KV heads with packed rows
    int num_splits;  // splits by keys of each query tile
    VarlenSequences sequences;
  };

  // num_tiles_bound: the most tiles the batch can have (the grid's bound), splits counted.
  static Params to_params(int* list, int batch, int tile_heads, int num_splits, std::int64_t num_tiles_bound,
                          int num_sms, VarlenSequences const& sequences) {
    int const ctas = static_cast<int>(std::min<std::int64_t>(num_tiles_bound, num_sms));
    return {list, batch, std::max(ctas, 1), tile_heads, num_splits, sequences};
  }
  static dim3 grid(Params const& params, int) { return dim3(static_cast<unsigned>(params.ctas)); }
  static CUTLASS_DEVICE int first_tile(Params const&) { return blockIdx.x; }
  // The list was written by the kernel before this one on the stream.
  static CUTLASS_DEVICE bool has_tile(Params const& params, int index) {
    return index < __ldg(params.list + VarlenTileList::kNumTiles);
  }
  static CUTLASS_HOST_DEVICE bool is_part(Params const&, int) { return false; }
  static CUTLASS_DEVICE int take_next_tile(Params const& params) {
    return params.ctas + atomicAdd(params.list + VarlenTileList::kCounter, 1);
  }

  static CUTLASS_DEVICE VarlenTile tile(Params const& params, int index) {
    int const* tile_start = params.list + VarlenTileList::tile_start(params.batch);
    // The last p with tile_start[p] <= index (sequences without tiles share their start).
    int low = 0, high = params.batch - 1;
    while (low < high) {
      int const mid = (low + high + 1) / 2;
      if (__ldg(tile_start + mid) <= index) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    int const sequence = __ldg(params.list + VarlenTileList::kOrder + low);
    VarlenTile t;
    t.span = params.sequences.span(sequence);
    // The sequence's tiles, head by head: its query tiles, each as num_splits tiles.
    int const head_tiles = (__ldg(tile_start + low + 1) - __ldg(tile_start + low)) / params.tile_heads;
    int const local = index - __ldg(tile_start + low);
    int const head = local / head_tiles, in_head = local - head * head_tiles;
    int const rank = in_head / params.num_splits;
    t.split = in_head - rank * params.num_splits;
    t.m_block = head_tiles / params.num_splits - 1 - rank;
    t.head = head;
    t.batch = sequence;
    return t;
  }
};

// The backward's CTA order: CTA `index` takes key tile n_block of `pair` (batch entry * nheads_kv +
// KV head). Sections of `section` pairs one after the other; within a section the pairs run fastest
// and the key tiles slowest, so that with causal masks, where a key tile sees every query tile
// after it, the longest walks start first (LPT order) while the section's pairs share L2. A
// section of one pair is key tile after key tile, pair after pair. Either way a pair's lower key
// tiles come first (deterministic dQ waits on them).
struct BackwardOrder {
  int n_blocks;  // key tiles of a pair
  int kv_pairs;
  int section;   // pairs; the last section may have fewer
  struct Slot {
    int n_block, pair;
  };
  CUTLASS_HOST_DEVICE Slot operator()(int index) const {
    int const per_section = section * n_blocks;
    int const first = index / per_section * section;
    int const in_section = index % per_section;
    int const pairs = section < kv_pairs - first ? section : kv_pairs - first;
    return {in_section / pairs, first + in_section % pairs};
  }
  // The largest power of two of pairs whose pair_bytes together fit l2_bytes, at least one and at
  // most the first power of two at or past kv_pairs.
  static int section_for(std::int64_t pair_bytes, int kv_pairs, std::int64_t l2_bytes) {
    int section = 1;
    while (section < kv_pairs && 2 * section * pair_bytes <= l2_bytes) section *= 2;
    return section;
  }
};

// The tile after a CTA's current one: its index (num_tiles or more after the last tile), and whether
// it loads anything (a tile whose query rows see no key does not).
struct NextTile {
  int index;
  bool loads;
};

// Hands the queue's tile indices from the thread that takes them (producer thread 0) to the CTA's
// other roles. Slot t % 2 holds the index of the tile after the CTA's t-th tile (t from 0), written
// once the taker has issued the t-th tile's loads, a few key tiles before the consumers need it
// (when their last S GEMM of that tile retires). `full` completes once the index is written (one
// arrival), `empty` once every reader has read it; the taker reuses a slot once the readers emptied
// it.
struct TileRing {
  static constexpr int kSlots = 2;
  NextTile next[kSlots];
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
  CUTLASS_DEVICE void publish(int t, NextTile tile) {
    int const slot = t % kSlots, use = t / kSlots;
    if (use > 0) empty[slot].wait((use - 1) % 2);
    NextTile volatile& to = next[slot];
    to.index = tile.index;
    to.loads = tile.loads;
    full[slot].arrive();
  }
  CUTLASS_DEVICE NextTile take(int t) {
    int const slot = t % kSlots, use = t / kSlots;
    full[slot].wait(use % 2);
    NextTile volatile const& from = next[slot];
    NextTile const tile{from.index, from.loads};
    empty[slot].arrive();
    return tile;
  }
};

}  // namespace flashhop::sm90
