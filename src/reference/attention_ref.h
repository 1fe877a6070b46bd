// CPU reference attention in double precision, with flashhop's conventions (GQA, bottom-right
// causal and sliding-window masks, soft-capping, LSE in natural log, fully masked rows give O = 0
// and LSE = -inf). For tests and
// flashhop-bench --check; deliberately the plain formula, not the tiled algorithm.
#pragma once

#include <cstdint>
#include <vector>

#include "flashhop/flashhop.h"

namespace flashhop::reference {

struct AttentionShape {
  int batch = 1, seqlen_q = 0, seqlen_k = 0, nheads = 1, nheads_kv = 1;
  int head_dim = 0, head_dim_v = 0;
};

// What happens to the scores, as in flashhop::ForwardArgs: s = softmax_scale q.k, then
// softcap * tanh(s / softcap) when softcap > 0; query i sees keys j with
// i + offset - window_left <= j <= i + offset + window_right (offset = seqlen_k - seqlen_q, -1 =
// unbounded; causal bounds the right side at 0).
struct ScoreOptions {
  double softmax_scale = 1.0;
  double softcap = 0.0;
  bool causal = false;
  int window_left = -1, window_right = -1;
};

// Keys [begin, end) that query row `row` sees under `options`, clipped to [0, seqlen_k) (begin ==
// end when none). Both ends are non-decreasing in `row`.
struct VisibleKeys {
  std::int64_t begin, end;
};
VisibleKeys visible_keys(const AttentionShape& shape, const ScoreOptions& options, std::int64_t row);

// Inputs are contiguous: q (batch, seqlen_q, nheads, head_dim), k (batch, seqlen_k, nheads_kv,
// head_dim), v (batch, seqlen_k, nheads_kv, head_dim_v). Outputs are resized and filled:
// o (batch, seqlen_q, nheads, head_dim_v), lse (batch, nheads, seqlen_q).
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       const ScoreOptions& options, std::vector<double>* o, std::vector<double>* lse);

// The same attention at the precision a fused kernel keeps: scores, softmax and the P V sums in
// float, the unnormalised probabilities rounded to `dtype` before the P V product, O rounded to
// `dtype` at the end (float32: no rounding; float8_e4m3fn: P to e4m3, O to bfloat16, as FP8
// attention does). Its distance from attention_forward() is the yardstick
// for a kernel's error (FlashAttention's rule: kernel error <= 2 x this error + a small term).
void attention_forward_low_precision(const AttentionShape& shape, const float* q, const float* k,
                                     const float* v, const ScoreOptions& options, DType dtype,
                                     std::vector<float>* o, std::vector<float>* lse);

// The gradients of attention_forward()'s O for the gradient `dout` (contiguous, o's shape): dq, dk
// and dv, resized and filled in q's, k's and v's shapes (dk and dv summed over each KV head's query
// heads). Rows that see no key contribute nothing.
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* dout, const ScoreOptions& options, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv);

// The same gradients at the precision a fused kernel keeps: sums in float, P and dS rounded to
// `dtype` before the products that read them from 16-bit operands, the gradients rounded to `dtype`
// at the end. Its distance from attention_backward() is the yardstick for a kernel's error.
void attention_backward_low_precision(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                      const float* dout, const ScoreOptions& options, DType dtype,
                                      std::vector<float>* dq, std::vector<float>* dk, std::vector<float>* dv);

}  // namespace flashhop::reference
