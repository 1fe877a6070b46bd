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

constexpr int kSharedBytesPerCta = 227 * 1024;  // sm_90 opt-in limit for one CTA
constexpr int kSharedBytesPerSm = 228 * 1024;   // and for all CTAs of an SM (1 KB of it reserved per CTA)
constexpr int kElementBytes = 2;                // bf16 / fp16

struct ConfigCase {
  int head_dim, head_dim_v;
  bool local;
  bool wide_band;
  bool pack_gqa;
};

class TileConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(TileConfig, FitsTheKernelsLimits) {
  const ConfigCase c = GetParam();
  const ForwardTileConfig config = forward_tile_config(c.head_dim, c.local, c.wide_band, c.pack_gqa);
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
                               for (bool wide : {false, true}) {
                                 for (bool pack : {false, true}) cases.push_back({d, dv, local, wide, pack});
                               }
                             }
                           }
                           return cases;
                         }()),
                         [](const ::testing::TestParamInfo<ConfigCase>& info) {
                           const ConfigCase& c = info.param;
                           return "d" + std::to_string(c.head_dim) + "_dv" + std::to_string(c.head_dim_v) +
                                  (c.local ? "_local" : "_full") + (c.wide_band ? "_wide" : "") +
                                  (c.pack_gqa ? "_packgqa" : "");
                         });

TEST(TileConfigSelection, LocalNeverUsesWiderKeyTilesThanNonCausal) {
  // Wider key tiles waste more of the diagonal tile under a causal or window mask.
  for (int head_dim : {64, 96, 128, 192, 256}) {
    for (bool wide : {false, true}) {
      EXPECT_LE(forward_tile_config(head_dim, true, wide, false).block_n,
                forward_tile_config(head_dim, false, wide, false).block_n)
          << head_dim;
    }
  }
}

TEST(TileConfigSelection, BandWidthTilesAtHeadDims64And128And256Only) {
  // tools/generate_instantiations.py writes the other band width's kernels of these head dims
  // (BAND_WIDTH_HEAD_DIMS); dispatch.cu launches them wherever has_band_width_tiles holds.
  using flashhop::sm90::has_band_width_tiles;
  for (int head_dim : {64, 96, 128, 192, 256}) {
    const bool expected = head_dim == 64 || head_dim == 128 || head_dim == 256;
    EXPECT_EQ(has_band_width_tiles(head_dim, true), expected) << head_dim;
    EXPECT_EQ(has_band_width_tiles(head_dim, false), expected) << head_dim;
  }
  EXPECT_EQ(forward_tile_config(64, true, true, false).block_m, 192);
  // d = 64 without a mask: short query sequences ("narrow") on the packed rows' 64-row tiles.
  EXPECT_EQ(forward_tile_config(64, false, true, false).block_m, 192);
  EXPECT_EQ(forward_tile_config(64, false, false, false), forward_tile_config(64, false, true, true));
  // d = 256: narrow bands on 64-key tiles, wide ones on 80, masked or not.
  EXPECT_EQ(forward_tile_config(256, true, false, false).block_n, 64);
  EXPECT_EQ(forward_tile_config(256, false, false, false).block_n, 64);
  EXPECT_EQ(forward_tile_config(256, true, true, false), forward_tile_config(256, false, true, false));
  EXPECT_EQ(forward_tile_config(256, false, true, false).block_n, 80);
  // d = 128: short query sequences ("narrow", masked or not) on 64 x 64 tiles of one warpgroup.
  for (bool local : {false, true}) {
    EXPECT_EQ(forward_tile_config(128, local, false, false).block_m, 64);
    EXPECT_EQ(forward_tile_config(128, local, false, false).block_n, 64);
    EXPECT_EQ(forward_tile_config(128, local, true, false).block_m, 128);
  }
}

TEST(TileConfigSelection, PackedRowsOfHeadDim64OnOneWarpGroup) {
  // d = 64's packed GQA rows: 64-row tiles, one consumer warpgroup, two CTAs per SM, no ping-pong;
  // d = 128's take the unpacked rows' 128-row tiles (which the "wide" query rows take), the other
  // head dims' their unpacked tiles of the default band width.
  for (bool local : {false, true}) {
    const bool wide = flashhop::sm90::default_wide_band(local);
    const ForwardTileConfig packed = forward_tile_config(64, local, wide, true);
    EXPECT_EQ(packed.block_m, 64);
    EXPECT_FALSE(packed.mma_pingpong);
    EXPECT_EQ(forward_tile_config(128, local, wide, true), forward_tile_config(128, local, true, false));
    for (int head_dim : {96, 192, 256}) {
      EXPECT_EQ(forward_tile_config(head_dim, local, wide, true), forward_tile_config(head_dim, local, wide, false))
          << head_dim;
    }
  }
}

TEST(TileConfigSelection, ShortQueryRowsAtHeadDim128) {
  // The 64-row tiles where 128-row ones would pad seqlen_q to more than 5/4 of 64-row ones: up to
  // 64 queries and from 129 to 192, with a mask or without; the keys do not matter.
  using flashhop::sm90::band_is_wide;
  for (bool local : {false, true}) {
    for (int seqlen_q : {1, 16, 64, 129, 150, 192}) EXPECT_FALSE(band_is_wide(128, local, seqlen_q, 8192)) << seqlen_q;
    for (int seqlen_q : {0, 65, 100, 128, 193, 256, 257, 320, 16384}) {
      EXPECT_TRUE(band_is_wide(128, local, seqlen_q, 100)) << seqlen_q;
    }
  }
}

}  // namespace
