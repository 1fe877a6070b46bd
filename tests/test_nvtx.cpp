// The NVTX ranges of the API calls (src/api/nvtx.h): each range's name says which configuration the
// plan chose, with the dtype and the shape; without a profiler no domain exists and a range does
// nothing. No device is touched.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "api/nvtx.h"
#include "api/plan.h"
#include "flashhop/flashhop.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

struct RangeCase {
  const char* name;
  const char* entry;
  DType dtype;
  Problem problem;  // batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim (, head_dim_v)
  Masking masking;  // causal, window_left, window_right, softcap
  flashhop::PackGqa pack_gqa;
  const char* expected;
};

class RangeName : public ::testing::TestWithParam<RangeCase> {};

TEST_P(RangeName, NamesThePlannedConfiguration) {
  const RangeCase& c = GetParam();
  const ForwardPlan buffers = contiguous_plan(c.problem, c.dtype);
  flashhop::ForwardArgs args = bind_args(buffers, fake_bases(buffers), /*with_lse=*/true, c.masking);
  args.pack_gqa = c.pack_gqa;
  ASSERT_TRUE(flashhop::validate_forward(args).ok());
  const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(flashhop::detail::range_name(c.entry, plan), c.expected);
}

constexpr flashhop::PackGqa kAuto = flashhop::PackGqa::kAuto;
constexpr flashhop::PackGqa kOff = flashhop::PackGqa::kOff;

INSTANTIATE_TEST_SUITE_P(
    Plans, RangeName,
    ::testing::Values(
        // d = 128 without a mask: the wide-band tiles; 4096 queries fill unpacked tiles, so no packing.
        RangeCase{"full_d128_gqa", "forward", DType::kBFloat16, {2, 4096, 4096, 32, 8, 128}, {}, kAuto,
                  "forward bf16 hdim128_nomask b2 sq4096 sk4096 h32/8"},
        // Causal, seqlen 4096: the middle row sees 2049 keys, a wide band at d = 128.
        RangeCase{"causal_d128_gqa", "forward", DType::kBFloat16, {2, 4096, 4096, 32, 8, 128}, {true}, kAuto,
                  "forward bf16 hdim128_local_wide b2 sq4096 sk4096 h32/8 causal"},
        // A sliding window of 256 keys to the left: a narrow band.
        RangeCase{"window_d128", "forward", DType::kBFloat16, {1, 8192, 8192, 16, 16, 128}, {false, 256, 0},
                  kAuto, "forward bf16 hdim128_local b1 sq8192 sk8192 h16/16 window(256,0)"},
        // A window bounded on the left only; -1 names the unbounded side, as ForwardArgs takes it.
        RangeCase{"left_window_d128", "forward", DType::kFloat16, {1, 2048, 2048, 4, 4, 128}, {false, 100, -1},
                  kAuto, "forward fp16 hdim128_local b1 sq2048 sk2048 h4/4 window(100,-1)"},
        // GQA decoding: one query per head, packed 4 to a KV head.
        RangeCase{"decode_d64_packed", "forward", DType::kFloat16, {8, 1, 8192, 32, 8, 64}, {}, kAuto,
                  "forward fp16 hdim64_nomask_packgqa b8 sq1 sk8192 h32/8"},
        // Causal with one query: the band hides no key, so the unmasked kernel of short rows runs,
        // and the name says so.
        RangeCase{"causal_hiding_nothing", "forward", DType::kBFloat16, {3, 1, 100, 4, 4, 128}, {true}, kOff,
                  "forward bf16 hdim128_nomask_short b3 sq1 sk100 h4/4"},
        // The workspace query; dv differs from d; soft-capping.
        RangeCase{"workspace_d192x128_softcap", "forward_workspace_size", DType::kBFloat16,
                  {1, 1000, 300, 8, 8, 192, 128}, {false, -1, -1, 30.f}, kAuto,
                  "forward_workspace_size bf16 hdim192x128_nomask b1 sq1000 sk300 h8/8 softcap30"}),
    [](const ::testing::TestParamInfo<RangeCase>& info) { return info.param.name; });

// The backward's name: its recipe, the band, soft-capping and the deterministic order.
TEST(RangeNameBackward, NamesThePlannedConfiguration) {
  const ForwardPlan buffers = contiguous_plan({2, 300, 500, 8, 2, 128}, DType::kBFloat16);
  const flashhop::ForwardArgs forward = bind_args(buffers, fake_bases(buffers), /*with_lse=*/true);
  flashhop::BackwardArgs args = backward_args_of(forward, forward.o, forward.q, forward.k, forward.v);
  args.causal = true;
  args.softcap = 5.f;
  args.deterministic = true;
  EXPECT_EQ(flashhop::detail::range_name("backward", flashhop::detail::plan_backward(args)),
            "backward bf16 hdim128_local b2 sq300 sk500 h8/2 causal softcap5 deterministic");
}

// The quantization's name: its scaling, shape and rotation.
TEST(RangeNameQuantize, NamesScalingShapeAndRotation) {
  flashhop::sm90::Fp8QuantizeParams p;
  p.batch = 2;
  p.seqlen = 4096;
  p.nheads = 32;
  p.head_dim = 128;
  p.scaling = flashhop::Fp8Scaling::kPerHead;
  EXPECT_EQ(flashhop::detail::range_name("quantize_fp8", p), "quantize_fp8 per_head b2 s4096 h32 d128");
  const float signs[1] = {};
  p.hadamard_signs = signs;
  p.scaling = flashhop::Fp8Scaling::kPerBlock;
  EXPECT_EQ(flashhop::detail::range_name("quantize_fp8", p), "quantize_fp8 per_block b2 s4096 h32 d128 hadamard");
}

// Without a profiler (no NVTX injection library named in the environment) NVTX gives no domain, and
// a range neither builds its name nor calls into NVTX.
TEST(Nvtx, NoDomainWithoutAProfiler) {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) GTEST_SKIP() << "a profiler is attached";
  EXPECT_EQ(flashhop::detail::nvtx_domain(), nullptr);
  const ForwardPlan buffers = contiguous_plan({1, 128, 128, 2, 2, 64}, DType::kBFloat16);
  const flashhop::ForwardArgs args = bind_args(buffers, fake_bases(buffers), /*with_lse=*/false);
  const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
  { const flashhop::detail::ScopedRange range("forward", plan); }
  EXPECT_EQ(flashhop::detail::nvtx_domain(), nullptr);
}

}  // namespace
}  // namespace flashhop_test
