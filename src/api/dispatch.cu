// The planned recipe and dtype become template arguments here, once: each compiled kernel file
// (tools/generate_instantiations.py writes the list) is one entry of the table below. Kernels left
// out of the build (FLASHHOP_DTYPES, FLASHHOP_HEAD_DIMS) answer kNotSupported.
#include "api/dispatch.h"

#include <string>

#include <cutlass/numeric_types.h>

#include "kernels/sm90/bwd_launch.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::detail {
namespace {

using Launcher = Status (*)(const sm90::ForwardParams&, cudaStream_t);

struct CompiledKernel {
  DType dtype;
  int recipe;
  Launcher launch;
};

#define FLASHHOP_FORWARD_KERNEL(Element, dtype, recipe) {dtype, recipe, &sm90::launch_forward<Element, recipe>},
constexpr CompiledKernel kCompiledKernels[] = {
#include "kernels/sm90/fwd_kernel_list.inc"
    {DType::kFloat32, -1, nullptr},  // keeps the table non-empty in a build without kernels
};
#undef FLASHHOP_FORWARD_KERNEL

Launcher launcher_of(DType dtype, int recipe) {
  for (const CompiledKernel& kernel : kCompiledKernels) {
    if (kernel.dtype == dtype && kernel.recipe == recipe) return kernel.launch;
  }
  return nullptr;
}

using BackwardLauncher = Status (*)(const sm90::BackwardParams&, cudaStream_t);

struct CompiledBackwardKernel {
  DType dtype;
  int recipe;
  BackwardLauncher launch;
};

#define FLASHHOP_BACKWARD_KERNEL(Element, dtype, recipe) {dtype, recipe, &sm90::launch_backward<Element, recipe>},
constexpr CompiledBackwardKernel kCompiledBackwardKernels[] = {
#include "kernels/sm90/bwd_kernel_list.inc"
    {DType::kFloat32, -1, nullptr},  // keeps the table non-empty in a build without kernels
};
#undef FLASHHOP_BACKWARD_KERNEL

BackwardLauncher backward_launcher_of(DType dtype, int recipe) {
  for (const CompiledBackwardKernel& kernel : kCompiledBackwardKernels) {
    if (kernel.dtype == dtype && kernel.recipe == recipe) return kernel.launch;
  }
  return nullptr;
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

bool forward_kernel_compiled(DType dtype, int recipe) { return launcher_of(dtype, recipe) != nullptr; }

Status launch_forward(const ForwardPlan& plan, cudaStream_t stream) {
  const Launcher launch = launcher_of(plan.dtype, plan.recipe);
  if (launch == nullptr) {
    const sm90::ForwardRecipe& recipe = plan.recipe_of();
    return {StatusCode::kNotSupported, std::string("forward kernel for dtype ") + dtype_name(plan.dtype) +
                                           " and head_dim " + std::to_string(recipe.head_dim) + ", head_dim_v " +
                                           std::to_string(recipe.head_dim_v) + " (" + recipe.name +
                                           ") is not compiled into this build (see FLASHHOP_DTYPES and "
                                           "FLASHHOP_HEAD_DIMS)"};
  }
  return launch(plan.params, stream);
}

}  // namespace flashhop::detail

namespace flashhop::detail {

bool backward_kernel_compiled(DType dtype, int recipe) { return backward_launcher_of(dtype, recipe) != nullptr; }

Status launch_backward(const BackwardPlan& plan, cudaStream_t stream) {
  const BackwardLauncher launch = backward_launcher_of(plan.dtype, plan.recipe);
  if (launch == nullptr) {
    const sm90::BackwardRecipe& recipe = plan.recipe_of();
    return {StatusCode::kNotSupported, std::string("backward kernel for dtype ") + dtype_name(plan.dtype) +
                                           " and head_dim " + std::to_string(recipe.head_dim) + ", head_dim_v " +
                                           std::to_string(recipe.head_dim_v) + " (" + recipe.name +
                                           ") is not compiled into this build (see FLASHHOP_DTYPES and "
                                           "FLASHHOP_HEAD_DIMS)"};
  }
  return launch(plan.params, stream);
}

}  // namespace flashhop::detail
