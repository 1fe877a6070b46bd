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
// next head; every (query tile, head, batch) once; one CTA per SM at most.
TEST(CausalSchedule, QueueRunsHeadByHeadLongestFirst) {
  int counter = 0;  // only the device dereferences it
  for (auto [m_blocks, nheads, batch] :
       {std::tuple{1, 1, 1}, std::tuple{4, 16, 32}, std::tuple{7, 3, 5}, std::tuple{128, 16, 1}}) {
    CausalScheduler::Params const params = CausalScheduler::to_params(m_blocks, nheads, batch, &counter, 132);
    ASSERT_EQ(params.num_tiles, m_blocks * nheads * batch);
    EXPECT_EQ(CausalScheduler::grid(params, 132).x, unsigned(std::min(params.num_tiles, 132)));
    std::set<std::tuple<int, int, int>> seen;
    for (int index = 0; index < params.num_tiles; ++index) {
      ForwardTile const t = CausalScheduler::tile(params, index);
      EXPECT_EQ(t.m_block, m_blocks - 1 - index % m_blocks) << "index " << index;
      EXPECT_EQ(t.head, index / m_blocks % nheads) << "index " << index;
      EXPECT_EQ(t.batch, index / m_blocks / nheads) << "index " << index;
      seen.insert({t.m_block, t.head, t.batch});
    }
    EXPECT_EQ(int(seen.size()), params.num_tiles);
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
