// The backward pass on the GPU against the CPU reference in double precision: fresh random inputs,
// O and LSE from flashhop's forward, dq, dk and dv poisoned (NaN) before the call, over odd shapes,
// GQA ratios, every mask kind and soft-capping; the kernels' error may be twice the error of the same
// computation at the kernels' precision (attention_backward_low_precision) plus the final rounding.
// Variable-length batches (VarlenBackwardGpu) compare each sequence with the reference of that
// sequence alone. Skipped without a Hopper GPU, and for configurations the build did not compile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
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

struct NamedOptions {
  const char* name;
  Masking masking;
};

const NamedOptions kFull{"full", {}};
const NamedOptions kCausal{"causal", {true}};
const NamedOptions kWindow{"window61_17", {false, 61, 17}};
const NamedOptions kCausalWindow{"causal_window100", {true, 100, 0}};
const NamedOptions kSoftcap{"softcap", {false, -1, -1, 1.5f}};
const NamedOptions kSoftcapCausal{"softcap_causal", {true, -1, -1, 1.5f}};

struct BackwardCase {
  DType dtype;
  NamedOptions options;
  Problem problem;
  bool deterministic = false;
};

std::string name(const BackwardCase& c) {
  const Problem& p = c.problem;
  return std::string(c.dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" + std::to_string(p.head_dim) +
         (p.dv() != p.head_dim ? "x" + std::to_string(p.dv()) : "") + "_" +
         c.options.name + "_b" + std::to_string(p.batch) + "_sq" + std::to_string(p.seqlen_q) + "_sk" +
         std::to_string(p.seqlen_k) + "_h" + std::to_string(p.nheads) + "_kv" + std::to_string(p.nheads_kv) +
         (c.deterministic ? "_deterministic" : "");
}
void PrintTo(const BackwardCase& c, std::ostream* out) { *out << name(c); }

struct Inputs {
  std::vector<float> q, k, v, dout;
};

// Standard normal inputs of `p`'s shapes, rounded to `dtype`.
Inputs random_inputs(const Problem& p, DType dtype, std::mt19937& rng) {
  Inputs in;
  in.q = random_normal(p.q_elements(), dtype, rng);
  in.k = random_normal(p.k_elements(), dtype, rng);
  in.v = random_normal(p.v_elements(), dtype, rng);
  in.dout = random_normal(p.o_elements(), dtype, rng);
  return in;
}

struct Gradients {
  std::vector<float> dq, dk, dv;
};

// Forward then backward on the GPU; the gradients.
std::optional<Gradients> run_backward(const BackwardCase& c, const Inputs& in, Status* failure) {
  const Problem& p = c.problem;
  DeviceTensor tq(c.dtype, {p.batch, p.seqlen_q, p.nheads, p.head_dim});
  DeviceTensor tk(c.dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.head_dim});
  DeviceTensor tv(c.dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.dv()});
  DeviceTensor to(c.dtype, {p.batch, p.seqlen_q, p.nheads, p.dv()});
  DeviceTensor tdo(c.dtype, {p.batch, p.seqlen_q, p.nheads, p.dv()});
  DeviceTensor tlse(DType::kFloat32, {p.batch, p.nheads, p.seqlen_q});
  DeviceTensor tdq(c.dtype, {p.batch, p.seqlen_q, p.nheads, p.head_dim});
  DeviceTensor tdk(c.dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.head_dim});
  DeviceTensor tdv(c.dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.dv()});
  tq.upload(in.q);
  tk.upload(in.k);
  tv.upload(in.v);
  tdo.upload(in.dout);
  for (DeviceTensor* t : {&to, &tlse, &tdq, &tdk, &tdv}) t->poison();

  const Masking& m = c.options.masking;
  flashhop::ForwardArgs forward;
  forward.q = tq.desc;
  forward.k = tk.desc;
  forward.v = tv.desc;
  forward.o = to.desc;
  forward.lse = tlse.desc;
  forward.causal = m.causal;
  forward.window_left = m.window_left;
  forward.window_right = m.window_right;
  forward.softcap = m.softcap;
  flashhop::BackwardArgs backward = backward_args_of(forward, tdo.desc, tdq.desc, tdk.desc, tdv.desc);
  backward.deterministic = c.deterministic;

  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Status status = with_workspace(forward, flashhop::forward_workspace_size, flashhop::forward, stream);
  if (status.ok()) status = with_workspace(backward, flashhop::backward_workspace_size, flashhop::backward, stream);
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (!status.ok()) {
    *failure = status;
    return std::nullopt;
  }
  return Gradients{tdq.download(), tdk.download(), tdv.download()};
}

using BackwardGpu = GpuTestWithParam<BackwardCase>;

TEST_P(BackwardGpu, MatchesReference) {
  const BackwardCase& c = GetParam();
  const Problem& p = c.problem;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const Inputs in = random_inputs(p, c.dtype, rng);

  Status failure;
  const std::optional<Gradients> got = run_backward(c, in, &failure);
  if (failure.code == StatusCode::kNotSupported) GTEST_SKIP() << failure.message;
  ASSERT_TRUE(got.has_value()) << failure.message;

  flashhop::reference::ScoreOptions options;
  options.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
  options.softcap = c.options.masking.softcap;
  options.causal = c.options.masking.causal;
  options.window_left = c.options.masking.window_left;
  options.window_right = c.options.masking.window_right;
  std::vector<double> dq_ref, dk_ref, dv_ref;
  flashhop::reference::attention_backward(p.shape(), in.q.data(), in.k.data(), in.v.data(), in.dout.data(), options,
                                          &dq_ref, &dk_ref, &dv_ref);
  std::vector<float> dq_low, dk_low, dv_low;
  flashhop::reference::attention_backward_low_precision(p.shape(), in.q.data(), in.k.data(), in.v.data(),
                                                        in.dout.data(), options, c.dtype, &dq_low, &dk_low, &dv_low);

  const double unit = c.dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const struct {
    const char* name;
    const std::vector<float>& got;
    const std::vector<float>& low;
    const std::vector<double>& ref;
    int rows, heads, cols;  // of each batch entry, (rows, heads, cols) row-major
  } gradients[] = {{"dq", got->dq, dq_low, dq_ref, p.seqlen_q, p.nheads, p.head_dim},
                   {"dk", got->dk, dk_low, dk_ref, p.seqlen_k, p.nheads_kv, p.head_dim},
                   {"dv", got->dv, dv_low, dv_ref, p.seqlen_k, p.nheads_kv, p.dv()}};
  for (const auto& g : gradients) {
    const Error error = max_error(g.got, g.ref);
    const double baseline = max_error(g.low, g.ref).max;
    // FlashAttention's rule, plus the final rounding at the largest gradient's size; soft-capping's
    // tanh.approx moves each score by up to softcap * 2^-11.
    const double tolerance = 2 * baseline + unit * std::max(1.0, max_abs(g.ref)) +
                             flashhop::reference::softcap_score_error(c.options.masking.softcap) * max_abs(g.ref);
    const std::size_t at = error.at, col = at % g.cols, head = at / g.cols % g.heads,
                      row = at / g.cols / g.heads % g.rows, batch = at / g.cols / g.heads / g.rows;
    EXPECT_LE(error.max, tolerance) << g.name << ": max error at (batch " << batch << ", row " << row << ", head "
                                    << head << ", col " << col << "): got " << g.got[at] << ", reference "
                                    << g.ref[at] << "; " << error.nan << " NaN of " << g.got.size()
                                    << "; low-precision baseline error " << baseline;
  }
}

TEST_P(BackwardGpu, DeterministicCallsAreBitwiseIdentical) {
  const BackwardCase& c = GetParam();
  if (!c.deterministic) GTEST_SKIP() << "only for deterministic cases";
  std::mt19937 rng(7);
  const Inputs in = random_inputs(c.problem, c.dtype, rng);
  Status failure;
  const std::optional<Gradients> first = run_backward(c, in, &failure);
  if (failure.code == StatusCode::kNotSupported) GTEST_SKIP() << failure.message;
  ASSERT_TRUE(first.has_value()) << failure.message;
  for (int repeat = 1; repeat < 100; ++repeat) {  // 100 calls in all
    const std::optional<Gradients> again = run_backward(c, in, &failure);
    ASSERT_TRUE(again.has_value()) << failure.message;
    EXPECT_TRUE(again->dq == first->dq && again->dk == first->dk && again->dv == first->dv) << "repeat " << repeat;
  }
}

std::vector<BackwardCase> cases() {
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv): single rows, partial tiles, seqlen_q != seqlen_k
  // both ways, GQA ratios 1, 2, 8, and empty sequences.
  const std::vector<Problem> shapes = {
      {1, 1, 1, 1, 1},      {1, 63, 65, 2, 2},     {2, 113, 113, 4, 2}, {1, 128, 128, 2, 1}, {1, 255, 1000, 2, 2},
      {1, 1000, 255, 8, 1}, {1, 2049, 2049, 2, 2}, {1, 0, 65, 2, 1},    {1, 65, 0, 2, 1},    {2, 300, 300, 16, 2},
  };
  std::vector<BackwardCase> all;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
      for (const NamedOptions& options : {kFull, kCausal, kWindow, kCausalWindow, kSoftcap, kSoftcapCausal}) {
        if (dtype == DType::kFloat16 && options.masking.window_left >= 0) continue;  // bf16 covers the windows
        for (Problem problem : shapes) {
          problem.head_dim = d;
          problem.head_dim_v = dv;
          all.push_back({dtype, options, problem});
        }
      }
      Problem problem{2, 300, 500, 8, 2, d, dv};
      all.push_back({dtype, kCausal, problem, /*deterministic=*/true});
      all.push_back({dtype, kFull, problem, /*deterministic=*/true});
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, BackwardGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BackwardCase>& info) { return name(info.param); });

// ---- variable-length batches: each sequence against the reference of that sequence alone ----

// One sequence's slot in the packed tensors and its used rows (seqused, where the case gives them).
struct Slot {
  int queries, keys;
  int used_q, used_k;
};

struct VarlenBackwardCase {
  DType dtype;
  NamedOptions options;
  int head_dim, head_dim_v, nheads, nheads_kv;
  const char* lengths;  // names `slots`
  std::vector<Slot> slots;
  bool seqused = false;
  bool deterministic = false;
};

std::string name(const VarlenBackwardCase& c) {
  return std::string(c.dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" + std::to_string(c.head_dim) +
         (c.head_dim_v != c.head_dim ? "x" + std::to_string(c.head_dim_v) : "") + "_" + c.options.name + "_" +
         c.lengths + "_h" + std::to_string(c.nheads) + "_kv" + std::to_string(c.nheads_kv) +
         (c.seqused ? "_seqused" : "") + (c.deterministic ? "_deterministic" : "");
}
void PrintTo(const VarlenBackwardCase& c, std::ostream* out) { *out << name(c); }

struct VarlenRun {
  Gradients got;
  std::vector<int> cu_q, cu_k;
  int total_q = 0, total_k = 0;
};

// The packed inputs' forward then backward on the GPU, dq, dk and dv poisoned before the call.
std::optional<VarlenRun> run_varlen_backward(const VarlenBackwardCase& c, const Inputs& in, Status* failure) {
  VarlenRun run;
  run.cu_q = {0};
  run.cu_k = {0};
  std::vector<int> used_q, used_k;
  int max_q = 1, max_k = 1;
  for (const Slot& s : c.slots) {
    run.cu_q.push_back(run.cu_q.back() + s.queries);
    run.cu_k.push_back(run.cu_k.back() + s.keys);
    used_q.push_back(s.used_q);
    used_k.push_back(s.used_k);
    max_q = std::max(max_q, s.queries);
    max_k = std::max(max_k, s.keys);
  }
  const int batch = static_cast<int>(c.slots.size());
  run.total_q = run.cu_q.back();
  run.total_k = run.cu_k.back();
  const int tq_rows = run.total_q, tk_rows = run.total_k;
  DeviceTensor tq(c.dtype, {tq_rows, c.nheads, c.head_dim});
  DeviceTensor tk(c.dtype, {tk_rows, c.nheads_kv, c.head_dim});
  DeviceTensor tv(c.dtype, {tk_rows, c.nheads_kv, c.head_dim_v});
  DeviceTensor to(c.dtype, {tq_rows, c.nheads, c.head_dim_v});
  DeviceTensor tdo(c.dtype, {tq_rows, c.nheads, c.head_dim_v});
  DeviceTensor tlse(DType::kFloat32, {c.nheads, tq_rows});
  DeviceTensor tdq(c.dtype, {tq_rows, c.nheads, c.head_dim});
  DeviceTensor tdk(c.dtype, {tk_rows, c.nheads_kv, c.head_dim});
  DeviceTensor tdv(c.dtype, {tk_rows, c.nheads_kv, c.head_dim_v});
  tq.upload(in.q);
  tk.upload(in.k);
  tv.upload(in.v);
  tdo.upload(in.dout);
  for (DeviceTensor* t : {&to, &tlse, &tdq, &tdk, &tdv}) t->poison();
  DeviceBuffer dcu_q = upload_ints(run.cu_q), dcu_k = upload_ints(run.cu_k), dused_q = upload_ints(used_q),
               dused_k = upload_ints(used_k);

  const Masking& m = c.options.masking;
  flashhop::ForwardArgs forward;
  forward.q = tq.desc;
  forward.k = tk.desc;
  forward.v = tv.desc;
  forward.o = to.desc;
  forward.lse = tlse.desc;
  forward.causal = m.causal;
  forward.window_left = m.window_left;
  forward.window_right = m.window_right;
  forward.softcap = m.softcap;
  forward.cu_seqlens_q = flashhop::make_contiguous(dcu_q.data(), DType::kInt32, {batch + 1});
  forward.cu_seqlens_k = flashhop::make_contiguous(dcu_k.data(), DType::kInt32, {batch + 1});
  if (c.seqused) {
    forward.seqused_q = flashhop::make_contiguous(dused_q.data(), DType::kInt32, {batch});
    forward.seqused_k = flashhop::make_contiguous(dused_k.data(), DType::kInt32, {batch});
  }
  forward.max_seqlen_q = max_q;
  forward.max_seqlen_k = max_k;
  flashhop::BackwardArgs backward = backward_args_of(forward, tdo.desc, tdq.desc, tdk.desc, tdv.desc);
  backward.cu_seqlens_q = forward.cu_seqlens_q;
  backward.cu_seqlens_k = forward.cu_seqlens_k;
  backward.seqused_q = forward.seqused_q;
  backward.seqused_k = forward.seqused_k;
  backward.max_seqlen_q = max_q;
  backward.max_seqlen_k = max_k;
  backward.deterministic = c.deterministic;

  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Status status = with_workspace(forward, flashhop::forward_workspace_size, flashhop::forward, stream);
  if (status.ok()) status = with_workspace(backward, flashhop::backward_workspace_size, flashhop::backward, stream);
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (!status.ok()) {
    *failure = status;
    return std::nullopt;
  }
  run.got = Gradients{tdq.download(), tdk.download(), tdv.download()};
  return run;
}

int total_rows(const std::vector<Slot>& slots, int Slot::*rows) {
  int total = 0;
  for (const Slot& s : slots) total += s.*rows;
  return total;
}

using VarlenBackwardGpu = GpuTestWithParam<VarlenBackwardCase>;

// Each sequence's used rows of dq, dk and dv against the reference of that sequence alone (the
// fixed-length test's tolerance); the rows outside them left as they were (poisoned: NaN).
TEST_P(VarlenBackwardGpu, EachSequenceMatchesTheReference) {
  const VarlenBackwardCase& c = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const Problem packed{1, total_rows(c.slots, &Slot::queries), total_rows(c.slots, &Slot::keys), c.nheads,
                       c.nheads_kv, c.head_dim, c.head_dim_v};
  const Inputs in = random_inputs(packed, c.dtype, rng);
  Status failure;
  const std::optional<VarlenRun> run = run_varlen_backward(c, in, &failure);
  if (failure.code == StatusCode::kNotSupported) GTEST_SKIP() << failure.message;
  ASSERT_TRUE(run.has_value()) << failure.message;

  flashhop::reference::ScoreOptions options;
  options.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  options.softcap = c.options.masking.softcap;
  options.causal = c.options.masking.causal;
  options.window_left = c.options.masking.window_left;
  options.window_right = c.options.masking.window_right;
  const double unit = c.dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const std::int64_t q_row = std::int64_t{c.nheads} * c.head_dim, k_row = std::int64_t{c.nheads_kv} * c.head_dim,
                     v_row = std::int64_t{c.nheads_kv} * c.head_dim_v, o_row = std::int64_t{c.nheads} * c.head_dim_v;
  std::vector<bool> used_q(static_cast<std::size_t>(run->total_q)), used_k(static_cast<std::size_t>(run->total_k));
  for (std::size_t b = 0; b < c.slots.size(); ++b) {
    const int sq = c.seqused ? c.slots[b].used_q : c.slots[b].queries;
    const int sk = c.seqused ? c.slots[b].used_k : c.slots[b].keys;
    const int q0 = run->cu_q[b], k0 = run->cu_k[b];
    std::fill_n(used_q.begin() + q0, sq, true);
    std::fill_n(used_k.begin() + k0, sk, true);
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " (" << sq << " queries, " << sk << " keys)");
    const Problem p{1, sq, sk, c.nheads, c.nheads_kv, c.head_dim, c.head_dim_v};
    const auto rows = [](const std::vector<float>& all, int first, int count, std::int64_t row) {
      return std::vector<float>(all.begin() + first * row, all.begin() + (first + count) * row);
    };
    const std::vector<float> q = rows(in.q, q0, sq, q_row), k = rows(in.k, k0, sk, k_row),
                             v = rows(in.v, k0, sk, v_row), dout = rows(in.dout, q0, sq, o_row);
    std::vector<double> dq_ref, dk_ref, dv_ref;
    flashhop::reference::attention_backward(p.shape(), q.data(), k.data(), v.data(), dout.data(), options, &dq_ref,
                                            &dk_ref, &dv_ref);
    std::vector<float> dq_low, dk_low, dv_low;
    flashhop::reference::attention_backward_low_precision(p.shape(), q.data(), k.data(), v.data(), dout.data(),
                                                          options, c.dtype, &dq_low, &dk_low, &dv_low);
    const struct {
      const char* name;
      std::vector<float> got;
      const std::vector<float>& low;
      const std::vector<double>& ref;
    } gradients[] = {{"dq", rows(run->got.dq, q0, sq, q_row), dq_low, dq_ref},
                     {"dk", rows(run->got.dk, k0, sk, k_row), dk_low, dk_ref},
                     {"dv", rows(run->got.dv, k0, sk, v_row), dv_low, dv_ref}};
    for (const auto& g : gradients) {
      const Error error = max_error(g.got, g.ref);
      const double baseline = max_error(g.low, g.ref).max;
      const double tolerance = 2 * baseline + unit * std::max(1.0, max_abs(g.ref)) +
                               flashhop::reference::softcap_score_error(c.options.masking.softcap) * max_abs(g.ref);
      EXPECT_LE(error.max, tolerance) << g.name << ": max error at element " << error.at << ": got "
                                      << g.got[error.at] << ", reference " << g.ref[error.at] << "; " << error.nan
                                      << " NaN; low-precision baseline error " << baseline;
    }
  }
  // Rows outside every sequence's used rows keep the poison.
  const auto count_written = [](const std::vector<float>& values, const std::vector<bool>& used, std::int64_t row) {
    std::int64_t written = 0;
    for (std::size_t i = 0; i < values.size(); ++i) written += !used[i / row] && !std::isnan(values[i]);
    return written;
  };
  EXPECT_EQ(count_written(run->got.dq, used_q, q_row), 0) << "dq written outside the sequences' used rows";
  EXPECT_EQ(count_written(run->got.dk, used_k, k_row), 0) << "dk written outside the sequences' used rows";
  EXPECT_EQ(count_written(run->got.dv, used_k, v_row), 0) << "dv written outside the sequences' used rows";
}

TEST_P(VarlenBackwardGpu, DeterministicCallsAreBitwiseIdentical) {
  const VarlenBackwardCase& c = GetParam();
  if (!c.deterministic) GTEST_SKIP() << "only for deterministic cases";
  std::mt19937 rng(7);
  const Problem packed{1, total_rows(c.slots, &Slot::queries), total_rows(c.slots, &Slot::keys), c.nheads,
                       c.nheads_kv, c.head_dim, c.head_dim_v};
  const Inputs in = random_inputs(packed, c.dtype, rng);
  Status failure;
  const std::optional<VarlenRun> first = run_varlen_backward(c, in, &failure);
  if (failure.code == StatusCode::kNotSupported) GTEST_SKIP() << failure.message;
  ASSERT_TRUE(first.has_value()) << failure.message;
  // Bitwise, NaN poison included: compare the bytes' images as floats' bit patterns.
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (int repeat = 1; repeat < 100; ++repeat) {
    const std::optional<VarlenRun> again = run_varlen_backward(c, in, &failure);
    ASSERT_TRUE(again.has_value()) << failure.message;
    EXPECT_TRUE(same(again->got.dq, first->got.dq) && same(again->got.dk, first->got.dk) &&
                same(again->got.dv, first->got.dv))
        << "repeat " << repeat;
  }
}

std::vector<VarlenBackwardCase> varlen_cases() {
  // Slots of lengths 0, 1, 17, 128 and longer, queries and keys of different lengths, a sequence
  // without keys; with seqused, slots longer than their used rows (and one with no used queries).
  const std::vector<Slot> mixed = {{0, 5, 0, 5},      {1, 1, 1, 1},     {17, 17, 17, 17}, {128, 200, 128, 200},
                                   {300, 600, 300, 600}, {65, 0, 65, 0}, {200, 260, 200, 260}};
  const std::vector<Slot> used = {{40, 90, 33, 90}, {7, 300, 7, 150}, {130, 130, 0, 1}, {64, 64, 64, 0},
                                  {257, 513, 250, 500}};
  std::vector<VarlenBackwardCase> all;
  for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
    for (const NamedOptions& options : {kFull, kCausal, kWindow, kSoftcapCausal}) {
      all.push_back({DType::kBFloat16, options, d, dv, 4, 2, "mixed", mixed});
    }
    all.push_back({DType::kFloat16, kCausal, d, dv, 4, 2, "mixed", mixed});
    all.push_back({DType::kBFloat16, kCausal, d, dv, 12, 3, "used", used, /*seqused=*/true});
    all.push_back({DType::kBFloat16, kCausalWindow, d, dv, 8, 1, "used", used, /*seqused=*/true,
                   /*deterministic=*/true});
    all.push_back({DType::kBFloat16, kFull, d, dv, 4, 4, "mixed", mixed, /*seqused=*/false, /*deterministic=*/true});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, VarlenBackwardGpu, ::testing::ValuesIn(varlen_cases()),
                         [](const ::testing::TestParamInfo<VarlenBackwardCase>& info) {
                           return name(info.param);
                         });

}  // namespace
}  // namespace flashhop_test
