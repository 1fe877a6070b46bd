// Variable-length batches (cu_seqlens) and paged KV caches (page_table) on the GPU: each sequence
// against the double-precision CPU reference of that sequence alone, under the forward's tolerance
// rule (reference/tolerance.h).
// - Variable length: sequences of 0, 1, 17, 128, 1000 and 3000 queries, keys as many or not, every
//   mask kind, soft-capping, GQA, every head dim and both dtypes; with seqused, each sequence's
//   slot is longer than its used rows, and those rows hold large values that must not leak into
//   any result.
// - Paged: pages of 1, 3, 16, 64 and 256 rows in a shuffled order, page tables whose unused entries
//   name no page, decoding (1 to 16 queries) and prefill, 1, 4 and 8 query heads per KV head; the
//   slots of each sequence's last page past its keys hold large values that must not leak.
// - Both: query heads packed into tiles or not, and keys split (partials merged by the combine
//   kernel) or not, as the plan chooses and forced; FP8 (e4m3 inputs with per (sequence, KV head)
//   descales, bfloat16 O) against the reference on the dequantized inputs.
// - combine on its own against the merge in doubles; append_kv's rows in the cache against the
//   rotation in doubles (e4m3 rows copied exactly), and every other cache element unchanged.
// O and LSE are poisoned (NaN) before the call: every used row must be written, every other row
// left as it was. Skipped without a Hopper GPU and for kernels the build left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

// What the per-sequence check needs of a case, and how the call packs rows and splits keys.
struct Config {
  DType dtype;
  int head_dim, head_dim_v;
  int nheads, nheads_kv;
  Masking masking;
  flashhop::PackGqa pack_gqa = flashhop::PackGqa::kAuto;
  int num_splits = 0;
};

// O's dtype: the inputs', bfloat16 for e4m3 ones.
DType output_dtype(DType dtype) { return dtype == DType::kFloat8E4M3 ? DType::kBFloat16 : dtype; }

const char* dtype_label(DType dtype) {
  return dtype == DType::kBFloat16 ? "bf16" : dtype == DType::kFloat16 ? "fp16" : "e4m3";
}

// "", or "_packon" / "_packoff" and "_splits<n>" where the case sets them.
std::string call_suffix(flashhop::PackGqa pack_gqa, int num_splits) {
  std::string suffix = pack_gqa == flashhop::PackGqa::kOn    ? "_packon"
                       : pack_gqa == flashhop::PackGqa::kOff ? "_packoff"
                                                             : "";
  if (num_splits > 0) suffix += "_splits" + std::to_string(num_splits);
  return suffix;
}

struct VarlenCase {
  std::string name;
  DType dtype;
  int head_dim, head_dim_v;
  int nheads, nheads_kv;
  Masking masking;
  std::vector<Sequence> sequences;
  int slack = 0;  // > 0: seqused given, each slot this many rows longer than its used rows
  flashhop::PackGqa pack_gqa = flashhop::PackGqa::kAuto;
  int num_splits = 0;

  Config config() const { return {dtype, head_dim, head_dim_v, nheads, nheads_kv, masking, pack_gqa, num_splits}; }
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

// A device tensor of `dtype` holding `values`.
DeviceBuffer upload_floats(const std::vector<float>& values, DType dtype) {
  return upload_packed(Packed{static_cast<int>(values.size()), 1, 1, values}, dtype);
}

std::vector<float> download_as_floats(const DeviceBuffer& buffer, DType dtype) {
  const std::vector<unsigned char> image = buffer.download();
  std::vector<float> values(image.size() / flashhop::dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = load_element(dtype, &image[i * flashhop::dtype_size(dtype)]);
  }
  return values;
}

// Sequence b's O and LSE rows, from packed row q_row of o (total_q, nheads, dv) and lse (nheads,
// total_q), against the reference of its sq queries qb and its sk keys kb / vb (rows of nheads_kv
// heads).
void expect_sequence_matches(const Config& c, const float* qb, const float* kb, const float* vb, int sq, int sk,
                             const std::vector<float>& o, const std::vector<float>& lse, int q_row, int total_q) {
  flashhop::reference::ScoreOptions options;
  options.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  options.softcap = c.masking.softcap;
  options.causal = c.masking.causal;
  options.window_left = c.masking.window_left;
  options.window_right = c.masking.window_right;
  const flashhop::reference::AttentionShape shape{1, sq, sk, c.nheads, c.nheads_kv, c.head_dim, c.head_dim_v};
  std::vector<double> o_ref, lse_ref;
  std::vector<float> o_low, lse_low;
  flashhop::reference::attention_forward(shape, qb, kb, vb, options, &o_ref, &lse_ref);
  // FP8 is held to bounds of its own (below), without a low-precision run.
  const bool fp8 = c.dtype == DType::kFloat8E4M3;
  if (!fp8) flashhop::reference::attention_forward_low_precision(shape, qb, kb, vb, options, c.dtype, &o_low, &lse_low);
  double o_error = 0, o_baseline = 0, max_o = 0, max_v = 0, lse_error = 0, lse_baseline = 0;
  std::int64_t infinity_mismatches = 0, nan = 0;
  for (std::size_t i = 0; i < o_ref.size(); ++i) {
    const float got = o[std::size_t(q_row) * c.nheads * c.head_dim_v + i];
    nan += std::isnan(got);
    o_error = std::max(o_error, std::abs(got - o_ref[i]));
    if (!fp8) o_baseline = std::max(o_baseline, std::abs(o_low[i] - o_ref[i]));
    max_o = std::max(max_o, std::abs(o_ref[i]));
  }
  for (std::int64_t i = 0; i < std::int64_t{sk} * c.nheads_kv * c.head_dim_v; ++i) {
    max_v = std::max(max_v, double{std::abs(vb[i])});
  }
  for (int h = 0; h < c.nheads; ++h) {
    for (int i = 0; i < sq; ++i) {
      const double expected = lse_ref[std::size_t(h) * sq + i];
      const float got = lse[std::size_t(h) * total_q + q_row + i];
      if (std::isinf(expected)) {
        infinity_mismatches += !(std::isinf(got) && got < 0);
      } else {
        nan += std::isnan(got);
        lse_error = std::max(lse_error, std::abs(got - expected));
        if (!fp8) lse_baseline = std::max(lse_baseline, std::abs(lse_low[std::size_t(h) * sq + i] - expected));
      }
    }
  }
  EXPECT_EQ(nan, 0) << "NaN in O or LSE";
  EXPECT_EQ(infinity_mismatches, 0) << "LSE is -inf exactly where no key is visible";
  if (fp8) {
    const double score_error = flashhop::reference::fp8_score_error(
        c.head_dim, options.softmax_scale, max_row_norm(qb, std::int64_t{sq} * c.nheads, c.head_dim),
        max_row_norm(kb, std::int64_t{sk} * c.nheads_kv, c.head_dim));
    EXPECT_LE(o_error, flashhop::reference::fp8_o_tolerance(score_error, c.masking.softcap, sk, max_v, max_o));
    EXPECT_LE(lse_error, flashhop::reference::fp8_lse_tolerance(score_error, c.masking.softcap));
    return;
  }
  EXPECT_LE(o_error,
            flashhop::reference::o_tolerance(output_dtype(c.dtype), o_baseline, max_o, c.masking.softcap, max_v))
      << "low-precision baseline error " << o_baseline;
  EXPECT_LE(lse_error, flashhop::reference::lse_tolerance(lse_baseline, c.masking.softcap));
}

// O (total_q, nheads, dv) and LSE (nheads, total_q) of a call on the device, poisoned (NaN) first so
// that every value the call writes shows; bind() describes them in the call's arguments.
struct PoisonedOutputs {
  DType dtype;
  int total_q, nheads, head_dim_v;
  DeviceBuffer o, lse;

  PoisonedOutputs(const Config& c, int total_q)
      : dtype(output_dtype(c.dtype)), total_q(total_q), nheads(c.nheads), head_dim_v(c.head_dim_v),
        o(std::size_t(total_q) * c.nheads * c.head_dim_v * flashhop::dtype_size(dtype)),
        lse(std::size_t(c.nheads) * total_q * sizeof(float)) {
    o.upload(poisoned_storage(dtype, std::int64_t{total_q} * nheads * head_dim_v));
    lse.upload(poisoned_storage(DType::kFloat32, std::int64_t{nheads} * total_q));
  }
  void bind(flashhop::ForwardArgs& args) {
    args.o = flashhop::make_contiguous(o.data(), dtype, {total_q, nheads, head_dim_v});
    args.lse = flashhop::make_contiguous(lse.data(), DType::kFloat32, {nheads, total_q});
  }
  std::vector<float> o_values() const { return download_as_floats(o, dtype); }
  std::vector<float> lse_values() const { return download_as_floats(lse, DType::kFloat32); }
};

// How many values of packed rows [begin, end) of o and lse were written (they were poisoned).
std::int64_t count_written(const Config& c, const std::vector<float>& o, const std::vector<float>& lse, int begin,
                           int end, int total_q) {
  std::int64_t written = 0;
  for (int r = begin; r < end; ++r) {
    for (int i = 0; i < c.nheads * c.head_dim_v; ++i) written += !std::isnan(o[std::size_t(r) * c.nheads * c.head_dim_v + i]);
    for (int h = 0; h < c.nheads; ++h) written += !std::isnan(lse[std::size_t(h) * total_q + r]);
  }
  return written;
}

// FP8 calls' descales: q's, k's and v's (batch, nheads_kv), drawn from [0.5, 2], on the device;
// none for other dtypes. The reference reads each sequence's rows dequantized (scaled()).
struct Descales {
  int nheads_kv;
  std::vector<float> q, k, v;
  DeviceBuffer dq, dk, dv;

  Descales(const Config& c, int batch, std::mt19937& rng)
      : nheads_kv(c.nheads_kv), q(draw(c, batch, rng)), k(draw(c, batch, rng)), v(draw(c, batch, rng)),
        dq(upload_floats(q, DType::kFloat32)), dk(upload_floats(k, DType::kFloat32)),
        dv(upload_floats(v, DType::kFloat32)) {}
  static std::vector<float> draw(const Config& c, int batch, std::mt19937& rng) {
    if (c.dtype != DType::kFloat8E4M3) return {};
    std::uniform_real_distribution<float> uniform(0.5f, 2.f);
    std::vector<float> values(std::size_t(batch) * c.nheads_kv);
    for (float& x : values) x = uniform(rng);
    return values;
  }
  void bind(flashhop::ForwardArgs& args, int batch) const {
    if (q.empty()) return;
    args.q_descale = flashhop::make_contiguous(dq.data(), DType::kFloat32, {batch, nheads_kv});
    args.k_descale = flashhop::make_contiguous(dk.data(), DType::kFloat32, {batch, nheads_kv});
    args.v_descale = flashhop::make_contiguous(dv.data(), DType::kFloat32, {batch, nheads_kv});
  }
  // `rows` rows of `heads` heads of `cols` of sequence b, each head times descale[b, its KV head].
  std::vector<float> scaled(const std::vector<float>& descale, const float* x, int rows, int heads, int cols,
                            int b) const {
    if (descale.empty()) return std::vector<float>(x, x + std::size_t(rows) * heads * cols);
    return scaled_by_kv_head(x, rows, heads, cols, descale.data() + std::size_t(b) * nheads_kv, heads / nheads_kv);
  }
};

// forward with the case's mask, packing and split options, on a stream of its own, with a workspace
// of the size asked.
Status run_forward(flashhop::ForwardArgs& args, const Config& config) {
  const Masking& masking = config.masking;
  args.pack_gqa = config.pack_gqa;
  args.num_splits = config.num_splits;
  args.causal = masking.causal;
  args.window_left = masking.window_left;
  args.window_right = masking.window_right;
  args.softcap = masking.softcap;
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const Status status = with_workspace(args, flashhop::forward_workspace_size, flashhop::forward, stream);
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return status;
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
  PoisonedOutputs outputs(c.config(), total_q);
  DeviceBuffer dcu_q = upload_ints(cu_q), dcu_k = upload_ints(cu_k), dused_q = upload_ints(used_q),
               dused_k = upload_ints(used_k);
  const Descales descales(c.config(), batch, rng);

  flashhop::ForwardArgs args;
  args.q = flashhop::make_contiguous(dq.data(), c.dtype, {total_q, c.nheads, c.head_dim});
  args.k = flashhop::make_contiguous(dk.data(), c.dtype, {total_k, c.nheads_kv, c.head_dim});
  args.v = flashhop::make_contiguous(dv.data(), c.dtype, {total_k, c.nheads_kv, c.head_dim_v});
  outputs.bind(args);
  args.cu_seqlens_q = flashhop::make_contiguous(dcu_q.data(), DType::kInt32, {batch + 1});
  args.cu_seqlens_k = flashhop::make_contiguous(dcu_k.data(), DType::kInt32, {batch + 1});
  if (c.slack > 0) {
    args.seqused_q = flashhop::make_contiguous(dused_q.data(), DType::kInt32, {batch});
    args.seqused_k = flashhop::make_contiguous(dused_k.data(), DType::kInt32, {batch});
  }
  args.max_seqlen_q = max_q;
  args.max_seqlen_k = max_k;
  descales.bind(args, batch);
  const Status status = run_forward(args, c.config());
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = outputs.o_values();
  const std::vector<float> lse = outputs.lse_values();

  std::int64_t untouched_violations = 0;
  for (int b = 0; b < batch; ++b) {
    const int sq = used_q[b], sk = used_k[b];
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << sk << " keys)");
    if (sq > 0) {
      const std::vector<float> qb = descales.scaled(descales.q, q.row(cu_q[b]), sq, c.nheads, c.head_dim, b);
      const std::vector<float> kb = descales.scaled(descales.k, k.row(cu_k[b]), sk, c.nheads_kv, c.head_dim, b);
      const std::vector<float> vb = descales.scaled(descales.v, v.row(cu_k[b]), sk, c.nheads_kv, c.head_dim_v, b);
      expect_sequence_matches(c.config(), qb.data(), kb.data(), vb.data(), sq, sk, o, lse, cu_q[b], total_q);
    }
    untouched_violations += count_written(c.config(), o, lse, cu_q[b] + sq, cu_q[b + 1], total_q);
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
  // FP8: every head dim, the masks of the fixed-length FP8 tests, with seqused and GQA.
  for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
    for (const auto& mask : masks) {
      if (d != 128 && mask.masking.window_left >= 0) continue;
      const std::string name = std::string("e4m3_d") + std::to_string(d) + (dv != d ? "x" + std::to_string(dv) : "") +
                               "_" + mask.name + "_mixed_seqused_h8_kv2";
      all.push_back({name, DType::kFloat8E4M3, d, dv, 8, 2, mask.masking, mixed, 5});
    }
    all.push_back({"e4m3_d" + std::to_string(d) + (dv != d ? "x" + std::to_string(dv) : "") + "_causal_equal_h2_kv1",
                   DType::kFloat8E4M3, d, dv, 2, 1, masks[1].masking, equal});
  }
  // Packed query heads and splits by keys, forced both ways, at d = 64 (two CTAs per SM) and 128,
  // and FP8's at d = 128.
  for (auto [d, dv] : {std::pair{64, 64}, {128, 128}}) {
    for (const auto& mask : masks) {
      for (auto [pack, splits] : {std::pair{flashhop::PackGqa::kOn, 1}, {flashhop::PackGqa::kOn, 3},
                                  {flashhop::PackGqa::kOff, 5}}) {
        const std::string name = "bf16_d" + std::to_string(d) + "_" + mask.name + "_mixed_seqused_h8_kv2" +
                                 call_suffix(pack, splits);
        all.push_back({name, DType::kBFloat16, d, dv, 8, 2, mask.masking, mixed, 5, pack, splits});
        if (d == 128) {
          all.push_back({"e4m3" + name.substr(4), DType::kFloat8E4M3, d, dv, 8, 2, mask.masking, mixed, 5, pack,
                         splits});
        }
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, VarlenGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<VarlenCase>& info) { return info.param.name; });

struct PagedCase {
  std::string name;
  Config config;
  int page_size;
  std::vector<Sequence> sequences;
};
void PrintTo(const PagedCase& c, std::ostream* out) { *out << c.name; }

using PagedGpu = GpuTestWithParam<PagedCase>;

TEST_P(PagedGpu, EachSequenceMatchesTheReference) {
  const PagedCase& pc = GetParam();
  const Config& c = pc.config;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const int batch = static_cast<int>(pc.sequences.size());
  const int page = pc.page_size;

  // Queries packed; each sequence's keys on pages of its own, all pages in a shuffled order and a
  // few more than the sequences use. A page-table entry past a sequence's pages names no page (-1).
  std::vector<int> cu_q{0}, keys;
  int max_q = 1, max_k = 1, max_pages = 1, pages_used = 0;
  for (const Sequence& sequence : pc.sequences) {
    cu_q.push_back(cu_q.back() + sequence.seqlen_q);
    keys.push_back(sequence.seqlen_k);
    max_q = std::max(max_q, sequence.seqlen_q);
    max_k = std::max(max_k, sequence.seqlen_k);
    const int pages = (sequence.seqlen_k + page - 1) / page;
    max_pages = std::max(max_pages, pages + 1);
    pages_used += pages;
  }
  const int total_q = cu_q.back();
  const int num_pages = pages_used + 3;
  std::vector<int> order(num_pages);
  for (int i = 0; i < num_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> table(std::size_t(batch) * max_pages, -1);
  for (int b = 0, next = 0; b < batch; ++b) {
    for (int j = 0; j < (keys[b] + page - 1) / page; ++j) table[std::size_t(b) * max_pages + j] = order[next++];
  }

  Packed q{total_q, c.nheads, c.head_dim, random_normal(std::int64_t{total_q} * c.nheads * c.head_dim, c.dtype, rng)};
  // The cache's rows, page after page; each slot past a sequence's keys (and each unused page)
  // holds large values that no result may see.
  const int cache_rows = num_pages * page;
  Packed k_cache{cache_rows, c.nheads_kv, c.head_dim, std::vector<float>(std::size_t(cache_rows) * c.nheads_kv * c.head_dim, 100.f)};
  Packed v_cache{cache_rows, c.nheads_kv, c.head_dim_v,
                 std::vector<float>(std::size_t(cache_rows) * c.nheads_kv * c.head_dim_v, 1000.f)};
  std::vector<Packed> k_of, v_of;  // each sequence's keys, contiguous, for the reference
  for (int b = 0; b < batch; ++b) {
    k_of.push_back({keys[b], c.nheads_kv, c.head_dim,
                    random_normal(std::int64_t{keys[b]} * c.nheads_kv * c.head_dim, c.dtype, rng)});
    v_of.push_back({keys[b], c.nheads_kv, c.head_dim_v,
                    random_normal(std::int64_t{keys[b]} * c.nheads_kv * c.head_dim_v, c.dtype, rng)});
    for (int j = 0; j < keys[b]; ++j) {
      const int row = table[std::size_t(b) * max_pages + j / page] * page + j % page;
      std::copy_n(k_of[b].row(j), c.nheads_kv * c.head_dim, k_cache.row(row));
      std::copy_n(v_of[b].row(j), c.nheads_kv * c.head_dim_v, v_cache.row(row));
    }
  }

  DeviceBuffer dq = upload_packed(q, c.dtype), dk = upload_packed(k_cache, c.dtype), dv = upload_packed(v_cache, c.dtype);
  PoisonedOutputs outputs(c, total_q);
  DeviceBuffer dcu_q = upload_ints(cu_q), dkeys = upload_ints(keys), dtable = upload_ints(table);
  const Descales descales(c, batch, rng);

  flashhop::ForwardArgs args;
  args.q = flashhop::make_contiguous(dq.data(), c.dtype, {total_q, c.nheads, c.head_dim});
  args.k = flashhop::make_contiguous(dk.data(), c.dtype, {num_pages, page, c.nheads_kv, c.head_dim});
  args.v = flashhop::make_contiguous(dv.data(), c.dtype, {num_pages, page, c.nheads_kv, c.head_dim_v});
  outputs.bind(args);
  args.cu_seqlens_q = flashhop::make_contiguous(dcu_q.data(), DType::kInt32, {batch + 1});
  args.seqused_k = flashhop::make_contiguous(dkeys.data(), DType::kInt32, {batch});
  args.page_table = flashhop::make_contiguous(dtable.data(), DType::kInt32, {batch, max_pages});
  args.max_seqlen_q = max_q;
  args.max_seqlen_k = max_k;
  descales.bind(args, batch);
  const Status status = run_forward(args, c);
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = outputs.o_values();
  const std::vector<float> lse = outputs.lse_values();
  for (int b = 0; b < batch; ++b) {
    const int sq = cu_q[b + 1] - cu_q[b];
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << keys[b] << " keys)");
    if (sq > 0) {
      const std::vector<float> qb = descales.scaled(descales.q, q.row(cu_q[b]), sq, c.nheads, c.head_dim, b);
      const std::vector<float> kb = descales.scaled(descales.k, k_of[b].values.data(), keys[b], c.nheads_kv,
                                                    c.head_dim, b);
      const std::vector<float> vb = descales.scaled(descales.v, v_of[b].values.data(), keys[b], c.nheads_kv,
                                                    c.head_dim_v, b);
      expect_sequence_matches(c, qb.data(), kb.data(), vb.data(), sq, keys[b], o, lse, cu_q[b], total_q);
    }
  }
}

std::vector<PagedCase> paged_cases() {
  // Decoding: 1 to 16 new queries over caches of 1 to 3000 keys (one empty); prefill: queries as
  // many as the keys, and chunks of a longer cache.
  const std::vector<Sequence> decode = {{1, 1000}, {4, 17}, {16, 3000}, {1, 1}, {2, 0}, {8, 129}};
  const std::vector<Sequence> prefill = {{17, 17}, {128, 1000}, {1000, 1000}, {0, 5}, {300, 300}};
  const struct {
    const char* name;
    Masking masking;
  } masks[] = {{"full", {}}, {"causal", {true}}, {"window61_17", {false, 61, 17}}, {"softcap_causal", {true, -1, -1, 1.5f}}};
  std::vector<PagedCase> all;
  const auto add = [&](DType dtype, int d, int dv, int page, int nheads, int nheads_kv, const auto& mask, bool decoding,
                       flashhop::PackGqa pack = flashhop::PackGqa::kAuto, int splits = 0) {
    const std::string name = std::string(dtype_label(dtype)) + "_d" + std::to_string(d) +
                             (dv != d ? "x" + std::to_string(dv) : "") + "_page" + std::to_string(page) + "_" +
                             mask.name + "_h" + std::to_string(nheads) + "_kv" + std::to_string(nheads_kv) +
                             (decoding ? "_decode" : "_prefill") + call_suffix(pack, splits);
    all.push_back({name, {dtype, d, dv, nheads, nheads_kv, mask.masking, pack, splits}, page, decoding ? decode : prefill});
  };
  // d = 128 at every page size, mask and GQA ratio (1, 4 and 8 query heads per KV head).
  for (int page : {1, 3, 16, 64, 256}) {
    for (const auto& mask : masks) {
      for (auto [nheads, nheads_kv] : {std::pair{8, 8}, {8, 2}, {8, 1}}) add(DType::kBFloat16, 128, 128, page, nheads, nheads_kv, mask, true);
      add(DType::kBFloat16, 128, 128, page, 4, 2, mask, false);
    }
  }
  // Packed query heads and splits by keys forced both ways (the cases above take the plan's
  // choice), including more splits than a short sequence has key tiles.
  for (int page : {1, 16}) {
    for (const auto& mask : masks) {
      for (auto [pack, splits] : {std::pair{flashhop::PackGqa::kOff, 1}, {flashhop::PackGqa::kOn, 1},
                                  {flashhop::PackGqa::kOn, 7}, {flashhop::PackGqa::kOff, 4}}) {
        add(DType::kBFloat16, 128, 128, page, 8, 2, mask, true, pack, splits);
      }
    }
  }
  // FP8 at d = 128: pages of 1, 16 and 256, decoding and prefill, packed and split.
  for (int page : {1, 16, 256}) {
    for (const auto& mask : masks) {
      add(DType::kFloat8E4M3, 128, 128, page, 8, 2, mask, true);
      add(DType::kFloat8E4M3, 128, 128, page, 4, 2, mask, false);
    }
    add(DType::kFloat8E4M3, 128, 128, page, 8, 2, masks[1], true, flashhop::PackGqa::kOn, 7);
    add(DType::kFloat8E4M3, 128, 128, page, 8, 2, masks[0], true, flashhop::PackGqa::kOff, 4);
  }
  // Every head dim, fp16 and e4m3 at pages of 16, and of 2 (4 for e4m3), decoding also packed and
  // split.
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3}) {
    for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {192, 192}, {192, 128}, {256, 256}}) {
      for (int page : {dtype == DType::kFloat8E4M3 ? 4 : 2, 16}) {  // e4m3 at d = 96: multiples of 4
        add(dtype, d, dv, page, 4, 1, masks[1], true);
        add(dtype, d, dv, page, 4, 1, masks[1], true, flashhop::PackGqa::kOn, 3);
        add(dtype, d, dv, page, 2, 2, masks[0], false);
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, PagedGpu, ::testing::ValuesIn(paged_cases()),
                         [](const ::testing::TestParamInfo<PagedCase>& info) { return info.param.name; });

// flashhop::combine against the merge in doubles: random partials, some splits that saw no key
// (LSE -inf), rows that no split saw (O = 0, LSE = -inf), out_partial a strided view (every other
// row of a larger buffer), out in bfloat16 and float32 poisoned before the call.
struct CombineCase {
  DType out_dtype;
  int num_splits, rows, nheads, head_dim_v;
};

using CombineGpu = GpuTestWithParam<CombineCase>;

TEST_P(CombineGpu, MatchesTheMergeInDoubles) {
  const CombineCase& c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int splits = c.num_splits, rows = c.rows, heads = c.nheads, dv = c.head_dim_v;
  const float kMinusInf = -std::numeric_limits<float>::infinity();
  // out_partial (splits, rows, heads, dv) in every other row of a (splits, 2 rows, heads, dv) buffer.
  std::vector<float> o_partial(std::size_t(splits) * 2 * rows * heads * dv), lse_partial(std::size_t(splits) * rows * heads);
  for (float& x : o_partial) x = normal(rng);
  for (int s = 0; s < splits; ++s) {
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        float& lse = lse_partial[(std::size_t(s) * rows + r) * heads + h];
        // Row 0 is seen by no split; in the others, every third (split, head) saw no key.
        lse = r == 0 || (s + h) % 3 == 1 ? kMinusInf : 5.f * normal(rng);
      }
    }
  }
  DeviceBuffer d_o_partial = upload_floats(o_partial, DType::kFloat32);
  DeviceBuffer d_lse_partial = upload_floats(lse_partial, DType::kFloat32);
  const std::int64_t out_elements = std::int64_t{rows} * heads * dv;
  DeviceBuffer d_out(out_elements * flashhop::dtype_size(c.out_dtype)), d_lse(std::size_t(heads) * rows * sizeof(float));
  d_out.upload(poisoned_storage(c.out_dtype, out_elements));
  d_lse.upload(poisoned_storage(DType::kFloat32, std::int64_t{heads} * rows));

  flashhop::CombineArgs args;
  args.out_partial = flashhop::make_contiguous(d_o_partial.data(), DType::kFloat32, {splits, rows, heads, dv});
  args.out_partial.stride[1] *= 2;
  args.out_partial.stride[0] *= 2;
  args.lse_partial = flashhop::make_contiguous(d_lse_partial.data(), DType::kFloat32, {splits, rows, heads});
  args.out = flashhop::make_contiguous(d_out.data(), c.out_dtype, {rows, heads, dv});
  args.lse = flashhop::make_contiguous(d_lse.data(), DType::kFloat32, {heads, rows});
  const Status status = flashhop::combine(args, nullptr);
  ASSERT_TRUE(status.ok()) << status.message;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const std::vector<float> out = download_as_floats(d_out, c.out_dtype);
  const std::vector<float> lse = download_as_floats(d_lse, DType::kFloat32);

  // out rounds to out_dtype: a few of its ulps; lse in float32.
  const double o_tolerance = c.out_dtype == DType::kFloat32 ? 1e-5 : 1e-2;
  std::int64_t mismatches = 0;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      double max = -std::numeric_limits<double>::infinity();
      for (int s = 0; s < splits; ++s) max = std::max<double>(max, lse_partial[(std::size_t(s) * rows + r) * heads + h]);
      double sum = 0;
      for (int s = 0; s < splits; ++s) {
        const double part = lse_partial[(std::size_t(s) * rows + r) * heads + h];
        if (std::isfinite(part)) sum += std::exp(part - max);
      }
      const double expected_lse = sum > 0 ? max + std::log(sum) : -std::numeric_limits<double>::infinity();
      const float got_lse = lse[std::size_t(h) * rows + r];
      if (std::isinf(expected_lse) ? got_lse != kMinusInf : std::abs(got_lse - expected_lse) > 1e-4 * (1 + std::abs(expected_lse))) {
        ++mismatches;
      }
      for (int j = 0; j < dv; ++j) {
        double expected = 0;
        for (int s = 0; s < splits; ++s) {
          const double part = lse_partial[(std::size_t(s) * rows + r) * heads + h];
          if (!std::isfinite(part)) continue;
          expected += std::exp(part - expected_lse) * o_partial[((std::size_t(s) * 2 * rows + 2 * r) * heads + h) * dv + j];
        }
        const float got = out[(std::size_t(r) * heads + h) * dv + j];
        if (!(std::abs(got - expected) <= o_tolerance * (1 + std::abs(expected)))) ++mismatches;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Grid, CombineGpu,
                         ::testing::Values(CombineCase{DType::kBFloat16, 7, 33, 4, 128},
                                           CombineCase{DType::kFloat32, 40, 5, 3, 96},
                                           CombineCase{DType::kFloat16, 1, 9, 2, 256},
                                           CombineCase{DType::kFloat32, 3, 17, 5, 13}),
                         [](const ::testing::TestParamInfo<CombineCase>& info) {
                           const CombineCase& c = info.param;
                           return std::string(flashhop::dtype_name(c.out_dtype)) + "_splits" +
                                  std::to_string(c.num_splits) + "_rows" + std::to_string(c.rows) + "_h" +
                                  std::to_string(c.nheads) + "_dv" + std::to_string(c.head_dim_v);
                         });

// flashhop::append_kv on a paged cache: each new key row lands rotated (against the rotation in
// doubles of the rounded inputs), each value row as it is, every other cache element unchanged,
// rows past a sequence's pages left out; queries rotated at their positions. Both pairings; e4m3
// caches take their rows unrotated (no tables), bit for bit.
struct AppendCase {
  DType dtype;
  bool interleaved, advance;
  int page_size;
  bool rotary = true;
};

using AppendKvGpu = GpuTestWithParam<AppendCase>;

TEST_P(AppendKvGpu, WritesRotatedRowsAndNothingElse) {
  const AppendCase& c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const int heads_kv = 2, heads = 4, d = 128, rotary_dim = 64, seqlen_ro = 512, page = c.page_size;
  const int max_pages = 256 / page, batch = 3;
  const std::vector<int> cached = {100, 0, 254};  // the last sequence's third new row lies past its 256 keys
  const std::vector<int> cu_new = {0, 3, 4, 7}, cu_q = {0, 2, 3, 5};
  const int total_new = cu_new.back(), total_q = cu_q.back(), num_pages = batch * max_pages;
  std::vector<int> table(std::size_t(batch) * max_pages);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = int((i * 7 + 3) % table.size());  // a permutation
  const std::int64_t cache_elements = std::int64_t{num_pages} * page * heads_kv * d;
  const std::vector<float> k_cache = random_normal(cache_elements, c.dtype, rng), v_cache = random_normal(cache_elements, c.dtype, rng);
  const std::vector<float> k_new = random_normal(std::int64_t{total_new} * heads_kv * d, c.dtype, rng);
  const std::vector<float> v_new = random_normal(std::int64_t{total_new} * heads_kv * d, c.dtype, rng);
  const std::vector<float> q = random_normal(std::int64_t{total_q} * heads * d, c.dtype, rng);
  std::vector<float> cos(std::size_t(seqlen_ro) * rotary_dim / 2), sin(cos.size());
  std::uniform_real_distribution<float> angle(0.f, 6.28f);
  for (std::size_t i = 0; i < cos.size(); ++i) {
    const float a = angle(rng);
    cos[i] = round_to(c.dtype, std::cos(a));
    sin[i] = round_to(c.dtype, std::sin(a));
  }
  DeviceBuffer dk_cache = upload_floats(k_cache, c.dtype), dv_cache = upload_floats(v_cache, c.dtype),
               dk_new = upload_floats(k_new, c.dtype), dv_new = upload_floats(v_new, c.dtype),
               dq = upload_floats(q, c.dtype), dcos = upload_floats(cos, c.dtype), dsin = upload_floats(sin, c.dtype),
               dtable = upload_ints(table), dcached = upload_ints(cached),
               dcu_new = upload_ints(cu_new), dcu_q = upload_ints(cu_q);
  DeviceBuffer dq_rotated(q.size() * flashhop::dtype_size(c.dtype));
  dq_rotated.upload(poisoned_storage(c.dtype, std::int64_t(q.size())));
  using flashhop::make_contiguous;
  flashhop::AppendKvArgs args;
  args.k_cache = make_contiguous(dk_cache.data(), c.dtype, {num_pages, page, heads_kv, d});
  args.v_cache = make_contiguous(dv_cache.data(), c.dtype, {num_pages, page, heads_kv, d});
  args.page_table = make_contiguous(dtable.data(), DType::kInt32, {batch, max_pages});
  args.cache_seqlens = make_contiguous(dcached.data(), DType::kInt32, {batch});
  args.k_new = make_contiguous(dk_new.data(), c.dtype, {total_new, heads_kv, d});
  args.v_new = make_contiguous(dv_new.data(), c.dtype, {total_new, heads_kv, d});
  args.cu_seqlens_new = make_contiguous(dcu_new.data(), DType::kInt32, {batch + 1});
  if (c.rotary) {
    args.rotary_cos = make_contiguous(dcos.data(), c.dtype, {seqlen_ro, rotary_dim / 2});
    args.rotary_sin = make_contiguous(dsin.data(), c.dtype, {seqlen_ro, rotary_dim / 2});
    args.rotary_interleaved = c.interleaved;
    args.q = make_contiguous(dq.data(), c.dtype, {total_q, heads, d});
    args.q_rotated = make_contiguous(dq_rotated.data(), c.dtype, {total_q, heads, d});
    args.cu_seqlens_q = make_contiguous(dcu_q.data(), DType::kInt32, {batch + 1});
    args.q_positions_advance = c.advance;
  }
  const Status status = flashhop::append_kv(args, nullptr);
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> k_after = download_as_floats(dk_cache, c.dtype), v_after = download_as_floats(dv_cache, c.dtype);
  const std::vector<float> q_after = download_as_floats(dq_rotated, c.dtype);

  // x (heads of d) rotated at `position`, in doubles (as it is without rotary tables).
  const auto rotated = [&](const float* x, int position, int element) {
    if (!c.rotary || element >= rotary_dim) return double(x[element]);
    const int half = rotary_dim / 2;
    int j, first, second;
    bool is_first;
    if (c.interleaved) {
      j = element / 2, first = 2 * j, second = first + 1, is_first = element % 2 == 0;
    } else {
      j = element % half, first = j, second = j + half, is_first = element < half;
    }
    const double cs = cos[std::size_t(position) * half + j], sn = sin[std::size_t(position) * half + j];
    return is_first ? x[first] * cs - x[second] * sn : x[first] * sn + x[second] * cs;
  };
  const double tolerance = !c.rotary ? 0.0 : c.dtype == DType::kBFloat16 ? 2e-2 : 2e-3;  // rows copied: exact
  std::vector<float> k_expected = k_cache, v_expected = v_cache;
  std::int64_t rotation_mismatches = 0;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < cu_new[b + 1] - cu_new[b]; ++i) {
      const int key = cached[b] + i, row = cu_new[b] + i;
      if (key >= max_pages * page) continue;  // past the sequence's pages: not written
      const std::int64_t at = (std::int64_t{table[std::size_t(b) * max_pages + key / page]} * page + key % page) * heads_kv * d;
      for (int h = 0; h < heads_kv; ++h) {
        for (int e = 0; e < d; ++e) {
          const double want = rotated(&k_new[(std::size_t(row) * heads_kv + h) * d], key, e);
          const float got = k_after[at + h * d + e];
          rotation_mismatches += std::abs(got - want) > tolerance * (1 + std::abs(want));
          k_expected[at + h * d + e] = got;
          v_expected[at + h * d + e] = v_new[(std::size_t(row) * heads_kv + h) * d + e];
        }
      }
    }
    for (int i = 0; c.rotary && i < cu_q[b + 1] - cu_q[b]; ++i) {
      const int position = cached[b] + (c.advance ? i : 0), row = cu_q[b] + i;
      for (int e = 0; e < heads * d; ++e) {
        const double want = rotated(&q[(std::size_t(row) * heads + e / d) * d], position, e % d);
        rotation_mismatches += std::abs(q_after[std::size_t(row) * heads * d + e] - want) > tolerance * (1 + std::abs(want));
      }
    }
  }
  EXPECT_EQ(rotation_mismatches, 0);
  EXPECT_EQ(k_after, k_expected) << "a key element outside the new rows changed";
  EXPECT_EQ(v_after, v_expected) << "a value element differs from the new row, or outside it changed";
}

INSTANTIATE_TEST_SUITE_P(Grid, AppendKvGpu,
                         ::testing::Values(AppendCase{DType::kBFloat16, true, true, 16}, AppendCase{DType::kBFloat16, false, false, 1},
                                           AppendCase{DType::kFloat16, true, false, 64}, AppendCase{DType::kFloat16, false, true, 256},
                                           AppendCase{DType::kFloat8E4M3, false, false, 16, false},
                                           AppendCase{DType::kFloat8E4M3, false, false, 1, false}),
                         [](const ::testing::TestParamInfo<AppendCase>& info) {
                           const AppendCase& c = info.param;
                           if (!c.rotary) return std::string(dtype_label(c.dtype)) + "_unrotated_page" + std::to_string(c.page_size);
                           return std::string(dtype_label(c.dtype)) + (c.interleaved ? "_interleaved" : "_halves") +
                                  (c.advance ? "_advancing" : "_same") + "_page" + std::to_string(c.page_size);
                         });

}  // namespace
}  // namespace flashhop_test
