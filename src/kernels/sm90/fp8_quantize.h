// FP8 (e4m3) quantization of attention inputs (flashhop::quantize_fp8): the kernels' arguments and
// launcher. Host-includable (no CuTe).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashhop/flashhop.h"

namespace flashhop::sm90 {

// The head dims that the kernels are compiled for (each head dim is a template argument).
inline constexpr int kFp8QuantizeHeadDims[] = {64, 96, 128, 192, 256};

// Strides in elements; the last dimension of x and out is contiguous. The kernels work on tiles of
// kFp8ScaleBlockRows rows of one head, and tile (b, h, block) takes its scale from
//   descale[b * descale_batch_stride + (h / heads_per_group) * descale_group_stride + block * descale_block_stride]
// which covers the three scalings: per tensor all strides 0; per head the block stride 0; per block
// one head per group and the block stride 1.
struct Fp8QuantizeParams {
  void const* x = nullptr;  // (batch, seqlen, nheads, head_dim), bfloat16 or float16
  std::int64_t x_batch_stride = 0, x_row_stride = 0, x_head_stride = 0;
  void* out = nullptr;  // like x, e4m3
  std::int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  float* descale = nullptr;
  std::int64_t descale_batch_stride = 0, descale_group_stride = 0, descale_block_stride = 0;
  int heads_per_group = 1;
  // The entries of descale as (scale_batches, scale_groups), which the amax pass of the per-tensor
  // and per-head scalings accumulates into: (1, 1) per tensor, (batch, groups) per head.
  int scale_batches = 1, scale_groups = 1;
  float const* hadamard_signs = nullptr;  // (head_dim), or null: no rotation
  int batch = 0, seqlen = 0, nheads = 0, head_dim = 0;
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
};

// The kernels of x's elements `Element`: cutlass::bfloat16_t or cutlass::half_t.
template <class Element>
Status launch_quantize_fp8(Fp8QuantizeParams const& p, cudaStream_t stream);

}  // namespace flashhop::sm90
