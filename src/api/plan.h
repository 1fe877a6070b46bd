// The plan of a forward or backward call: which compiled configuration (recipe) runs it, the
// kernels' arguments, and the workspace they need. Planned once per call from validated arguments and the
// device's facts; dispatch and the workspace query read the plan, nothing derives it again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "flashhop/flashhop.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_recipes.h"
#include "kernels/sm90/fp8_quantize.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_recipes.h"

namespace flashhop::detail {

// What the plan needs to know of the device: the persistent grids are sized to its SMs and the
// causal queue's tail group to its L2 cache. Zeros where the device could not be asked (then no
// round is split).
struct DeviceFacts {
  int num_sms = 0;
  std::int64_t l2_bytes = 0;
};

// The variable-length part of a forward plan (cu_seqlens; flashhop.h's packed layout). params then
// hold the batch, max_seqlen_q / max_seqlen_k as seqlen_q / seqlen_k, the row and head strides of
// the packed tensors (batch strides 0: sequence b starts at row cu_seqlens[b]), the band of the
// longest sequences and the cu_seqlens / seqused pointers; each sequence's own lengths and band
// come from the device at run time (varlen.h).
struct VarlenPlan {
  int batch = 0;                           // cu_seqlens_q.shape[0] - 1
  std::int64_t total_q = 0, total_k = 0;   // q.shape[0], k.shape[0]
  int max_seqlen_q = 0, max_seqlen_k = 0;  // the caller's bounds, cut at total_q and total_k
  const int* cu_seqlens_q = nullptr;       // device (batch + 1)
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;          // device (batch); null where not given
  const int* seqused_k = nullptr;
  const int* leftpad_k = nullptr;          // device (batch); null where not given
  // Query tiles of the planned recipe, bounded: batch * ceil(tile rows of max_seqlen_q / block_m) *
  // tile heads (query_rows.h), before splits by keys (params.num_splits).
  std::int64_t num_tiles_bound = 0;
  // The tile list (sm90::VarlenTileList), and with splits their partial results
  // (sm90::VarlenSplitPartials); 0 without query rows.
  std::size_t workspace_bytes = 0;
};

struct ForwardPlan {
  DType dtype = DType::kBFloat16;
  int recipe = -1;  // index into sm90::kForwardRecipes
  sm90::ForwardParams params;  // the workspace pointer is left null
  std::size_t workspace_bytes = 0;
  std::optional<VarlenPlan> varlen;  // with cu_seqlens

  const sm90::ForwardRecipe& recipe_of() const { return sm90::kForwardRecipes[recipe]; }
};

// Plans a call whose arguments validate_forward() accepted.
ForwardPlan plan_forward(const ForwardArgs& args, const DeviceFacts& device);

// The recipe of (d, dv, mask, packed rows) for tile choice `choice`: the head dim's own tiles for it
// where it has some, else the default choice's (sm90::default_tile_choice); none where the head
// dims have no recipe at all.
std::optional<int> find_recipe(int head_dim, int head_dim_v, bool local, bool pack_gqa, sm90::TileChoice choice);

// The tile choice of unpacked rows: whether the query rows are too few for the tall tiles, else
// whether the middle query row sees at least wide_band_keys(d) keys (without a mask, seqlen_k).
sm90::TileChoice tile_choice(int head_dim, int head_dim_v, bool local, int seqlen_q, int middle_row_keys);

// Whether a call packs the query heads of a KV group into its query tiles (PackGqa): kAuto packs
// when heads_per_kv_head > 1 and the packed rows fill their query tiles (packed_tile_rows, the
// packed kernel's block_m) better by more than 10% than the unpacked rows fill theirs (tile_rows).
bool use_pack_gqa(PackGqa mode, int seqlen_q, int heads_per_kv_head, int tile_rows, int packed_tile_rows);

struct BackwardPlan {
  DType dtype = DType::kBFloat16;
  int recipe = -1;  // index into sm90::kBackwardRecipes
  sm90::BackwardParams params;  // the workspace parts are left null
  sm90::BackwardWorkspace workspace{};

  const sm90::BackwardRecipe& recipe_of() const { return sm90::kBackwardRecipes[recipe]; }
  // Points the workspace parts of params into `base` (workspace.bytes long).
  void bind_workspace(void* base);
};

// Plans a backward call whose arguments validate_backward accepted.
BackwardPlan plan_backward(const BackwardArgs& args);

// The kernels' arguments of a quantize_fp8 call whose arguments validate_quantize_fp8 accepted.
sm90::Fp8QuantizeParams plan_quantize_fp8(const QuantizeFp8Args& args);

}  // namespace flashhop::detail
