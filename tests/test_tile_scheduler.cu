// Host tests of the tile schedulers' order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/sm90/tile_scheduler.h"

namespace {

// The L2 cache the scheduler's tail group is sized by (H200: 60 MiB).
constexpr std::int64_t kH200L2Bytes = 60ll << 20;

using flashhop::sm90::CausalScheduler;
using flashhop::sm90::ForwardTile;
using flashhop::sm90::SplitPolicy;
constexpr SplitPolicy kLast = SplitPolicy::kLastRound;

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
        CausalScheduler::to_params(m_blocks, nheads, batch, &counter, 132, kv_bytes, heads_per_kv, kH200L2Bytes);
    int const head_batches = nheads * batch;
    ASSERT_EQ(params.num_tiles, m_blocks * head_batches);
    EXPECT_EQ(CausalScheduler::grid(params, 132).x, unsigned(std::min(params.num_tiles, 132)));
    int const tail = CausalScheduler::tail_group_heads(m_blocks, head_batches, std::min(params.num_tiles, 132),
                                                       kv_bytes, heads_per_kv, kH200L2Bytes);
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
  std::int64_t const budget = kH200L2Bytes * CausalScheduler::kTailGroupL2Percent / 100;
  // 4 x 132 tiles of 100: 6 heads; K/V of budget / 8 each fit 8.
  EXPECT_EQ(CausalScheduler::tail_group_heads(100, 16, 132, budget / 8, 1, kH200L2Bytes), 6);
  // 4 x 132 tiles of 16: 33 heads, but only 4 KV heads' K/V fit, of 2 query heads each.
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, budget / 4, 2, kH200L2Bytes), 8);
  // K/V larger than the budget: one head, as head by head.
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, budget * 2, 1, kH200L2Bytes), 1);
  // Fewer heads than wanted: all of them.
  EXPECT_EQ(CausalScheduler::tail_group_heads(4, 5, 20, 1, 1, kH200L2Bytes), 5);
  // The budget is a share of the device's L2: the H100's 50 MiB hold fewer heads' K/V than the H200's.
  EXPECT_EQ(CausalScheduler::tail_group_heads(100, 16, 132, budget / 8, 1, 50ll << 20), 6);
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, (40ll << 20) / 3, 1, 50ll << 20), 3);
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, (40ll << 20) / 3, 1, kH200L2Bytes), 3);
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, (48ll << 20) / 3, 1, 50ll << 20), 2);
  EXPECT_EQ(CausalScheduler::tail_group_heads(16, 128, 132, (48ll << 20) / 3, 1, kH200L2Bytes), 3);
  // About one or two CTA counts of query tiles per head: head by head.
  for (int m_blocks : {124, 128, 132, 140, 256, 264}) {
    EXPECT_EQ(CausalScheduler::tail_group_heads(m_blocks, 16, 132, 1, 1, kH200L2Bytes), 1) << m_blocks;
  }
  for (int m_blocks : {64, 86, 120, 150, 240}) {
    EXPECT_GT(CausalScheduler::tail_group_heads(m_blocks, 16, 132, 1, 1, kH200L2Bytes), 1) << m_blocks;
  }
}

// Without a mask: tile index = ((batch * nheads) + head) * num_m_blocks + query tile.
TEST(StaticPersistentSchedule, QueryTileFastestThenHeadThenBatch) {
  using flashhop::sm90::StaticPersistentScheduler;
  for (auto [m_blocks, nheads, batch] :
       {std::tuple{1, 1, 1}, std::tuple{4, 16, 32}, std::tuple{7, 3, 5}, std::tuple{128, 1, 1}}) {
    StaticPersistentScheduler::Params const params =
        StaticPersistentScheduler::to_params(m_blocks, nheads, batch, 132, 8, SplitPolicy::kNone);
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

// The split last round: walking every CTA's indices visits each whole tile once and covers each
// split tile's key tiles once, in parts of at most two per CTA; a tile's parts, as parts_of lists
// them, are exactly the CTAs' parts of it, in key order.
TEST(StaticPersistentSchedule, SplitRoundCoversEveryKeyTileOnce) {
  using flashhop::sm90::SplitRound;
  using flashhop::sm90::StaticPersistentScheduler;
  int splits = 0;
  for (int num_sms : {132, 114, 7, 264}) {
    for (auto [m_blocks, nheads, batch, key_tiles] :
         {std::tuple{1, 1, 1, 1}, std::tuple{8, 16, 16, 8}, std::tuple{128, 16, 1, 128}, std::tuple{8, 8, 4, 3},
          std::tuple{9, 16, 2, 9}, std::tuple{3, 64, 1, 6}, std::tuple{5, 27, 1, 1}, std::tuple{7, 3, 5, 40},
          std::tuple{8, 16, 16, 16}, std::tuple{9, 16, 2, 30}, std::tuple{1, 8, 8, 64}, std::tuple{3, 2, 2, 24}}) {
      StaticPersistentScheduler::Params const params =
          StaticPersistentScheduler::to_params(m_blocks, nheads, batch, num_sms, key_tiles, SplitPolicy::kLastRound);
      SplitRound const& plan = params.split;
      // Split, the grid is every CTA the SMs hold; unsplit, no more than the tiles.
      int const num_tiles = m_blocks * nheads * batch;
      int const ctas = plan.splits() ? num_sms : std::min(num_tiles, num_sms);
      ASSERT_EQ(plan.ctas, ctas);
      ASSERT_EQ(params.num_tiles, num_tiles);
      splits += plan.splits();
      if (plan.splits()) {
        EXPECT_EQ(plan.whole_tiles % ctas, 0);
        EXPECT_EQ(plan.steps, (num_tiles - plan.whole_tiles) * key_tiles);
      } else {
        EXPECT_EQ(plan.whole_tiles, num_tiles);
      }
      std::vector<int> whole_seen(num_tiles, 0);
      std::vector<std::vector<int>> key_seen(num_tiles, std::vector<int>(key_tiles, 0));
      // (split tile) -> the (CTA, k) of its parts, in the order of their key tiles.
      std::map<int, std::vector<std::pair<int, int>>> parts_seen;
      for (int cta = 0; cta < ctas; ++cta) {
        int parts = 0;
        for (int index = StaticPersistentScheduler::first_tile<true>(params, cta);
             StaticPersistentScheduler::has_tile(params, index);
             index = StaticPersistentScheduler::next_tile<true>(params, cta, index)) {
          ForwardTile const t = StaticPersistentScheduler::tile(params, index);
          int const tile = (t.batch * nheads + t.head) * m_blocks + t.m_block;
          if (!StaticPersistentScheduler::is_part(params, index)) {
            EXPECT_LT(tile, plan.whole_tiles);
            ++whole_seen[tile];
            continue;
          }
          ++parts;
          int const slot = index - num_tiles;
          EXPECT_EQ(slot / 2, cta);
          SplitRound::Part const part = StaticPersistentScheduler::part(params, index);
          ASSERT_TRUE(part.exists);
          EXPECT_EQ(tile, plan.whole_tiles + part.tile);
          ASSERT_LT(part.key_begin, part.key_end);
          for (int n = part.key_begin; n < part.key_end; ++n) ++key_seen[tile][n];
          parts_seen[part.tile].push_back({part.key_begin, slot});
        }
        EXPECT_LE(parts, 2) << "cta " << cta;
      }
      for (int tile = 0; tile < num_tiles; ++tile) {
        if (tile < plan.whole_tiles) {
          EXPECT_EQ(whole_seen[tile], 1) << "tile " << tile;
        } else {
          for (int n = 0; n < key_tiles; ++n) EXPECT_EQ(key_seen[tile][n], 1) << "tile " << tile << " key tile " << n;
        }
      }
      for (auto& [split_tile, seen] : parts_seen) {
        std::sort(seen.begin(), seen.end());
        SplitRound::Parts const parts = plan.parts_of(split_tile);
        ASSERT_EQ(parts.count, int(seen.size())) << "split tile " << split_tile;
        for (int p = 0; p < parts.count; ++p) {
          EXPECT_EQ(SplitRound::slot(parts.first_cta + p, p == 0 && parts.first_is_second ? 1 : 0), seen[p].second)
              << "split tile " << split_tile << " part " << p;
        }
      }
    }
  }
  EXPECT_GT(splits, 5);  // the shapes above split in most configurations
}

// A round splits only where that saves each CTA kMinSavedKeyTiles key tiles on average: 2048 tiles
// on 132 SMs leave 68, whose split saves key_tiles x 64 / 132.
TEST(StaticPersistentSchedule, SplitsOnlyWhereTheLastRoundSavesEnough) {
  using flashhop::sm90::SplitRound;
  static_assert(SplitRound::kMinSavedKeyTiles == 6, "the key tile counts below straddle 6 saved");
  EXPECT_FALSE(SplitRound::plan(2048, 12, 132, kLast).splits());  // 5.8 saved
  EXPECT_TRUE(SplitRound::plan(2048, 13, 132, kLast).splits());   // 6.3 saved
  EXPECT_FALSE(SplitRound::plan(2111, 500, 132, kLast).splits());  // rest 131: 3.8 saved, most CTAs are busy anyway
  EXPECT_TRUE(SplitRound::plan(2110, 500, 132, kLast).splits());   // rest 130: 7.6 saved
  EXPECT_FALSE(SplitRound::plan(2048, 128, 2048, kLast).splits());        // one whole round
  EXPECT_FALSE(SplitRound::plan(128, 8, 132, kLast).splits());  // one round of 128 tiles: 0.5 saved
}

// The grid that the kernel's scheduler and the API's workspace size plan for: every CTA the SMs
// hold where a round splits, including a single round of fewer tiles than CTAs (decoding); else
// no more CTAs than tiles.
TEST(StaticPersistentSchedule, PlansEveryCtaWhereARoundSplits) {
  using flashhop::sm90::SplitRound;
  using flashhop::sm90::StaticPersistentScheduler;
  EXPECT_EQ(SplitRound::plan(2110, 500, 132, kLast).ctas, 132);
  EXPECT_TRUE(SplitRound::plan(2110, 500, 132, kLast).splits());
  // 64 tiles of 64 key tiles (8 x 8 KV heads decoding over 8192 keys): 31 key tiles per CTA, not 64.
  EXPECT_EQ(SplitRound::plan(64, 64, 132, kLast).ctas, 132);
  EXPECT_EQ(SplitRound::plan(64, 64, 132, kLast).whole_tiles, 0);
  EXPECT_EQ(SplitRound::plan(64, 64, 132, kLast).steps, 64 * 64);
  EXPECT_FALSE(SplitRound::plan(64, 8, 132, kLast).splits());  // 4.1 saved
  EXPECT_EQ(SplitRound::plan(64, 8, 132, kLast).ctas, 64);
  EXPECT_FALSE(SplitRound::plan(100, 1, 132, kLast).splits());  // fewer key tiles than CTAs
  StaticPersistentScheduler::Params const params =
      StaticPersistentScheduler::to_params(/*num_m_blocks=*/10, /*nheads=*/211, /*batch=*/1, 132, 500,
                                           SplitPolicy::kLastRound);
  EXPECT_EQ(params.split.steps, SplitRound::plan(2110, 500, 132, kLast).steps);
}

// Packed GQA rows split only a single round of fewer tiles than CTAs; kNone never splits.
TEST(StaticPersistentSchedule, SingleRoundPolicySplitsOnlyASingleRound) {
  using flashhop::sm90::SplitRound;
  EXPECT_TRUE(SplitRound::plan(64, 64, 132, SplitPolicy::kSingleRound).splits());
  EXPECT_EQ(SplitRound::plan(64, 64, 132, SplitPolicy::kSingleRound).ctas, 132);
  EXPECT_TRUE(SplitRound::plan(2110, 500, 132, kLast).splits());
  EXPECT_FALSE(SplitRound::plan(2110, 500, 132, SplitPolicy::kSingleRound).splits());  // after 15 whole rounds
  EXPECT_EQ(SplitRound::plan(2110, 500, 132, SplitPolicy::kSingleRound).ctas, 132);
  EXPECT_FALSE(SplitRound::plan(64, 64, 132, SplitPolicy::kNone).splits());
  EXPECT_EQ(SplitRound::plan(64, 64, 132, SplitPolicy::kNone).ctas, 64);
}

// first_step and cta_of_step, in 32-bit arithmetic, against their definitions in 64 bits:
// first_step(c) = floor(c x steps / ctas); cta_of_step(s) = the largest c with first_step(c) <= s.
TEST(StaticPersistentSchedule, SplitStepsMatchTheirDefinitions) {
  using flashhop::sm90::SplitRound;
  int plans = 0;
  for (int ctas : {1, 7, 114, 132, 264, 1000}) {
    for (int key_tiles : {1, 3, 64, 127, 1024, 65536, 1 << 22}) {
      for (int tiles : {1, 5, 63, 64, 131, 263, 999}) {
        SplitRound const plan = SplitRound::plan(tiles, key_tiles, ctas, kLast);
        if (!plan.splits()) continue;
        ++plans;
        std::int64_t const steps = plan.steps;
        for (int c = 0; c <= ctas; ++c) {
          ASSERT_EQ(plan.first_step(c), static_cast<int>(c * steps / ctas)) << ctas << " " << steps << " " << c;
        }
        ASSERT_EQ(plan.first_step(ctas), plan.steps);
        // Every CTA's first and last step, and the steps around them.
        for (int c = 0; c < ctas; ++c) {
          int const begin = plan.first_step(c), end = plan.first_step(c + 1);
          for (std::int64_t step : {std::int64_t{begin} - 1, std::int64_t{begin}, std::int64_t{begin} + 1,
                                    std::int64_t{end} - 2, std::int64_t{end} - 1}) {
            if (step < 0 || step >= steps) continue;
            int const expected = static_cast<int>(((step + 1) * ctas + steps - 1) / steps) - 1;
            ASSERT_EQ(plan.cta_of_step(static_cast<int>(step)), expected) << ctas << " " << steps << " " << step;
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 50);
}

// The backward's CTA order: every (key tile, pair) once; a pair's key tiles in rising order (the
// deterministic dQ's waits rely on it); within a section, key tiles never fall as the index rises
// (the longest causal walks first); a section of one pair is key tile after key tile, pair after pair.
TEST(BackwardOrder, EveryKeyTileOnceLowerKeyTilesFirstLongestWalksFirst) {
  for (int n_blocks : {1, 2, 5, 16, 128}) {
    for (int kv_pairs : {1, 3, 8, 13, 64}) {
      for (int section = 1; section < 2 * kv_pairs; section *= 2) {
        flashhop::sm90::BackwardOrder const order{n_blocks, kv_pairs, section};
        std::map<std::pair<int, int>, int> index_of;  // (pair, n_block) -> index
        int previous_n_block = 0;
        for (int index = 0; index < n_blocks * kv_pairs; ++index) {
          auto const [n_block, pair] = order(index);
          ASSERT_TRUE(n_block >= 0 && n_block < n_blocks && pair >= 0 && pair < kv_pairs)
              << n_blocks << " key tiles, " << kv_pairs << " pairs, section " << section << ", index " << index;
          ASSERT_TRUE(index_of.emplace(std::pair{pair, n_block}, index).second) << "twice: pair " << pair;
          if (index % (section * n_blocks) != 0) EXPECT_GE(n_block, previous_n_block) << "index " << index;
          previous_n_block = n_block;
          if (section == 1) EXPECT_EQ(index, pair * n_blocks + n_block);
        }
        for (int pair = 0; pair < kv_pairs; ++pair) {
          for (int n_block = 1; n_block < n_blocks; ++n_block) {
            EXPECT_LT(index_of.at({pair, n_block - 1}), index_of.at({pair, n_block}));
          }
        }
      }
    }
  }
}

// Sections: the largest power of two of pairs whose bytes fit, at least one, never past the first
// power of two at or above the pair count.
TEST(BackwardOrder, SectionsFitTheirPairsBytes) {
  using flashhop::sm90::BackwardOrder;
  std::int64_t const l2 = 40ll << 20;
  EXPECT_EQ(BackwardOrder::section_for(l2, 64, l2), 1);
  EXPECT_EQ(BackwardOrder::section_for(2 * l2, 64, l2), 1);
  EXPECT_EQ(BackwardOrder::section_for(l2 / 8, 64, l2), 8);
  EXPECT_EQ(BackwardOrder::section_for(l2 / 8 + 1, 64, l2), 4);
  EXPECT_EQ(BackwardOrder::section_for(1, 64, l2), 64);
  EXPECT_EQ(BackwardOrder::section_for(1, 13, l2), 16);
  EXPECT_EQ(BackwardOrder::section_for(1, 1, l2), 1);
}

}  // namespace
