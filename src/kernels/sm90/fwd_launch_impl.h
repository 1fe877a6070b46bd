// Definition of launch_forward (declared in fwd_launch.h). Included only by the generated
// instantiation files, so each configuration compiles in a translation unit of its own.
#pragma once

#include <string>
#include <type_traits>

#include "kernels/sm90/fwd_kernel.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::sm90 {

// The combine of a variable-length batch split by keys: its partials (VarlenSplitPartials) into O
// and LSE, sequence by sequence.
inline CombineParams combine_params(ForwardParams const& p, int head_dim_v) {
  using Layout = VarlenSplitPartials;
  CombineParams c;
  c.o_partial = Layout::o(p.workspace, p.batch);
  c.lse_partial = Layout::lse(p.workspace, p.batch, p.num_splits, p.total_q, p.nheads, head_dim_v);
  c.o = p.o;
  c.lse = p.lse;
  c.num_splits = p.num_splits;
  c.batch = p.batch;
  c.seqlen = p.seqlen_q;
  c.nheads = p.nheads;
  c.head_dim_v = head_dim_v;
  c.o_partial_head_stride = head_dim_v;
  c.o_partial_row_stride = std::int64_t{p.nheads} * head_dim_v;
  c.o_partial_split_stride = c.o_partial_row_stride * p.total_q;
  c.lse_partial_head_stride = 1;
  c.lse_partial_row_stride = p.nheads;
  c.lse_partial_split_stride = std::int64_t{p.nheads} * p.total_q;
  c.o_row_stride = p.o_row_stride;
  c.o_head_stride = p.o_head_stride;
  c.lse_head_stride = p.lse_head_stride;
  c.lse_row_stride = p.lse_row_stride;
  c.cu_seqlens_q = p.cu_seqlens_q;
  c.seqused_q = p.seqused_q;
  c.total_q = p.total_q;
  return c;
}

// Launches the forward kernel of one mainloop.
template <class Mainloop>
Status launch_kernel(ForwardParams const& p, cudaStream_t stream) {
  using Mask = typename Mainloop::Mask;
  using Kernel = ForwardKernel<Mainloop, ForwardEpilogue<Mainloop>>;
  using Scheduler = typename Kernel::Scheduler;

  typename Kernel::Params const params = Kernel::to_params(p);
  if constexpr (Kernel::kVarlen) {
    if (p.page_table != nullptr && params.mainloop.paged.page_table == nullptr) {
      return {StatusCode::kCudaError, "cuTensorMapEncodeTiled could not describe the paged k_cache / v_cache"};
    }
  }
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
  // A variable-length batch's tile list (varlen.h), written by one CTA, which also zeroes its
  // counter; else the tile queue's counter (tile_scheduler.h), or the split round's counters
  // (split_round.h), start at zero in every call.
  std::size_t counter_bytes = 0;
  if constexpr (Kernel::kVarlen) {
    constexpr int kPrepareThreads = 1024;
    VarlenPrepareParams const prepare{Kernel::sequences_of(p), p.batch, Mainloop::kBlockM,
                                      Mainloop::kPackGqa ? p.nheads / p.nheads_kv : 1,
                                      Mainloop::Rows::tile_heads(p.nheads, p.nheads_kv), p.num_splits,
                                      static_cast<int*>(p.workspace)};
    varlen_prepare_kernel<kPrepareThreads><<<1, kPrepareThreads, 0, stream>>>(prepare);
    err = cudaGetLastError();
    if (err != cudaSuccess) {
      return {StatusCode::kCudaError,
              std::string("variable-length prepare kernel launch: ") + cudaGetErrorString(err)};
    }
  } else if constexpr (Mask::kIsLocal) {
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
  if constexpr (Kernel::kVarlen) {
    if (p.num_splits > 1) {
      return launch_combine<typename Mainloop::ElementO>(combine_params(p, Mainloop::kHeadDimV), stream);
    }
  }
  return Status::success();
}

// One recipe's kernel, or where it has one per soft-capping choice (softcap_per_kernel), the
// kernel of the call's choice; for fixed-length or (kVarlen) variable-length batches.
template <class Element, int kRecipe, bool kVarlen>
Status launch_forward_of(ForwardParams const& p, cudaStream_t stream) {
  auto launch = [&](auto softcap_choice) {
    return launch_kernel<ForwardMainloop<Element, kRecipe, decltype(softcap_choice)::value, kVarlen>>(p, stream);
  };
  using Choice = SoftcapChoice;
  if constexpr (kForwardRecipes[kRecipe].softcap_per_kernel) {
    if (p.softcap > 0.f) return launch(std::integral_constant<Choice, Choice::kSoftcap>{});
    return launch(std::integral_constant<Choice, Choice::kNone>{});
  } else {
    return launch(std::integral_constant<Choice, Choice::kAtRunTime>{});
  }
}

template <class Element, int kRecipe>
Status launch_forward(ForwardParams const& p, cudaStream_t stream) {
  return launch_forward_of<Element, kRecipe, false>(p, stream);
}

template <class Element, int kRecipe>
Status launch_varlen_forward(ForwardParams const& p, cudaStream_t stream) {
  return launch_forward_of<Element, kRecipe, true>(p, stream);
}

}  // namespace flashhop::sm90
