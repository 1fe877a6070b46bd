// Maps CTAs to work tiles. For now one CTA per (query tile, head, batch): grid (m_blocks, nheads,
// batch), query tiles fastest so that the CTAs resident together share one head's K/V in L2.
#pragma once

#include <cuda_runtime_api.h>
#include <cutlass/cutlass.h>

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

template <bool kLongestFirst>
struct SingleTileScheduler {
  static dim3 grid(int num_m_blocks, int nheads, int batch) {
    return dim3(static_cast<unsigned>(num_m_blocks), static_cast<unsigned>(nheads), static_cast<unsigned>(batch));
  }
  static constexpr int kMaxGridYZ = 65535;

  // With causal masking the last query tiles see the most keys: launching them first keeps the
  // tail of the grid short.
  static CUTLASS_DEVICE ForwardTile tile() {
    int const m_block = kLongestFirst ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    return {m_block, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
  }
};

}  // namespace flashhop::sm90
