// Host tests of the sm90 forward tile configuration: every (head dim, mask) choice must fit the
// hardware limits that the kernel relies on.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/sm90/tile_config.h"

namespace {

using flashhop::sm90::forward_tile_config;
using flashhop::sm90::ForwardTileConfig;
using flashhop::sm90::TileChoice;

constexpr TileChoice kNarrow = TileChoice::kNarrowBand;
constexpr TileChoice kWide = TileChoice::kWideBand;
constexpr TileChoice kShort = TileChoice::kShortRows;
constexpr TileChoice kChoices[] = {kNarrow, kWide, kShort};

constexpr int kSharedBytesPerCta = 227 * 1024;  // sm_90 opt-in limit for one CTA
constexpr int kSharedBytesPerSm = 228 * 1024;   // and for all CTAs of an SM (1 KB of it reserved per CTA)
constexpr int kElementBytes = 2;                // bf16 / fp16

struct ConfigCase {
  int head_dim, head_dim_v;
  bool local;
  TileChoice choice;
  bool pack_gqa;
};

class TileConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(TileConfig, FitsTheKernelsLimits) {
  const ConfigCase c = GetParam();
  const ForwardTileConfig config = forward_tile_config(c.head_dim, c.local, c.choice, c.pack_gqa);
  // One to three consumer warpgroups of one 64-row wgmma atom each (WarpGroups' register budgets).
  EXPECT_TRUE(config.block_m == 64 || config.block_m == 128 || config.block_m == 192) << config.block_m;
  // S = Q K^T uses block_n as the wgmma N (a multiple of 8, at most 256); P V uses it as the K of
  // 16-wide register-A wgmma steps.
  EXPECT_EQ(config.block_n % 16, 0) << config.block_n;
  EXPECT_GE(config.block_n, 16);
  EXPECT_LE(config.block_n, 256);
  // At least double buffering, so TMA loads overlap the GEMMs.
  EXPECT_GE(config.stages, 2);
  // Each thread holds block_n / 4 columns of its score rows; the softmax splits them into chains.
  EXPECT_GE(config.softmax_chains, 1);
  EXPECT_LE(config.softmax_chains, config.block_n / 4);
  // Q (O may reuse it) and `stages` K and V tiles, plus a little for the mbarriers.
  const int tensor_bytes =
      (config.block_m * c.head_dim + config.stages * config.block_n * (c.head_dim + c.head_dim_v)) * kElementBytes;
  EXPECT_LE(tensor_bytes + 1024, kSharedBytesPerCta) << "block_n " << config.block_n;
  // One consumer warpgroup runs two CTAs per SM (WarpGroups), each with O in its own buffer.
  if (config.block_m == 64) {
    const int o_bytes = config.block_m * c.head_dim_v * kElementBytes;
    EXPECT_LE(2 * (tensor_bytes + o_bytes + 1024), kSharedBytesPerSm) << "block_n " << config.block_n;
  }
}

INSTANTIATE_TEST_SUITE_P(AllHeadDims, TileConfig,
                         ::testing::ValuesIn([] {
                           std::vector<ConfigCase> cases;
                           for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128},
                                                {256, 256}}) {
                             for (bool local : {false, true}) {
                               for (TileChoice choice : kChoices) {
                                 for (bool pack : {false, true}) cases.push_back({d, dv, local, choice, pack});
                               }
                             }
                           }
                           return cases;
                         }()),
                         [](const ::testing::TestParamInfo<ConfigCase>& info) {
                           const ConfigCase& c = info.param;
                           return "d" + std::to_string(c.head_dim) + "_dv" + std::to_string(c.head_dim_v) +
                                  (c.local ? "_local" : "_full") +
                                  (c.choice == kWide ? "_wide" : c.choice == kShort ? "_short" : "") +
                                  (c.pack_gqa ? "_packgqa" : "");
                         });

TEST(TileConfigSelection, LocalNeverUsesWiderKeyTilesThanNonCausal) {
  // Wider key tiles waste more of the diagonal tile under a causal or window mask.
  for (int head_dim : {64, 96, 128, 192, 256}) {
    for (TileChoice choice : kChoices) {
      EXPECT_LE(forward_tile_config(head_dim, true, choice, false).block_n,
                forward_tile_config(head_dim, false, choice, false).block_n)
          << head_dim;
    }
  }
}

TEST(TileConfigSelection, OwnTilesAtHeadDims64And128And256Only) {
  // tools/generate_instantiations.py writes the kernels of these choices (OWN_TILES); dispatch.cu
  // launches them wherever has_own_tiles holds.
  using flashhop::sm90::has_own_tiles;
  for (int head_dim : {96, 192}) {
    for (bool local : {false, true}) {
      for (TileChoice choice : kChoices) EXPECT_FALSE(has_own_tiles(head_dim, local, choice)) << head_dim;
    }
  }
  EXPECT_TRUE(has_own_tiles(64, true, kWide));
  EXPECT_FALSE(has_own_tiles(64, true, kShort));
  EXPECT_TRUE(has_own_tiles(64, false, kShort));
  EXPECT_FALSE(has_own_tiles(64, false, kNarrow));
  EXPECT_TRUE(has_own_tiles(128, true, kWide));
  EXPECT_TRUE(has_own_tiles(128, true, kShort));
  EXPECT_TRUE(has_own_tiles(128, false, kShort));
  EXPECT_FALSE(has_own_tiles(128, false, kNarrow));
  EXPECT_TRUE(has_own_tiles(256, true, kWide));
  EXPECT_FALSE(has_own_tiles(256, true, kShort));
  EXPECT_TRUE(has_own_tiles(256, false, kNarrow));
  EXPECT_FALSE(has_own_tiles(256, false, kShort));
  EXPECT_EQ(forward_tile_config(64, true, kWide, false).block_m, 192);
  // d = 64 without a mask: short query sequences on the packed rows' 64-row tiles.
  EXPECT_EQ(forward_tile_config(64, false, kWide, false).block_m, 192);
  EXPECT_EQ(forward_tile_config(64, false, kShort, false), forward_tile_config(64, false, kWide, true));
  // d = 256: narrow bands on 64-key tiles, wide ones on 80, masked or not.
  EXPECT_EQ(forward_tile_config(256, true, kNarrow, false).block_n, 64);
  EXPECT_EQ(forward_tile_config(256, false, kNarrow, false).block_n, 64);
  EXPECT_EQ(forward_tile_config(256, true, kWide, false), forward_tile_config(256, false, kWide, false));
  EXPECT_EQ(forward_tile_config(256, false, kWide, false).block_n, 80);
  // d = 128: short query sequences (masked or not) on 64 x 64 tiles of one warpgroup; bands on
  // 128 x 128, masked by chunks where narrow.
  for (bool local : {false, true}) {
    EXPECT_EQ(forward_tile_config(128, local, kShort, false).block_m, 64);
    EXPECT_EQ(forward_tile_config(128, local, kShort, false).block_n, 64);
    EXPECT_EQ(forward_tile_config(128, local, kWide, false).block_m, 128);
    EXPECT_FALSE(forward_tile_config(128, local, kWide, false).mask_by_chunks);
  }
  EXPECT_TRUE(forward_tile_config(128, true, kNarrow, false).mask_by_chunks);
  EXPECT_EQ(forward_tile_config(128, true, kNarrow, false).block_m, 128);
}

TEST(TileConfigSelection, PackedRowsOfHeadDim64OnOneWarpGroup) {
  // d = 64's packed GQA rows: 64-row tiles, one consumer warpgroup, two CTAs per SM, no ping-pong;
  // d = 128's take the unpacked rows' 128-row tiles of wide bands (they mask every column), the
  // other head dims' their unpacked tiles of the default choice.
  for (bool local : {false, true}) {
    const TileChoice choice = flashhop::sm90::default_tile_choice(local);
    const ForwardTileConfig packed = forward_tile_config(64, local, choice, true);
    EXPECT_EQ(packed.block_m, 64);
    EXPECT_FALSE(packed.mma_pingpong);
    EXPECT_EQ(forward_tile_config(128, local, choice, true), forward_tile_config(128, local, kWide, false));
    for (int head_dim : {96, 192, 256}) {
      EXPECT_EQ(forward_tile_config(head_dim, local, choice, true), forward_tile_config(head_dim, local, choice, false))
          << head_dim;
    }
  }
}

TEST(TileConfigSelection, ShortQueryRowsAtHeadDim128) {
  // The 64-row tiles where 128-row ones would pad seqlen_q to more than 5/4 of 64-row ones: up to
  // 64 queries and from 129 to 192, with a mask or without; the keys do not matter.
  using flashhop::sm90::tile_choice;
  for (bool local : {false, true}) {
    for (int seqlen_q : {1, 16, 64, 129, 150, 192}) {
      EXPECT_EQ(tile_choice(128, local, seqlen_q, 8192), kShort) << seqlen_q;
    }
    for (int seqlen_q : {0, 65, 100, 128, 193, 256, 257, 320, 16384}) {
      EXPECT_EQ(tile_choice(128, local, seqlen_q, 100), kNarrow) << seqlen_q;
      EXPECT_EQ(tile_choice(128, local, seqlen_q, 2048), kWide) << seqlen_q;
    }
  }
}

TEST(TileConfigSelection, SoftcapPerKernelOnlyForHeadDims64And128WithoutMaskOnTallTiles) {
  // launch_forward compiles two kernels, one per soft-capping choice, only for d = 64's unmasked
  // 192-row tiles and d = 128's unmasked 128-row tiles; every other configuration branches on
  // softcap in one kernel.
  using flashhop::sm90::softcap_per_kernel;
  EXPECT_TRUE(softcap_per_kernel(64, false, kWide, false));
  EXPECT_EQ(forward_tile_config(64, false, kWide, false).block_m, 192);
  EXPECT_TRUE(softcap_per_kernel(128, false, kWide, false));
  EXPECT_EQ(forward_tile_config(128, false, kWide, false).block_m, 128);
  for (int head_dim : {64, 96, 128, 192, 256}) {
    for (bool local : {false, true}) {
      for (TileChoice choice : kChoices) {
        for (bool pack : {false, true}) {
          if ((head_dim == 64 || head_dim == 128) && !local && choice == kWide && !pack) continue;
          EXPECT_FALSE(softcap_per_kernel(head_dim, local, choice, pack))
              << head_dim << " local " << local << " choice " << static_cast<int>(choice) << " pack " << pack;
        }
      }
    }
  }
}

}  // namespace
