// Host tests of the tile schedulers' order. Causal: every (query tile, head, batch) exactly once,
// whatever the CTA count; the queue runs head by head, longest first; the static snake takes a
// head group's tiles before the next group's, longest (last query tile) first within a group;
// groups are whole rounds sized to half the L2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <tuple>

#include "kernels/sm90/tile_scheduler.h"

namespace {

using flashhop::sm90::CausalScheduler;
using flashhop::sm90::ForwardTile;

struct ScheduleCase {
  int num_m_blocks, nheads, batch;
  bool queue;
  int64_t kv_bytes_per_head, l2_bytes;
  int num_sms;
};

class CausalSchedule : public ::testing::TestWithParam<ScheduleCase> {};

std::tuple<int, int, int> key(ForwardTile const& t) { return {t.m_block, t.head, t.batch}; }

// The CTAs of a launch, as CausalScheduler::grid makes them for `num_sms` SMs.
int64_t ctas_of(CausalScheduler::Params const& params, int num_sms) {
  return CausalScheduler::grid(params, num_sms).x;
}

// The queue's counter, which only the device dereferences.
int* counter_of(bool queue) {
  static int counter = 0;
  return queue ? &counter : nullptr;
}

// The snake's tile of rank `rank`: the snake order's launch index of that rank.
ForwardTile tile_of_rank(CausalScheduler::Params const& params, int64_t rank, int64_t ctas) {
  int64_t const round = rank / ctas;
  int64_t position = rank % ctas;
  if ((round + 1) * ctas <= params.num_tiles && round % 2 == 1) position = ctas - 1 - position;
  return CausalScheduler::tile(params, round * ctas + position);
}

TEST_P(CausalSchedule, VisitsEveryTileOnce) {
  ScheduleCase const c = GetParam();
  CausalScheduler::Params const params =
      CausalScheduler::to_params(c.num_m_blocks, c.nheads, c.batch, counter_of(c.queue), c.kv_bytes_per_head,
                                 c.num_sms, c.l2_bytes);
  ASSERT_EQ(params.num_tiles, int64_t(c.num_m_blocks) * c.nheads * c.batch);
  std::set<std::tuple<int, int, int>> seen;
  for (int64_t index = 0; index < params.num_tiles; ++index) {
    ForwardTile const t = CausalScheduler::tile(params, index);
    ASSERT_GE(t.m_block, 0);
    ASSERT_LT(t.m_block, c.num_m_blocks);
    ASSERT_GE(t.head, 0);
    ASSERT_LT(t.head, c.nheads);
    ASSERT_GE(t.batch, 0);
    ASSERT_LT(t.batch, c.batch);
    EXPECT_TRUE(seen.insert(key(t)).second) << "tile (" << t.m_block << ", " << t.head << ", " << t.batch
                                            << ") twice, index " << index;
  }
  EXPECT_EQ(int64_t(seen.size()), params.num_tiles);
}

// The queue: indices run over one head's query tiles, the last first, then the next head.
TEST_P(CausalSchedule, QueueRunsHeadByHeadLongestFirst) {
  ScheduleCase const c = GetParam();
  CausalScheduler::Params const params = CausalScheduler::to_params(
      c.num_m_blocks, c.nheads, c.batch, counter_of(true), c.kv_bytes_per_head, c.num_sms, c.l2_bytes);
  EXPECT_EQ(ctas_of(params, c.num_sms), std::min<int64_t>(params.num_tiles, c.num_sms));
  for (int64_t index = 0; index < params.num_tiles; ++index) {
    ForwardTile const t = CausalScheduler::tile(params, index);
    EXPECT_EQ(t.m_block, c.num_m_blocks - 1 - index % c.num_m_blocks) << "index " << index;
    EXPECT_EQ(int64_t(t.batch) * c.nheads + t.head, index / c.num_m_blocks) << "index " << index;
  }
}

TEST_P(CausalSchedule, SnakeGroupsFitHalfTheL2AndRunLongestFirst) {
  ScheduleCase const c = GetParam();
  CausalScheduler::Params const params = CausalScheduler::to_params(
      c.num_m_blocks, c.nheads, c.batch, counter_of(false), c.kv_bytes_per_head, c.num_sms, c.l2_bytes);
  int64_t const heads_batch = int64_t(c.nheads) * c.batch;
  int64_t const ctas = ctas_of(params, c.num_sms);
  EXPECT_EQ(ctas, std::min<int64_t>(params.num_tiles, c.num_sms));
  int64_t const group_heads = params.full_group.divisor;  // (head, batch) pairs per full group
  int64_t const group_tiles = group_heads * c.num_m_blocks;
  ASSERT_GE(group_heads, 1);
  ASSERT_LE(group_heads, heads_batch);
  if (group_heads < heads_batch) {
    // Groups of whole rounds, as large as half the L2 allows.
    EXPECT_EQ(group_tiles % ctas, 0) << group_tiles << " tiles per group, " << ctas << " CTAs";
    EXPECT_LE(group_heads * c.kv_bytes_per_head, c.l2_bytes / 2);
    int64_t const round_heads = ctas / std::gcd(ctas, int64_t(c.num_m_blocks));
    EXPECT_GT((group_heads + round_heads) * c.kv_bytes_per_head, c.l2_bytes / 2);
  }
  // Rank by rank, the tiles cover whole groups in order, and within a group the query tiles never
  // grow.
  for (int64_t rank = 0; rank < params.num_tiles; ++rank) {
    ForwardTile const t = tile_of_rank(params, rank, ctas);
    int64_t const head_batch = int64_t(t.batch) * c.nheads + t.head;
    EXPECT_EQ(head_batch / group_heads, rank / group_tiles) << "rank " << rank;
    if (rank % group_tiles != 0) EXPECT_LE(t.m_block, tile_of_rank(params, rank - 1, ctas).m_block) << "rank " << rank;
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

constexpr int64_t kL2 = 60 << 20;  // H200
constexpr int kSms = 132;

INSTANTIATE_TEST_SUITE_P(
    Shapes, CausalSchedule,
    ::testing::Values(ScheduleCase{4, 16, 32, false, 512 * 256 * 2, kL2, kSms},    // d 128, 512: 99-head groups
                      ScheduleCase{8, 32, 16, false, 1024 * 256, kL2, kSms},       // d 64, 1k: 99-head groups
                      ScheduleCase{32, 8, 4, false, 4096 * 1024, kL2, kSms},       // d 256, 4k: 33 heads exceed L2
                      ScheduleCase{5, 3, 7, false, 1 << 30, kL2, kSms},            // K/V above L2
                      ScheduleCase{3, 2, 1, false, 1000, kL2, kSms},               // fewer tiles than CTAs
                      ScheduleCase{7, 5, 31, false, 1 << 20, 64 << 20, 16},        // 32-head groups, the last partial
                      ScheduleCase{32, 16, 4, true, 4096 * 256, kL2, kSms}));     // the queue

}  // namespace
