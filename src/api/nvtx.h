// NVTX ranges around the API calls, for Nsight Systems and Nsight Compute (docs/PROFILING.md): one
// range per call of forward, backward and their workspace queries (the C API calls them), in the domain
// "flashhop", named by the planned configuration, e.g.
//   forward bf16 hdim128_local_wide b2 sq4096 sk4096 h32/8 causal
// (and one per call of append_kv, combine and quantize_fp8, named by their shapes)
// NVTX3 is header-only: a profiler sets NVTX_INJECTION64_PATH, and the first NVTX call of the
// process loads that library. Without one, creating the domain answers null and a range costs a
// branch: its name is built only where a tool is attached.
#pragma once

#include <cstdio>
#include <string>

#include <nvtx3/nvToolsExt.h>

#include "api/plan.h"
#include "kernels/sm90/append_kv.h"
#include "kernels/sm90/fp8_quantize.h"
#include "flashhop/flashhop.h"

namespace flashhop::detail {

// The range of `entry` on a plan: the entry point, the dtype, the recipe (fwd_recipes.h's or
// bwd_recipes.h's name), the shape as b<batch> sq<seqlen_q> sk<seqlen_k> h<nheads>/<nheads_kv>, then
// what the recipe's name leaves out: the band of a band recipe ("causal", or "window(L,R)" with -1
// for an unbounded side, as ForwardArgs takes it), soft-capping ("softcap30") and, for the
// backward, "deterministic".
template <class Params>
std::string range_name(const char* entry, DType dtype, const char* recipe, bool local, const Params& p) {
  const char* dtype_label = dtype == DType::kBFloat16 ? "bf16" : dtype == DType::kFloat16 ? "fp16" : dtype_name(dtype);
  std::string name = std::string(entry) + " " + dtype_label + " " + recipe + " b" + std::to_string(p.batch) + " sq" +
                     std::to_string(p.seqlen_q) + " sk" + std::to_string(p.seqlen_k) + " h" +
                     std::to_string(p.nheads) + "/" + std::to_string(p.nheads_kv);
  if (local) {
    // The plan writes an unbounded side as the width that reaches past every key (fwd_params.h).
    const int left = p.window_left >= p.seqlen_k ? -1 : p.window_left;
    const int right = p.window_right >= p.seqlen_q ? -1 : p.window_right;
    if (left == -1 && right == 0) {
      name += " causal";
    } else {
      name += " window(" + std::to_string(left) + "," + std::to_string(right) + ")";
    }
  }
  if (p.softcap > 0.f) {
    char softcap[32];
    std::snprintf(softcap, sizeof softcap, " softcap%g", static_cast<double>(p.softcap));
    name += softcap;
  }
  return name;
}

inline std::string range_name(const char* entry, const ForwardPlan& plan) {
  const int splits = plan.params.num_splits;
  return range_name(entry, plan.dtype, plan.recipe_of().name, plan.recipe_of().local(), plan.params) +
         (splits > 1 ? " splits" + std::to_string(splits) : "");
}

// "append_kv rows4 h8 d128 rotary64 queries4"
inline std::string range_name(const char* entry, const sm90::AppendKvParams& p) {
  return std::string(entry) + " rows" + std::to_string(p.total_new) + " h" + std::to_string(p.nheads_kv) + " d" +
         std::to_string(p.head_dim) + (p.rotary_cos ? " rotary" + std::to_string(p.rotary_dim) : "") +
         (p.q ? " queries" + std::to_string(p.total_q) : "");
}

// "quantize_fp8 per_head b2 s4096 h32 d128 hadamard"
inline std::string range_name(const char* entry, const sm90::Fp8QuantizeParams& p) {
  const char* scaling = p.scaling == Fp8Scaling::kPerTensor ? "per_tensor"
                        : p.scaling == Fp8Scaling::kPerHead ? "per_head"
                                                            : "per_block";
  return std::string(entry) + " " + scaling + " b" + std::to_string(p.batch) + " s" + std::to_string(p.seqlen) +
         " h" + std::to_string(p.nheads) + " d" + std::to_string(p.head_dim) + (p.hadamard_signs ? " hadamard" : "");
}

// "combine splits4 rows8 h32 dv128"
inline std::string range_name(const char* entry, const sm90::CombineParams& p) {
  return std::string(entry) + " splits" + std::to_string(p.num_splits) + " rows" + std::to_string(p.seqlen) + " h" +
         std::to_string(p.nheads) + " dv" + std::to_string(p.head_dim_v);
}

inline std::string range_name(const char* entry, const BackwardPlan& plan) {
  return range_name(entry, plan.dtype, plan.recipe_of().name, plan.recipe_of().local(), plan.params) +
         (plan.params.deterministic ? " deterministic" : "");
}

// The domain "flashhop", created on first use; null where no tool is attached (NVTX then answers
// null to every domain), and then for the whole process: tools attach at its start.
inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("flashhop");
  return domain;
}

// A push/pop range from construction to the end of the scope, on the calling thread. The range
// needs the plan for its name, so the entry points open it once they have planned: in forward and
// backward it covers the workspace and device checks, the memsets and the kernel launches, not the
// validation, the device attribute queries and the planning before it.
class ScopedRange {
 public:
  template <class Plan>
  ScopedRange(const char* entry, const Plan& plan) : domain_(nvtx_domain()) {
    if (domain_ == nullptr) return;
    const std::string name = range_name(entry, plan);
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name.c_str();  // the tool copies it
    nvtxDomainRangePushEx(domain_, &attributes);
  }
  ~ScopedRange() {
    if (domain_ != nullptr) nvtxDomainRangePop(domain_);
  }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  nvtxDomainHandle_t domain_;
};

}  // namespace flashhop::detail
