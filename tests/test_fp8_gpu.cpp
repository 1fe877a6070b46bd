// The FP8 forward (e4m3 q, k and v with FlashAttention-3's descales, bfloat16 O) on the GPU against
// the double-precision CPU reference on the dequantized inputs (e4m3 value times its (batch, KV
// head)'s descale), within the bounds of P's e4m3 rounding and the e4m3 wgmmas' accumulator
// (fp8_o_tolerance and fp8_lse_tolerance, reference/tolerance.h). Fresh
// random inputs every run, O and LSE poisoned first, odd shapes, GQA, every mask kind and
// soft-capping, every head dim; descales given per (batch, KV head), broadcast (stride 0), or not
// at all, or block scales (one per 128 rows of a head) instead. Skips without a Hopper GPU, and for
// head dims the build left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"
#include "reference/tolerance.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::Status;
using flashhop::StatusCode;

enum class Descales { kPerHead, kBroadcast, kNone, kBlock };

struct Fp8Case {
  const char* mask_name;
  Masking masking;
  Problem problem;
  Descales descales = Descales::kPerHead;
  flashhop::PackGqa pack_gqa = flashhop::PackGqa::kOff;
};

std::string name(const Fp8Case& c) {
  const Problem& p = c.problem;
  const char* descales[] = {"perhead", "broadcast", "nodescale", "blockscale"};
  return std::string("d") + std::to_string(p.head_dim) + (p.dv() != p.head_dim ? "x" + std::to_string(p.dv()) : "") +
         "_" + c.mask_name + "_b" + std::to_string(p.batch) + "_sq" + std::to_string(p.seqlen_q) + "_sk" +
         std::to_string(p.seqlen_k) + "_h" + std::to_string(p.nheads) + "_kv" + std::to_string(p.nheads_kv) + "_" +
         descales[static_cast<int>(c.descales)] + (c.pack_gqa == flashhop::PackGqa::kOn ? "_packgqa" : "");
}
void PrintTo(const Fp8Case& c, std::ostream* out) { *out << name(c); }

// e4m3 values of a standard normal times 16 (so that they use the format's range), and descales
// drawn from [0.02, 0.1]: the dequantized inputs are of order one.
std::vector<float> random_e4m3(std::int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = round_to(DType::kFloat8E4M3, 16.f * normal(rng));
  return values;
}
std::vector<float> random_descales(std::int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(0.02f, 0.1f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = uniform(rng);
  return values;
}

// x (batch, seqlen, heads, dim) times its (batch, KV head)'s descale; `group` heads per KV head.
std::vector<float> dequantized(const std::vector<float>& x, const std::vector<float>& descale, const Problem& p,
                               int seqlen, int heads, int dim, int group) {
  std::vector<float> out;
  const std::size_t batch_elements = std::size_t(seqlen) * heads * dim;
  for (int b = 0; b < p.batch; ++b) {
    const std::vector<float> scaled = scaled_by_kv_head(x.data() + b * batch_elements, seqlen, heads, dim,
                                                        descale.data() + std::size_t(b) * p.nheads_kv, group);
    out.insert(out.end(), scaled.begin(), scaled.end());
  }
  return out;
}

// x (batch, seqlen, heads, dim) times its block scale, scales (batch, heads, blocks of 128 rows).
std::vector<float> block_dequantized(const std::vector<float>& x, const std::vector<float>& scales, int seqlen,
                                     int heads, int dim) {
  const std::size_t blocks = (seqlen + flashhop::kFp8ScaleBlockRows - 1) / flashhop::kFp8ScaleBlockRows;
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t head = i / dim % heads, row = i / dim / heads % seqlen, batch = i / dim / heads / seqlen;
    out[i] = x[i] * scales[(batch * heads + head) * blocks + row / flashhop::kFp8ScaleBlockRows];
  }
  return out;
}

using Fp8ForwardGpu = GpuTestWithParam<Fp8Case>;

TEST_P(Fp8ForwardGpu, MatchesTheReferenceOnDequantizedInputs) {
  const Fp8Case& c = GetParam();
  const Problem& p = c.problem;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "random seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> q = random_e4m3(p.q_elements(), rng), k = random_e4m3(p.k_elements(), rng),
                           v = random_e4m3(p.v_elements(), rng);
  const std::int64_t descale_count = std::int64_t{p.batch} * p.nheads_kv;
  std::vector<float> q_descale = random_descales(descale_count, rng), k_descale = random_descales(descale_count, rng),
                     v_descale = random_descales(descale_count, rng);
  if (c.descales == Descales::kBroadcast) {
    for (std::vector<float>* d : {&q_descale, &k_descale, &v_descale}) std::fill(d->begin(), d->end(), (*d)[0]);
  } else if (c.descales == Descales::kNone) {
    for (std::vector<float>* d : {&q_descale, &k_descale, &v_descale}) std::fill(d->begin(), d->end(), 1.f);
  }

  DeviceTensor tq(DType::kFloat8E4M3, {p.batch, p.seqlen_q, p.nheads, p.head_dim});
  DeviceTensor tk(DType::kFloat8E4M3, {p.batch, p.seqlen_k, p.nheads_kv, p.head_dim});
  DeviceTensor tv(DType::kFloat8E4M3, {p.batch, p.seqlen_k, p.nheads_kv, p.dv()});
  DeviceTensor to(DType::kBFloat16, {p.batch, p.seqlen_q, p.nheads, p.dv()});
  DeviceTensor tlse(DType::kFloat32, {p.batch, p.nheads, p.seqlen_q});
  tq.upload(q);
  tk.upload(k);
  tv.upload(v);
  to.poison();
  tlse.poison();
  // Per head: (batch, nheads_kv) contiguous; broadcast: one value, strides 0.
  const bool broadcast = c.descales == Descales::kBroadcast;
  DeviceTensor tq_descale(DType::kFloat32, {broadcast ? 1 : p.batch, broadcast ? 1 : p.nheads_kv});
  DeviceTensor tk_descale(DType::kFloat32, {broadcast ? 1 : p.batch, broadcast ? 1 : p.nheads_kv});
  DeviceTensor tv_descale(DType::kFloat32, {broadcast ? 1 : p.batch, broadcast ? 1 : p.nheads_kv});
  flashhop::ForwardArgs args;
  args.q = tq.desc;
  args.k = tk.desc;
  args.v = tv.desc;
  args.o = to.desc;
  args.lse = tlse.desc;
  args.causal = c.masking.causal;
  args.window_left = c.masking.window_left;
  args.window_right = c.masking.window_right;
  args.softcap = c.masking.softcap;
  args.pack_gqa = c.pack_gqa;
  if (c.descales != Descales::kNone && c.descales != Descales::kBlock) {
    const std::int64_t values = broadcast ? 1 : descale_count;
    tq_descale.upload(std::vector<float>(q_descale.begin(), q_descale.begin() + values));
    tk_descale.upload(std::vector<float>(k_descale.begin(), k_descale.begin() + values));
    tv_descale.upload(std::vector<float>(v_descale.begin(), v_descale.begin() + values));
    for (auto [arg, tensor] : {std::pair{&args.q_descale, &tq_descale}, std::pair{&args.k_descale, &tk_descale},
                               std::pair{&args.v_descale, &tv_descale}}) {
      TensorDesc d = tensor->desc;
      if (broadcast) {  // a (batch, nheads_kv) view of one value
        d.shape[0] = p.batch;
        d.shape[1] = p.nheads_kv;
        d.stride[0] = d.stride[1] = 0;
      }
      *arg = d;
    }
  }
  // Block scales: (batch, heads, blocks of 128 rows), in place of the descales.
  const auto blocks = [](int rows) { return (rows + flashhop::kFp8ScaleBlockRows - 1) / flashhop::kFp8ScaleBlockRows; };
  const std::vector<float> q_blocks = random_descales(std::int64_t{p.batch} * p.nheads * blocks(p.seqlen_q), rng);
  const std::vector<float> k_blocks = random_descales(std::int64_t{p.batch} * p.nheads_kv * blocks(p.seqlen_k), rng);
  const std::vector<float> v_blocks = random_descales(std::int64_t{p.batch} * p.nheads_kv * blocks(p.seqlen_k), rng);
  DeviceTensor tq_blocks(DType::kFloat32, {p.batch, p.nheads, blocks(p.seqlen_q)});
  DeviceTensor tk_blocks(DType::kFloat32, {p.batch, p.nheads_kv, blocks(p.seqlen_k)});
  DeviceTensor tv_blocks(DType::kFloat32, {p.batch, p.nheads_kv, blocks(p.seqlen_k)});
  if (c.descales == Descales::kBlock) {
    tq_blocks.upload(q_blocks);
    tk_blocks.upload(k_blocks);
    tv_blocks.upload(v_blocks);
    args.q_block_scale = tq_blocks.desc;
    args.k_block_scale = tk_blocks.desc;
    args.v_block_scale = tv_blocks.desc;
  }
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const Status status = with_workspace(args, flashhop::forward_workspace_size, flashhop::forward, stream);
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (status.code == StatusCode::kNotSupported) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<float> o = to.download(), lse = tlse.download();

  const int group = p.nheads / p.nheads_kv;
  const bool block = c.descales == Descales::kBlock;
  const std::vector<float> q_real = block ? block_dequantized(q, q_blocks, p.seqlen_q, p.nheads, p.head_dim)
                                          : dequantized(q, q_descale, p, p.seqlen_q, p.nheads, p.head_dim, group);
  const std::vector<float> k_real = block ? block_dequantized(k, k_blocks, p.seqlen_k, p.nheads_kv, p.head_dim)
                                          : dequantized(k, k_descale, p, p.seqlen_k, p.nheads_kv, p.head_dim, 1);
  const std::vector<float> v_real = block ? block_dequantized(v, v_blocks, p.seqlen_k, p.nheads_kv, p.dv())
                                          : dequantized(v, v_descale, p, p.seqlen_k, p.nheads_kv, p.dv(), 1);
  flashhop::reference::ScoreOptions options;
  options.softmax_scale = 1.0 / std::sqrt(double(p.head_dim));
  options.softcap = c.masking.softcap;
  options.causal = c.masking.causal;
  options.window_left = c.masking.window_left;
  options.window_right = c.masking.window_right;
  std::vector<double> o_ref, lse_ref;
  flashhop::reference::attention_forward(p.shape(), q_real.data(), k_real.data(), v_real.data(), options, &o_ref,
                                         &lse_ref);

  const double score_error = flashhop::reference::fp8_score_error(
      p.head_dim, options.softmax_scale, max_row_norm(q_real.data(), p.q_elements() / p.head_dim, p.head_dim),
      max_row_norm(k_real.data(), p.k_elements() / p.head_dim, p.head_dim));
  const Error o_error = max_error(o, o_ref);
  EXPECT_LE(o_error.max, flashhop::reference::fp8_o_tolerance(score_error, c.masking.softcap, p.seqlen_k,
                                                              max_abs(v_real), max_abs(o_ref)))
      << "O: max error at element " << o_error.at << " (got " << o[o_error.at] << ", reference " << o_ref[o_error.at]
      << ")";
  const Error lse_error = max_error(lse, lse_ref);
  EXPECT_LE(lse_error.max, flashhop::reference::fp8_lse_tolerance(score_error, c.masking.softcap))
      << "LSE: max error at element " << lse_error.at << " (got " << lse[lse_error.at] << ", reference "
      << lse_ref[lse_error.at] << ")";
}

std::vector<Fp8Case> cases() {
  const struct {
    const char* name;
    Masking masking;
  } masks[] = {{"full", {}},
               {"causal", {true}},
               {"window61_17", {false, 61, 17}},
               {"softcap", {false, -1, -1, 1.5f}},
               {"softcap_causal", {true, -1, -1, 1.5f}}};
  // (batch, seqlen_q, seqlen_k, nheads, nheads_kv): a single row, partial tiles, seqlen_q != seqlen_k
  // both ways, GQA 1, 2 and 8, empty sequences.
  const std::vector<Problem> all_shapes = {{1, 1, 1, 1, 1},     {1, 63, 65, 2, 2},   {2, 113, 113, 4, 2},
                                          {1, 255, 1000, 2, 2}, {1, 1000, 255, 8, 1}, {1, 2049, 2049, 2, 2},
                                          {1, 0, 65, 2, 1},     {1, 65, 0, 2, 1}};
  const std::vector<Problem> some_shapes = {{1, 63, 65, 2, 2}, {2, 113, 113, 4, 2}, {1, 1000, 255, 8, 1}};
  std::vector<Fp8Case> all;
  for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
    for (const auto& mask : masks) {
      for (Problem problem : d == 128 ? all_shapes : some_shapes) {
        problem.head_dim = d;
        problem.head_dim_v = dv;
        all.push_back({mask.name, mask.masking, problem});
      }
    }
    Problem problem{2, 300, 500, 8, 2, d, dv};
    all.push_back({"causal", {true}, problem, Descales::kBroadcast});
    all.push_back({"full", {}, problem, Descales::kNone});
    // Block scales: several blocks of queries and keys, a partial last block (head dim 192's key
    // tiles straddle blocks: refused, the case skips).
    if (d != 192) {
      for (const auto& mask : masks) all.push_back({mask.name, mask.masking, problem, Descales::kBlock});
    }
    // Packed GQA rows: decoding (a query per sequence over long keys) and short queries, 4 and 8
    // query heads per KV head.
    for (const Problem& packed : {Problem{4, 1, 1000, 32, 8, d, dv}, Problem{2, 17, 513, 16, 2, d, dv}}) {
      for (const auto& mask : masks) {
        all.push_back({mask.name, mask.masking, packed, Descales::kPerHead, flashhop::PackGqa::kOn});
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, Fp8ForwardGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return name(info.param); });

}  // namespace
}  // namespace flashhop_test
