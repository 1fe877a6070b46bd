// Host test of the FP8 forward's register plumbing (gmma_utils.h), against CuTe's own wgmma
// layouts: each value of P's 8-bit A fragment, which a thread fills from its own score
// accumulator (accumulator_as_fp8_a_operand), is the score of the row that the A layout says, and
// of the key fp8_key_of gives for the column it says, so that V^T's keys in that order
// (fp8_transpose.h) make P V the attention's sum. And the transposer itself, emulated on the host
// over each FP8 recipe's swizzled shared-memory layouts: every V^T byte in place, and the banks its
// warps' loads and stores touch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "kernels/sm90/fp8_transpose.h"
#include "kernels/sm90/fwd_mainloop.h"
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

// The host copy of prmt follows the PTX manual's byte numbering, and the transposer's selectors
// take bytes 0, 2, 4, 6 (and 1, 3, 5, 7) of two ldmatrix registers.
TEST(Fp8Operand, BytePermuteNumbersBytesAsPtx) {
  // Bytes 0 .. 7 of (low, high) are 0x00, 0x11, ..., 0x77: selector 0x5140 takes bytes 0, 4, 1, 5.
  EXPECT_EQ(flashhop::sm90::byte_perm(0x33221100u, 0x77665544u, 0x5140u), 0x55114400u);
  EXPECT_EQ(flashhop::sm90::byte_perm(0x33221100u, 0x77665544u, 0x6420u), 0x66442200u);
  EXPECT_EQ(flashhop::sm90::byte_perm(0x33221100u, 0x77665544u, 0x7531u), 0x77553311u);
}

// The transposer's two warps, emulated on the host on a stage of V in the recipe's swizzled layout
// (bytes: a key's low 8 bits, then in a second pass d's), write V^T with P's column c holding key
// fp8_key_of(c); and each 8 x 16-byte matrix of their ldmatrix and stmatrix touches each bank once
// (one wavefront: no bank conflicts). The emulation follows the PTX manual: in ldmatrix.x4 (and
// stmatrix.x4) lane 8 i + j addresses row j of matrix i; word w of row j goes to (comes from) lane
// 4 j + w; with .trans, lane 4 q + m receives the 16-bit pairs q of rows 2m and 2m + 1.
template <int kRecipe>
void expect_transposer_writes_p_order() {
  using Mainloop = flashhop::sm90::ForwardMainloop<cutlass::float_e4m3_t, kRecipe>;
  using Transposer = typename Mainloop::Transposer;
  using Element = cutlass::float_e4m3_t;
  constexpr int kKeys = Mainloop::kBlockN, kDims = Mainloop::kHeadDimV, kThreads = Mainloop::Roles::kTransposeThreads;
  SCOPED_TRACE(flashhop::sm90::kForwardRecipes[kRecipe].name);
  // The swizzles permute address bits below 1024, as the kernel's 1024-byte aligned buffers.
  const auto aligned = [](std::vector<std::uint8_t>& storage) {
    return reinterpret_cast<Element*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 1023) / 1024 * 1024);
  };
  std::vector<std::uint8_t> v_storage(cute::cosize_v<typename Mainloop::SmemLayoutV> + 1024);
  std::vector<std::uint8_t> vt_storage(cute::cosize_v<typename Mainloop::SmemLayoutVt> + 1024);
  Element* const v_bytes = aligned(v_storage);
  Element* const vt_bytes = aligned(vt_storage);
  std::uint8_t* const v = reinterpret_cast<std::uint8_t*>(v_bytes);
  std::uint8_t* const vt = reinterpret_cast<std::uint8_t*>(vt_bytes);
  const auto byte_at = [](const Element& e) { return reinterpret_cast<const std::uint8_t&>(e); };
  // The most distinct 4-byte words that one matrix's eight 16-byte rows put into one bank.
  const auto ways = [](const std::uint32_t (&rows)[32], int matrix) {
    std::map<int, std::set<std::uint32_t>> banks;
    for (int j = 0; j < 8; ++j) {
      for (int w = 0; w < 4; ++w) {
        std::uint32_t const word = rows[8 * matrix + j] / 4 + w;
        banks[static_cast<int>(word % 32)].insert(word);
      }
    }
    std::size_t most = 0;
    for (const auto& bank : banks) most = std::max(most, bank.second.size());
    return static_cast<int>(most);
  };
  int load_ways = 0, store_ways = 0;
  // Every stage: V's stage i into Vt's stage of the other end, as the rings' indices may differ.
  for (int stage = 0; stage < Mainloop::kStages; ++stage) {
    const int vt_stage = Mainloop::kStages - 1 - stage;
    cute::Tensor sV = cute::make_tensor(cute::make_smem_ptr(v_bytes), typename Mainloop::SmemLayoutV{})(cute::_, cute::_, stage);
    cute::Tensor sVt = cute::make_tensor(cute::make_smem_ptr(vt_bytes), typename Mainloop::SmemLayoutVt{})(cute::_, cute::_, vt_stage);
    for (bool keys : {true, false}) {
      for (int key = 0; key < kKeys; ++key) {
        for (int d = 0; d < kDims; ++d) reinterpret_cast<std::uint8_t&>(sV(key, d)) = keys ? key : d;
      }
      std::fill(vt_storage.begin(), vt_storage.end(), std::uint8_t{0xff});
      for (int warp = 0; warp < kThreads / 32; ++warp) {
        for (int round = 0; round < Transposer::kRounds; ++round) {
          typename Transposer::LaneOffsets lanes[32];
          std::uint32_t load_at[32], store_at[32];
          for (int lane = 0; lane < 32; ++lane) {
            lanes[lane] = Transposer::offsets_of(32 * warp + lane);
            load_at[lane] = Transposer::kStageBytes * stage + Transposer::moved(lanes[lane].load, Transposer::v_round(round));
            store_at[lane] = Transposer::kStageBytes * vt_stage + Transposer::moved(lanes[lane].store, Transposer::vt_round(round));
          }
          std::uint32_t out[32][4];
          for (int lane = 0; lane < 32; ++lane) {
            int const q = lane / 4, m = lane % 4;
            std::uint32_t in[4];
            for (int i = 0; i < 4; ++i) {
              std::uint8_t const* const even = v + load_at[8 * i + 2 * m];
              std::uint8_t const* const odd = v + load_at[8 * i + 2 * m + 1];
              in[i] = even[2 * q] | even[2 * q + 1] << 8 | odd[2 * q] << 16 | static_cast<std::uint32_t>(odd[2 * q + 1]) << 24;
            }
            Transposer::words(in, lanes[lane].select, out[lane]);
          }
          for (int lane = 0; lane < 32; ++lane) {
            int const q = lane / 4, m = lane % 4;
            for (int i = 0; i < 4; ++i) {
              for (int b = 0; b < 4; ++b) vt[store_at[8 * i + q] + 4 * m + b] = out[lane][i] >> (8 * b) & 0xff;
            }
          }
          for (int i = 0; i < 4; ++i) {
            load_ways = std::max(load_ways, ways(load_at, i));
            store_ways = std::max(store_ways, ways(store_at, i));
          }
        }
      }
      int wrong = 0;
      for (int d = 0; d < kDims; ++d) {
        for (int c = 0; c < kKeys; ++c) wrong += byte_at(sVt(d, c)) != (keys ? flashhop::sm90::fp8_key_of(c) : d);
      }
      EXPECT_EQ(wrong, 0) << (keys ? "keys" : "columns d") << " out of place, stage " << stage;
    }
  }
  EXPECT_EQ(load_ways, 1);
  EXPECT_EQ(store_ways, 1);
}

template <int... kRecipes>
void expect_every_fp8_transposer_writes_p_order(std::integer_sequence<int, kRecipes...>) {
  const auto one = [](auto recipe) {
    constexpr int kRecipe = decltype(recipe)::value;
    constexpr flashhop::sm90::ForwardRecipe r = flashhop::sm90::kForwardRecipes[kRecipe];
    if constexpr (r.fp8 && !r.pack_gqa && !r.local()) expect_transposer_writes_p_order<kRecipe>();
  };
  (one(std::integral_constant<int, kRecipes>{}), ...);
}

TEST(Fp8Transposer, WritesVtInPOrderWithoutBankConflicts) {
  expect_every_fp8_transposer_writes_p_order(std::make_integer_sequence<int, flashhop::sm90::kNumForwardRecipes>{});
}

}  // namespace
