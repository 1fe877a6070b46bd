// Host tests of the tile schedulers' order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>

#include "kernels/sm90/tile_scheduler.h"

namespace {

using flashhop::sm90::CausalScheduler;
using flashhop::sm90::ForwardTile;

// Causal: the queue's indices run over one head's query tiles, the last (longest) first, then the
// next head, up to the tail group, whose heads' tiles interleave by rank (every head's last query
// tile, then every head's second last, ...); every (query tile, head, batch) once; one CTA per SM at
// most.
TEST(CausalSchedule, QueueRunsHeadByHeadLongestFirstThenTailGroupByRank) {
  int counter = 0;  // only the device dereferences it
  std::int64_t const kv_bytes = 1 << 20;
  for (auto [m_blocks, nheads, batch, heads_per_kv] :
       {std::tuple{1, 1, 1, 1}, std::tuple{4, 16, 32, 1}, std::tuple{7, 3, 5, 3}, std::tuple{128, 16, 1, 4},
        std::tuple{16, 128, 1, 1}}) {
    CausalScheduler::Params const params =
        CausalScheduler::to_params(m_blocks, nheads, batch, &counter, 132, kv_bytes, heads_per_kv);
    int const head_batches = nheads * batch;
    ASSERT_EQ(params.num_tiles, m_blocks * head_batches);
    EXPECT_EQ(CausalScheduler::grid(params, 132).x, unsigned(std::min(params.num_tiles, 132)));
    int const tail = CausalScheduler::tail_group_heads(m_blocks, head_batches, std::min(params.num_tiles, 132),
                                                       kv_bytes, heads_per_kv);
    ASSERT_GE(tail, 1);
    ASSERT_LE(tail, head_batches);
    int const tail_start = (head_batches - tail) * m_blocks;
    std::set<std::tuple<int, int, int>> seen;
    for (int index = 0; index < params.num_tiles; ++index) {
      ForwardTile const t = CausalScheduler::tile(params, index);
      int const rank = index < tail_start ? index % m_blocks : (index - tail_start) / tail;
      int const head_batch =
          index < tail_start ? index / m_blocks : head_batches - tail + (index - tail_start) % tail;
      EXPECT_EQ(t.m_block, m_blocks - 1 - rank) << "index " << index;
      EXPECT_EQ(t.head, head_batch % nheads) << "index " << index;
      EXPECT_EQ(t.batch, head_batch / nheads) << "index " << index;
      seen.insert({t.m_block, t.head, t.batch});
    }
    EXPECT_EQ(int(seen.size()), params.num_tiles);
  }
}

// The tail group holds about four long tiles per CTA, within the heads whose K/V fit the L2 budget
// (whole KV groups), and within the heads there are; none where a head has about a multiple of the
// CTAs' count of query tiles.
TEST(CausalSchedule, TailGroupSize) {
  std::int64_t const budget = CausalScheduler::kTailGroupL2Bytes;
  // 4 x 132 tiles of 100: 6 heads; K/V of budget / 8 each fit 8.
  EXPECT_EQ(CausalScheduler::tail_group_heads(100, 16, 132, budget / 8, 1), 6);
  // 4 x 132 tiles of 16: 33 heads, but only 4 KV heads' K/V fit, of 2 query heads each.
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, budget / 4, 2), 8);
  // K/V larger than the budget: one head, as head by head.
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, budget * 2, 1), 1);
  // Fewer heads than wanted: all of them.
  EXPECT_EQ(CausalScheduler::tail_group_heads(4, 5, 20, 1, 1), 5);
  // About one or two CTA counts of query tiles per head: head by head.
  for (int m_blocks : {124, 128, 132, 140, 256, 264}) {
    EXPECT_EQ(CausalScheduler::tail_group_heads(m_blocks, 16, 132, 1, 1), 1) << m_blocks;
  }
  for (int m_blocks : {64, 86, 120, 150, 240}) {
    EXPECT_GT(CausalScheduler::tail_group_heads(m_blocks, 16, 132, 1, 1), 1) << m_blocks;
  }
}

// Without a mask: tile index = ((batch * nheads) + head) * num_m_blocks + query tile.
TEST(StaticPersistentSchedule, QueryTileFastestThenHeadThenBatch) {
  using flashhop::sm90::StaticPersistentScheduler;
  for (auto [m_blocks, nheads, batch] :
       {std::tuple{1, 1, 1}, std::tuple{4, 16, 32}, std::tuple{7, 3, 5}, std::tuple{128, 1, 1}}) {
    StaticPersistentScheduler::Params const params = StaticPersistentScheduler::to_params(m_blocks, nheads, batch);
    ASSERT_EQ(params.num_tiles, m_blocks * nheads * batch);
    EXPECT_EQ(StaticPersistentScheduler::grid(params, 132).x, unsigned(std::min(params.num_tiles, 132)));
    for (int index = 0; index < params.num_tiles; ++index) {
      ForwardTile const t = StaticPersistentScheduler::tile(params, index);
      EXPECT_EQ(t.m_block, index % m_blocks);
      EXPECT_EQ(t.head, index / m_blocks % nheads);
      EXPECT_EQ(t.batch, index / m_blocks / nheads);
    }
  }
}

}  // namespace
