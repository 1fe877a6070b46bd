// Definition of launch_forward (declared in fwd_launch.h). Included only by the generated
// instantiation files, so each configuration compiles in a translation unit of its own.
#pragma once

#include <string>
#include <type_traits>

#include "kernels/sm90/fwd_kernel.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::sm90 {

// Launches the forward kernel of one mainloop.
template <class Mainloop>
Status launch_kernel(ForwardParams const& p, cudaStream_t stream) {
  using Mask = typename Mainloop::Mask;
  using Kernel = ForwardKernel<Mainloop, ForwardEpilogue<Mainloop>>;
  using Scheduler = typename Kernel::Scheduler;

  typename Kernel::Params const params = Kernel::to_params(p);
  auto const kernel = forward_kernel<Kernel>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSharedBytes);
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err)};
  }
  // Several CTAs per SM need the most shared memory the SM can give (the default carveout may not
  // hold two).
  if constexpr (Mainloop::Roles::kCtasPerSm > 1) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) {
      return {StatusCode::kCudaError, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err)};
    }
  }
  // The tile queue's counter (tile_scheduler.h), or the split round's counters (split_round.h),
  // start at zero in every call.
  std::size_t counter_bytes = 0;
  if constexpr (Mask::kIsLocal) {
    counter_bytes = sizeof(int);
  } else if constexpr (Kernel::kSplitRound) {
    if (params.scheduler.split.splits()) {
      counter_bytes = SplitWorkspace::counter_bytes(params.scheduler.split, Mainloop::kConsumerWarpGroups);
    }
  }
  if (counter_bytes > 0) {
    err = cudaMemsetAsync(p.workspace, 0, counter_bytes, stream);
    if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("cudaMemsetAsync: ") + cudaGetErrorString(err)};
  }
  kernel<<<Scheduler::grid(params.scheduler, p.num_sms), Kernel::kThreads, Kernel::kSharedBytes, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("forward kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

// One recipe's kernel, or where it has one per soft-capping choice (softcap_per_kernel), the
// kernel of the call's choice.
template <class Element, int kRecipe>
Status launch_forward(ForwardParams const& p, cudaStream_t stream) {
  auto launch = [&](auto softcap_choice) {
    return launch_kernel<ForwardMainloop<Element, kRecipe, decltype(softcap_choice)::value>>(p, stream);
  };
  using Choice = SoftcapChoice;
  if constexpr (kForwardRecipes[kRecipe].softcap_per_kernel) {
    if (p.softcap > 0.f) return launch(std::integral_constant<Choice, Choice::kSoftcap>{});
    return launch(std::integral_constant<Choice, Choice::kNone>{});
  } else {
    return launch(std::integral_constant<Choice, Choice::kAtRunTime>{});
  }
}

}  // namespace flashhop::sm90
