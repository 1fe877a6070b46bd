// The plan of a forward or backward call (plan.h): the tile choice, packed GQA rows, the recipe,
// the kernels' arguments and the workspace, from validated arguments.
#include "api/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/sm90/split_round.h"

namespace flashhop::detail {
namespace {

using sm90::kForwardRecipes;
using sm90::TileChoice;

// A band is wide when its middle query row sees at least this many keys: causal with seqlen_q =
// seqlen_k from 2k at d = 64, where its 192-row tiles gain, and from 4k at d = 128 and 256, where
// their wide-band tiles win (tools/forward_recipes.py).
constexpr int wide_band_keys(int head_dim) { return head_dim <= 64 ? 1024 : 2048; }

// `rows` rounded up to whole tiles of `tile` rows.
constexpr long long padded_rows(int rows, int tile) { return (rows + tile - 1ll) / tile * tile; }

// Keys that the band (window_left, window_right, in ForwardParams' non-negative widths) shows query
// row seqlen_q / 2: about the mean over the rows for a causal mask and a sliding window alike.
int middle_row_keys(int seqlen_q, int seqlen_k, int window_left, int window_right) {
  const std::int64_t diagonal = std::int64_t{seqlen_q / 2} + seqlen_k - seqlen_q;
  const std::int64_t first = std::max<std::int64_t>(0, diagonal - window_left);
  const std::int64_t end = std::min<std::int64_t>(seqlen_k, diagonal + window_right + 1);
  return static_cast<int>(std::max<std::int64_t>(0, end - first));
}

// The stride of a dimension of size 1 is never followed; it becomes the extent of the tensor's
// other dimensions, so that any given stride (0, negative, past TMA's 2^40 bytes) is accepted.
// The strides of the first three dimensions go into stride0 .. stride2.
void normalise_unit_strides(const TensorDesc& t, std::int64_t& stride0, std::int64_t& stride1,
                            std::int64_t& stride2) {
  std::int64_t span = 1;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] > 1) span = std::max(span, t.stride[d] * t.shape[d]);
  }
  std::int64_t* strides[] = {&stride0, &stride1, &stride2};
  for (int d = 0; d < 3; ++d) *strides[d] = t.shape[d] == 1 ? span : t.stride[d];
}

// The workspace of a planned call: with a band, the tile queue's counter (tile_scheduler.h); without
// one, the counters and partial results of the split round (split_round.h), planned for the
// device's SMs as the kernel plans it; none where no round splits or the SM count is unknown (the
// kernel, given no workspace, then splits nothing either).
std::size_t workspace_bytes(const sm90::ForwardRecipe& recipe, const sm90::ForwardParams& p) {
  if (p.batch == 0 || p.seqlen_q == 0) return 0;
  if (recipe.local()) return sizeof(int);
  if (p.num_sms == 0 || recipe.split == sm90::SplitPolicy::kNone) return 0;
  const int consumers = recipe.consumer_warpgroups();
  const std::int64_t rows = sm90::tile_rows_per_head(p.seqlen_q, p.nheads, p.nheads_kv, recipe.pack_gqa);
  const std::int64_t num_tiles = (rows + recipe.block_m - 1) / recipe.block_m *
                                 sm90::tile_heads_of(p.nheads, p.nheads_kv, recipe.pack_gqa) * p.batch;
  const sm90::SplitRound plan =
      sm90::SplitRound::plan(static_cast<int>(num_tiles), (p.seqlen_k + recipe.block_n - 1) / recipe.block_n,
                             p.num_sms * sm90::ctas_per_sm(consumers), recipe.split);
  return sm90::SplitWorkspace::bytes(plan, consumers, recipe.head_dim_v);
}

// The scale the kernels multiply scores by: the caller's, else 1 / sqrt(head_dim). A scale of 0
// runs as 2^-100: every finite score's exponent (|s| < 2^70) then rounds exp2 to 1 as 0 does, while
// masked scores stay -inf (0 * -inf would be NaN) and the softmax's max slack, 8 / scale, stays finite.
float kernel_softmax_scale(std::optional<float> scale, int head_dim) {
  const float value = scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))));
  return value == 0.f ? 0x1p-100f : value;
}

// The band in non-negative widths: an unbounded side, and any wider one, becomes the width that
// reaches past every key (seqlen_k on the left, seqlen_q on the right). The band hides nothing when
// each row's reaches back to key 0 (the last row, window_left >= seqlen_k - 1) and on to the last
// key (the first row, window_right >= seqlen_q - 1).
void set_band(bool causal, int window_left, int window_right, int seqlen_q, int seqlen_k, int* left, int* right) {
  const int right_side = causal ? 0 : window_right;
  *left = window_left < 0 ? seqlen_k : std::min(window_left, seqlen_k);
  *right = right_side < 0 ? seqlen_q : std::min(right_side, seqlen_q);
}

}  // namespace

std::optional<int> find_recipe(int head_dim, int head_dim_v, bool local, bool pack_gqa, TileChoice choice) {
  const auto find = [&](TileChoice wanted) -> std::optional<int> {
    for (int i = 0; i < sm90::kNumForwardRecipes; ++i) {
      const sm90::ForwardRecipe& r = kForwardRecipes[i];
      if (!r.fp8 && r.head_dim == head_dim && r.head_dim_v == head_dim_v && r.local() == local &&
          r.pack_gqa == pack_gqa && r.tile_choice == wanted) {
        return i;
      }
    }
    return std::nullopt;
  };
  if (std::optional<int> own = find(choice)) return own;
  return find(sm90::default_tile_choice(local));
}

// The FP8 recipe of the head dims, mask kind and packing (one each; validation accepted only head
// dims that have recipes).
int fp8_recipe(int head_dim, int head_dim_v, bool local, bool pack_gqa) {
  for (int i = 0; i < sm90::kNumForwardRecipes; ++i) {
    const sm90::ForwardRecipe& r = kForwardRecipes[i];
    if (r.fp8 && r.head_dim == head_dim && r.head_dim_v == head_dim_v && r.local() == local &&
        r.pack_gqa == pack_gqa) {
      return i;
    }
  }
  return -1;
}

// Short rows, where the head dim has tiles of its own for them:
// - d = 64 (192-row tiles): unless seqlen_q fills the 192-row tiles to at least 4/5 (a 192-row tile
//   holding 128 queries fills two thirds);
// - else (128-row tiles): where 128-row tiles pad seqlen_q to more than 5/4 of the rows that 64-row
//   tiles pad it to (full 64-row tiles run slower than full 128-row ones): up to 64 queries and
//   from 129 to 192.
TileChoice tile_choice(int head_dim, int head_dim_v, bool local, int seqlen_q, int middle_row_keys) {
  const std::optional<int> short_rows = find_recipe(head_dim, head_dim_v, local, false, TileChoice::kShortRows);
  if (short_rows && kForwardRecipes[*short_rows].tile_choice == TileChoice::kShortRows) {
    const bool few = head_dim <= 64 ? 5ll * seqlen_q < 4 * padded_rows(seqlen_q, 192)
                                    : 4 * padded_rows(seqlen_q, 128) > 5 * padded_rows(seqlen_q, 64);
    if (few) return TileChoice::kShortRows;
    if (head_dim <= 64) return TileChoice::kWideBand;  // d = 64 without a mask: by the rows alone
  }
  return middle_row_keys >= wide_band_keys(head_dim) ? TileChoice::kWideBand : TileChoice::kNarrowBand;
}

bool use_pack_gqa(PackGqa mode, int seqlen_q, int heads_per_kv_head, int tile_rows, int packed_tile_rows) {
  if (mode != PackGqa::kAuto) return mode == PackGqa::kOn;
  const std::int64_t packed = std::int64_t{seqlen_q} * heads_per_kv_head;
  if (heads_per_kv_head == 1 || packed > sm90::kMaxSeqlenSum) return false;
  // The fraction of a query tile's rows that hold queries, the last tile of each head counted.
  const auto fill = [](std::int64_t rows, int tile) {
    return static_cast<double>(rows) / static_cast<double>((rows + tile - 1) / tile * tile);
  };
  return fill(seqlen_q, tile_rows) < 0.9 * fill(packed, packed_tile_rows);
}

namespace {

// A packed (total, ...) tensor viewed with a leading batch dimension (1, total, ...), so that the
// fixed-length plan reads its row and head strides where it reads a batch's.
TensorDesc as_one_batch(const TensorDesc& t) {
  TensorDesc batched = t;
  batched.rank = t.rank + 1;
  batched.shape[0] = 1;
  batched.stride[0] = 0;
  for (int d = 0; d < t.rank && d + 1 < kMaxRank; ++d) {
    batched.shape[d + 1] = t.shape[d];
    batched.stride[d + 1] = t.stride[d];
  }
  return batched;
}

const int* int_data(const std::optional<TensorDesc>& t) { return t ? static_cast<const int*>(t->data) : nullptr; }

// Splits by keys of a variable-length call (ForwardArgs::num_splits = 0) with at most `tiles` query
// tiles of `key_tiles` key tiles each on `ctas` CTAs: none when the tiles fill 4/5 of the CTAs or
// more (or the device is unknown); else as many as the CTAs hold, each split at least
// kMinSplitKeyTiles long (a split pays a Q load, a first GEMM that nothing overlaps, and its share
// of the combine).
int auto_num_splits(std::int64_t tiles, int key_tiles, int ctas) {
  constexpr int kMinSplitKeyTiles = 4;
  if (ctas == 0 || tiles == 0 || 5 * tiles >= 4 * std::int64_t{ctas}) return 1;
  const std::int64_t fill = ctas / tiles, longest = key_tiles / kMinSplitKeyTiles;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>({fill, longest, kMaxSplits})));
}

// The plan of a variable-length call: as a fixed-length call of `batch` sequences of the bounds'
// lengths for the mask kind, whose recipes of the default tile choice have variable-length kernels
// (ForwardRecipe::varlen), packed rows or not as for those lengths; the sequences' tile bound, the
// splits by keys and the workspace (tile list, and the splits' partial results).
ForwardPlan plan_varlen_forward(const ForwardArgs& args, const DeviceFacts& device) {
  // A paged cache's pages (num_pages, page_size, nheads_kv, d) stand in the fixed-length plan as
  // (1, page_size, nheads_kv, d); their shape and strides are set below.
  const bool paged = args.page_table.has_value();
  const auto page_rows = [](TensorDesc t) {
    t.shape[0] = 1;
    return t;
  };
  ForwardArgs as_fixed = args;
  as_fixed.q = as_one_batch(args.q);
  as_fixed.k = paged ? page_rows(args.k) : as_one_batch(args.k);
  as_fixed.v = paged ? page_rows(args.v) : as_one_batch(args.v);
  as_fixed.o = as_one_batch(args.o);
  if (args.lse) as_fixed.lse = as_one_batch(*args.lse);
  as_fixed.cu_seqlens_q = as_fixed.cu_seqlens_k = as_fixed.seqused_q = as_fixed.seqused_k = std::nullopt;
  as_fixed.leftpad_k = std::nullopt;
  as_fixed.page_table = std::nullopt;

  VarlenPlan varlen;
  varlen.batch = static_cast<int>(args.cu_seqlens_q->shape[0] - 1);
  varlen.total_q = args.q.shape[0];
  varlen.total_k = paged ? args.page_table->shape[1] * args.k.shape[1] : args.k.shape[0];
  varlen.max_seqlen_q = static_cast<int>(std::min<std::int64_t>(args.max_seqlen_q, varlen.total_q));
  varlen.max_seqlen_k = static_cast<int>(std::min<std::int64_t>(args.max_seqlen_k, varlen.total_k));
  varlen.cu_seqlens_q = int_data(args.cu_seqlens_q);
  varlen.cu_seqlens_k = int_data(args.cu_seqlens_k);
  varlen.seqused_q = int_data(args.seqused_q);
  varlen.seqused_k = int_data(args.seqused_k);
  varlen.leftpad_k = int_data(args.leftpad_k);
  // The recipe and options as for `batch` sequences of max_seqlen_q queries and max_seqlen_k keys.
  as_fixed.q.shape[0] = as_fixed.k.shape[0] = as_fixed.v.shape[0] = as_fixed.o.shape[0] = varlen.batch;
  as_fixed.q.shape[1] = as_fixed.o.shape[1] = varlen.max_seqlen_q;
  as_fixed.k.shape[1] = as_fixed.v.shape[1] = varlen.max_seqlen_k;
  if (as_fixed.lse) {
    as_fixed.lse->shape[0] = varlen.batch;
    as_fixed.lse->shape[2] = varlen.max_seqlen_q;
  }
  as_fixed.max_seqlen_q = as_fixed.max_seqlen_k = 0;
  as_fixed.pack_gqa = PackGqa::kOff;
  ForwardPlan plan = plan_forward(as_fixed, device);
  // The variable-length recipes of the mask kind and input kind (FP8 or not), unpacked and packed;
  // packing as for the bounds. The FP8 plan above set the descales.
  const sm90::ForwardRecipe& fixed = plan.recipe_of();
  const auto varlen_recipe = [&](bool pack_gqa) {
    for (int i = 0; i < sm90::kNumForwardRecipes; ++i) {
      const sm90::ForwardRecipe& r = kForwardRecipes[i];
      if (r.varlen && r.fp8 == fixed.fp8 && r.head_dim == fixed.head_dim && r.head_dim_v == fixed.head_dim_v &&
          r.local() == fixed.local() && r.pack_gqa == pack_gqa) {
        return i;
      }
    }
    return -1;
  };
  const int unpacked = varlen_recipe(false), packed = varlen_recipe(true);
  const bool pack_gqa = use_pack_gqa(args.pack_gqa, varlen.max_seqlen_q, plan.params.nheads / plan.params.nheads_kv,
                                     kForwardRecipes[unpacked].block_m, kForwardRecipes[packed].block_m);
  plan.recipe = pack_gqa ? packed : unpacked;
  // The strides of the packed tensors as they are (the bounds' lengths above may make a row
  // dimension look like size 1, whose stride the fixed-length plan replaces); batch strides 0:
  // sequence b starts at row cu_seqlens[b], not at a multiple of a batch stride.
  sm90::ForwardParams& p = plan.params;
  const auto packed_strides = [](const TensorDesc& t, std::int64_t& batch, std::int64_t& row, std::int64_t& head) {
    normalise_unit_strides(as_one_batch(t), batch, row, head);
    batch = 0;
  };
  packed_strides(args.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  packed_strides(args.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  if (paged) {
    // The page stride in the batch stride's place (PagedKV).
    normalise_unit_strides(args.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    normalise_unit_strides(args.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
    p.page_table = static_cast<const int*>(args.page_table->data);
    p.page_table_stride = args.page_table->shape[0] > 1 ? args.page_table->stride[0] : 0;
    p.page_size = static_cast<int>(args.k.shape[1]);
    p.num_pages = static_cast<int>(args.k.shape[0]);
    p.max_pages = static_cast<int>(args.page_table->shape[1]);
  } else {
    packed_strides(args.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    packed_strides(args.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  }
  if (args.lse) packed_strides(*args.lse, p.lse_batch_stride, p.lse_head_stride, p.lse_row_stride);

  p.cu_seqlens_q = varlen.cu_seqlens_q;
  p.cu_seqlens_k = varlen.cu_seqlens_k;
  p.seqused_q = varlen.seqused_q;
  p.seqused_k = varlen.seqused_k;
  p.leftpad_k = varlen.leftpad_k;
  p.total_q = static_cast<int>(varlen.total_q);
  p.total_k = static_cast<int>(varlen.total_k);

  const sm90::ForwardRecipe& recipe = plan.recipe_of();
  const std::int64_t rows = sm90::tile_rows_per_head(p.seqlen_q, p.nheads, p.nheads_kv, recipe.pack_gqa);
  varlen.num_tiles_bound = (rows + recipe.block_m - 1) / recipe.block_m *
                           sm90::tile_heads_of(p.nheads, p.nheads_kv, recipe.pack_gqa) * varlen.batch;
  const int key_tiles = static_cast<int>((varlen.max_seqlen_k + recipe.block_n - 1) / recipe.block_n);
  const int ctas = device.num_sms * sm90::ctas_per_sm(recipe.consumer_warpgroups());
  p.num_splits = args.num_splits > 0 ? args.num_splits : auto_num_splits(varlen.num_tiles_bound, key_tiles, ctas);
  if (varlen.num_tiles_bound == 0) {
    varlen.workspace_bytes = 0;
  } else if (p.num_splits > 1) {
    varlen.workspace_bytes = sm90::VarlenSplitPartials::bytes(varlen.batch, p.num_splits, varlen.total_q, p.nheads,
                                                              recipe.head_dim_v);
  } else {
    varlen.workspace_bytes = sm90::VarlenTileList::bytes(varlen.batch);
  }
  plan.workspace_bytes = varlen.workspace_bytes;
  plan.varlen = varlen;
  return plan;
}

}  // namespace

ForwardPlan plan_forward(const ForwardArgs& args, const DeviceFacts& device) {
  if (args.cu_seqlens_q) return plan_varlen_forward(args, device);
  ForwardPlan plan;
  plan.dtype = args.q.dtype;
  sm90::ForwardParams& params = plan.params;
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.o = args.o.data;

  params.batch = static_cast<int>(args.q.shape[0]);
  params.seqlen_q = static_cast<int>(args.q.shape[1]);
  params.nheads = static_cast<int>(args.q.shape[2]);
  params.seqlen_k = static_cast<int>(args.k.shape[1]);
  params.nheads_kv = static_cast<int>(args.k.shape[2]);
  const int head_dim = static_cast<int>(args.q.shape[3]);
  const int head_dim_v = static_cast<int>(args.v.shape[3]);

  normalise_unit_strides(args.q, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
  normalise_unit_strides(args.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  normalise_unit_strides(args.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  normalise_unit_strides(args.o, params.o_batch_stride, params.o_row_stride, params.o_head_stride);
  if (args.lse) {
    params.lse = static_cast<float*>(args.lse->data);
    normalise_unit_strides(*args.lse, params.lse_batch_stride, params.lse_head_stride,
                           params.lse_row_stride);
  }

  params.softmax_scale = kernel_softmax_scale(args.softmax_scale, head_dim);
  params.softcap = args.softcap;

  set_band(args.causal, args.window_left, args.window_right, params.seqlen_q, params.seqlen_k, &params.window_left,
           &params.window_right);
  const bool local = params.window_left < params.seqlen_k - 1 || params.window_right < params.seqlen_q - 1;

  if (args.q.dtype == DType::kFloat8E4M3) {
    // FP8: the head dims' recipe of the mask kind, packed rows as for the others (never with block
    // scales, which validation refused packed), and the scales.
    const bool pack_gqa = !args.q_block_scale &&
                          use_pack_gqa(args.pack_gqa, params.seqlen_q, params.nheads / params.nheads_kv,
                                       kForwardRecipes[fp8_recipe(head_dim, head_dim_v, local, false)].block_m,
                                       kForwardRecipes[fp8_recipe(head_dim, head_dim_v, local, true)].block_m);
    plan.recipe = fp8_recipe(head_dim, head_dim_v, local, pack_gqa);
    const auto descale = [](const std::optional<TensorDesc>& t, const float*& data, std::int64_t& batch_stride,
                            std::int64_t& head_stride) {
      if (!t) return;
      data = static_cast<const float*>(t->data);
      batch_stride = t->shape[0] > 1 ? t->stride[0] : 0;
      head_stride = t->shape[1] > 1 ? t->stride[1] : 0;
    };
    descale(args.q_descale, params.q_descale, params.q_descale_batch_stride, params.q_descale_head_stride);
    descale(args.k_descale, params.k_descale, params.k_descale_batch_stride, params.k_descale_head_stride);
    descale(args.v_descale, params.v_descale, params.v_descale_batch_stride, params.v_descale_head_stride);
    const auto block_scale = [](const std::optional<TensorDesc>& t, sm90::ForwardParams::BlockScales& scales) {
      if (!t) return;
      scales.data = static_cast<const float*>(t->data);
      scales.batch_stride = t->shape[0] > 1 ? t->stride[0] : 0;
      scales.head_stride = t->shape[1] > 1 ? t->stride[1] : 0;
      scales.block_stride = t->shape[2] > 1 ? t->stride[2] : 0;
    };
    block_scale(args.q_block_scale, params.q_block_scale);
    block_scale(args.k_block_scale, params.k_block_scale);
    block_scale(args.v_block_scale, params.v_block_scale);
  } else {
    // Packed rows take the default choice; the unpacked rows' tiles, which packing is weighed
    // against, their own. Validation accepted only head dims that have recipes.
    const TileChoice unpacked_choice =
        tile_choice(head_dim, head_dim_v, local, params.seqlen_q,
                    middle_row_keys(params.seqlen_q, params.seqlen_k, params.window_left, params.window_right));
    const int unpacked = *find_recipe(head_dim, head_dim_v, local, false, unpacked_choice);
    const int packed = *find_recipe(head_dim, head_dim_v, local, true, sm90::default_tile_choice(local));
    const bool pack_gqa = use_pack_gqa(args.pack_gqa, params.seqlen_q, params.nheads / params.nheads_kv,
                                       kForwardRecipes[unpacked].block_m, kForwardRecipes[packed].block_m);
    plan.recipe = pack_gqa ? packed : unpacked;
  }

  params.num_sms = device.num_sms;
  params.l2_bytes = device.l2_bytes;
  plan.workspace_bytes = workspace_bytes(plan.recipe_of(), params);
  return plan;
}

BackwardPlan plan_backward(const BackwardArgs& args) {
  BackwardPlan plan;
  plan.dtype = args.q.dtype;
  sm90::BackwardParams& params = plan.params;
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.o = args.o.data;
  params.dout = args.dout.data;
  params.lse = static_cast<const float*>(args.lse.data);
  params.dq = args.dq.data;
  params.dk = args.dk.data;
  params.dv = args.dv.data;

  // A variable-length batch's tensors read as one batch entry of its packed rows; sequence b starts
  // at row cu_seqlens[b], not at a multiple of a batch stride (0).
  const bool varlen = args.cu_seqlens_q.has_value();
  const auto batched = [&](const TensorDesc& t) { return varlen ? as_one_batch(t) : t; };
  const TensorDesc q = batched(args.q), k = batched(args.k), v = batched(args.v);
  params.nheads = static_cast<int>(q.shape[2]);
  params.nheads_kv = static_cast<int>(k.shape[2]);
  params.head_dim = static_cast<int>(q.shape[3]);
  params.head_dim_v = static_cast<int>(v.shape[3]);
  if (varlen) {
    params.batch = static_cast<int>(args.cu_seqlens_q->shape[0] - 1);
    params.total_q = static_cast<int>(args.q.shape[0]);
    params.total_k = static_cast<int>(args.k.shape[0]);
    params.seqlen_q = std::min(args.max_seqlen_q, params.total_q);
    params.seqlen_k = std::min(args.max_seqlen_k, params.total_k);
    params.cu_seqlens_q = int_data(args.cu_seqlens_q);
    params.cu_seqlens_k = int_data(args.cu_seqlens_k);
    params.seqused_q = int_data(args.seqused_q);
    params.seqused_k = int_data(args.seqused_k);
  } else {
    params.batch = static_cast<int>(q.shape[0]);
    params.seqlen_q = static_cast<int>(q.shape[1]);
    params.seqlen_k = static_cast<int>(k.shape[1]);
  }

  const auto strides = [&](const TensorDesc& t, std::int64_t& batch, std::int64_t& row, std::int64_t& head) {
    normalise_unit_strides(batched(t), batch, row, head);
    if (varlen) batch = 0;
  };
  strides(args.q, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
  strides(args.k, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  strides(args.v, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  strides(args.o, params.o_batch_stride, params.o_row_stride, params.o_head_stride);
  strides(args.dout, params.do_batch_stride, params.do_row_stride, params.do_head_stride);
  strides(args.dq, params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride);
  strides(args.dk, params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride);
  strides(args.dv, params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride);
  strides(args.lse, params.lse_batch_stride, params.lse_head_stride, params.lse_row_stride);

  params.softmax_scale = kernel_softmax_scale(args.softmax_scale, params.head_dim);
  params.softcap = args.softcap;
  set_band(args.causal, args.window_left, args.window_right, params.seqlen_q, params.seqlen_k, &params.window_left,
           &params.window_right);
  params.local = params.window_left < params.seqlen_k - 1 || params.window_right < params.seqlen_q - 1;
  params.deterministic = args.deterministic;

  for (int i = 0; i < sm90::kNumBackwardRecipes; ++i) {
    const sm90::BackwardRecipe& r = sm90::kBackwardRecipes[i];
    if (r.head_dim == params.head_dim && r.head_dim_v == params.head_dim_v && r.local() == params.local) {
      plan.recipe = i;
    }
  }
  plan.workspace = params.batch == 0
                       ? sm90::BackwardWorkspace{}
                       : sm90::BackwardWorkspace::plan(params.batch, params.nheads, params.seqlen_q,
                                                       varlen ? params.total_q : -1, params.head_dim,
                                                       params.deterministic, plan.recipe_of().block_m);
  return plan;
}

sm90::Fp8QuantizeParams plan_quantize_fp8(const QuantizeFp8Args& args) {
  // The stride of a dimension of size 1 is never followed.
  const auto stride = [](const TensorDesc& t, int d) { return t.shape[d] > 1 ? t.stride[d] : 0; };
  sm90::Fp8QuantizeParams p;
  p.x = args.x.data;
  p.x_batch_stride = stride(args.x, 0);
  p.x_row_stride = stride(args.x, 1);
  p.x_head_stride = stride(args.x, 2);
  p.out = args.out.data;
  p.out_batch_stride = stride(args.out, 0);
  p.out_row_stride = stride(args.out, 1);
  p.out_head_stride = stride(args.out, 2);
  p.descale = static_cast<float*>(args.descale.data);
  p.hadamard_signs = args.hadamard_signs ? static_cast<const float*>(args.hadamard_signs->data) : nullptr;
  p.batch = static_cast<int>(args.x.shape[0]);
  p.seqlen = static_cast<int>(args.x.shape[1]);
  p.nheads = static_cast<int>(args.x.shape[2]);
  p.head_dim = static_cast<int>(args.x.shape[3]);
  p.scaling = args.scaling;
  // Every tile reads descale at batch * batch stride + (head / heads_per_group) * group stride +
  // block * block stride (fp8_quantize.h).
  switch (args.scaling) {
    case Fp8Scaling::kPerTensor:
      break;
    case Fp8Scaling::kPerHead:
      p.descale_batch_stride = stride(args.descale, 0);
      p.descale_group_stride = stride(args.descale, 1);
      p.scale_batches = p.batch;
      p.scale_groups = static_cast<int>(args.descale.shape[1]);
      p.heads_per_group = p.nheads / p.scale_groups;
      break;
    case Fp8Scaling::kPerBlock:
      p.descale_batch_stride = stride(args.descale, 0);
      p.descale_group_stride = stride(args.descale, 1);
      p.descale_block_stride = 1;
      break;
  }
  return p;
}

void BackwardPlan::bind_workspace(void* base) {
  char* bytes = static_cast<char*>(base);
  params.lse_log2 = reinterpret_cast<float*>(bytes + workspace.lse_offset);
  params.delta = reinterpret_cast<float*>(bytes + workspace.delta_offset);
  params.dq_accum = reinterpret_cast<float*>(bytes + workspace.dq_accum_offset);
  params.dq_semaphore = params.deterministic ? reinterpret_cast<int*>(bytes + workspace.semaphore_offset) : nullptr;
}

}  // namespace flashhop::detail
