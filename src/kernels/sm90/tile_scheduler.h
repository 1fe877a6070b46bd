// Static persistent tile scheduler: the grid has at most one CTA per SM, and CTA c takes the work
// tiles c, c + gridDim.x, c + 2 gridDim.x, ... A work tile is one 128-row query tile of one head.
// Tiles are numbered with the query tile fastest, so that the CTAs working at the same time share
// one head's K/V in L2; with causal masking each head's last (longest) query tiles come first.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>
#include <cutlass/cutlass.h>

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

template <bool kLongestFirst>
struct StaticPersistentScheduler {
  struct Params {
    int num_m_blocks, nheads;
    int64_t num_tiles;
  };

  static Params to_params(int num_m_blocks, int nheads, int batch) {
    return {num_m_blocks, nheads, int64_t(num_m_blocks) * nheads * batch};
  }
  static dim3 grid(Params const& params, int num_sms) {
    return dim3(static_cast<unsigned>(params.num_tiles < num_sms ? params.num_tiles : num_sms));
  }

  static CUTLASS_DEVICE int64_t first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int64_t next_tile(int64_t index) { return index + gridDim.x; }

  static CUTLASS_DEVICE ForwardTile tile(Params const& params, int64_t index) {
    int const m = static_cast<int>(index % params.num_m_blocks);
    int64_t const head_batch = index / params.num_m_blocks;
    return {kLongestFirst ? params.num_m_blocks - 1 - m : m, static_cast<int>(head_batch % params.nheads),
            static_cast<int>(head_batch / params.nheads)};
  }
};

}  // namespace flashhop::sm90
