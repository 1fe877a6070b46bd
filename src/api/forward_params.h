// Validated forward arguments, flattened for the kernels. Built once by the API layer.
#pragma once

#include <cstdint>

#include "flashhop/flashhop.h"

namespace flashhop::detail {

struct ForwardParams {
  const void* q = nullptr;  // (batch, seqlen_q, nheads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim_v)
  void* o = nullptr;        // (batch, seqlen_q, nheads, head_dim_v)
  float* lse = nullptr;     // (batch, nheads, seqlen_q) or null

  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_kv = 0;
  int head_dim = 0, head_dim_v = 0;

  // Strides in elements, per (batch, seq, head); the last dimension is contiguous.
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 1.f;
  bool causal = false;
  int device = 0;
};

// Flattens arguments that validate_forward() accepted.
ForwardParams make_forward_params(const ForwardArgs& args);

// Launches the sm90 forward kernel chosen for `params` (dtype, head dim, mask) on `stream`.
// Returns kNotSupported when that configuration was not compiled into this build.
Status launch_forward_sm90(const ForwardParams& params, cudaStream_t stream);

}  // namespace flashhop::detail
