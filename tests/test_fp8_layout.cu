// Host test of the FP8 forward's register plumbing (gmma_utils.h), against CuTe's own wgmma
// layouts: each value of P's 8-bit A fragment, which a thread fills from its own score
// accumulator (accumulator_as_fp8_a_operand), is the score of the row that the A layout says, and
// of the key fp8_key_of gives for the column it says, so that V^T's keys in that order
// (fp8_transpose.h) make P V the attention's sum.
#include <gtest/gtest.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "kernels/sm90/fp8_transpose.h"
#include "kernels/sm90/gmma_utils.h"

namespace {

template <int kN>
void expect_p_columns_hold_their_keys() {
  using namespace cute;
  using CLayout = GMMA::CLayout_64xN<kN>;  // (thread, value) -> row + 64 column of the 64 x kN scores
  using ALayout = GMMA::ALayout_64x32;     // (thread, value) -> row + 64 k of a 64 x 32 A block
  // A thread's accumulator: one wgmma of N = kN, compact ((2, 2, kN / 8), 1, 1), as partition_fragment_C makes it.
  auto const accumulator = make_layout(Shape<Shape<_2, _2, Int<kN / 8>>, _1, _1>{});
  auto const p = flashhop::sm90::accumulator_as_fp8_a_operand(accumulator);  // P's A order -> accumulator value
  static_assert(decltype(size(p))::value == kN / 2);
  for (int thread = 0; thread < 128; ++thread) {
    for (int block = 0; block < kN / 32; ++block) {
      for (int i = 0; i < 16; ++i) {
        int const a = ALayout{}(thread, i);
        int const row = a % 64, column = 32 * block + a / 64;  // of P, the A operand
        int const c = CLayout{}(thread, p(i, 0, block));
        EXPECT_EQ(c % 64, row) << "thread " << thread << ", value " << i << " of block " << block;
        EXPECT_EQ(c / 64, flashhop::sm90::fp8_key_of(column)) << "thread " << thread << ", value " << i;
      }
    }
  }
}

TEST(Fp8Operand, PColumnsHoldTheScoresOfTheirKeys) {
  expect_p_columns_hold_their_keys<64>();
  expect_p_columns_hold_their_keys<96>();
  expect_p_columns_hold_their_keys<128>();
}

// fp8_key_of permutes each block of 16 keys: every key once.
TEST(Fp8Operand, KeyOrderIsAPermutationOfEachBlockOf16) {
  for (int base = 0; base < 256; base += 16) {
    bool seen[16] = {};
    for (int column = base; column < base + 16; ++column) {
      int const key = flashhop::sm90::fp8_key_of(column);
      ASSERT_GE(key, base);
      ASSERT_LT(key, base + 16);
      EXPECT_FALSE(seen[key - base]) << key;
      seen[key - base] = true;
    }
  }
}

// The transposer's 4 x 4 byte transpose, through prmt's selectors: byte j of out[i] is byte i of
// in[j] (the host copy of prmt follows the PTX manual's byte numbering).
TEST(Fp8Operand, TransposerSwapsBytesAndWords) {
  // Bytes 0 .. 7 of (low, high) are 0x00, 0x11, ..., 0x77: selector 0x5140 takes bytes 0, 4, 1, 5.
  EXPECT_EQ(flashhop::sm90::byte_perm(0x33221100u, 0x77665544u, 0x5140u), 0x55114400u);
  const std::uint32_t in[4] = {0x03020100u, 0x13121110u, 0x23222120u, 0x33323130u};  // byte i of in[j]: 0x(j)(i)
  std::uint32_t out[4];
  flashhop::sm90::transpose_bytes(in, out);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ((out[i] >> (8 * j)) & 0xff, (in[j] >> (8 * i)) & 0xff) << i << " " << j;
  }
}

}  // namespace
