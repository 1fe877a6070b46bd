// Definition of launch_forward (declared in fwd_launch.h). Included only by the generated
// instantiation files, so each configuration compiles in a translation unit of its own.
#pragma once

#include <string>

#include "kernels/sm90/fwd_kernel.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::sm90 {

template <class Element, int kHeadDim, class Mask>
Status launch_forward(detail::ForwardParams const& p, cudaStream_t stream) {
  using Mainloop = ForwardMainloop<Element, kHeadDim, Mask>;
  using Kernel = ForwardKernel<Mainloop, ForwardEpilogue<Mainloop>>;
  using Scheduler = typename Kernel::Scheduler;

  if (p.nheads > Scheduler::kMaxGridYZ || p.batch > Scheduler::kMaxGridYZ) {
    return {StatusCode::kNotSupported, "nheads (" + std::to_string(p.nheads) + ") and batch (" +
                                           std::to_string(p.batch) + ") must each be at most 65535"};
  }
  typename Kernel::Params const params = Kernel::to_params(p);
  auto const kernel = forward_kernel<Kernel>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSharedBytes);
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(err)};
  }
  kernel<<<Scheduler::grid(Kernel::num_m_blocks(p), p.nheads, p.batch), kForwardThreads, Kernel::kSharedBytes,
           stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("forward kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

}  // namespace flashhop::sm90
