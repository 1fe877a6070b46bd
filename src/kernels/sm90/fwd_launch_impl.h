// Definition of launch_forward (declared in fwd_launch.h). Included only by the generated
// instantiation files, so each configuration compiles in a translation unit of its own.
#pragma once

#include <string>

#include "kernels/sm90/fwd_kernel.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::sm90 {

template <class Element, int kHeadDim, int kHeadDimV, class Mask, bool kPackGqa, TileChoice kTileChoice>
Status launch_forward(detail::ForwardParams const& p, cudaStream_t stream) {
  using Mainloop = ForwardMainloop<Element, kHeadDim, kHeadDimV, Mask, kPackGqa, kTileChoice>;
  using Kernel = ForwardKernel<Mainloop, ForwardEpilogue<Mainloop>>;
  using Scheduler = typename Kernel::Scheduler;

  int num_sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, p.device);
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(err)};
  }
  typename Kernel::Params const params = Kernel::to_params(p, num_sms);
  auto const kernel = forward_kernel<Kernel>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSharedBytes);
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
  kernel<<<Scheduler::grid(params.scheduler, num_sms), Kernel::kThreads, Kernel::kSharedBytes, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("forward kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

}  // namespace flashhop::sm90
