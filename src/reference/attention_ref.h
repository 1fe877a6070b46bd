// CPU reference attention in double precision, with flashhop's conventions (GQA, bottom-right
// causal, LSE in natural log, fully masked rows give O = 0 and LSE = -inf). For tests and
// flashhop-bench --check; deliberately the plain formula, not the tiled algorithm.
#pragma once

#include <cstdint>
#include <vector>

namespace flashhop::reference {

struct AttentionShape {
  int batch = 1, seqlen_q = 0, seqlen_k = 0, nheads = 1, nheads_kv = 1;
  int head_dim = 0, head_dim_v = 0;
};

// Inputs are contiguous: q (batch, seqlen_q, nheads, head_dim), k (batch, seqlen_k, nheads_kv,
// head_dim), v (batch, seqlen_k, nheads_kv, head_dim_v). Outputs are resized and filled:
// o (batch, seqlen_q, nheads, head_dim_v), lse (batch, nheads, seqlen_q).
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       double softmax_scale, bool causal, std::vector<double>* o,
                       std::vector<double>* lse);

}  // namespace flashhop::reference
