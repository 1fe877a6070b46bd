// Tile schedulers of the sm90 forward kernel. A work tile is one 128-row query tile of one head of
// one batch entry. Tiles are numbered with the query tile fastest, so that the CTAs working at the
// same time share one head's K/V in L2; with kLongestFirst (causal masks) each head's last query
// tiles, which see the most keys, come first. The kernel walks its tiles as
//   for (index = first_tile(); index < params.num_tiles; index = next_tile(index)) ...
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>
#include <cutlass/cutlass.h>

namespace flashhop::sm90 {

struct ForwardTile {
  int m_block, head, batch;
};

template <bool kLongestFirst>
struct TileOrder {
  struct Params {
    int num_m_blocks, nheads;
    int64_t num_tiles;
  };

  static Params to_params(int num_m_blocks, int nheads, int batch) {
    return {num_m_blocks, nheads, int64_t(num_m_blocks) * nheads * batch};
  }

  static CUTLASS_DEVICE ForwardTile tile(Params const& params, int64_t index) {
    int const m = static_cast<int>(index % params.num_m_blocks);
    int64_t const head_batch = index / params.num_m_blocks;
    return {kLongestFirst ? params.num_m_blocks - 1 - m : m, static_cast<int>(head_batch % params.nheads),
            static_cast<int>(head_batch / params.nheads)};
  }
};

// Persistent: at most one CTA per SM; CTA c takes tiles c, c + gridDim.x, ... Later tiles' loads
// overlap earlier tiles' epilogues, and no CTA start-up is paid per tile. Static striding suits
// tiles of equal cost (no causal mask).
template <bool kLongestFirst>
struct StaticPersistentScheduler : TileOrder<kLongestFirst> {
  using Params = typename TileOrder<kLongestFirst>::Params;
  static dim3 grid(Params const& params, int num_sms) {
    return dim3(static_cast<unsigned>(params.num_tiles < num_sms ? params.num_tiles : num_sms));
  }
  static CUTLASS_DEVICE int64_t first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int64_t next_tile(int64_t index) { return index + gridDim.x; }
};

// One CTA per tile: the hardware hands CTAs to SMs as they free up, which balances tiles of unequal
// cost. On H200 (bf16, 16k, d = 128, causal) static striding ran at 457 TFLOP/s, this at 637:
// striding by the SM count deals some CTAs mostly long tiles and others mostly short ones.
template <bool kLongestFirst>
struct SingleTileScheduler : TileOrder<kLongestFirst> {
  using Params = typename TileOrder<kLongestFirst>::Params;
  static dim3 grid(Params const& params, int /*num_sms*/) { return dim3(static_cast<unsigned>(params.num_tiles)); }
  static CUTLASS_DEVICE int64_t first_tile() { return blockIdx.x; }
  static CUTLASS_DEVICE int64_t next_tile(int64_t /*index*/) { return INT64_MAX; }
};

}  // namespace flashhop::sm90
