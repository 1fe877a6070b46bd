// Plain attention, one block of query rows of one head per task, tasks spread over all cores.
// Work per block: scores = scale * Q_block K^T, softmax per row, O_block = P V. A block of rows shares
// each K and V row it reads, so K and V stream through the cache once per block, not once per row.
#include "reference/attention_ref.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace flashhop::reference {
namespace {

// Query rows per task: enough to reuse each K / V row 16 times, small enough that the score
// accumulators stay in registers.
constexpr int kRowBlock = 16;

// Runs tasks 0..count-1 on every core. make_runner() is called once per thread and returns the
// callable that runs one task there, so per-thread scratch memory lives in that callable.
template <typename MakeRunner>
void run_tasks(std::int64_t count, const MakeRunner& make_runner) {
  if (count == 0) return;
  const std::int64_t threads =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::thread::hardware_concurrency()), 1, count);
  std::atomic<std::int64_t> next_task{0};
  auto work = [&] {
    auto run = make_runner();
    for (std::int64_t task = next_task++; task < count; task = next_task++) run(task);
  };
  std::vector<std::thread> helpers;
  for (std::int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
}


// Attention with every sum in `Real`; round_probability(p) is applied to each unnormalised
// probability exp(s - max) before the P V product (but not to the row sum, as in the kernels).
template <typename Real, typename RoundProbability>
void attend(const AttentionShape& s, const float* q, const float* k, const float* v, const ScoreOptions& options,
            RoundProbability round_probability, std::vector<Real>* o, std::vector<Real>* lse) {
  const Real scale = static_cast<Real>(options.softmax_scale);
  const Real softcap = static_cast<Real>(options.softcap);
  if (s.nheads_kv < 1 || s.nheads % s.nheads_kv != 0) {
    throw std::invalid_argument("reference attention: nheads must be a positive multiple of nheads_kv");
  }
  const std::int64_t d = s.head_dim, dv = s.head_dim_v;
  const std::int64_t heads_per_kv_head = s.nheads / s.nheads_kv;
  const std::int64_t row_blocks = (s.seqlen_q + kRowBlock - 1) / kRowBlock;
  o->assign(static_cast<std::size_t>(s.batch) * s.seqlen_q * s.nheads * dv, Real(0));
  lse->assign(static_cast<std::size_t>(s.batch) * s.nheads * s.seqlen_q, -std::numeric_limits<Real>::infinity());

  auto make_runner = [&] {
    std::vector<Real> q_block_t(d * kRowBlock);  // (head_dim, kRowBlock): Q block transposed
    std::vector<Real> probs;                     // (block keys, kRowBlock): scores, then probabilities
    std::vector<Real> o_block(kRowBlock * dv);   // (kRowBlock, head_dim_v): unnormalised O
    return [&, q_block_t, probs, o_block](std::int64_t task) mutable {
      const std::int64_t b = task / (s.nheads * row_blocks);
      const std::int64_t h = task / row_blocks % s.nheads;
      const std::int64_t kv_head = h / heads_per_kv_head;
      const std::int64_t row_begin = task % row_blocks * kRowBlock;
      const std::int64_t rows = std::min<std::int64_t>(kRowBlock, s.seqlen_q - row_begin);
      // Both ends of the visible keys move right row by row, so the block's first and last rows
      // bound the keys it reads: [key_begin, key_begin + block_keys).
      const std::int64_t key_begin = visible_keys(s, options, row_begin).begin;
      const std::int64_t block_keys =
          std::max<std::int64_t>(visible_keys(s, options, row_begin + rows - 1).end - key_begin, 0);

      // Rows past the end of the sequence stay zero and are never written out.
      std::fill(q_block_t.begin(), q_block_t.end(), Real(0));
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* q_row = q + ((b * s.seqlen_q + row_begin + r) * s.nheads + h) * d;
        for (std::int64_t c = 0; c < d; ++c) q_block_t[c * kRowBlock + r] = q_row[c];
      }

      probs.resize(block_keys * kRowBlock);
      for (std::int64_t j = 0; j < block_keys; ++j) {
        const float* k_row = k + ((b * s.seqlen_k + key_begin + j) * s.nheads_kv + kv_head) * d;
        Real dots[kRowBlock] = {};
        for (std::int64_t c = 0; c < d; ++c) {
          const Real k_value = k_row[c];
          for (int r = 0; r < kRowBlock; ++r) dots[r] += q_block_t[c * kRowBlock + r] * k_value;
        }
        for (int r = 0; r < kRowBlock; ++r) {
          const Real score = dots[r] * scale;
          probs[j * kRowBlock + r] = softcap > 0 ? softcap * std::tanh(score / softcap) : score;
        }
      }

      // Softmax per row over its visible keys, max-subtracted; the other keys get probability 0.
      Real row_sums[kRowBlock] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const VisibleKeys visible = visible_keys(s, options, row_begin + r);
        const std::int64_t first = visible.begin - key_begin, last = visible.end - key_begin;
        Real row_max = -std::numeric_limits<Real>::infinity();
        for (std::int64_t j = first; j < last; ++j) row_max = std::max(row_max, probs[j * kRowBlock + r]);
        for (std::int64_t j = 0; j < block_keys; ++j) {
          if (j < first || j >= last) {
            probs[j * kRowBlock + r] = 0;
            continue;
          }
          const Real p = std::exp(probs[j * kRowBlock + r] - row_max);
          row_sums[r] += p;
          probs[j * kRowBlock + r] = round_probability(p);
        }
        if (last > first) (*lse)[(b * s.nheads + h) * s.seqlen_q + row_begin + r] = row_max + std::log(row_sums[r]);
      }

      std::fill(o_block.begin(), o_block.end(), Real(0));
      for (std::int64_t j = 0; j < block_keys; ++j) {
        const float* v_row = v + ((b * s.seqlen_k + key_begin + j) * s.nheads_kv + kv_head) * dv;
        for (std::int64_t r = 0; r < rows; ++r) {
          const Real p = probs[j * kRowBlock + r];
          Real* o_row = &o_block[r * dv];
          for (std::int64_t c = 0; c < dv; ++c) o_row[c] += p * static_cast<Real>(v_row[c]);
        }
      }

      // A row with no visible key keeps O = 0 and LSE = -inf from the initialisation.
      for (std::int64_t r = 0; r < rows; ++r) {
        const VisibleKeys visible = visible_keys(s, options, row_begin + r);
        if (visible.end == visible.begin) continue;
        Real* out = o->data() + ((b * s.seqlen_q + row_begin + r) * s.nheads + h) * dv;
        for (std::int64_t c = 0; c < dv; ++c) out[c] = o_block[r * dv + c] / row_sums[r];
      }
    };
  };
  run_tasks(s.batch * s.nheads * row_blocks, make_runner);
}

// Gradients, one task per (batch, KV head), which owns its rows of dk and dv: for each query row of
// the group's heads, P over the visible keys (from the row's own max and sum), dP = dO V^T,
// D = sum P dP, dS = P (dP - D) times the score's derivative, then dq += dS K, dk += dS^T q,
// dv += P^T dO. round_operand(x) is applied to P and dS where the kernels read them as 16-bit operands.
template <typename Real, typename RoundOperand>
void attend_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* dout,
                     const ScoreOptions& options, RoundOperand round_operand, std::vector<Real>* dq,
                     std::vector<Real>* dk, std::vector<Real>* dv) {
  if (s.nheads_kv < 1 || s.nheads % s.nheads_kv != 0) {
    throw std::invalid_argument("reference attention: nheads must be a positive multiple of nheads_kv");
  }
  const Real scale = static_cast<Real>(options.softmax_scale);
  const Real softcap = static_cast<Real>(options.softcap);
  const std::int64_t d = s.head_dim, dv_dim = s.head_dim_v;
  const std::int64_t group = s.nheads / s.nheads_kv;
  dq->assign(static_cast<std::size_t>(s.batch) * s.seqlen_q * s.nheads * d, Real(0));
  dk->assign(static_cast<std::size_t>(s.batch) * s.seqlen_k * s.nheads_kv * d, Real(0));
  dv->assign(static_cast<std::size_t>(s.batch) * s.seqlen_k * s.nheads_kv * dv_dim, Real(0));

  auto make_runner = [&] {
    std::vector<Real> probs, dprobs, derivative;
    return [&, probs, dprobs, derivative](std::int64_t task) mutable {
      const std::int64_t b = task / s.nheads_kv, kv_head = task % s.nheads_kv;
      auto k_row = [&](std::int64_t j) { return k + ((b * s.seqlen_k + j) * s.nheads_kv + kv_head) * d; };
      auto v_row = [&](std::int64_t j) { return v + ((b * s.seqlen_k + j) * s.nheads_kv + kv_head) * dv_dim; };
      for (std::int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
        for (std::int64_t i = 0; i < s.seqlen_q; ++i) {
          const VisibleKeys visible = visible_keys(s, options, i);
          const std::int64_t count = visible.end - visible.begin;
          if (count == 0) continue;
          const float* q_row = q + ((b * s.seqlen_q + i) * s.nheads + h) * d;
          const float* do_row = dout + ((b * s.seqlen_q + i) * s.nheads + h) * dv_dim;
          probs.assign(count, Real(0));
          dprobs.assign(count, Real(0));
          derivative.assign(count, Real(1));
          Real row_max = -std::numeric_limits<Real>::infinity();
          for (std::int64_t j = 0; j < count; ++j) {
            const float* key = k_row(visible.begin + j);
            Real dot = 0;
            for (std::int64_t c = 0; c < d; ++c) dot += static_cast<Real>(q_row[c]) * key[c];
            Real score = dot * scale;
            if (softcap > 0) {
              const Real t = std::tanh(score / softcap);
              score = softcap * t;
              derivative[j] = 1 - t * t;
            }
            probs[j] = score;
            row_max = std::max(row_max, score);
          }
          Real sum = 0;
          for (std::int64_t j = 0; j < count; ++j) sum += probs[j] = std::exp(probs[j] - row_max);
          Real delta = 0;
          for (std::int64_t j = 0; j < count; ++j) {
            probs[j] /= sum;
            const float* value = v_row(visible.begin + j);
            Real dot = 0;
            for (std::int64_t c = 0; c < dv_dim; ++c) dot += static_cast<Real>(do_row[c]) * value[c];
            dprobs[j] = dot;
            delta += probs[j] * dot;
          }
          Real* dq_row = dq->data() + ((b * s.seqlen_q + i) * s.nheads + h) * d;
          for (std::int64_t j = 0; j < count; ++j) {
            const std::int64_t key = visible.begin + j;
            const Real p = round_operand(probs[j]);
            const Real ds = round_operand(probs[j] * (dprobs[j] - delta) * derivative[j]) * scale;
            const float* key_values = k_row(key);
            Real* dk_row = dk->data() + ((b * s.seqlen_k + key) * s.nheads_kv + kv_head) * d;
            Real* dv_row = dv->data() + ((b * s.seqlen_k + key) * s.nheads_kv + kv_head) * dv_dim;
            for (std::int64_t c = 0; c < d; ++c) {
              dq_row[c] += ds * key_values[c];
              dk_row[c] += ds * q_row[c];
            }
            for (std::int64_t c = 0; c < dv_dim; ++c) dv_row[c] += p * do_row[c];
          }
        }
      }
    };
  };
  run_tasks(std::int64_t{s.batch} * s.nheads_kv, make_runner);
}

float round_to_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
float round_to_fp16(float x) { return __half2float(__float2half_rn(x)); }
float round_to_e4m3(float x) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), __NV_E4M3)));
}
float keep_float(float x) { return x; }

}  // namespace

VisibleKeys visible_keys(const AttentionShape& s, const ScoreOptions& options, std::int64_t row) {
  const std::int64_t diagonal = row + s.seqlen_k - s.seqlen_q;
  const int right = options.causal ? 0 : options.window_right;
  std::int64_t begin = options.window_left < 0 ? 0 : diagonal - options.window_left;
  std::int64_t end = right < 0 ? s.seqlen_k : diagonal + right + 1;
  begin = std::clamp<std::int64_t>(begin, 0, s.seqlen_k);
  end = std::clamp<std::int64_t>(end, 0, s.seqlen_k);
  return {begin, std::max(begin, end)};
}

void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       const ScoreOptions& options, std::vector<double>* o, std::vector<double>* lse) {
  attend<double>(shape, q, k, v, options, [](double p) { return p; }, o, lse);
}

void attention_forward_low_precision(const AttentionShape& shape, const float* q, const float* k,
                                     const float* v, const ScoreOptions& options, DType dtype,
                                     std::vector<float>* o, std::vector<float>* lse) {
  float (*round_to_dtype)(float) = keep_float;
  if (dtype == DType::kBFloat16) round_to_dtype = round_to_bf16;
  if (dtype == DType::kFloat16) round_to_dtype = round_to_fp16;
  // FP8: P is e4m3 in P V, O bfloat16.
  attend<float>(shape, q, k, v, options, dtype == DType::kFloat8E4M3 ? round_to_e4m3 : round_to_dtype, o, lse);
  if (dtype == DType::kFloat8E4M3) round_to_dtype = round_to_bf16;
  for (float& value : *o) value = round_to_dtype(value);
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* dout, const ScoreOptions& options, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv) {
  attend_backward<double>(shape, q, k, v, dout, options, [](double x) { return x; }, dq, dk, dv);
}

void attention_backward_low_precision(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                      const float* dout, const ScoreOptions& options, DType dtype,
                                      std::vector<float>* dq, std::vector<float>* dk, std::vector<float>* dv) {
  float (*round_to_dtype)(float) = keep_float;
  if (dtype == DType::kBFloat16) round_to_dtype = round_to_bf16;
  if (dtype == DType::kFloat16) round_to_dtype = round_to_fp16;
  attend_backward<float>(shape, q, k, v, dout, options, round_to_dtype, dq, dk, dv);
  for (std::vector<float>* gradient : {dq, dk, dv}) {
    for (float& value : *gradient) value = round_to_dtype(value);
  }
}

}  // namespace flashhop::reference
