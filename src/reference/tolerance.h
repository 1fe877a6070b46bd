// FlashAttention's acceptance rule for a fused kernel's forward output, shared by the GPU tests and
// flashhop-bench --check: the kernel's error against attention_forward() (double precision) may be
// twice the error of attention_forward_low_precision() (the same attention at the kernel's
// precision) plus small absolute terms:
//   max |O - O_ref|     <= o_tolerance(dtype, max |O_low - O_ref|, max |O_ref|, softcap, max |V|)
//   max |LSE - LSE_ref| <= lse_tolerance(max |LSE_low - LSE_ref|, softcap)
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashhop/flashhop.h"

namespace flashhop::reference {

// Soft-capping: the kernel's tanh (tanh.approx.f32) has a relative error below 2^-10.987, so each
// kept score softcap * tanh(.) moves by at most softcap * 2^-11 against the reference. That moves
// LSE by at most as much, and each probability by that factor, so O (a weighted mean of V rows) by
// at most 2 x softcap * 2^-11 x max |V|.
inline double softcap_score_error(double softcap) { return softcap * 0x1p-11; }

// The absolute part for O: the final rounding of O to the dtype, which alone moves an element by up
// to the unit roundoff (bf16 2^-8, fp16 2^-11) times its size, taken at the size of the largest
// output and at least 1. Sized at 1 only, it failed a d = 192 window test on one element:
// reference 2.3768, kernel 2.390625, the upper of the two bf16 values around the reference (a step
// of 2^-6 there).
inline double o_tolerance(DType dtype, double o_baseline_error, double max_abs_o_ref, double softcap,
                          double max_abs_v) {
  double const rounding = (dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11) * std::max(1.0, max_abs_o_ref);
  return 2 * o_baseline_error + rounding + 2 * softcap_score_error(softcap) * max_abs_v;
}

// LSE is computed in float32 from float32 scores; 1e-3 bounds its rounding at our magnitudes.
inline double lse_tolerance(double lse_baseline_error, double softcap) {
  return 2 * lse_baseline_error + 1e-3 + softcap_score_error(softcap);
}

// FP8 (e4m3 Q, K and V, P rounded to e4m3 for P V, O bfloat16) is held to bounds derived from the
// formats instead: the e4m3 wgmmas keep 13 of their float accumulator's mantissa bits, truncated
// (PyTorch's study of H100 GEMM accumulators), which the host does not reproduce closely enough
// for a low-precision run to serve as the yardstick (on the H100 the kernels' errors reached 4x
// such a run's; decision log D141).
// A score softmax_scale * q.k is accumulated in head_dim / 32 steps of 32 products, each step
// truncating less than 2^-13 of a sum no larger than sum_c |q_c k_c| <= |q| |k|; LSE moves by as
// much as the largest score.
inline double fp8_score_error(int head_dim, double softmax_scale, double max_q_norm, double max_k_norm) {
  return (head_dim + 31) / 32 * 0x1p-13 * softmax_scale * max_q_norm * max_k_norm;
}
inline double fp8_lse_tolerance(double score_error, double softcap) {
  return 1e-3 + score_error + softcap_score_error(softcap);
}
// O: rounding P to e4m3 moves each probability by at most 2^-4 of itself, so O (a weighted mean of
// V rows) by at most 2^-4 max |V|; the scores' error scales each probability by at most
// exp(+-score_error), moving O by about 2 x score_error x max |V|; the P V accumulator truncates
// less than 2^-13 of its sum in each step of 32 keys; then O's rounding to bfloat16.
inline double fp8_o_tolerance(double score_error, double softcap, std::int64_t seqlen_k, double max_abs_v,
                              double max_abs_o_ref) {
  double const key_steps = static_cast<double>((seqlen_k + 31) / 32);
  return (0x1p-4 + 2 * (score_error + softcap_score_error(softcap)) + key_steps * 0x1p-13) * max_abs_v +
         0x1p-8 * std::max(1.0, max_abs_o_ref);
}

}  // namespace flashhop::reference
