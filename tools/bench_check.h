// flashhop-bench --check: compares one forward output with the CPU reference.
//
// Reference: flashhop::reference::attention_forward (double precision) on exactly the values the
// kernel read. Baseline: reference::attention_forward_low_precision, the same attention at the
// precision a fused kernel keeps (fp32 sums, probabilities and output rounded to the input dtype).
// The check passes when, over the compared elements, O and LSE are within the tolerances of
// reference/tolerance.h (FlashAttention's rule: twice the baseline's error plus the final rounding
// of O, fp32 rounding of LSE and the soft-capping terms; max|O_ref| and max|V| over the compared
// rows and the V rows they see), every O element is finite (outputs are poisoned with NaN before
// the call, so a NaN left anywhere is an element never written), no LSE element is NaN, and a
// fully masked row has LSE = -inf in both.
//
// Subset: the double-precision reference of the largest shapes would take minutes each, so the
// compared part is capped at kCheckBudgetMacs multiply-adds (a pair's copy of K and V counted as 16
// query rows' worth): all (batch, head) pairs and all rows when
// the problem fits; otherwise an evenly spaced sample of (batch, head) pairs that always includes the
// first and the last; and, when even two pairs do not fit, 16 evenly spaced blocks of query rows, the
// first block starting at row 0 and the last ending at the last row. Each block is compared against
// an exact sub-problem (its rows and only the keys they can see, under a mask translated to the
// sub-problem's corner), so causal and window masking are checked at every sampled position. `scope`
// says what was compared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"

namespace flashhop::bench {

// Upper bound on multiply-adds of the reference per checked configuration (the baseline costs about
// as much again, in float); sized so that --check over the whole peers sweep takes a few minutes on
// 16 cores.
inline constexpr double kCheckBudgetMacs = 8.0e9;

// Contiguous host copies of one forward call's tensors, as stored on the device: q, k, v and o hold
// raw float16/bfloat16 bits, lse holds float32.
struct HostTensors {
  DType dtype = DType::kBFloat16;
  std::vector<std::uint16_t> q, k, v, o;
  std::vector<float> lse;
};

struct CheckResult {
  std::string scope;                  // what was compared, in words
  std::int64_t nonfinite_o = 0;       // over all of O
  std::int64_t nan_lse = 0;           // over all of LSE
  std::int64_t lse_inf_mismatch = 0;  // compared rows where exactly one of LSE, LSE_ref is -inf
  double o_max_abs_err = 0, o_baseline_max_abs_err = 0, o_tolerance = 0;
  double o_rel_l2_err = 0;  // ||O - O_ref|| / ||O_ref|| over the compared elements
  double lse_max_abs_err = 0, lse_baseline_max_abs_err = 0, lse_tolerance = 0;
  bool passed = false;
};

// Compares `tensors` (the output of one forward call on `shape` with `options`) with the reference.
CheckResult check_forward(const reference::AttentionShape& shape, const reference::ScoreOptions& options,
                          const HostTensors& tensors);

}  // namespace flashhop::bench
