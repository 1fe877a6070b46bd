// Host tests of the masks' tile ranges (mask.h): which key tile a query tile's walk starts on, and
// for the backward which query tiles a key tile visits and which tiles need no per-element mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "kernels/sm90/mask.h"

namespace {

using flashhop::sm90::KeyBlocks;
using flashhop::sm90::LocalMask;
using flashhop::sm90::NoMask;

constexpr int kBlockM = 128, kBlockN = 128;

// Whether every query of [first_query, last_query] sees every key of key tile n.
template <class Mask>
bool whole(Mask const& mask, int first_query, int last_query, int n) {
  for (int query = first_query; query <= last_query; ++query) {
    flashhop::sm90::RowKeys const keys = mask.row_keys(query);
    if (keys.begin > n * kBlockN || keys.end < (n + 1) * kBlockN) return false;
  }
  return true;
}

// For every query tile: the first key tile is the highest whole one when the last tile needs
// masking and a whole one exists, else the last tile. Returns how many query tiles start below
// their last key tile.
template <class Mask>
int check_first(Mask const& mask, int seqlen_q) {
  int moved = 0;
  for (int m = 0; m * kBlockM < seqlen_q; ++m) {
    int const first_query = m * kBlockM, last_query = first_query + kBlockM - 1;
    KeyBlocks const blocks = mask.template key_blocks<kBlockN>(first_query, last_query);
    if (blocks.empty()) continue;
    int highest_whole = -1;
    for (int n = blocks.begin; n < blocks.end; ++n) {
      if (whole(mask, first_query, last_query, n)) highest_whole = n;
    }
    int const first = blocks.first();
    SCOPED_TRACE(::testing::Message() << "query tile " << m << ", key tiles [" << blocks.begin << ", " << blocks.end
                                      << "), first " << first);
    if (highest_whole >= 0 && highest_whole != blocks.end - 1) {
      EXPECT_EQ(first, highest_whole);
      ++moved;
    } else {
      EXPECT_EQ(first, blocks.end - 1);
    }
  }
  return moved;
}

TEST(KeyBlocks, WalkStartsOnTheHighestWholeTileWhereTheLastIsMasked) {
  int moved = 0;
  for (auto [seqlen_q, seqlen_k] : {std::tuple{512, 512}, std::tuple{1000, 1000}, std::tuple{300, 1100},
                                    std::tuple{1100, 300}, std::tuple{1, 4096}, std::tuple{4097, 4097}}) {
    SCOPED_TRACE(::testing::Message() << "seqlen_q " << seqlen_q << ", seqlen_k " << seqlen_k);
    moved += check_first(NoMask{seqlen_q, seqlen_k}, seqlen_q);
    // The host writes an unbounded side, and any wider one, as the width that just reaches past
    // the keys (LocalMask): window_left <= seqlen_k, window_right <= seqlen_q.
    for (auto [left, right] : {std::tuple{seqlen_k, 0}, std::tuple{300, 0}, std::tuple{61, 17},
                               std::tuple{seqlen_k, 40}, std::tuple{1000, 200}}) {
      left = std::min(left, seqlen_k);
      right = std::min(right, seqlen_q);
      SCOPED_TRACE(::testing::Message() << "window " << left << ", " << right);
      moved += check_first(LocalMask{seqlen_q, seqlen_k, left, right}, seqlen_q);
    }
  }
  EXPECT_GT(moved, 50);  // causal and seqlen_k % 128 != 0 start below the last tile in most tiles
}

// Without a mask a whole last tile, or a single key tile, is where the walk starts.
TEST(KeyBlocks, UnmaskedWalkStartsOnTheLastTileWhenItIsWhole) {
  EXPECT_EQ((NoMask{512, 512}.key_blocks<kBlockN>(0, 127).first()), 3);
  EXPECT_EQ((NoMask{512, 500}.key_blocks<kBlockN>(0, 127).first()), 2);  // the last tile has 116 keys
  EXPECT_EQ((NoMask{512, 100}.key_blocks<kBlockN>(0, 127).first()), 0);  // one partial tile
}

// The backward's questions, against every query and key: which query tiles of 64 rows see one of
// a key tile's keys (query_blocks), and whether all of a tile's queries see all of its keys
// (sees_whole_tile, on the unclipped band: keys past seqlen_k count as seen).
TEST(QueryBlocks, MatchVisibilityQueryByQuery) {
  constexpr int kRows = 64, kKeys = 64;
  int whole_tiles = 0, partial_tiles = 0;
  for (auto [seqlen_q, seqlen_k] : {std::tuple{300, 300}, std::tuple{130, 700}, std::tuple{700, 130},
                                    std::tuple{1, 257}, std::tuple{2049, 2049}}) {
    for (auto [left, right] : {std::tuple{seqlen_k, 0}, std::tuple{61, 17}, std::tuple{0, 0}, std::tuple{200, 90},
                               std::tuple{seqlen_k, seqlen_q}}) {
      LocalMask const mask{seqlen_q, seqlen_k, std::min(left, seqlen_k), std::min(right, seqlen_q)};
      SCOPED_TRACE(::testing::Message() << "seqlen_q " << seqlen_q << ", seqlen_k " << seqlen_k << ", window "
                                        << mask.window_left << ", " << mask.window_right);
      for (int first_key = 0; first_key < seqlen_k; first_key += kKeys) {
        int const last_key = std::min(first_key + kKeys, seqlen_k) - 1;
        flashhop::sm90::QueryBlocks const blocks = mask.query_blocks<kRows>(first_key, last_key);
        for (int m = 0; m * kRows < seqlen_q; ++m) {
          bool sees_one = false, sees_all = true;
          for (int query = m * kRows; query < m * kRows + kRows; ++query) {
            for (int key = first_key; key < first_key + kKeys; ++key) {
              bool const seen = key >= mask.band_begin(query) && key < mask.band_end(query);
              sees_all = sees_all && seen;
              sees_one = sees_one || (seen && query < seqlen_q && key <= last_key);
            }
          }
          EXPECT_EQ(m >= blocks.begin && m < blocks.end, sees_one) << "query tile " << m << ", keys " << first_key;
          EXPECT_EQ(mask.sees_whole_tile(m * kRows, kRows, first_key, kKeys), sees_all)
              << "query tile " << m << ", keys " << first_key;
          (sees_all ? whole_tiles : partial_tiles) += sees_one;
        }
      }
    }
  }
  EXPECT_GT(whole_tiles, 100);
  EXPECT_GT(partial_tiles, 100);
}

}  // namespace
