// flashhop::forward on the GPU against the double-precision CPU reference, FlashAttention's way:
// max |O - O_ref| <= 2 x max |O_low - O_ref| + small terms (reference/tolerance.h), where O_low is the
// same attention at the kernel's precision (attention_forward_low_precision). Fresh random inputs every
// run; outputs are poisoned with NaN first, so every element must be written, and padding around
// strided outputs must stay untouched. Every test skips without a GPU, and a configuration not
// compiled into the build (kNotSupported) skips with the library's message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "api/plan.h"
#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"
#include "reference/tolerance.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::Status;
using flashhop::StatusCode;

struct MaxError {
  double value = 0;
  std::size_t index = 0;
};

// Largest |got - expected| over entries where expected is finite.
template <typename Got>
MaxError max_abs_error(const std::vector<Got>& got, const std::vector<double>& expected) {
  MaxError error;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (!std::isfinite(expected[i])) continue;
    const double difference = std::abs(double{got[i]} - expected[i]);
    if (difference > error.value) error = {difference, i};
  }
  return error;
}

std::int64_t count_nan(const std::vector<float>& values) {
  return std::count_if(values.begin(), values.end(), [](float x) { return std::isnan(x); });
}

class CudaStream {
 public:
  CudaStream() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~CudaStream() {
    if (cudaStreamDestroy(stream_) != cudaSuccess) ADD_FAILURE() << "cudaStreamDestroy failed";
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

struct Call {
  Call(const Problem& problem, DType dtype, const Masking& masking, ForwardPlan plan)
      : problem(problem), dtype(dtype), masking(masking), plan(std::move(plan)) {}

  Problem problem;
  DType dtype;
  Masking masking;
  ForwardPlan plan;
  bool with_lse = true;
  std::optional<float> softmax_scale;
  flashhop::PackGqa pack_gqa = flashhop::PackGqa::kAuto;
};

// The plan's allocations on the host: outputs and padding poisoned, q, k and v scattered in.
std::vector<std::vector<unsigned char>> host_images(const ForwardPlan& plan, const std::vector<float>& q,
                                                    const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<std::vector<unsigned char>> host;
  for (std::size_t i = 0; i < plan.buffer_dtypes.size(); ++i) {
    host.push_back(poisoned_storage(plan.buffer_dtypes[i], plan.buffer_elements[i]));
  }
  scatter(q, plan.q, &host[plan.q.buffer]);
  scatter(k, plan.k, &host[plan.k.buffer]);
  scatter(v, plan.v, &host[plan.v.buffer]);
  return host;
}

// Copies each host image into a device buffer of its own; returns their addresses.
std::vector<void*> upload(const std::vector<std::vector<unsigned char>>& host, std::vector<DeviceBuffer>* device) {
  std::vector<void*> bases;
  for (const std::vector<unsigned char>& image : host) {
    device->emplace_back(image.size());
    device->back().upload(image);
    bases.push_back(device->back().data());
  }
  return bases;
}

// flashhop::forward with the workspace it asks for, poisoned (with_workspace).
flashhop::Status forward_with_workspace(const flashhop::ForwardArgs& args, cudaStream_t stream) {
  return with_workspace(args, flashhop::forward_workspace_size, flashhop::forward, stream);
}

// Runs flashhop::forward on fresh random inputs laid out as `call.plan` says, and checks O (and LSE)
// against the reference. Skips the test when the build lacks the configuration.
void run_and_check(const Call& call) {
  const Problem& p = call.problem;
  const ForwardPlan& plan = call.plan;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> q = random_normal(p.q_elements(), call.dtype, rng);
  const std::vector<float> k = random_normal(p.k_elements(), call.dtype, rng);
  const std::vector<float> v = random_normal(p.v_elements(), call.dtype, rng);
  const std::vector<std::vector<unsigned char>> host = host_images(plan, q, k, v);
  std::vector<DeviceBuffer> device;
  const std::vector<void*> bases = upload(host, &device);

  flashhop::ForwardArgs args = bind_args(plan, bases, call.with_lse, call.masking);
  args.softmax_scale = call.softmax_scale;
  args.pack_gqa = call.pack_gqa;
  const CudaStream stream;
  const Status status = forward_with_workspace(args, stream.get());
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;

  for (std::size_t i = 0; i < device.size(); ++i) {
    if (i != static_cast<std::size_t>(plan.o.buffer) && i != static_cast<std::size_t>(plan.lse.buffer)) {
      EXPECT_TRUE(device[i].download() == host[i]) << "input buffer " << i << " was modified";
    }
  }
  const std::vector<unsigned char> o_storage = device[plan.o.buffer].download();
  const std::vector<float> o = gather(o_storage, plan.o);
  ASSERT_EQ(count_nan(o), 0) << "elements of O not written (of " << o.size() << ")";
  EXPECT_EQ(count_non_nan(o_storage, call.dtype), static_cast<std::int64_t>(o.size()))
      << "written outside the view of O";
  const std::vector<unsigned char> lse_storage = device[plan.lse.buffer].download();
  const std::vector<float> lse = gather(lse_storage, plan.lse);
  if (call.with_lse) {
    ASSERT_EQ(count_nan(lse), 0) << "elements of LSE not written (of " << lse.size() << ")";
    EXPECT_EQ(count_non_nan(lse_storage, DType::kFloat32), static_cast<std::int64_t>(lse.size()))
        << "written outside the view of LSE";
  } else {
    EXPECT_EQ(count_non_nan(lse_storage, DType::kFloat32), 0) << "LSE written although not requested";
  }

  // The scale the kernel uses: the given one, else 1/sqrt(d) rounded to float (as plan_forward).
  flashhop::reference::ScoreOptions options;
  options.softmax_scale = call.softmax_scale.value_or(static_cast<float>(1.0 / std::sqrt(double(p.head_dim))));
  options.softcap = call.masking.softcap;
  options.causal = call.masking.causal;
  options.window_left = call.masking.window_left;
  options.window_right = call.masking.window_right;
  std::vector<double> o_ref, lse_ref;
  flashhop::reference::attention_forward(p.shape(), q.data(), k.data(), v.data(), options, &o_ref, &lse_ref);
  std::vector<float> o_low, lse_low;
  flashhop::reference::attention_forward_low_precision(p.shape(), q.data(), k.data(), v.data(), options, call.dtype,
                                                       &o_low, &lse_low);

  double max_abs_v = 0, max_abs_o_ref = 0;
  for (float x : v) max_abs_v = std::max(max_abs_v, double{std::abs(x)});
  for (double x : o_ref) max_abs_o_ref = std::max(max_abs_o_ref, std::abs(x));
  const MaxError o_error = max_abs_error(o, o_ref), o_baseline = max_abs_error(o_low, o_ref);
  EXPECT_LE(o_error.value, flashhop::reference::o_tolerance(call.dtype, o_baseline.value, max_abs_o_ref,
                                                            call.masking.softcap, max_abs_v))
      << "max |O - O_ref| at element " << o_error.index << ": got " << o[o_error.index] << ", reference "
      << o_ref[o_error.index] << "; low-precision baseline error " << o_baseline.value;

  // Rows with no visible key: O exactly 0 and LSE exactly -inf.
  std::int64_t bad_masked_rows = 0;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.nheads; ++h) {
      for (int i = 0; i < p.seqlen_q; ++i) {
        const std::size_t row = (std::size_t(b) * p.nheads + h) * p.seqlen_q + i;
        if (!std::isinf(lse_ref[row])) continue;
        const auto first = o.begin() + ((std::int64_t{b} * p.seqlen_q + i) * p.nheads + h) * p.dv();
        const bool zero = std::all_of(first, first + p.dv(), [](float x) { return x == 0.f; });
        const bool minus_inf = !call.with_lse || (std::isinf(lse[row]) && lse[row] < 0);
        bad_masked_rows += !(zero && minus_inf);
      }
    }
  }
  EXPECT_EQ(bad_masked_rows, 0) << "fully masked rows without O = 0 and LSE = -inf";

  if (call.with_lse) {
    std::int64_t infinite_mismatches = 0;
    for (std::size_t i = 0; i < lse.size(); ++i) infinite_mismatches += std::isinf(lse_ref[i]) != std::isinf(lse[i]);
    EXPECT_EQ(infinite_mismatches, 0) << "LSE is -inf exactly where no key is visible";
    const MaxError lse_error = max_abs_error(lse, lse_ref), lse_baseline = max_abs_error(lse_low, lse_ref);
    EXPECT_LE(lse_error.value, flashhop::reference::lse_tolerance(lse_baseline.value, call.masking.softcap))
        << "max |LSE - LSE_ref| at row " << lse_error.index << ": got " << lse[lse_error.index] << ", reference "
        << lse_ref[lse_error.index];
  }
}

// The recipe forward() plans for `call` (which tiles, whether packed); no memory is touched.
const flashhop::sm90::ForwardRecipe& planned_recipe(const Call& call) {
  flashhop::ForwardArgs args =
      bind_args(call.plan, std::vector<void*>(call.plan.buffer_dtypes.size()), call.with_lse, call.masking);
  args.pack_gqa = call.pack_gqa;
  return flashhop::detail::plan_forward(args, {}).recipe_of();
}

const char* short_name(DType dtype) { return dtype == DType::kBFloat16 ? "bf16" : "fp16"; }

// The harness itself, on the host: values survive scatter and gather through the strided plan, and
// the padding stays poisoned.
TEST(ForwardHarness, StridedPlanRoundTripsAndLeavesPaddingPoisoned) {
  const Problem problem{2, 9, 9, 4, 2, 64};
  const ForwardPlan plan = strided_plan(problem, DType::kBFloat16);
  std::mt19937 rng(8);
  const std::vector<float> q = random_normal(problem.q_elements(), DType::kBFloat16, rng);
  const std::vector<float> k = random_normal(problem.k_elements(), DType::kBFloat16, rng);
  const std::vector<float> v = random_normal(problem.v_elements(), DType::kBFloat16, rng);
  std::vector<unsigned char> qkv = poisoned_storage(DType::kBFloat16, plan.buffer_elements[plan.q.buffer]);
  scatter(q, plan.q, &qkv);
  scatter(k, plan.k, &qkv);
  scatter(v, plan.v, &qkv);
  EXPECT_EQ(gather(qkv, plan.q), q);
  EXPECT_EQ(gather(qkv, plan.k), k);
  EXPECT_EQ(gather(qkv, plan.v), v);
  EXPECT_EQ(count_non_nan(qkv, DType::kBFloat16), plan.buffer_elements[plan.q.buffer])
      << "q, k, v fill the packed rows";

  std::vector<unsigned char> o = poisoned_storage(DType::kBFloat16, plan.buffer_elements[plan.o.buffer]);
  scatter(q, plan.o, &o);
  EXPECT_EQ(gather(o, plan.o), q);
  EXPECT_EQ(count_non_nan(o, DType::kBFloat16), problem.q_elements());
  EXPECT_GT(plan.buffer_elements[plan.o.buffer], problem.q_elements()) << "o has padding";
}

// ---- the grid: dtype x head dims x masking x shape -----------------------------------------------

// (d, dv) pairs the kernels are built for.
struct HeadDims {
  int d, dv;
};
constexpr HeadDims kHeadDims[] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};

// Named masking variants: every mask and soft-capping alone, and in combination.
struct NamedMasking {
  const char* name;
  Masking masking;
};
const NamedMasking kFull{"full", {}};
const NamedMasking kCausal{"causal", {true}};
// Both edges of the band cut key tiles of every size, and a row sees 79 keys at most.
const NamedMasking kWindow{"window61_17", {false, 61, 17}};
// Mistral-style: causal with a left window; rows see up to 301 keys.
const NamedMasking kCausalWindow{"causal_window300", {true, 300, 0}};
// Bounded on the right only (a look-ahead), unbounded to the left.
const NamedMasking kRightWindow{"window_right40", {false, -1, 40}};
// A cap small enough to bend the scores (scale * q.k is about N(0, 1) here).
const NamedMasking kSoftcapCausal{"softcap_causal", {true, -1, -1, 1.5f}};
const NamedMasking kSoftcapWindow{"softcap_window61_17", {false, 61, 17, 1.5f}};

std::string head_dims_name(int d, int dv) {
  return "_d" + std::to_string(d) + (dv != d ? "x" + std::to_string(dv) : "");
}

struct GridCase {
  DType dtype;
  NamedMasking masking;
  Problem problem;
};

// Every (dtype, head dims, masking, shape): bf16 with each of `bf16_variants`, fp16 with each of
// `fp16_variants`.
std::vector<GridCase> grid_cases(const std::vector<Problem>& shapes, const std::vector<NamedMasking>& bf16_variants,
                                 const std::vector<NamedMasking>& fp16_variants) {
  std::vector<GridCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const HeadDims& dims : kHeadDims) {
      for (const NamedMasking& masking : dtype == DType::kBFloat16 ? bf16_variants : fp16_variants) {
        for (Problem problem : shapes) {
          problem.head_dim = dims.d;
          problem.head_dim_v = dims.dv;
          cases.push_back({dtype, masking, problem});
        }
      }
    }
  }
  return cases;
}

std::vector<GridCase> grid() {
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv); head dims are set per case. Heads are few so that
  // the CPU reference stays cheap; together the shapes cover GQA ratios 1, 2, 8 and all-to-one.
  // The three shapes from {2, 1100, 300, 16, 4} have more query tiles (288, 256; 432 to 624 in
  // {6, 400, 100, 32, 8}, whose query heads are packed) than an H200 has SMs, so each persistent CTA
  // walks several (with a band, taken from the tile queue), in {6, 400, ...} at least three; with
  // causal masking runs of them are fully masked (seqlen_q > seqlen_k). In {6, 400, ...} the 1600
  // packed rows of a KV head leave the last query tile 64 rows, one consumer warpgroup's, so the
  // second one (d >= 96) skips that tile (rows_past_end) between tiles it computes.
  const std::vector<Problem> shapes = {
      {1, 1, 1, 1, 1},       {1, 7, 7, 8, 1},        {2, 113, 113, 4, 2},   {1, 127, 129, 2, 2},
      {1, 128, 128, 16, 2},  {1, 129, 1000, 2, 1},   {1, 1000, 129, 2, 2},  {3, 65, 97, 4, 1},
      {1, 1023, 1023, 2, 1}, {1, 4097, 4097, 2, 1},  {1, 0, 5, 2, 1},       {1, 5, 0, 2, 1},
      {0, 7, 9, 2, 1},
      {2, 1100, 300, 16, 4}, {4, 1000, 300, 8, 2},   {6, 400, 100, 32, 8},
  };
  // bf16 runs every variant; fp16 (the same kernels with another element type) the plain masks
  // and one combination.
  return grid_cases(shapes,
                    {kFull, kCausal, kWindow, kCausalWindow, kRightWindow, kSoftcapCausal, kSoftcapWindow},
                    {kFull, kCausal, kSoftcapWindow});
}

std::string name(const GridCase& c) {
  const Problem& p = c.problem;
  return std::string(short_name(c.dtype)) + head_dims_name(p.head_dim, p.dv()) + "_" + c.masking.name + "_b" +
         std::to_string(p.batch) + "_sq" + std::to_string(p.seqlen_q) + "_sk" + std::to_string(p.seqlen_k) + "_h" +
         std::to_string(p.nheads) + "_kv" + std::to_string(p.nheads_kv);
}
void PrintTo(const GridCase& c, std::ostream* out) { *out << name(c); }

using ForwardGpu = GpuTestWithParam<GridCase>;

TEST_P(ForwardGpu, MatchesReference) {
  const GridCase& c = GetParam();
  run_and_check(Call(c.problem, c.dtype, c.masking.masking, contiguous_plan(c.problem, c.dtype)));
}

INSTANTIATE_TEST_SUITE_P(Grid, ForwardGpu, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// Without a mask, at d = 64 to 128, the tiles past the last whole round of an H200's 132 SMs are
// split over the CTAs by key tiles (split_round.h) where that saves enough; the parts merge through
// the workspace. In {2, 1100, 1500, 16, 4} 24 tiles of 8 or 12 key tiles split into five or six
// parts each; in {4, 1, 1152, 37, 37} 148 one-row tiles at d = 128, which takes its 64-row tiles
// for one query (tile_choice: short rows), all 148 of 18 key tiles over 264 CTAs. In
// {1, 100, 9000, 4, 4} the only round splits: 4 tiles of 71 key tiles (47 at d = 96) over 132
// CTAs, and at d = 64, whose 100 queries take the 64-row tiles, 8 over 264.
// d = 192 and 256 run these shapes unsplit, d = 64 the first two, d = 96 the second.
std::vector<GridCase> split_round_cases() {
  return grid_cases({{2, 1100, 1500, 16, 4}, {4, 1, 1152, 37, 37}, {1, 100, 9000, 4, 4}}, {kFull}, {kFull});
}
INSTANTIATE_TEST_SUITE_P(SplitRound, ForwardGpu, ::testing::ValuesIn(split_round_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// ---- packed GQA rows: the query heads of a KV group share the query tiles ----------------------

std::vector<GridCase> pack_gqa_cases() {
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv): decoding (one query, MQA and GQA), a few queries
  // per group, group sizes 3 and 12 that do not divide the 128-row tile and 7 that divides neither it
  // nor the 192-row tile (packed rows of one query straddle tiles), one head per group (g = 1), no
  // keys, and a grid of 4 x 2 x 19 = 152 packed tiles, more than an H200's 132 SMs, so that
  // persistent CTAs walk several and hand Q's buffer over. Where two consumer warpgroups share a
  // 128-row tile (d >= 96), the second one's rows all lie past the last row, so that it skips the
  // tile (rows_past_end), in {2, 1, 1000, 8, 1} (8 rows per KV head), {2, 5, 333, 12, 3} (20),
  // {1, 64, 64, 4, 4} (64), {1, 3, 0, 4, 2} (6, no keys) and the last tile of {2, 37, 300, 14, 2}
  // (259).
  const std::vector<Problem> shapes = {
      {2, 1, 1000, 8, 1}, {2, 5, 333, 12, 3}, {1, 113, 257, 6, 2}, {3, 40, 700, 24, 2},
      {1, 64, 64, 4, 4},  {1, 3, 0, 4, 2},    {4, 300, 500, 16, 2}, {2, 37, 300, 14, 2},
  };
  return grid_cases(shapes, {kFull, kCausal, kWindow, kCausalWindow, kSoftcapWindow}, {kCausal});
}

using ForwardGpuPackGqa = GpuTestWithParam<GridCase>;

TEST_P(ForwardGpuPackGqa, MatchesReference) {
  const GridCase& c = GetParam();
  Call call(c.problem, c.dtype, c.masking.masking, contiguous_plan(c.problem, c.dtype));
  call.pack_gqa = flashhop::PackGqa::kOn;
  run_and_check(call);
}

INSTANTIATE_TEST_SUITE_P(PackGqa, ForwardGpuPackGqa, ::testing::ValuesIn(pack_gqa_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// Packed rows without a mask split their last round by keys (split_round.h; d <= 128), here the
// only one, as their tiles are fewer than the CTAs. Decoding in {3, 1, 9000, 8, 2} (one query, so
// causal masks nothing): 6 packed tiles of 71 key tiles (47 of 192 keys at d = 96) over an H200's
// 132 CTAs (264 at d = 64, two per SM) in runs of 2 to 4 key tiles (1 or 2 at d = 64), so each
// tile merges 20 to 45 parts. In {2, 37, 3000, 16, 2}, 296 packed rows per KV head: 12 tiles of
// 128 rows (20 of 64 at d = 64) of 24 key tiles (16 at d = 96), each KV head's last tile partly
// padding; causal, a band over it, runs unsplit from the tile queue. d = 192 and 256 never split.
std::vector<GridCase> pack_gqa_split_cases() {
  return grid_cases({{3, 1, 9000, 8, 2}, {2, 37, 3000, 16, 2}}, {kFull, kCausal}, {kFull});
}
INSTANTIATE_TEST_SUITE_P(PackGqaSplit, ForwardGpuPackGqa, ::testing::ValuesIn(pack_gqa_split_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// ---- wide bands: d = 64's 192-row tiles, d = 256's 80-key tiles, d = 128's tiles that mask every
// column (plan.cpp, wide_band_keys; the grid's narrow bands mask d = 64's and 128's by chunks);
// without a mask, rows over many keys (the grid's shorter keys take d = 256's 64-key tiles) -----

std::vector<GridCase> wide_band_cases() {
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv): short queries on long keys, so that the middle
  // row sees over wide_band_keys(d) keys (1024 at d = 64, 2048 at d = 128 and 256) while the CPU
  // reference stays cheap; the first shape has 6 x 16 x 2 = 192 query tiles, more than an H200's
  // SMs, so the CTAs take several from the tile queue, and so has the d = 128 one of 700 queries.
  const std::vector<Problem> shapes = {{2, 1000, 5000, 16, 2, 64}, {1, 777, 4900, 3, 1, 64},
                                       {2, 300, 2600, 4, 4, 256},  {1, 130, 2250, 5, 5, 256},
                                       {2, 700, 3000, 16, 2, 128}, {1, 300, 2600, 3, 3, 128}};
  // Every key tile kind: the right edge (the diagonal, or 40 or 100 keys past it), whole tiles, and
  // tiles cut by a left window (on the first shape, row i sees keys from i - 500 on).
  const NamedMasking kWideWindow{"window4500_100", {false, 4500, 100}};
  const NamedMasking kSoftcapFull{"softcap_full", {false, -1, -1, 1.5f}};
  std::vector<GridCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const NamedMasking& masking : {kCausal, kSoftcapCausal, kWideWindow, kRightWindow, kFull, kSoftcapFull}) {
      for (const Problem& problem : shapes) cases.push_back({dtype, masking, problem});
    }
  }
  return cases;
}

using ForwardGpuWideBand = GpuTestWithParam<GridCase>;

TEST_P(ForwardGpuWideBand, MatchesReference) {
  const GridCase& c = GetParam();
  Call call(c.problem, c.dtype, c.masking.masking, contiguous_plan(c.problem, c.dtype));
  // Unpacked rows: kAuto packs the 3-head group of the second shape (d = 64's packed tiles are 64
  // rows), and packed rows take the default tile choice.
  call.pack_gqa = flashhop::PackGqa::kOff;
  ASSERT_EQ(planned_recipe(call).tile_choice, flashhop::sm90::TileChoice::kWideBand)
      << "this shape no longer takes the wide-band tiles";
  run_and_check(call);
}

INSTANTIATE_TEST_SUITE_P(WideBand, ForwardGpuWideBand, ::testing::ValuesIn(wide_band_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// ---- short query sequences at d = 128: 64 x 64 tiles, two CTAs per SM (tile_choice) -------------

std::vector<GridCase> short_query_cases() {
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv), d = 128, one head per KV head so that kAuto
  // keeps the rows unpacked. {2, 50, 1500, 36, 36}: 72 tiles of 24 key tiles, fewer than the 264
  // CTAs of an H200, so without a mask the only round splits by keys; {2, 150, 500, 48, 48}: 150
  // queries in three 64-row tiles (the last 22 rows), 288 tiles, so CTAs take a second one (with a
  // band, from the tile queue).
  const std::vector<Problem> shapes = {{2, 50, 1500, 36, 36, 128}, {2, 150, 500, 48, 48, 128}};
  std::vector<GridCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const std::vector<NamedMasking> maskings =
        dtype == DType::kBFloat16 ? std::vector<NamedMasking>{kFull, kCausal, kWindow, kCausalWindow, kSoftcapCausal}
                                  : std::vector<NamedMasking>{kFull, kCausal};
    for (const NamedMasking& masking : maskings) {
      for (const Problem& problem : shapes) cases.push_back({dtype, masking, problem});
    }
  }
  return cases;
}

using ForwardGpuShortQueries = GpuTestWithParam<GridCase>;

TEST_P(ForwardGpuShortQueries, MatchesReference) {
  const GridCase& c = GetParam();
  const Call call(c.problem, c.dtype, c.masking.masking, contiguous_plan(c.problem, c.dtype));
  const flashhop::sm90::ForwardRecipe& recipe = planned_recipe(call);
  ASSERT_TRUE(!recipe.pack_gqa && recipe.tile_choice == flashhop::sm90::TileChoice::kShortRows)
      << "this shape no longer takes the short query tiles";
  run_and_check(call);
}

INSTANTIATE_TEST_SUITE_P(ShortQueries, ForwardGpuShortQueries, ::testing::ValuesIn(short_query_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return name(info.param); });

// ---- layouts: strided operands, LSE absent -----------------------------------------------------

struct LayoutCase {
  DType dtype;
  HeadDims dims;
  NamedMasking masking;
};

// q, k and v packed in one tensor need dv == d: with `packable_only`, the (192, 128) cases are left out.
std::vector<LayoutCase> layout_cases(bool packable_only) {
  std::vector<LayoutCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const HeadDims& dims : kHeadDims) {
      if (packable_only && dims.dv != dims.d) continue;
      for (const NamedMasking& masking : {kFull, kCausal, kSoftcapWindow}) cases.push_back({dtype, dims, masking});
    }
  }
  return cases;
}

std::string name(const LayoutCase& c) {
  return std::string(short_name(c.dtype)) + head_dims_name(c.dims.d, c.dims.dv) + "_" + c.masking.name;
}
void PrintTo(const LayoutCase& c, std::ostream* out) { *out << name(c); }

using ForwardGpuLayout = GpuTestWithParam<LayoutCase>;
using ForwardGpuPackedLayout = GpuTestWithParam<LayoutCase>;

TEST_P(ForwardGpuPackedLayout, PackedQkvPaddedOutputsGivenScale) {
  const LayoutCase& c = GetParam();
  const Problem problem{2, 257, 257, 4, 2, c.dims.d, c.dims.dv};
  Call call{problem, c.dtype, c.masking.masking, strided_plan(problem, c.dtype)};
  call.softmax_scale = 0.6f / std::sqrt(float(c.dims.d));
  run_and_check(call);
}

// A scale of 0 is a scale, not the default: every visible key weighs the same.
TEST_P(ForwardGpuLayout, ScaleZero) {
  const LayoutCase& c = GetParam();
  const Problem problem{1, 130, 200, 4, 2, c.dims.d, c.dims.dv};
  Call call{problem, c.dtype, c.masking.masking, contiguous_plan(problem, c.dtype)};
  call.softmax_scale = 0.f;
  run_and_check(call);
}

TEST_P(ForwardGpuLayout, WithoutLse) {
  const LayoutCase& c = GetParam();
  const Problem problem{2, 190, 300, 4, 1, c.dims.d, c.dims.dv};
  Call call{problem, c.dtype, c.masking.masking, contiguous_plan(problem, c.dtype)};
  call.with_lse = false;
  run_and_check(call);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ForwardGpuPackedLayout, ::testing::ValuesIn(layout_cases(/*packable_only=*/true)),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return name(info.param); });
INSTANTIATE_TEST_SUITE_P(Layouts, ForwardGpuLayout, ::testing::ValuesIn(layout_cases(/*packable_only=*/false)),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return name(info.param); });

// Packed GQA rows through strided operands: Q, K and V slices of one QKV tensor, O padded per head,
// LSE padded per row; and without LSE.
using ForwardGpuPackGqaLayout = GpuTestWithParam<LayoutCase>;
using ForwardGpuPackGqaPackedLayout = GpuTestWithParam<LayoutCase>;

TEST_P(ForwardGpuPackGqaPackedLayout, PackedQkvPaddedOutputs) {
  const LayoutCase& c = GetParam();
  const Problem problem{2, 40, 40, 24, 2, c.dims.d, c.dims.dv};
  Call call{problem, c.dtype, c.masking.masking, strided_plan(problem, c.dtype)};
  call.pack_gqa = flashhop::PackGqa::kOn;
  run_and_check(call);
}

TEST_P(ForwardGpuPackGqaLayout, WithoutLse) {
  const LayoutCase& c = GetParam();
  const Problem problem{2, 7, 300, 16, 2, c.dims.d, c.dims.dv};
  Call call{problem, c.dtype, c.masking.masking, contiguous_plan(problem, c.dtype)};
  call.pack_gqa = flashhop::PackGqa::kOn;
  call.with_lse = false;
  run_and_check(call);
}

INSTANTIATE_TEST_SUITE_P(PackGqaLayouts, ForwardGpuPackGqaPackedLayout,
                         ::testing::ValuesIn(layout_cases(/*packable_only=*/true)),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return name(info.param); });
INSTANTIATE_TEST_SUITE_P(PackGqaLayouts, ForwardGpuPackGqaLayout,
                         ::testing::ValuesIn(layout_cases(/*packable_only=*/false)),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return name(info.param); });

// ---- determinism: repeated calls give bitwise identical outputs -----------------------------------

struct RepeatCase {
  DType dtype;
  NamedMasking masking;
  Problem problem;
  flashhop::PackGqa pack_gqa = flashhop::PackGqa::kAuto;
};

using ForwardGpuRepeat = GpuTestWithParam<RepeatCase>;

TEST_P(ForwardGpuRepeat, RepeatedCallsAreBitwiseIdentical) {
  const RepeatCase& c = GetParam();
  const ForwardPlan plan = contiguous_plan(c.problem, c.dtype);
  std::mt19937 rng(std::random_device{}());
  const std::vector<float> q = random_normal(c.problem.q_elements(), c.dtype, rng);
  const std::vector<float> k = random_normal(c.problem.k_elements(), c.dtype, rng);
  const std::vector<float> v = random_normal(c.problem.v_elements(), c.dtype, rng);
  const std::vector<std::vector<unsigned char>> host = host_images(plan, q, k, v);
  std::vector<DeviceBuffer> device;
  const std::vector<void*> bases = upload(host, &device);
  flashhop::ForwardArgs args = bind_args(plan, bases, /*with_lse=*/true, c.masking.masking);
  args.pack_gqa = c.pack_gqa;

  std::vector<unsigned char> first_o, first_lse;
  for (int run = 0; run < 3; ++run) {
    device[plan.o.buffer].upload(host[plan.o.buffer]);  // poison again: every run writes everything
    device[plan.lse.buffer].upload(host[plan.lse.buffer]);
    const Status status = forward_with_workspace(args, nullptr);
    if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
    ASSERT_TRUE(status.ok()) << status.message;
    if (run == 0) {
      first_o = device[plan.o.buffer].download();
      first_lse = device[plan.lse.buffer].download();
    } else {
      EXPECT_TRUE(device[plan.o.buffer].download() == first_o) << "O differs in run " << run;
      EXPECT_TRUE(device[plan.lse.buffer].download() == first_lse) << "LSE differs in run " << run;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Repeat, ForwardGpuRepeat,
    ::testing::Values(RepeatCase{DType::kBFloat16, kFull, {2, 1100, 1100, 16, 4, 128}},
                      RepeatCase{DType::kBFloat16, kCausal, {2, 1100, 300, 16, 4, 128}},
                      RepeatCase{DType::kFloat16, kCausal, {1, 2048, 2048, 8, 1, 256}},
                      RepeatCase{DType::kFloat16, kFull, {3, 513, 777, 32, 8, 64}},
                      RepeatCase{DType::kBFloat16, kSoftcapWindow, {2, 1500, 1500, 8, 2, 96}},
                      RepeatCase{DType::kBFloat16, kCausalWindow, {2, 1500, 1500, 8, 2, 192, 128}},
                      RepeatCase{DType::kBFloat16, kCausal, {4, 300, 500, 16, 2, 128}, flashhop::PackGqa::kOn},
                      // The only round split by keys (SplitRound, PackGqaSplit).
                      RepeatCase{DType::kBFloat16, kFull, {1, 100, 9000, 4, 4, 64}},
                      RepeatCase{DType::kBFloat16, kFull, {3, 1, 9000, 8, 2, 64}, flashhop::PackGqa::kOn},
                      RepeatCase{DType::kBFloat16, kFull, {3, 1, 9000, 8, 2, 128}, flashhop::PackGqa::kOn},
                      RepeatCase{DType::kBFloat16, kFull, {2, 50, 1500, 36, 36, 128}}),
    [](const ::testing::TestParamInfo<RepeatCase>& info) {
      const RepeatCase& c = info.param;
      return std::string(short_name(c.dtype)) + head_dims_name(c.problem.head_dim, c.problem.dv()) + "_" +
             c.masking.name + "_sq" + std::to_string(c.problem.seqlen_q) +
             (c.pack_gqa == flashhop::PackGqa::kOn ? "_packgqa" : "");
    });

// ---- forward captured in a CUDA graph ------------------------------------------------------------

// Calls captured into a CUDA graph replay like eager calls: the workspace's counters are zeroed by
// the graph itself (a causal call: the tile queue's counter; a call with a split round: its
// counters), with the workspace poisoned before every replay.
struct GraphCase {
  NamedMasking masking;
  Problem problem;
};

using ForwardGpuGraph = GpuTestWithParam<GraphCase>;

TEST_P(ForwardGpuGraph, ReplaysMatchAnEagerCall) {
  const GraphCase& c = GetParam();
  const ForwardPlan plan = contiguous_plan(c.problem, DType::kBFloat16);
  std::mt19937 rng(std::random_device{}());
  const std::vector<float> q = random_normal(c.problem.q_elements(), DType::kBFloat16, rng);
  const std::vector<float> k = random_normal(c.problem.k_elements(), DType::kBFloat16, rng);
  const std::vector<float> v = random_normal(c.problem.v_elements(), DType::kBFloat16, rng);
  const std::vector<std::vector<unsigned char>> host = host_images(plan, q, k, v);
  std::vector<DeviceBuffer> device;
  const std::vector<void*> bases = upload(host, &device);
  const flashhop::ForwardArgs args = bind_args(plan, bases, /*with_lse=*/true, c.masking.masking);

  const Status eager = forward_with_workspace(args, nullptr);
  if (eager.code == StatusCode::kNotSupported) GTEST_SKIP() << eager.message;
  ASSERT_TRUE(eager.ok()) << eager.message;
  const std::vector<unsigned char> eager_o = device[plan.o.buffer].download();
  const std::vector<unsigned char> eager_lse = device[plan.lse.buffer].download();

  std::size_t bytes = 0;
  ASSERT_TRUE(flashhop::forward_workspace_size(args, &bytes).ok());
  ASSERT_GT(bytes, 0u) << "the case is meant to use the workspace";
  DeviceBuffer workspace(bytes);
  CudaStream stream;
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  const Status captured = flashhop::forward(args, workspace.data(), bytes, stream.get());
  cuda_check(cudaStreamEndCapture(stream.get(), &graph), "cudaStreamEndCapture");
  ASSERT_TRUE(captured.ok()) << captured.message;
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int replay = 0; replay < 3; ++replay) {
    device[plan.o.buffer].upload(host[plan.o.buffer]);
    device[plan.lse.buffer].upload(host[plan.lse.buffer]);
    workspace.upload(std::vector<unsigned char>(bytes, 0xff));
    cuda_check(cudaGraphLaunch(exec, stream.get()), "cudaGraphLaunch");
    cuda_check(cudaStreamSynchronize(stream.get()), "graph replay");
    EXPECT_TRUE(device[plan.o.buffer].download() == eager_o) << "O differs in replay " << replay;
    EXPECT_TRUE(device[plan.lse.buffer].download() == eager_lse) << "LSE differs in replay " << replay;
  }
  cuda_check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
  cuda_check(cudaGraphDestroy(graph), "cudaGraphDestroy");
}

INSTANTIATE_TEST_SUITE_P(Graph, ForwardGpuGraph,
                         ::testing::Values(GraphCase{kCausal, {2, 700, 700, 16, 4, 128}},
                                           GraphCase{kCausalWindow, {2, 1500, 1500, 8, 2, 64}},
                                           GraphCase{kFull, {1, 100, 9000, 4, 4, 64}}),
                         [](const ::testing::TestParamInfo<GraphCase>& info) {
                           const GraphCase& c = info.param;
                           return "bf16" + head_dims_name(c.problem.head_dim, c.problem.dv()) + "_" +
                                  c.masking.name + "_sq" + std::to_string(c.problem.seqlen_q);
                         });

// ---- device checks of forward() ------------------------------------------------------------------

using ForwardGpuDeviceChecks = RequiresGpu;

// A device buffer of 4 bytes per element for each allocation of `plan` (contents left as they
// are); returns their addresses.
std::vector<void*> allocate(const ForwardPlan& plan, std::vector<DeviceBuffer>* device) {
  std::vector<void*> bases;
  for (std::int64_t elements : plan.buffer_elements) {
    device->emplace_back(static_cast<std::size_t>(elements) * 4);
    bases.push_back(device->back().data());
  }
  return bases;
}

TEST_F(ForwardGpuDeviceChecks, HostMemoryIsRejected) {
  const Problem problem{1, 16, 16, 2, 1, 128};
  const ForwardPlan plan = contiguous_plan(problem, DType::kBFloat16);
  std::vector<DeviceBuffer> device;
  std::vector<void*> bases = allocate(plan, &device);
  std::vector<unsigned char> host_k(static_cast<std::size_t>(problem.k_elements()) * 2);
  bases[plan.k.buffer] = host_k.data();

  const Status status = flashhop::forward(bind_args(plan, bases, true), nullptr, 0, nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("k.data"), std::string::npos) << status.message;
  EXPECT_NE(status.message.find("host memory"), std::string::npos) << status.message;
}

// A causal call runs its tiles from a queue, whose counter lives in the workspace: one in host
// memory is rejected like an operand.
TEST_F(ForwardGpuDeviceChecks, HostWorkspaceIsRejected) {
  const Problem problem{1, 300, 300, 2, 1, 128};
  const ForwardPlan plan = contiguous_plan(problem, DType::kBFloat16);
  std::vector<DeviceBuffer> device;
  std::vector<void*> bases = allocate(plan, &device);
  const flashhop::ForwardArgs args = bind_args(plan, bases, true, Masking{/*causal=*/true});
  std::size_t bytes = 0;
  ASSERT_TRUE(flashhop::forward_workspace_size(args, &bytes).ok());
  ASSERT_GT(bytes, 0u);
  std::vector<int> host_workspace(bytes / sizeof(int) + 1);

  const Status status = flashhop::forward(args, host_workspace.data(), bytes, nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("workspace"), std::string::npos) << status.message;
  EXPECT_NE(status.message.find("host memory"), std::string::npos) << status.message;
}

TEST_F(ForwardGpuDeviceChecks, OperandsMustBeOnTheCurrentDevice) {
  int current = 0;
  cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  const ForwardPlan plan = contiguous_plan({1, 16, 16, 2, 1, 128}, DType::kBFloat16);
  flashhop::ForwardArgs args = bind_args(plan, fake_bases(plan), true);
  args.q.device = args.k.device = args.v.device = args.o.device = args.lse->device = current + 1;

  const Status status = flashhop::forward(args, nullptr, 0, nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("q.device = " + std::to_string(current + 1)), std::string::npos) << status.message;
}

}  // namespace
}  // namespace flashhop_test
