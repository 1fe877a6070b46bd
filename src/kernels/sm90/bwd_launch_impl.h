// Definition of launch_backward (declared in bwd_launch.h). Included only by the generated
// instantiation files, so each configuration compiles in a translation unit of its own.
#pragma once

#include <string>

#include "kernels/sm90/bwd_kernel.h"
#include "kernels/sm90/bwd_launch.h"

namespace flashhop::sm90 {

inline Status cuda_status(char const* what, cudaError_t error) {
  if (error == cudaSuccess) return Status::success();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(error)};
}

// The three kernels in stream order: preprocess (per query tile), main (per key tile), postprocess.
// A call without query rows has nothing but dK = dV = 0 to write (the main kernel's empty walks);
// one without keys, dQ = 0 (the accumulator the preprocess clears). A variable-length batch runs
// on the grids of its bounds.
template <class Kernel>
Status launch_kernels(BackwardParams const& p, cudaStream_t stream) {
  typename Kernel::RowParams const row_params = Kernel::to_row_params(p);
  std::int64_t const row_blocks = std::int64_t{row_params.rows.m_blocks} * p.nheads * p.batch;
  if (row_blocks > 0) {
    backward_preprocess_kernel<Kernel>
        <<<static_cast<unsigned>(row_blocks), Kernel::kConsumerThreads, 0, stream>>>(row_params);
    if (Status status = cuda_status("backward preprocess launch", cudaGetLastError()); !status.ok()) return status;
  }
  if (p.deterministic && row_blocks > 0) {
    if (Status status =
            cuda_status("cudaMemsetAsync", cudaMemsetAsync(p.dq_semaphore, 0, row_blocks * sizeof(int), stream));
        !status.ok()) {
      return status;
    }
  }
  // Without keys there are no key tiles (and no K for a TMA descriptor).
  std::int64_t const key_blocks =
      (std::int64_t{p.seqlen_k} + Kernel::kBlockN - 1) / Kernel::kBlockN * p.nheads_kv * p.batch;
  if (key_blocks > 0) {
    typename Kernel::Params const params = Kernel::to_params(p);
    auto const kernel = backward_kernel<Kernel>;
    if (Status status = cuda_status(
            "cudaFuncSetAttribute",
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSharedBytes));
        !status.ok()) {
      return status;
    }
    kernel<<<static_cast<unsigned>(key_blocks), Kernel::kThreads, Kernel::kSharedBytes, stream>>>(params);
    if (Status status = cuda_status("backward kernel launch", cudaGetLastError()); !status.ok()) return status;
  }
  if (row_blocks > 0) {
    backward_postprocess_kernel<Kernel>
        <<<static_cast<unsigned>(row_blocks), Kernel::kConsumerThreads, 0, stream>>>(row_params);
    if (Status status = cuda_status("backward postprocess launch", cudaGetLastError()); !status.ok()) return status;
  }
  return Status::success();
}

// The recipe's kernel for the call's soft-capping choice (a kernel each: the softcap one keeps the
// tanh derivative in registers).
template <class Element, int kRecipe>
Status launch_backward(BackwardParams const& p, cudaStream_t stream) {
  if (p.softcap > 0.f) return launch_kernels<BackwardKernel<Element, kRecipe, true>>(p, stream);
  return launch_kernels<BackwardKernel<Element, kRecipe, false>>(p, stream);
}

}  // namespace flashhop::sm90
