// Host test of the FP8 forward's register plumbing (gmma_utils.h), against CuTe's own wgmma
// layouts: each value of P's 8-bit A fragment, which a thread fills from its own score
// accumulator (accumulator_as_fp8_a_operand), is the score of the row that the A layout says, and
// of the key fp8_key_of gives for the column it says, so that V^T's keys in that order
// (fp8_transpose.h) make P V the attention's sum. And the transposer itself, run on the host over
// each FP8 recipe's swizzled shared-memory layouts: every V^T byte in place, and the banks its
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

// The transposer's threads, run one after another on a stage of V in the recipe's swizzled layout
// (bytes: a key's low 8 bits, then in a second pass d's), write V^T with P's column c holding key
// fp8_key_of(c); and each warp-wide 4-byte load and store touches at most `ways` words of one
// bank (a wavefront per word beyond the first: shared memory's bank conflicts).
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
  const auto byte_at = [](const Element& e) { return reinterpret_cast<const std::uint8_t&>(e); };
  // Every stage: V's stage i into Vt's stage of the other end, as the rings' indices may differ.
  for (int stage = 0; stage < Mainloop::kStages; ++stage) {
    const int vt_stage = Mainloop::kStages - 1 - stage;
    cute::Tensor sV = cute::make_tensor(cute::make_smem_ptr(v_bytes), typename Mainloop::SmemLayoutV{})(cute::_, cute::_, stage);
    cute::Tensor sVt = cute::make_tensor(cute::make_smem_ptr(vt_bytes), typename Mainloop::SmemLayoutVt{})(cute::_, cute::_, vt_stage);
    for (bool keys : {true, false}) {
      for (int key = 0; key < kKeys; ++key) {
        for (int d = 0; d < kDims; ++d) reinterpret_cast<std::uint8_t&>(sV(key, d)) = keys ? key : d;
      }
      for (int thread = 0; thread < kThreads; ++thread) {
        Transposer::transpose(reinterpret_cast<const std::uint8_t*>(v_bytes) + Transposer::kStageBytes * stage,
                              reinterpret_cast<std::uint8_t*>(vt_bytes) + Transposer::kStageBytes * vt_stage,
                              Transposer::offsets_of(thread));
      }
      int wrong = 0;
      for (int d = 0; d < kDims; ++d) {
        for (int c = 0; c < kKeys; ++c) wrong += byte_at(sVt(d, c)) != (keys ? flashhop::sm90::fp8_key_of(c) : d);
      }
      EXPECT_EQ(wrong, 0) << (keys ? "keys" : "columns d") << " out of place, stage " << stage;
    }
  }
  cute::Tensor sV = cute::make_tensor(cute::make_smem_ptr(v_bytes), typename Mainloop::SmemLayoutV{})(cute::_, cute::_, 0);
  cute::Tensor sVt = cute::make_tensor(cute::make_smem_ptr(vt_bytes), typename Mainloop::SmemLayoutVt{})(cute::_, cute::_, 0);
  // Bank conflicts of the warps' accesses: for each warp and task round, each of the four loads
  // and four stores, the most distinct 4-byte words that fall into one of the 32 banks.
  const auto ways = [](const std::vector<std::intptr_t>& bytes) {
    std::map<int, std::set<std::intptr_t>> banks;
    for (std::intptr_t at : bytes) banks[static_cast<int>(at / 4 % 32)].insert(at / 4);
    std::size_t most = 0;
    for (const auto& bank : banks) most = std::max(most, bank.second.size());
    return static_cast<int>(most);
  };
  int load_ways = 0, store_ways = 0;
  for (int first = 0; first < Transposer::kTasks; first += 32) {
    for (int j = 0; j < 4; ++j) {
      std::vector<std::intptr_t> loads, stores;
      for (int task = first; task < first + 32; ++task) {
        const int d = Transposer::d_of(task), column = Transposer::column_of(task);
        const int key = flashhop::sm90::fp8_key_of(column) + j % 2 + 8 * (j / 2);
        loads.push_back(&sV(key, d) - v_bytes);
        stores.push_back(&sVt(d + j, column) - vt_bytes);
      }
      load_ways = std::max(load_ways, ways(loads));
      store_ways = std::max(store_ways, ways(stores));
    }
  }
  // 96-key tiles (d = 192): V^T's 96-byte rows take 32-byte swizzle atoms, stores 4-way there.
  EXPECT_LE(load_ways, 2);
  EXPECT_LE(store_ways, kKeys % 64 == 0 ? 2 : 4);
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

TEST(Fp8Transposer, WritesVtInPOrderWithFewBankConflicts) {
  expect_every_fp8_transposer_writes_p_order(std::make_integer_sequence<int, flashhop::sm90::kNumForwardRecipes>{});
}

}  // namespace
