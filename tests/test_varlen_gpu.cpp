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
// O and LSE are poisoned (NaN) before the call: every used row must be written, every other row
// left as it was. Skipped without a Hopper GPU and for kernels the build left out.
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

// What the per-sequence check needs of a case.
struct Config {
  DType dtype;
  int head_dim, head_dim_v;
  int nheads, nheads_kv;
  Masking masking;
};

struct VarlenCase {
  std::string name;
  DType dtype;
  int head_dim, head_dim_v;
  int nheads, nheads_kv;
  Masking masking;
  std::vector<Sequence> sequences;
  int slack = 0;  // > 0: seqused given, each slot this many rows longer than its used rows

  Config config() const { return {dtype, head_dim, head_dim_v, nheads, nheads_kv, masking}; }
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
  flashhop::reference::attention_forward_low_precision(shape, qb, kb, vb, options, c.dtype, &o_low, &lse_low);
  double o_error = 0, o_baseline = 0, max_o = 0, max_v = 0, lse_error = 0, lse_baseline = 0;
  std::int64_t infinity_mismatches = 0, nan = 0;
  for (std::size_t i = 0; i < o_ref.size(); ++i) {
    const float got = o[std::size_t(q_row) * c.nheads * c.head_dim_v + i];
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
      const float got = lse[std::size_t(h) * total_q + q_row + i];
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

// O (total_q, nheads, dv) and LSE (nheads, total_q) of a call on the device, poisoned (NaN) first so
// that every value the call writes shows; bind() describes them in the call's arguments.
struct PoisonedOutputs {
  DType dtype;
  int total_q, nheads, head_dim_v;
  DeviceBuffer o, lse;

  PoisonedOutputs(const Config& c, int total_q)
      : dtype(c.dtype), total_q(total_q), nheads(c.nheads), head_dim_v(c.head_dim_v),
        o(std::size_t(total_q) * c.nheads * c.head_dim_v * flashhop::dtype_size(c.dtype)),
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

// forward with the case's mask options, on a stream of its own, with a workspace of the size asked.
Status run_forward(flashhop::ForwardArgs& args, const Masking& masking) {
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
  const Status status = run_forward(args, c.masking);
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = outputs.o_values();
  const std::vector<float> lse = outputs.lse_values();

  std::int64_t untouched_violations = 0;
  for (int b = 0; b < batch; ++b) {
    const int sq = used_q[b], sk = used_k[b];
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << sk << " keys)");
    if (sq > 0) {
      expect_sequence_matches(c.config(), q.row(cu_q[b]), k.row(cu_k[b]), v.row(cu_k[b]), sq, sk, o, lse, cu_q[b],
                              total_q);
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
  const Status status = run_forward(args, c.masking);
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = outputs.o_values();
  const std::vector<float> lse = outputs.lse_values();
  for (int b = 0; b < batch; ++b) {
    const int sq = cu_q[b + 1] - cu_q[b];
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << keys[b] << " keys)");
    if (sq > 0) {
      expect_sequence_matches(c, q.row(cu_q[b]), k_of[b].values.data(), v_of[b].values.data(), sq, keys[b], o, lse,
                              cu_q[b], total_q);
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
  const auto add = [&](DType dtype, int d, int dv, int page, int nheads, int nheads_kv, const auto& mask, bool decoding) {
    const std::string name = std::string(dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" + std::to_string(d) +
                             (dv != d ? "x" + std::to_string(dv) : "") + "_page" + std::to_string(page) + "_" +
                             mask.name + "_h" + std::to_string(nheads) + "_kv" + std::to_string(nheads_kv) +
                             (decoding ? "_decode" : "_prefill");
    all.push_back({name, {dtype, d, dv, nheads, nheads_kv, mask.masking}, page, decoding ? decode : prefill});
  };
  // d = 128 at every page size, mask and GQA ratio (1, 4 and 8 query heads per KV head).
  for (int page : {1, 3, 16, 64, 256}) {
    for (const auto& mask : masks) {
      for (auto [nheads, nheads_kv] : {std::pair{8, 8}, {8, 2}, {8, 1}}) add(DType::kBFloat16, 128, 128, page, nheads, nheads_kv, mask, true);
      add(DType::kBFloat16, 128, 128, page, 4, 2, mask, false);
    }
  }
  // Every head dim and fp16 at pages of 16, and of 2 and 1 (odd pages are not supported at d = 96).
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {192, 192}, {192, 128}, {256, 256}}) {
      for (int page : {2, 16}) {
        add(dtype, d, dv, page, 4, 1, masks[1], true);
        add(dtype, d, dv, page, 2, 2, masks[0], false);
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, PagedGpu, ::testing::ValuesIn(paged_cases()),
                         [](const ::testing::TestParamInfo<PagedCase>& info) { return info.param.name; });

}  // namespace
}  // namespace flashhop_test
