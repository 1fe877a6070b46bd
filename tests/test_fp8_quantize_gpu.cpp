// flashhop::quantize_fp8 on the GPU against the double-precision CPU reference
// (reference/fp8_quantize_ref.h): the rotation in doubles, then e4m3 rounding to nearest even with
// saturation at +-448.
// - Every scaling (per tensor; per head with groups of 1, 2 and all heads, as GQA's query heads;
//   per block), with and without the rotation, every head dim, seqlens 1, 127, 128, 129 and 1000,
//   both dtypes, x contiguous or a slice of a wider buffer (whose other values are large enough to
//   show if read) with out and descale padded. The heads of one group (one head per block) of the
//   last batch entry are zeros: their descale must be 1 and their values 0.
// - Each value must be a correct rounding of the reference's y / descale: within half an e4m3 step
//   of it, plus the float error of the kernel's scale (and rotation); ties are checked exactly
//   where the scale is 1 (RoundsToNearestEven).
// - Q and K rotated with the same signs and dequantized give Q K^T within e4m3's error.
// - A tensor of zeros (or without rows) gets descale 1 and values 0.
// Outputs (and their padding) are poisoned (NaN) before each call; every value must be written and
// the padding left as it was. Skipped without a Hopper GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashhop/flashhop.h"
#include "reference/fp8_quantize_ref.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

namespace ref = flashhop::reference;
using flashhop::Fp8Scaling;
using flashhop::QuantizeFp8Args;
using flashhop::Status;

constexpr std::uint8_t kE4m3Nan = 0x7f;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
// A strided x sits in rows of nheads + kExtraHeads heads of head_dim + kXHeadPadding elements;
// those other elements hold kUnreadValue.
constexpr int kExtraHeads = 2;
constexpr int kXHeadPadding = 8;
constexpr float kUnreadValue = 30000.f;
// A padded out has head_dim + kOutHeadPadding bytes per head; a padded descale kDescalePadding
// entries after each of its rows.
constexpr int kOutHeadPadding = 16;
constexpr int kDescalePadding = 3;

const char* scaling_name(Fp8Scaling scaling) {
  return scaling == Fp8Scaling::kPerTensor ? "per_tensor" : scaling == Fp8Scaling::kPerHead ? "per_head" : "per_block";
}

// The signs of the rotation: +-1, and values that the kernel must read as signs (0 and -0 as +1,
// other magnitudes, NaN as -1).
std::vector<float> random_signs(int head_dim, std::mt19937& rng) {
  std::vector<float> signs(head_dim);
  for (float& s : signs) s = rng() % 2 ? 1.f : -1.f;
  signs[1] = 0.f;
  signs[2] = -0.f;
  signs[3] = -3.5f;
  signs[4] = 0.25f;
  signs[5] = kNan;
  return signs;
}

// Device memory of one call: x, out and descale placed as the layout says, the host images of out
// and descale as downloaded, and the call's arguments.
struct QuantizeCall {
  ref::QuantizeShape shape;
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
  int groups = 0;
  bool strided = false;
  DType dtype = DType::kBFloat16;
  std::optional<DeviceBuffer> x, out, descale, signs;
  QuantizeFp8Args args;

  // descale's logical shape for the scaling.
  std::vector<std::int64_t> descale_shape() const {
    const int blocks = (shape.seqlen + flashhop::kFp8ScaleBlockRows - 1) / flashhop::kFp8ScaleBlockRows;
    if (scaling == Fp8Scaling::kPerTensor) return {1};
    if (scaling == Fp8Scaling::kPerHead) return {shape.batch, groups};
    return {shape.batch, shape.nheads, blocks};
  }
  // Elements of out's and descale's buffers, padding included.
  std::int64_t out_head() const { return shape.head_dim + (strided ? kOutHeadPadding : 0); }
  std::int64_t out_bytes() const { return std::int64_t{shape.batch} * shape.seqlen * shape.nheads * out_head(); }
  // A row of descale's buffer; an empty one counts as 1, so that every stride stays positive (as
  // PyTorch's strides of empty tensors).
  std::int64_t descale_row() const {
    const std::vector<std::int64_t> s = descale_shape();
    return std::max<std::int64_t>(s.back(), 1) + (strided && s.size() > 1 ? kDescalePadding : 0);
  }
  std::int64_t descale_elements() const {
    std::int64_t rows = 1;
    const std::vector<std::int64_t> s = descale_shape();
    for (std::size_t d = 0; d + 1 < s.size(); ++d) rows *= s[d];
    return rows * descale_row();
  }
  // The buffer offsets of out's element (b, s, h, i) and of descale's entry `entry` (contiguous index).
  std::int64_t out_offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t i) const {
    return ((b * shape.seqlen + s) * shape.nheads + h) * out_head() + i;
  }
  std::int64_t descale_offset(std::int64_t entry) const {
    const std::int64_t last = descale_shape().back();
    return entry / last * descale_row() + entry % last;
  }

  // Uploads x (logical (batch, seqlen, nheads, head_dim), row-major, already rounded to dtype),
  // poisons out and descale and sets the arguments.
  void prepare(const std::vector<float>& x_values, const std::vector<float>* hadamard_signs) {
    const std::int64_t b = shape.batch, s = shape.seqlen, h = shape.nheads, d = shape.head_dim;
    const std::int64_t rows = std::max<std::int64_t>(s, 1);  // in the batch strides
    const std::int64_t x_heads = h + (strided ? kExtraHeads : 0), x_head = d + (strided ? kXHeadPadding : 0);
    const std::size_t element = flashhop::dtype_size(dtype);
    std::vector<unsigned char> x_image(static_cast<std::size_t>(b * s * x_heads * x_head) * element);
    for (std::size_t at = 0; at < x_image.size(); at += element) store_element(dtype, kUnreadValue, &x_image[at]);
    for (std::int64_t i = 0; i < b * s * h * d; ++i) {
      const std::int64_t row = i / d, head = row % h, position = row / h;  // position: b * s + s
      store_element(dtype, x_values[i], &x_image[((position * x_heads + head) * x_head + i % d) * element]);
    }
    x.emplace(x_image.size());
    x->upload(x_image);
    out.emplace(static_cast<std::size_t>(out_bytes()));
    out->upload(std::vector<unsigned char>(static_cast<std::size_t>(out_bytes()), kE4m3Nan));
    descale.emplace(static_cast<std::size_t>(descale_elements()) * sizeof(float));
    descale->upload(poisoned_storage(DType::kFloat32, descale_elements()));

    args = QuantizeFp8Args{};
    args.x = strided_view(dtype, {b, s, h, d}, {rows * x_heads * x_head, x_heads * x_head, x_head, 1});
    args.x.data = x->data();
    args.out =
        strided_view(DType::kFloat8E4M3, {b, s, h, d}, {rows * h * out_head(), h * out_head(), out_head(), 1});
    args.out.data = out->data();
    const std::vector<std::int64_t> ds = descale_shape();
    if (ds.size() == 1) {
      args.descale = strided_view(DType::kFloat32, {1}, {1});
    } else if (ds.size() == 2) {
      args.descale = strided_view(DType::kFloat32, {ds[0], ds[1]}, {descale_row(), 1});
    } else {
      args.descale = strided_view(DType::kFloat32, {ds[0], ds[1], ds[2]}, {ds[1] * descale_row(), descale_row(), 1});
    }
    args.descale.data = descale->data();
    args.scaling = scaling;
    if (hadamard_signs != nullptr) {
      std::vector<unsigned char> image(hadamard_signs->size() * sizeof(float));
      std::memcpy(image.data(), hadamard_signs->data(), image.size());
      signs.emplace(image.size());
      signs->upload(image);
      args.hadamard_signs = flashhop::make_contiguous(signs->data(), DType::kFloat32, {d});
    }
  }

  Status run() {
    const Status status = flashhop::quantize_fp8(args, nullptr);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after quantize_fp8");
    return status;
  }

  std::vector<float> downloaded_descale() const {
    const std::vector<unsigned char> image = descale->download();
    std::vector<float> values(image.size() / sizeof(float));
    std::memcpy(values.data(), image.data(), image.size());
    return values;
  }
};

// Random normal values rounded to `dtype`, with a large value every 97 elements (an outlier
// channel in most rows), and the heads [0, zero_heads) of the last batch entry zeros.
std::vector<float> random_input(const ref::QuantizeShape& shape, DType dtype, int zero_heads, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const std::int64_t elements = std::int64_t{shape.batch} * shape.seqlen * shape.nheads * shape.head_dim;
  std::vector<float> x(static_cast<std::size_t>(elements));
  for (std::int64_t i = 0; i < elements; ++i) {
    const std::int64_t row = i / shape.head_dim, head = row % shape.nheads;
    const bool last_batch = row / shape.nheads / shape.seqlen == shape.batch - 1;
    x[i] = last_batch && head < zero_heads ? 0.f : round_to(dtype, normal(rng) * (i % 97 == 0 ? 24.f : 1.f));
  }
  return x;
}

// The largest float error of the kernel's rotation in units of y / descale: each of the log2(b)
// stages rounds sums of at most sum |x| over the block, which is at most sqrt(b) ||x|| = sqrt(b)
// ||y|| <= b amax, and y / descale is at most 448 at amax.
double rotation_error_bound(int head_dim) {
  const int block = ref::hadamard_block(head_dim);
  return std::ldexp(1.0, -24) * std::log2(static_cast<double>(block)) * std::sqrt(static_cast<double>(block)) *
         flashhop::kFp8E4m3Max;
}

struct QuantizeCase {
  std::string name;
  DType dtype;
  Fp8Scaling scaling;
  int groups;  // per head
  bool rotate;
  ref::QuantizeShape shape;
  bool strided;
};

void PrintTo(const QuantizeCase& c, std::ostream* out) { *out << c.name; }

std::vector<QuantizeCase> quantize_cases() {
  std::vector<QuantizeCase> cases;
  int index = 0;
  for (int head_dim : {64, 96, 128, 192, 256}) {
    for (int seqlen : {1, 127, 128, 129, 1000}) {
      for (Fp8Scaling scaling : {Fp8Scaling::kPerTensor, Fp8Scaling::kPerHead, Fp8Scaling::kPerBlock}) {
        for (bool rotate : {false, true}) {
          QuantizeCase c;
          c.dtype = index % 3 == 2 ? DType::kFloat16 : DType::kBFloat16;
          c.scaling = scaling;
          c.shape = {2, seqlen, 4, head_dim};
          c.groups = scaling == Fp8Scaling::kPerHead ? (index % 3 == 0 ? 4 : index % 3 == 1 ? 2 : 1) : 0;
          c.rotate = rotate;
          c.strided = (index / 2) % 2 == 1;
          c.name = std::string(c.dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" + std::to_string(head_dim) + "_s" +
                   std::to_string(seqlen) + "_" + scaling_name(scaling) +
                   (c.groups > 0 ? std::to_string(c.groups) : "") + (rotate ? "_hadamard" : "") +
                   (c.strided ? "_strided" : "");
          cases.push_back(c);
          ++index;
        }
      }
    }
  }
  return cases;
}

using QuantizeGpu = GpuTestWithParam<QuantizeCase>;

TEST_P(QuantizeGpu, MatchesTheReference) {
  const QuantizeCase& c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const int zero_heads = c.scaling == Fp8Scaling::kPerHead ? c.shape.nheads / c.groups : 1;
  const std::vector<float> x = random_input(c.shape, c.dtype, zero_heads, rng);
  const std::vector<float> signs = random_signs(c.shape.head_dim, rng);

  QuantizeCall call;
  call.shape = c.shape;
  call.scaling = c.scaling;
  call.groups = c.groups;
  call.strided = c.strided;
  call.dtype = c.dtype;
  call.prepare(x, c.rotate ? &signs : nullptr);
  const Status status = call.run();
  ASSERT_TRUE(status.ok()) << status.message;

  const ref::Quantized expected =
      ref::quantize_fp8(c.shape, x.data(), c.scaling, c.groups, c.rotate ? signs.data() : nullptr);
  const std::vector<float> descale = call.downloaded_descale();
  // descale: amax / 448 rounded once, or after the float rotation.
  const double descale_tolerance = c.rotate ? 1e-5 : 2e-7;
  std::vector<bool> is_entry(descale.size(), false);
  for (std::size_t e = 0; e < expected.descale.size(); ++e) {
    const std::int64_t at = call.descale_offset(static_cast<std::int64_t>(e));
    is_entry[at] = true;
    EXPECT_NEAR(descale[at], expected.descale[e], descale_tolerance * expected.descale[e]) << "descale entry " << e;
  }
  std::int64_t descale_padding_written = 0;
  for (std::size_t at = 0; at < descale.size(); ++at) descale_padding_written += !is_entry[at] && !std::isnan(descale[at]);
  EXPECT_EQ(descale_padding_written, 0);

  // Values: a correct rounding of y / descale, up to the float error of the kernel's scale and
  // rotation; the padding bytes left poisoned.
  const std::vector<unsigned char> out = call.out->download();
  std::vector<bool> is_value(out.size(), false);
  const double rotation_error = c.rotate ? rotation_error_bound(c.shape.head_dim) : 0.0;
  const int d = c.shape.head_dim;
  std::int64_t wrong = 0, reported = 0;
  for (std::size_t i = 0; i < expected.scaled.size(); ++i) {
    const std::int64_t row = static_cast<std::int64_t>(i) / d;
    const std::int64_t h = row % c.shape.nheads, s = row / c.shape.nheads % c.shape.seqlen,
                       b = row / c.shape.nheads / c.shape.seqlen;
    const std::int64_t at = call.out_offset(b, s, h, static_cast<std::int64_t>(i) % d);
    is_value[at] = true;
    const double got = ref::e4m3_value(out[at]);
    const double exact = expected.scaled[i];
    const double clamped = std::max(-double{flashhop::kFp8E4m3Max}, std::min(double{flashhop::kFp8E4m3Max}, exact));
    const double allowed = ref::e4m3_half_ulp(exact) + 1e-5 * std::fabs(exact) + rotation_error;
    if (!(std::fabs(got - clamped) <= allowed)) {
      ++wrong;
      if (reported++ < 5) {
        ADD_FAILURE() << "element (" << b << ", " << s << ", " << h << ", " << i % d << "): got " << got
                      << " (code 0x" << std::hex << int(out[at]) << std::dec << "), y / descale = " << exact
                      << ", nearest e4m3 " << expected.quantized[i];
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  std::int64_t padding_written = 0;
  for (std::size_t at = 0; at < out.size(); ++at) padding_written += !is_value[at] && out[at] != kE4m3Nan;
  EXPECT_EQ(padding_written, 0);
}

INSTANTIATE_TEST_SUITE_P(Grid, QuantizeGpu, ::testing::ValuesIn(quantize_cases()),
                         [](const ::testing::TestParamInfo<QuantizeCase>& info) { return info.param.name; });

class QuantizeGpuEdges : public RequiresGpu {};

// With 448 in x, per tensor, descale is 1 and the scale exact: each value is x rounded to the
// nearest e4m3 value, ties to the even one, in the normal and the subnormal range.
TEST_F(QuantizeGpuEdges, RoundsToNearestEven) {
  const std::vector<std::pair<float, float>> rounded = {
      {448.f, 448.f},       {1.0625f, 1.f},         {1.1875f, 1.25f},      {-1.0625f, -1.f},
      {0x1p-10f, 0.f},      {0x3p-10f, 0x1p-8f},    {-0x3p-10f, -0x1p-8f}, {0.53125f, 0.5f},
      {0.59375f, 0.625f},   {248.f, 256.f},         {440.f, 448.f},        {432.f, 448.f},
      {400.f, 384.f},       {-17.f, -16.f},         {19.f, 20.f},          {0x5p-10f, 0x1p-8f}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const ref::QuantizeShape shape{1, 1, 1, 64};
    std::vector<float> x(64, 0.f);
    for (std::size_t i = 0; i < rounded.size(); ++i) x[i] = rounded[i].first;
    QuantizeCall call;
    call.shape = shape;
    call.dtype = dtype;
    call.prepare(x, nullptr);
    const Status status = call.run();
    ASSERT_TRUE(status.ok()) << status.message;
    EXPECT_EQ(call.downloaded_descale()[0], 1.f);
    const std::vector<unsigned char> out = call.out->download();
    for (int i = 0; i < 64; ++i) {
      const double expected = i < static_cast<int>(rounded.size()) ? rounded[i].second : 0.0;
      EXPECT_EQ(ref::e4m3_value(out[i]), expected) << flashhop::dtype_name(dtype) << " x = " << x[i];
      EXPECT_EQ(ref::round_to_e4m3(x[i]), expected) << x[i];
    }
  }
}

// Zeros: descale 1 and values 0 (+0 or -0: the signs flip zeros too) for every scaling, rotated or
// not; no rows at all: descale 1 as well.
TEST_F(QuantizeGpuEdges, ZerosGiveDescaleOne) {
  std::mt19937 rng(1);
  const std::vector<float> signs = random_signs(128, rng);
  for (Fp8Scaling scaling : {Fp8Scaling::kPerTensor, Fp8Scaling::kPerHead, Fp8Scaling::kPerBlock}) {
    for (bool rotate : {false, true}) {
      for (int seqlen : {0, 130}) {
        SCOPED_TRACE(::testing::Message() << scaling_name(scaling) << (rotate ? " rotated" : "") << " seqlen " << seqlen);
        QuantizeCall call;
        call.shape = {2, seqlen, 4, 128};
        call.scaling = scaling;
        call.groups = 2;
        call.strided = true;
        call.prepare(std::vector<float>(std::size_t(2) * seqlen * 4 * 128, 0.f), rotate ? &signs : nullptr);
        const Status status = call.run();
        ASSERT_TRUE(status.ok()) << status.message;
        const std::int64_t entries = ref::descale_entries(call.shape, scaling, 2);
        const std::vector<float> descale = call.downloaded_descale();
        for (std::int64_t e = 0; e < entries; ++e) EXPECT_EQ(descale[call.descale_offset(e)], 1.f) << e;
        const std::vector<unsigned char> out = call.out->download();
        std::int64_t nonzero = 0;
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t s = 0; s < seqlen; ++s)
            for (std::int64_t h = 0; h < 4; ++h)
              for (std::int64_t i = 0; i < 128; ++i) nonzero += ref::e4m3_value(out[call.out_offset(b, s, h, i)]) != 0.0;
        EXPECT_EQ(nonzero, 0);
      }
    }
  }
}

// One call's dequantized values: out * descale of each element's group, as doubles.
std::vector<double> dequantized(const QuantizeCall& call) {
  const std::vector<unsigned char> out = call.out->download();
  const std::vector<float> descale = call.downloaded_descale();
  const ref::QuantizeShape& shape = call.shape;
  std::vector<double> values;
  for (int b = 0; b < shape.batch; ++b)
    for (int s = 0; s < shape.seqlen; ++s)
      for (int h = 0; h < shape.nheads; ++h) {
        const double scale =
            descale[call.descale_offset(ref::descale_index(shape, call.scaling, call.groups, b, s, h))];
        for (int i = 0; i < shape.head_dim; ++i) values.push_back(ref::e4m3_value(out[call.out_offset(b, s, h, i)]) * scale);
      }
  return values;
}

// Q (1, 257, 8, d) and K (1, 300, 2, d) with outlier channels, quantized per head with FA3's
// (batch, nheads_kv) descale for both (Q's groups = nheads_kv), rotated with the same signs: the
// dequantized scores q.k of each query head against its KV head match those of the original
// values within e4m3's error bound, element by element, and in the root mean square within 5% of
// the scores' (the rounding errors of a sum mostly cancel: about 0.5% is expected; unrelated
// rotations of Q and K would give errors as large as the scores).
TEST_F(QuantizeGpuEdges, RotatedScoresMatchTheOriginalOnes) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int d : {64, 96, 128, 192, 256}) {
    SCOPED_TRACE(::testing::Message() << "head dim " << d);
    const ref::QuantizeShape q_shape{1, 257, 8, d}, k_shape{1, 300, 2, d};
    const auto input = [&](const ref::QuantizeShape& shape) {
      std::vector<float> x(std::size_t(shape.seqlen) * shape.nheads * d);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const int channel = static_cast<int>(i % d);
        x[i] = round_to(DType::kBFloat16, normal(rng) * (channel == 3 || channel == d / 2 + 1 ? 20.f : 1.f));
      }
      return x;
    };
    const std::vector<float> q = input(q_shape), k = input(k_shape);
    const std::vector<float> signs = random_signs(d, rng);
    QuantizeCall q_call, k_call;
    for (auto [call, shape, values] : {std::tuple{&q_call, q_shape, &q}, std::tuple{&k_call, k_shape, &k}}) {
      call->shape = shape;
      call->scaling = Fp8Scaling::kPerHead;
      call->groups = 2;
      call->prepare(*values, &signs);
      const Status status = call->run();
      ASSERT_TRUE(status.ok()) << status.message;
    }
    const std::vector<double> q_deq = dequantized(q_call), k_deq = dequantized(k_call);
    const std::vector<float> q_descale = q_call.downloaded_descale(), k_descale = k_call.downloaded_descale();
    const auto rotated = [&](const std::vector<float>& x) {
      std::vector<double> y(x.begin(), x.end());
      for (std::size_t row = 0; row < y.size(); row += d) ref::hadamard_rotate(signs.data(), d, &y[row]);
      return y;
    };
    const std::vector<double> yq = rotated(q), yk = rotated(k);
    // Per element: |error| <= delta |y| + alpha, delta the relative half step (2^-4, and the float
    // scale's), alpha half the subnormal step (2^-10) and the float rotation's error, times the descale.
    constexpr double kDelta = 0x1p-4 + 1e-5;
    double squared_error = 0.0, squared_score = 0.0;
    std::int64_t beyond_bound = 0;
    for (int h = 0; h < 8; ++h) {
      const int kv = h / 4;
      const double alpha_q = q_descale[kv] * (0x1p-10 + rotation_error_bound(d));
      const double alpha_k = k_descale[kv] * (0x1p-10 + rotation_error_bound(d));
      for (int i = 0; i < 257; ++i) {
        const std::size_t q_row = (std::size_t(i) * 8 + h) * d;
        for (int j = 0; j < 300; ++j) {
          const std::size_t k_row = (std::size_t(j) * 2 + kv) * d;
          double score = 0.0, deq_score = 0.0, bound = 0.0;
          for (int e = 0; e < d; ++e) {
            score += double(q[q_row + e]) * k[k_row + e];
            deq_score += q_deq[q_row + e] * k_deq[k_row + e];
            const double aq = std::fabs(yq[q_row + e]), ak = std::fabs(yk[k_row + e]);
            bound += aq * ak * (2 * kDelta + kDelta * kDelta) + (alpha_q * ak + alpha_k * aq) * (1 + kDelta) +
                     alpha_q * alpha_k;
          }
          beyond_bound += std::fabs(deq_score - score) > bound;
          squared_error += (deq_score - score) * (deq_score - score);
          squared_score += score * score;
        }
      }
    }
    EXPECT_EQ(beyond_bound, 0);
    EXPECT_LE(std::sqrt(squared_error), 0.05 * std::sqrt(squared_score));
  }
}

}  // namespace
}  // namespace flashhop_test
