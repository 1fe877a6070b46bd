// Validated forward arguments, flattened for the kernels. Built once by the API layer.
#pragma once

#include <cstdint>

#include "flashhop/flashhop.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop::detail {

struct ForwardParams {
  const void* q = nullptr;  // (batch, seqlen_q, nheads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim_v)
  void* o = nullptr;        // (batch, seqlen_q, nheads, head_dim_v)
  float* lse = nullptr;     // (batch, nheads, seqlen_q) or null

  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_kv = 0;
  int head_dim = 0, head_dim_v = 0;

  // Strides in elements, per (batch, seq, head); the last dimension is contiguous.
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 1.f;
  float softcap = 0.f;  // > 0: scores become softcap * tanh(softmax_scale * q.k / softcap)
  // The visible band, aligned to the bottom-right corner: query i sees keys j with
  // i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right.
  // Both are >= 0 here: an unbounded side is written as a width that reaches past every key
  // (window_left = seqlen_k, window_right = seqlen_q); causal is window_right = 0.
  int window_left = 0, window_right = 0;
  bool local = false;  // the band hides some key from some query (else no mask is needed)
  // Query tiles run over (query row, head of the KV group) pairs, the head fastest (PackGqa).
  bool pack_gqa = false;
  // Whether the query rows see many keys (sm90::wide_band_keys; without a mask the band is all
  // seqlen_k keys) or are few (sm90::tile_choice), which picks the tiles where a head dim has some
  // of its own for it (sm90::has_own_tiles); packed GQA rows: sm90::default_tile_choice(local).
  sm90::TileChoice tile_choice = sm90::TileChoice::kNarrowBand;
  // forward()'s workspace: with a band (`local`), the int counter of the tile queue
  // (CausalScheduler), zeroed before the kernel; without, the split last round's counters and
  // partial results (split_round.h) where it splits one; else null.
  void* workspace = nullptr;
  int device = 0;
};

// Whether a call packs the query heads of a KV group into its query tiles (PackGqa): kAuto packs
// when heads_per_kv_head > 1 and the packed rows fill their query tiles (packed_tile_rows, the
// packed kernel's block_m) better by more than 10% than the unpacked rows fill theirs (tile_rows).
bool use_pack_gqa(PackGqa mode, int seqlen_q, int heads_per_kv_head, int tile_rows, int packed_tile_rows);

// Flattens arguments that validate_forward() accepted; the workspace is left null.
ForwardParams make_forward_params(const ForwardArgs& args);

// Launches the sm90 forward kernel chosen for `params` (dtype, head dim, mask) on `stream`.
// Returns kNotSupported when that configuration was not compiled into this build.
Status launch_forward_sm90(const ForwardParams& params, cudaStream_t stream);

}  // namespace flashhop::detail
