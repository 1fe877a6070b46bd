// The combine kernel (CombineParams, fwd_params.h): merges the partial results of splits by keys
// into O and LSE. One warp per (row, head): the lanes read the splits' LSEs (a max, then a sum of
// exponentials, reduced across the warp), then walk the splits in order, each lane accumulating
// its columns (lane, lane + 32, ...) of O, so that every warp load reads 128 contiguous bytes and
// the result does not depend on timing.
#include <cmath>
#include <string>

#include <cutlass/numeric_types.h>

#include "kernels/sm90/fwd_launch.h"
#include "kernels/sm90/varlen.h"

namespace flashhop::sm90 {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxColumnsPerLane = kMaxCombineHeadDim / 32;

template <class Element>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) combine_kernel(CombineParams const p) {
  int const lane = threadIdx.x % 32;
  std::int64_t const pair = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;  // (row, head)
  if (pair >= std::int64_t{p.seqlen} * p.nheads) return;
  int const row = static_cast<int>(pair / p.nheads), head = static_cast<int>(pair % p.nheads);
  float const kMinusInf = -INFINITY;
  for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
    int packed_row = row;
    if (p.cu_seqlens_q != nullptr) {
      int begin, length;
      VarlenSequences::slot(p.cu_seqlens_q, p.seqused_q, b, p.total_q, p.seqlen, begin, length);
      if (row >= length) continue;
      packed_row = begin + row;
    }
    float const* lse_partial =
        p.lse_partial + b * p.lse_partial_batch_stride + packed_row * p.lse_partial_row_stride +
        head * p.lse_partial_head_stride;
    float max = kMinusInf;
    for (int s = lane; s < p.num_splits; s += 32) max = fmaxf(max, lse_partial[s * p.lse_partial_split_stride]);
    for (int offset = 16; offset > 0; offset /= 2) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
    float sum = 0.f;
    if (max != kMinusInf) {
      for (int s = lane; s < p.num_splits; s += 32) {
        float const part = lse_partial[s * p.lse_partial_split_stride];
        if (part != kMinusInf) sum += expf(part - max);
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    // No split saw a key: O = 0, LSE = -inf, as a row that sees no key.
    float const lse = sum > 0.f ? max + logf(sum) : kMinusInf;

    float accum[kMaxColumnsPerLane];
#pragma unroll
    for (int j = 0; j < kMaxColumnsPerLane; ++j) accum[j] = 0.f;
    float const* o_partial = p.o_partial + b * p.o_partial_batch_stride + packed_row * p.o_partial_row_stride +
                             head * p.o_partial_head_stride;
    for (int s = 0; s < p.num_splits && lse != kMinusInf; ++s) {
      float const part = lse_partial[s * p.lse_partial_split_stride];
      if (part == kMinusInf) continue;
      float const weight = expf(part - lse);
      float const* split_row = o_partial + s * p.o_partial_split_stride;
#pragma unroll
      for (int j = 0; j < kMaxColumnsPerLane; ++j) {
        int const col = lane + 32 * j;
        if (col < p.head_dim_v) accum[j] = fmaf(weight, __ldg(split_row + col), accum[j]);
      }
    }
    Element* const o = static_cast<Element*>(p.o) + b * p.o_batch_stride + packed_row * p.o_row_stride +
                       head * p.o_head_stride;
#pragma unroll
    for (int j = 0; j < kMaxColumnsPerLane; ++j) {
      int const col = lane + 32 * j;
      if (col < p.head_dim_v) o[col] = static_cast<Element>(accum[j]);
    }
    if (p.lse != nullptr && lane == 0) {
      p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + packed_row * p.lse_row_stride] = lse;
    }
  }
}

}  // namespace

template <class Element>
Status launch_combine(CombineParams const& p, cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen == 0 || p.nheads == 0) return Status::success();
  std::int64_t const blocks = (std::int64_t{p.seqlen} * p.nheads + kWarpsPerBlock - 1) / kWarpsPerBlock;
  constexpr int kMaxGridY = 65535;  // the rest of the batch is looped over
  dim3 const grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.batch < kMaxGridY ? p.batch : kMaxGridY));
  combine_kernel<Element><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("combine kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

template Status launch_combine<cutlass::bfloat16_t>(CombineParams const&, cudaStream_t);
template Status launch_combine<cutlass::half_t>(CombineParams const&, cudaStream_t);
template Status launch_combine<float>(CombineParams const&, cudaStream_t);

}  // namespace flashhop::sm90
