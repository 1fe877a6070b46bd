// Variable-length batches (cu_seqlens) on the GPU: each sequence against the double-precision CPU
// reference of that sequence alone, under the forward's tolerance rule (reference/tolerance.h).
// Sequences of 0, 1, 17, 128, 1000 and 3000 queries, keys as many or not, every mask kind,
// soft-capping, GQA, every head dim and both dtypes; with seqused, each sequence's slot is longer
// than its used rows, and those rows hold large values that must not leak into any result. O and
// LSE are poisoned (NaN) before the call: every used row must be written, every other row left as
// it was. Skipped without a Hopper GPU and for kernels the build left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"
#include "reference/tolerance.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::Status;
using flashhop::StatusCode;

struct Sequence {
  int seqlen_q, seqlen_k;
};

struct VarlenCase {
  std::string name;
  DType dtype;
  int head_dim, head_dim_v;
  int nheads, nheads_kv;
  Masking masking;
  std::vector<Sequence> sequences;
  int slack = 0;  // > 0: seqused given, each slot this many rows longer than its used rows
};
void PrintTo(const VarlenCase& c, std::ostream* out) { *out << c.name; }

// The rows of a packed tensor (rows, heads, cols), host side, as floats.
struct Packed {
  int rows, heads, cols;
  std::vector<float> values;
  float* row(int r) { return values.data() + std::size_t(r) * heads * cols; }
};

// A device tensor of `dtype` holding `host`'s values.
DeviceBuffer upload_packed(const Packed& host, DType dtype) {
  std::vector<unsigned char> image(host.values.size() * flashhop::dtype_size(dtype));
  for (std::size_t i = 0; i < host.values.size(); ++i) {
    store_element(dtype, host.values[i], &image[i * flashhop::dtype_size(dtype)]);
  }
  DeviceBuffer buffer(image.size());
  buffer.upload(image);
  return buffer;
}

DeviceBuffer upload_ints(const std::vector<int>& values) {
  std::vector<unsigned char> image(values.size() * sizeof(int));
  if (!values.empty()) std::memcpy(image.data(), values.data(), image.size());
  DeviceBuffer buffer(image.size());
  buffer.upload(image);
  return buffer;
}

std::vector<float> download_as_floats(const DeviceBuffer& buffer, DType dtype) {
  const std::vector<unsigned char> image = buffer.download();
  std::vector<float> values(image.size() / flashhop::dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = load_element(dtype, &image[i * flashhop::dtype_size(dtype)]);
  }
  return values;
}

using VarlenGpu = GpuTestWithParam<VarlenCase>;

TEST_P(VarlenGpu, EachSequenceMatchesTheReference) {
  const VarlenCase& c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const int batch = static_cast<int>(c.sequences.size());

  // Slots: sequence b's used rows, then `slack` rows of large values that no result may see.
  std::vector<int> cu_q{0}, cu_k{0}, used_q, used_k;
  int max_q = 1, max_k = 1;
  for (const Sequence& s : c.sequences) {
    cu_q.push_back(cu_q.back() + s.seqlen_q + c.slack);
    cu_k.push_back(cu_k.back() + s.seqlen_k + c.slack);
    used_q.push_back(s.seqlen_q);
    used_k.push_back(s.seqlen_k);
    max_q = std::max(max_q, s.seqlen_q);
    max_k = std::max(max_k, s.seqlen_k);
  }
  const int total_q = cu_q.back(), total_k = cu_k.back();
  Packed q{total_q, c.nheads, c.head_dim, random_normal(std::int64_t{total_q} * c.nheads * c.head_dim, c.dtype, rng)};
  Packed k{total_k, c.nheads_kv, c.head_dim,
           random_normal(std::int64_t{total_k} * c.nheads_kv * c.head_dim, c.dtype, rng)};
  Packed v{total_k, c.nheads_kv, c.head_dim_v,
           random_normal(std::int64_t{total_k} * c.nheads_kv * c.head_dim_v, c.dtype, rng)};
  for (int b = 0; b < batch; ++b) {
    for (int r = cu_k[b] + used_k[b]; r < cu_k[b + 1]; ++r) {
      std::fill_n(k.row(r), c.nheads_kv * c.head_dim, 100.f);
      std::fill_n(v.row(r), c.nheads_kv * c.head_dim_v, 1000.f);
    }
    for (int r = cu_q[b] + used_q[b]; r < cu_q[b + 1]; ++r) std::fill_n(q.row(r), c.nheads * c.head_dim, 100.f);
  }

  DeviceBuffer dq = upload_packed(q, c.dtype), dk = upload_packed(k, c.dtype), dv = upload_packed(v, c.dtype);
  const std::int64_t o_elements = std::int64_t{total_q} * c.nheads * c.head_dim_v;
  DeviceBuffer dout(o_elements * flashhop::dtype_size(c.dtype)), dlse(std::size_t(c.nheads) * total_q * sizeof(float));
  dout.upload(poisoned_storage(c.dtype, o_elements));
  dlse.upload(poisoned_storage(DType::kFloat32, std::int64_t{c.nheads} * total_q));
  DeviceBuffer dcu_q = upload_ints(cu_q), dcu_k = upload_ints(cu_k), dused_q = upload_ints(used_q),
               dused_k = upload_ints(used_k);

  flashhop::ForwardArgs args;
  args.q = flashhop::make_contiguous(dq.data(), c.dtype, {total_q, c.nheads, c.head_dim});
  args.k = flashhop::make_contiguous(dk.data(), c.dtype, {total_k, c.nheads_kv, c.head_dim});
  args.v = flashhop::make_contiguous(dv.data(), c.dtype, {total_k, c.nheads_kv, c.head_dim_v});
  args.o = flashhop::make_contiguous(dout.data(), c.dtype, {total_q, c.nheads, c.head_dim_v});
  args.lse = flashhop::make_contiguous(dlse.data(), DType::kFloat32, {c.nheads, total_q});
  args.cu_seqlens_q = flashhop::make_contiguous(dcu_q.data(), DType::kInt32, {batch + 1});
  args.cu_seqlens_k = flashhop::make_contiguous(dcu_k.data(), DType::kInt32, {batch + 1});
  if (c.slack > 0) {
    args.seqused_q = flashhop::make_contiguous(dused_q.data(), DType::kInt32, {batch});
    args.seqused_k = flashhop::make_contiguous(dused_k.data(), DType::kInt32, {batch});
  }
  args.max_seqlen_q = max_q;
  args.max_seqlen_k = max_k;
  args.causal = c.masking.causal;
  args.window_left = c.masking.window_left;
  args.window_right = c.masking.window_right;
  args.softcap = c.masking.softcap;

  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const Status status = with_workspace(args, flashhop::forward_workspace_size, flashhop::forward, stream);
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = download_as_floats(dout, c.dtype);
  const std::vector<float> lse = download_as_floats(dlse, DType::kFloat32);

  flashhop::reference::ScoreOptions options;
  options.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  options.softcap = c.masking.softcap;
  options.causal = c.masking.causal;
  options.window_left = c.masking.window_left;
  options.window_right = c.masking.window_right;
  std::int64_t untouched_violations = 0;
  for (int b = 0; b < batch; ++b) {
    const int sq = used_q[b], sk = used_k[b];
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << sk << " keys)");
    if (sq > 0) {
      const flashhop::reference::AttentionShape shape{1, sq, sk, c.nheads, c.nheads_kv, c.head_dim, c.head_dim_v};
      std::vector<double> o_ref, lse_ref;
      std::vector<float> o_low, lse_low;
      const float* qb = q.row(cu_q[b]);
      const float* kb = k.row(cu_k[b]);
      const float* vb = v.row(cu_k[b]);
      flashhop::reference::attention_forward(shape, qb, kb, vb, options, &o_ref, &lse_ref);
      flashhop::reference::attention_forward_low_precision(shape, qb, kb, vb, options, c.dtype, &o_low, &lse_low);
      double o_error = 0, o_baseline = 0, max_o = 0, max_v = 0, lse_error = 0, lse_baseline = 0;
      std::int64_t infinity_mismatches = 0, nan = 0;
      for (std::size_t i = 0; i < o_ref.size(); ++i) {
        const float got = o[std::size_t(cu_q[b]) * c.nheads * c.head_dim_v + i];
        nan += std::isnan(got);
        o_error = std::max(o_error, std::abs(got - o_ref[i]));
        o_baseline = std::max(o_baseline, std::abs(o_low[i] - o_ref[i]));
        max_o = std::max(max_o, std::abs(o_ref[i]));
      }
      for (std::int64_t i = 0; i < std::int64_t{sk} * c.nheads_kv * c.head_dim_v; ++i) {
        max_v = std::max(max_v, double{std::abs(vb[i])});
      }
      for (int h = 0; h < c.nheads; ++h) {
        for (int i = 0; i < sq; ++i) {
          const double expected = lse_ref[std::size_t(h) * sq + i];
          const float got = lse[std::size_t(h) * total_q + cu_q[b] + i];
          if (std::isinf(expected)) {
            infinity_mismatches += !(std::isinf(got) && got < 0);
          } else {
            nan += std::isnan(got);
            lse_error = std::max(lse_error, std::abs(got - expected));
            lse_baseline = std::max(lse_baseline, std::abs(lse_low[std::size_t(h) * sq + i] - expected));
          }
        }
      }
      EXPECT_EQ(nan, 0) << "NaN in O or LSE";
      EXPECT_EQ(infinity_mismatches, 0) << "LSE is -inf exactly where no key is visible";
      EXPECT_LE(o_error, flashhop::reference::o_tolerance(c.dtype, o_baseline, max_o, c.masking.softcap, max_v))
          << "low-precision baseline error " << o_baseline;
      EXPECT_LE(lse_error, flashhop::reference::lse_tolerance(lse_baseline, c.masking.softcap));
    }
    // The slot's unused rows keep their poison.
    for (int r = cu_q[b] + sq; r < cu_q[b + 1]; ++r) {
      for (int i = 0; i < c.nheads * c.head_dim_v; ++i) {
        untouched_violations += !std::isnan(o[std::size_t(r) * c.nheads * c.head_dim_v + i]);
      }
      for (int h = 0; h < c.nheads; ++h) untouched_violations += !std::isnan(lse[std::size_t(h) * total_q + r]);
    }
  }
  EXPECT_EQ(untouched_violations, 0) << "O or LSE written in rows past seqused";
}

std::vector<VarlenCase> cases() {
  // Self-attention lengths, and queries and keys of different lengths (decoding-like, and keys
  // missing: such rows give O = 0 and LSE = -inf).
  const std::vector<Sequence> equal = {{17, 17}, {0, 0}, {1, 1}, {128, 128}, {1000, 1000}, {3000, 3000}};
  const std::vector<Sequence> mixed = {{1, 1000}, {17, 3000}, {0, 17}, {128, 0}, {1000, 128}, {3, 5}};
  const struct {
    const char* name;
    Masking masking;
  } masks[] = {{"full", {}},
               {"causal", {true}},
               {"window61_17", {false, 61, 17}},
               {"causal_window100", {true, 100, 0}},
               {"softcap", {false, -1, -1, 1.5f}},
               {"softcap_causal", {true, -1, -1, 1.5f}}};
  std::vector<VarlenCase> all;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
      for (const auto& mask : masks) {
        if (dtype == DType::kFloat16 && mask.masking.window_left >= 0) continue;  // bf16 covers the windows
        for (bool seqused : {false, true}) {
          const bool bf16 = dtype == DType::kBFloat16;
          const std::string name = std::string(bf16 ? "bf16" : "fp16") + "_d" + std::to_string(d) +
                                   (dv != d ? "x" + std::to_string(dv) : "") + "_" + mask.name +
                                   (seqused ? "_mixed_seqused_h8_kv2" : "_equal_h2_kv1");
          all.push_back({name, dtype, d, dv, seqused ? 8 : 2, seqused ? 2 : 1, mask.masking, seqused ? mixed : equal,
                         seqused ? 5 : 0});
        }
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, VarlenGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<VarlenCase>& info) { return info.param.name; });

}  // namespace
}  // namespace flashhop_test
