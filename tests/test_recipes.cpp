// Host tests of the recipe table (fwd_recipes.h, generated from tools/forward_recipes.py): every
// recipe fits the hardware limits its kernel relies on; the plan finds a recipe for every call;
// validation, dispatch and the build agree with the table.
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api/dispatch.h"
#include "api/plan.h"
#include "flashhop/flashhop.h"
#include "kernels/sm90/bwd_recipes.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_recipes.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::sm90::ForwardRecipe;
using flashhop::sm90::kForwardRecipes;
using flashhop::sm90::OBuffer;
using flashhop::sm90::TileChoice;

constexpr TileChoice kNarrow = TileChoice::kNarrowBand;
constexpr TileChoice kWide = TileChoice::kWideBand;
constexpr TileChoice kShort = TileChoice::kShortRows;

constexpr int kSharedBytesPerCta = 227 * 1024;  // sm_90 opt-in limit for one CTA
constexpr int kSharedBytesPerSm = 228 * 1024;   // and for all CTAs of an SM (1 KB of it reserved per CTA)
constexpr int kElementBytes = 2;                // bf16 / fp16

std::vector<ForwardRecipe> all_recipes() { return {std::begin(kForwardRecipes), std::end(kForwardRecipes)}; }

class Recipe : public ::testing::TestWithParam<ForwardRecipe> {};

TEST_P(Recipe, FitsTheKernelsLimits) {
  const ForwardRecipe r = GetParam();
  // One to three consumer warpgroups of one 64-row wgmma atom each (WarpGroups' register budgets).
  EXPECT_TRUE(r.block_m == 64 || r.block_m == 128 || r.block_m == 192) << r.block_m;
  // Validation bounds the tile count in tiles of kSmallestBlockM rows, which no recipe undercuts.
  EXPECT_GE(r.block_m, flashhop::sm90::kSmallestBlockM);
  // S = Q K^T uses block_n as the wgmma N (a multiple of 8, at most 256); P V uses it as the K of
  // 16-wide register-A wgmma steps.
  EXPECT_EQ(r.block_n % 16, 0) << r.block_n;
  EXPECT_GE(r.block_n, 16);
  EXPECT_LE(r.block_n, 256);
  EXPECT_GE(r.stages, 2);  // TMA loads overlap the GEMMs
  // Each thread holds block_n / 4 columns of its score rows; the softmax splits them into chains.
  EXPECT_GE(r.softmax_chains, 1);
  EXPECT_LE(r.softmax_chains, r.block_n / 4);
  // FP8: 1-byte Q, K and V, and stages of V transposed; O is 16-bit in every recipe.
  const int element_bytes = r.fp8 ? 1 : kElementBytes;
  const int vt_bytes = r.fp8 ? r.stages * r.block_n * r.head_dim_v : 0;
  const int tensor_bytes =
      (r.block_m * r.head_dim + r.stages * r.block_n * (r.head_dim + r.head_dim_v) + vt_bytes) * element_bytes;
  const int o_bytes = r.block_m * r.head_dim_v * kElementBytes;
  EXPECT_LE(tensor_bytes + (r.o_buffer == OBuffer::kOwn ? o_bytes : 0) + 1024, kSharedBytesPerCta);
  // One consumer warpgroup runs two CTAs per SM (WarpGroups), each with O in its own buffer.
  if (r.block_m == 64) {
    EXPECT_EQ(r.o_buffer, OBuffer::kOwn);
    EXPECT_LE(2 * (tensor_bytes + o_bytes + 1024), kSharedBytesPerSm);
  }
  // Packed rows and the mask kinds' other choices: unpacked recipes of a choice other than the
  // default are the head dim's own tiles for it.
  EXPECT_TRUE(!r.pack_gqa || r.tile_choice == flashhop::sm90::default_tile_choice(r.local())) << r.name;
  EXPECT_TRUE(r.local() || !r.mask_by_chunks) << r.name;
  // FP8: two or three consumer warpgroups (the transposer's register budget), key tiles of whole
  // 32-column A fragments of P, O in its own buffer; compiled for variable-length batches too.
  if (r.fp8) {
    EXPECT_TRUE(r.block_m == 128 || r.block_m == 192) << r.name;
    EXPECT_EQ(r.block_n % 32, 0) << r.name;
    EXPECT_EQ(r.o_buffer, OBuffer::kOwn) << r.name;
    EXPECT_TRUE(r.varlen) << r.name;
  }
  // Each (head dims, mask, packing, choice, FP8) has one recipe.
  int same = 0;
  for (const ForwardRecipe& other : kForwardRecipes) {
    same += other.head_dim == r.head_dim && other.head_dim_v == r.head_dim_v && other.mask == r.mask &&
            other.pack_gqa == r.pack_gqa && other.tile_choice == r.tile_choice && other.fp8 == r.fp8;
  }
  EXPECT_EQ(same, 1) << r.name;
}

INSTANTIATE_TEST_SUITE_P(Table, Recipe, ::testing::ValuesIn(all_recipes()),
                         [](const ::testing::TestParamInfo<ForwardRecipe>& info) { return info.param.name; });

// Every (head dims, mask, packing, choice) of the table's head dims finds a recipe: its own, or the
// default choice's.
TEST(RecipeLookup, EveryChoiceFindsARecipe) {
  for (const ForwardRecipe& r : kForwardRecipes) {
    for (TileChoice choice : {kNarrow, kWide, kShort}) {
      const auto found = flashhop::detail::find_recipe(r.head_dim, r.head_dim_v, r.local(), r.pack_gqa, choice);
      ASSERT_TRUE(found.has_value()) << r.name;
      const TileChoice taken = kForwardRecipes[*found].tile_choice;
      EXPECT_TRUE(taken == choice || taken == flashhop::sm90::default_tile_choice(r.local())) << r.name;
    }
  }
  EXPECT_FALSE(flashhop::detail::find_recipe(80, 80, false, false, kWide).has_value());
  EXPECT_FALSE(flashhop::detail::find_recipe(128, 64, false, false, kWide).has_value());
}

// The plan takes a head dim's variable-length kernel by mask kind, packed rows and input kind (FP8
// or not): one recipe each, its O out through a buffer of its own or Q's (stored row by row).
TEST(RecipeLookup, EachHeadDimMaskKindAndPackingHasOneVariableLengthRecipe) {
  for (const flashhop::sm90::ForwardRecipe& r : kForwardRecipes) {
    int varlen = 0;
    for (const flashhop::sm90::ForwardRecipe& other : kForwardRecipes) {
      varlen += other.varlen && other.head_dim == r.head_dim && other.head_dim_v == r.head_dim_v &&
                other.local() == r.local() && other.pack_gqa == r.pack_gqa && other.fp8 == r.fp8;
    }
    EXPECT_EQ(varlen, 1) << r.name;
    if (r.varlen) {
      EXPECT_NE(r.o_buffer, OBuffer::kTakeTurns) << r.name;
    }
  }
}

TEST(RecipeLookup, ShortQueryRowsAtHeadDim128) {
  // The 64-row tiles where 128-row ones would pad seqlen_q to more than 5/4 of 64-row ones: up to
  // 64 queries and from 129 to 192, with a mask or without; the keys do not matter.
  using flashhop::detail::tile_choice;
  for (bool local : {false, true}) {
    for (int seqlen_q : {1, 16, 64, 129, 150, 192}) {
      EXPECT_EQ(tile_choice(128, 128, local, seqlen_q, 8192), kShort) << seqlen_q;
    }
    for (int seqlen_q : {0, 65, 100, 128, 193, 256, 257, 320, 16384}) {
      EXPECT_EQ(tile_choice(128, 128, local, seqlen_q, 100), kNarrow) << seqlen_q;
      EXPECT_EQ(tile_choice(128, 128, local, seqlen_q, 2048), kWide) << seqlen_q;
    }
  }
}

// Validation accepts exactly the head dims of the table, and names them when it refuses.
TEST(RecipeAgreement, ValidationAcceptsTheTablesHeadDims) {
  std::set<std::pair<int, int>> table;
  for (const ForwardRecipe& r : kForwardRecipes) table.insert({r.head_dim, r.head_dim_v});
  for (int d : {32, 64, 80, 96, 128, 160, 192, 256, 512}) {
    for (int dv : {64, 96, 128, 192, 256}) {
      const Problem problem{1, 8, 8, 2, 2, d};
      ForwardPlan plan = contiguous_plan(problem, DType::kBFloat16);
      flashhop::ForwardArgs args = bind_args(plan, fake_bases(plan), false);
      args.v.shape[3] = args.o.shape[3] = dv;
      args.v.stride[0] = args.v.stride[1] = 2 * dv;
      args.v.stride[2] = dv;
      args.o.stride[0] = 8 * 2 * dv;
      args.o.stride[1] = 2 * dv;
      args.o.stride[2] = dv;
      const flashhop::Status status = flashhop::validate_forward(args);
      EXPECT_EQ(status.ok(), table.count({d, dv}) == 1) << d << " " << dv << ": " << status.message;
      if (!status.ok()) {
        EXPECT_EQ(status.code, flashhop::StatusCode::kNotSupported) << status.message;
      }
    }
  }
}

// Dispatch holds a kernel for exactly the tables' recipes of the dtypes and head dims that CMake
// compiled (FLASHHOP_TEST_DTYPES, FLASHHOP_TEST_HEAD_DIMS: the build's selection, comma-separated).
TEST(RecipeAgreement, DispatchHoldsTheBuildsSelection) {
  const auto split = [](const std::string& list) {
    std::set<std::string> items;
    std::stringstream stream(list);
    for (std::string item; std::getline(stream, item, ',');) items.insert(item);
    return items;
  };
  const std::set<std::string> dtypes = split(FLASHHOP_TEST_DTYPES), head_dims = split(FLASHHOP_TEST_HEAD_DIMS);
  // Each recipe of a table (that has the kernel: `has`) is compiled for exactly the selected dtypes
  // of its kind (`takes`: FP8 recipes e4m3, the others bf16 and fp16) where its head dims are selected.
  const auto expect_selection = [&](const auto& recipes, bool (*compiled)(DType, int), const char* pass,
                                    auto const& has, auto const& takes) {
    for (int i = 0; i < static_cast<int>(std::size(recipes)); ++i) {
      const auto& r = recipes[i];
      const std::string dims = r.head_dim == r.head_dim_v
                                   ? std::to_string(r.head_dim)
                                   : std::to_string(r.head_dim) + "x" + std::to_string(r.head_dim_v);
      for (auto [dtype, name] :
           {std::pair{DType::kBFloat16, "bf16"}, {DType::kFloat16, "fp16"}, {DType::kFloat8E4M3, "e4m3"}}) {
        const bool selected = has(r) && takes(r, dtype) && dtypes.count(name) == 1 && head_dims.count(dims) == 1;
        EXPECT_EQ(compiled(dtype, i), selected) << pass << " " << name << " " << r.name;
      }
    }
  };
  const auto every = [](const auto&) { return true; };
  const auto forward_kind = [](const flashhop::sm90::ForwardRecipe& r, DType dtype) {
    return r.fp8 == (dtype == DType::kFloat8E4M3);
  };
  expect_selection(kForwardRecipes, flashhop::detail::forward_kernel_compiled, "forward", every, forward_kind);
  expect_selection(kForwardRecipes, flashhop::detail::varlen_forward_kernel_compiled, "variable-length forward",
                   [](const flashhop::sm90::ForwardRecipe& r) { return r.varlen; }, forward_kind);
  expect_selection(flashhop::sm90::kBackwardRecipes, flashhop::detail::backward_kernel_compiled, "backward", every,
                   [](const auto&, DType dtype) { return dtype != DType::kFloat8E4M3; });
}

}  // namespace
}  // namespace flashhop_test
