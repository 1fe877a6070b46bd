// The planned recipe and dtype become template arguments here, once: each compiled kernel file
// (tools/generate_instantiations.py writes the list) is one entry of the table below. Kernels left
// out of the build (FLASHHOP_DTYPES, FLASHHOP_HEAD_DIMS) answer kNotSupported.
#include "api/dispatch.h"

#include <cstddef>
#include <string>

#include <cutlass/numeric_types.h>

#include "kernels/sm90/bwd_launch.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::detail {
namespace {

// One compiled kernel file: its (dtype, recipe index) and its launcher of `Params`.
template <class Params>
struct CompiledKernel {
  DType dtype;
  int recipe;
  Status (*launch)(const Params&, cudaStream_t);
};

#define FLASHHOP_FORWARD_KERNEL(Element, dtype, recipe) {dtype, recipe, &sm90::launch_forward<Element, recipe>},
constexpr CompiledKernel<sm90::ForwardParams> kForwardKernels[] = {
#include "kernels/sm90/fwd_kernel_list.inc"
    {DType::kFloat32, -1, nullptr},  // keeps the table non-empty in a build without kernels
};
#undef FLASHHOP_FORWARD_KERNEL

#define FLASHHOP_VARLEN_FORWARD_KERNEL(Element, dtype, recipe) \
  {dtype, recipe, &sm90::launch_varlen_forward<Element, recipe>},
constexpr CompiledKernel<sm90::ForwardParams> kVarlenForwardKernels[] = {
#include "kernels/sm90/fwd_varlen_kernel_list.inc"
    {DType::kFloat32, -1, nullptr},  // keeps the table non-empty in a build without kernels
};
#undef FLASHHOP_VARLEN_FORWARD_KERNEL

#define FLASHHOP_BACKWARD_KERNEL(Element, dtype, recipe) {dtype, recipe, &sm90::launch_backward<Element, recipe>},
constexpr CompiledKernel<sm90::BackwardParams> kBackwardKernels[] = {
#include "kernels/sm90/bwd_kernel_list.inc"
    {DType::kFloat32, -1, nullptr},  // keeps the table non-empty in a build without kernels
};
#undef FLASHHOP_BACKWARD_KERNEL

// The launcher of (dtype, recipe) in `table`; null where the build did not compile it.
template <class Params, std::size_t kSize>
auto launcher_of(const CompiledKernel<Params> (&table)[kSize], DType dtype, int recipe) {
  for (const CompiledKernel<Params>& kernel : table) {
    if (kernel.dtype == dtype && kernel.recipe == recipe) return kernel.launch;
  }
  return decltype(table[0].launch){nullptr};
}

// A plan's kernel runs on `stream`; kNotSupported, naming it, where the build left it out.
template <class Params, std::size_t kSize, class Plan>
Status launch_planned(const CompiledKernel<Params> (&table)[kSize], const char* pass, const Plan& plan,
                      cudaStream_t stream) {
  const auto launch = launcher_of(table, plan.dtype, plan.recipe);
  if (launch == nullptr) {
    const auto& recipe = plan.recipe_of();
    return {StatusCode::kNotSupported, std::string(pass) + " kernel for dtype " + dtype_name(plan.dtype) +
                                           " and head_dim " + std::to_string(recipe.head_dim) + ", head_dim_v " +
                                           std::to_string(recipe.head_dim_v) + " (" + recipe.name +
                                           ") is not compiled into this build (see FLASHHOP_DTYPES and "
                                           "FLASHHOP_HEAD_DIMS)"};
  }
  return launch(plan.params, stream);
}

}  // namespace

Status check_compute_capability(int major, int minor) {
  constexpr int kMajor = 9, kMinor = 0;  // sm_90a: wgmma, setmaxnreg, TMA; its code runs on 9.0 alone
  if (major == kMajor && minor == kMinor) return Status::success();
  return {StatusCode::kNotSupported, "the CUDA device has compute capability " + std::to_string(major) + "." +
                                         std::to_string(minor) + ": flashhop's kernels need " +
                                         std::to_string(kMajor) + "." + std::to_string(kMinor) +
                                         " (Hopper: H100, H200, H20, GH200)"};
}

bool forward_kernel_compiled(DType dtype, int recipe) { return launcher_of(kForwardKernels, dtype, recipe) != nullptr; }

Status launch_forward(const ForwardPlan& plan, cudaStream_t stream) {
  return launch_planned(kForwardKernels, "forward", plan, stream);
}

bool varlen_forward_kernel_compiled(DType dtype, int recipe) {
  return launcher_of(kVarlenForwardKernels, dtype, recipe) != nullptr;
}

Status launch_varlen_forward(const ForwardPlan& plan, cudaStream_t stream) {
  return launch_planned(kVarlenForwardKernels, "variable-length forward", plan, stream);
}

bool backward_kernel_compiled(DType dtype, int recipe) {
  return launcher_of(kBackwardKernels, dtype, recipe) != nullptr;
}

Status launch_backward(const BackwardPlan& plan, cudaStream_t stream) {
  return launch_planned(kBackwardKernels, "backward", plan, stream);
}

Status launch_append_kv(const sm90::AppendKvParams& params, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBFloat16) return sm90::launch_append_kv<cutlass::bfloat16_t>(params, stream);
  if (dtype == DType::kFloat16) return sm90::launch_append_kv<cutlass::half_t>(params, stream);
  if (dtype == DType::kFloat8E4M3) return sm90::launch_append_kv<cutlass::float_e4m3_t>(params, stream);
  return {StatusCode::kInvalidArgument, std::string("k_cache.dtype = ") + dtype_name(dtype) +
                                            ": expected float16, bfloat16 or float8_e4m3fn"};
}

Status launch_quantize_fp8(const sm90::Fp8QuantizeParams& params, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBFloat16) return sm90::launch_quantize_fp8<cutlass::bfloat16_t>(params, stream);
  if (dtype == DType::kFloat16) return sm90::launch_quantize_fp8<cutlass::half_t>(params, stream);
  return {StatusCode::kInvalidArgument, std::string("x.dtype = ") + dtype_name(dtype) + ": expected float16 or bfloat16"};
}

Status launch_combine(const sm90::CombineParams& params, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBFloat16:
      return sm90::launch_combine<cutlass::bfloat16_t>(params, stream);
    case DType::kFloat16:
      return sm90::launch_combine<cutlass::half_t>(params, stream);
    case DType::kFloat32:
      return sm90::launch_combine<float>(params, stream);
    case DType::kInt32:
    case DType::kFloat8E4M3:
      break;
  }
  return {StatusCode::kInvalidArgument, std::string("out.dtype = ") + dtype_name(dtype) +
                                            ": expected bfloat16, float16 or float32"};
}

}  // namespace flashhop::detail
