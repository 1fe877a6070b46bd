// Every check on forward and backward arguments, in one place. validate_forward() and validate_backward() read only
// the descriptors (no device calls), so it also serves bindings and tests; the plan (plan.cpp) trusts its verdict.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashhop/flashhop.h"
#include "kernels/sm90/bwd_recipes.h"
#include "kernels/sm90/fp8_quantize.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_recipes.h"

namespace flashhop {
namespace {

// TMA moves tiles only between 16-byte aligned global addresses, so every row start must be one.
constexpr std::int64_t kRowAlignmentBytes = 16;
// LSE is written as plain float32 stores.
constexpr std::int64_t kLseAlignmentBytes = sizeof(float);
// The kernels index sequences and heads with 32-bit integers, and the mask band's bounds, which
// reach past seqlen_q + seqlen_k by up to one query tile (sm90::kMaxSeqlenSum).
constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
using sm90::kMaxSeqlenSum;

template <typename... Parts>
Status fail(StatusCode code, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  return {code, message.str()};
}

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return fail(StatusCode::kInvalidArgument, parts...);
}

// One argument of the call together with the meaning of its dimensions, for error messages.
struct Operand {
  const char* name;
  const TensorDesc& desc;
  const char* const* dim_names;
  int expected_rank;

  std::int64_t dim(int d) const { return desc.shape[d]; }
  bool has_zero_elements() const {
    for (int d = 0; d < expected_rank; ++d) {
      if (desc.shape[d] == 0) return true;
    }
    return false;
  }
};

// "k.shape[2] (nheads_kv)"
std::string dim_label(const Operand& t, int d) {
  std::ostringstream label;
  label << t.name << ".shape[" << d << "] (" << t.dim_names[d] << ")";
  return label.str();
}

// `context` follows the expected dimensions in the message (" with cu_seqlens").
Status check_rank(const Operand& t, const char* context = "") {
  if (t.desc.rank != t.expected_rank) {
    std::ostringstream dims;
    for (int d = 0; d < t.expected_rank; ++d) dims << (d ? ", " : "") << t.dim_names[d];
    return invalid(t.name, ".rank = ", t.desc.rank, ": expected ", t.expected_rank, " (", dims.str(), ")", context);
  }
  return Status::success();
}

Status check_dtype(const Operand& t, DType expected, const char* reason) {
  if (t.desc.dtype != expected) {
    return invalid(t.name, ".dtype = ", dtype_name(t.desc.dtype), ": expected ", dtype_name(expected), " (",
                   reason, ")");
  }
  return Status::success();
}

Status check_nonnegative_dims(const Operand& t) {
  for (int d = 0; d < t.expected_rank; ++d) {
    if (t.dim(d) < 0) return invalid(dim_label(t, d), " = ", t.dim(d), ": expected >= 0");
  }
  return Status::success();
}

Status check_dim_at_least_one(const Operand& t, int d) {
  if (t.dim(d) < 1) return invalid(dim_label(t, d), " = ", t.dim(d), ": expected >= 1");
  return Status::success();
}

Status check_dim_fits_int32(const Operand& t, int d) {
  if (t.dim(d) > kMaxInt32) return invalid(dim_label(t, d), " = ", t.dim(d), ": expected <= ", kMaxInt32);
  return Status::success();
}

// `t.shape[d]` must equal `source.shape[source_d]`, the operand that defines that size.
Status check_dim_matches(const Operand& t, int d, const Operand& source, int source_d) {
  if (t.dim(d) != source.dim(source_d)) {
    return invalid(dim_label(t, d), " = ", t.dim(d), ": expected ", source.dim(source_d), " (",
                   dim_label(source, source_d), ")");
  }
  return Status::success();
}

// TMA addresses global memory with strides below 2^40 bytes.
constexpr std::int64_t kTmaStrideLimitBytes = std::int64_t{1} << 40;

// Last dimension contiguous; every other stride, but those of size-1 dimensions (never stepped
// along; the plan replaces them), positive, a whole number of `alignment_bytes` and below
// `limit_bytes`.
Status check_strides(const Operand& t, std::int64_t alignment_bytes, std::optional<std::int64_t> limit_bytes) {
  const int last = t.expected_rank - 1;
  if (t.desc.stride[last] != 1) {
    return invalid(t.name, ".stride[", last, "] = ", t.desc.stride[last],
                   ": expected 1 (the last dimension must be contiguous)");
  }
  const std::int64_t element_bytes = static_cast<std::int64_t>(dtype_size(t.desc.dtype));
  const std::int64_t multiple = alignment_bytes / element_bytes;
  for (int d = 0; d < last; ++d) {
    const std::int64_t stride = t.desc.stride[d];
    if (t.dim(d) == 1) continue;
    if (stride < 1 || stride % multiple != 0) {
      return invalid(t.name, ".stride[", d, "] = ", stride, ": expected a positive multiple of ", multiple,
                     " elements (", alignment_bytes, "-byte aligned ", dtype_name(t.desc.dtype), " rows)");
    }
    if (limit_bytes && stride >= *limit_bytes / element_bytes) {
      return invalid(t.name, ".stride[", d, "] = ", stride, ": expected below ", *limit_bytes / element_bytes,
                     " elements (2^40 bytes, the TMA's limit)");
    }
  }
  return Status::success();
}

// A null pointer is accepted only for a tensor with nothing to read or write.
Status check_data(const Operand& t, std::int64_t alignment_bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.desc.data);
  if (t.desc.data == nullptr) {
    if (t.has_zero_elements()) return Status::success();
    return invalid(t.name, ".data = null: expected a device pointer (the tensor has elements)");
  }
  if (address % static_cast<std::uintptr_t>(alignment_bytes) != 0) {
    return invalid(t.name, ".data = 0x", std::hex, address, std::dec, ": expected a ", alignment_bytes,
                   "-byte aligned address");
  }
  return Status::success();
}

// `t` on the device of `reference` (q for attention calls).
Status check_same_device(const Operand& t, const Operand& reference) {
  if (t.desc.device != reference.desc.device) {
    return invalid(t.name, ".device = ", t.desc.device, ": expected ", reference.desc.device, " (", reference.name,
                   ".device)");
  }
  return Status::success();
}

// The bytes [begin, end) that a tensor's elements occupy; empty for a tensor without elements.
struct Span {
  unsigned __int128 begin = 0, end = 0;
};

Span span_of(const Operand& t) {
  if (t.has_zero_elements()) return {};
  unsigned __int128 extent = 1;  // in elements; strides are positive where a dimension has size > 1
  for (int d = 0; d < t.expected_rank; ++d) {
    if (t.dim(d) > 1) extent += static_cast<unsigned __int128>(t.dim(d) - 1) * t.desc.stride[d];
  }
  const auto begin = static_cast<unsigned __int128>(reinterpret_cast<std::uintptr_t>(t.desc.data));
  return {begin, begin + extent * dtype_size(t.desc.dtype)};
}

// An output must not share memory with an operand it is computed from or with another output: the
// kernels read the inputs while the outputs are written.
Status check_no_overlap(const Operand& output, const Operand& other) {
  const Span a = span_of(output), b = span_of(other);
  if (a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end) {
    return invalid(output.name, ".data = 0x", std::hex, reinterpret_cast<std::uintptr_t>(output.desc.data),
                   std::dec, ": its memory overlaps ", other.name,
                   "'s; expected an output that shares no memory with the other tensors");
  }
  return Status::success();
}

// Runs the checks in order and keeps the first failure.
class FirstError {
 public:
  FirstError& operator<<(Status status) {
    if (status_.ok()) status_ = std::move(status);
    return *this;
  }
  const Status& status() const { return status_; }

 private:
  Status status_;
};

constexpr const char* kQDims[] = {"batch", "seqlen_q", "nheads", "head_dim"};
constexpr const char* kKDims[] = {"batch", "seqlen_k", "nheads_kv", "head_dim"};
constexpr const char* kVDims[] = {"batch", "seqlen_k", "nheads_kv", "head_dim_v"};
constexpr const char* kODims[] = {"batch", "seqlen_q", "nheads", "head_dim_v"};
constexpr const char* kLseDims[] = {"batch", "nheads", "seqlen_q"};

// The (head_dim, head_dim_v) pairs that have recipes (tools/forward_recipes.py).
bool has_recipe(std::int64_t head_dim, std::int64_t head_dim_v) {
  for (const sm90::ForwardRecipe& recipe : sm90::kForwardRecipes) {
    if (recipe.head_dim == head_dim && recipe.head_dim_v == head_dim_v) return true;
  }
  return false;
}

// "a, b and c", in the recipe table's order, each once.
std::string listed(const std::vector<std::string>& items) {
  std::vector<std::string> unique;
  for (const std::string& item : items) {
    if (std::find(unique.begin(), unique.end(), item) == unique.end()) unique.push_back(item);
  }
  std::string text;
  for (std::size_t i = 0; i < unique.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == unique.size() ? " and " : ", ") + unique[i];
  }
  return text;
}

// q in float16 or bfloat16; k, v and o in q's dtype; LSE, where given, in float32.
Status check_attention_dtypes(const Operand& q, const Operand& k, const Operand& v, const Operand& o,
                              const std::optional<Operand>& lse) {
  const bool fp8 = q.desc.dtype == DType::kFloat8E4M3;
  if (q.desc.dtype != DType::kFloat16 && q.desc.dtype != DType::kBFloat16 && !fp8) {
    return invalid("q.dtype = ", dtype_name(q.desc.dtype), ": expected float16, bfloat16 or float8_e4m3fn");
  }
  FirstError checks;
  checks << check_dtype(k, q.desc.dtype, "the dtype of q") << check_dtype(v, q.desc.dtype, "the dtype of q");
  if (fp8) {
    checks << check_dtype(o, DType::kBFloat16, "FP8 attention writes bfloat16");
  } else {
    checks << check_dtype(o, q.desc.dtype, "the dtype of q");
  }
  if (lse) checks << check_dtype(*lse, DType::kFloat32, "LSE is float32");
  return checks.status();
}

// head_dim and head_dim_v are dimension `d` of q and `v_d` of v (3 in the fixed-length layout, 2
// with cu_seqlens, v's 3 in a paged cache).
Status check_supported_head_dims(const Operand& q, const Operand& v, int d = 3, int v_d = 3) {
  const std::int64_t head_dim = q.dim(d), head_dim_v = v.dim(v_d);
  std::vector<std::string> head_dims, other_dvs, pairs;
  for (const sm90::ForwardRecipe& recipe : sm90::kForwardRecipes) {
    head_dims.push_back(std::to_string(recipe.head_dim));
    if (recipe.head_dim_v == recipe.head_dim) continue;
    pairs.push_back("(" + std::to_string(recipe.head_dim) + ", " + std::to_string(recipe.head_dim_v) + ")");
    if (recipe.head_dim == head_dim) other_dvs.push_back(std::to_string(recipe.head_dim_v));
  }
  if (std::find(head_dims.begin(), head_dims.end(), std::to_string(head_dim)) == head_dims.end()) {
    return fail(StatusCode::kNotSupported, dim_label(q, d), " = ", head_dim, ": supported head dims are ",
                listed(head_dims));
  }
  if (!has_recipe(head_dim, head_dim_v)) {
    return fail(StatusCode::kNotSupported, dim_label(v, d), " = ", head_dim_v, ": expected head_dim (", head_dim, ")",
                other_dvs.empty() ? "" : " or " + listed(other_dvs), "; head_dim_v != head_dim is supported for ",
                listed(pairs), " only");
  }
  return Status::success();
}

Status check_mask_and_softcap(const ForwardArgs& args) {
  if (args.window_left < -1) {
    return invalid("window_left = ", args.window_left, ": expected -1 (unbounded) or a width >= 0");
  }
  if (args.window_right < -1) {
    return invalid("window_right = ", args.window_right, ": expected -1 (unbounded) or a width >= 0");
  }
  if (args.causal && args.window_right > 0) {
    return invalid("window_right = ", args.window_right,
                   ": expected -1 or 0 with causal (causal sees no key to the right of the diagonal)");
  }
  if (!(std::isfinite(args.softcap) && args.softcap >= 0.f)) {
    return invalid("softcap = ", args.softcap, ": expected a finite value >= 0 (0: off)");
  }
  return Status::success();
}

// Whether the query tiles of the smallest height are few enough for the tile schedulers; packing a
// KV group's heads into the rows makes no more of them. The shape's sizes fit int32 here.
bool query_tiles_fit(const Operand& q) {
  const std::int64_t per_batch = (q.dim(1) + sm90::kSmallestBlockM - 1) / sm90::kSmallestBlockM * q.dim(2);
  return q.dim(0) == 0 || per_batch <= sm90::kMaxQueryTiles / q.dim(0);
}

// Packed rows are seqlen_q * (nheads / nheads_kv) per KV head, indexed in 32 bits like sequences.
std::int64_t packed_rows(const Operand& q, const Operand& k) { return q.dim(1) * (q.dim(2) / k.dim(2)); }

// `packed` rows per KV head, named `rows` in the message ("seqlen_q * nheads / nheads_kv").
Status check_pack_gqa(const ForwardArgs& args, std::int64_t packed, const char* rows) {
  switch (args.pack_gqa) {
    case PackGqa::kAuto:
    case PackGqa::kOff:
      return Status::success();
    case PackGqa::kOn:
      if (packed > kMaxSeqlenSum) {
        return invalid("pack_gqa = on: ", rows, " = ", packed, ": expected <= ", kMaxSeqlenSum, " packed query rows");
      }
      return Status::success();
  }
  return invalid("pack_gqa = ", static_cast<int>(args.pack_gqa), ": expected PackGqa::kAuto, kOff or kOn");
}

// `t.shape[0]` is the batch that `cu_seqlens` (batch + 1 offsets) gives, or with `offsets` (t holds
// offsets too) its length.
Status check_batch_matches(const Operand& t, const Operand& cu_seqlens, bool offsets = false) {
  const std::int64_t expected = cu_seqlens.dim(0) - (offsets ? 0 : 1);
  if (t.dim(0) != expected) {
    return invalid(dim_label(t, 0), " = ", t.dim(0), ": expected ", expected, " (", cu_seqlens.name, ".shape[0]",
                   offsets ? ")" : " - 1)");
  }
  return Status::success();
}

// ---- FP8 ---------------------------------------------------------------------------------------

constexpr const char* kDescaleDims[] = {"batch", "nheads_kv"};
constexpr const char* kQBlockScaleDims[] = {"batch", "nheads", "blocks of 128 queries"};
constexpr const char* kKVBlockScaleDims[] = {"batch", "nheads_kv", "blocks of 128 keys"};

// Which calls take FP8: scales only with e4m3 inputs; block scales only in fixed-length batches,
// unpacked.
Status check_fp8_kind(const ForwardArgs& args) {
  const bool fp8 = args.q.dtype == DType::kFloat8E4M3;
  for (const auto& [name, scale] :
       {std::pair{"q_descale", &args.q_descale}, std::pair{"k_descale", &args.k_descale},
        std::pair{"v_descale", &args.v_descale}, std::pair{"q_block_scale", &args.q_block_scale},
        std::pair{"k_block_scale", &args.k_block_scale}, std::pair{"v_block_scale", &args.v_block_scale}}) {
    if (scale->has_value() && !fp8) {
      return invalid(name, " is given with q.dtype = ", dtype_name(args.q.dtype),
                     ": expected scales only with float8_e4m3fn q, k and v");
    }
  }
  if (!fp8) return Status::success();
  const int block_scales = args.q_block_scale.has_value() + args.k_block_scale.has_value() +
                           args.v_block_scale.has_value();
  if (block_scales != 0 && block_scales != 3) {
    return invalid("q_block_scale, k_block_scale and v_block_scale: ", block_scales,
                   " given, expected all three or none");
  }
  if (block_scales == 3 && (args.q_descale || args.k_descale || args.v_descale)) {
    return invalid("descales given with block scales: expected one kind of scaling");
  }
  if (block_scales == 3 && (args.cu_seqlens_q || args.page_table)) {
    return fail(StatusCode::kNotSupported, "block scales with ", args.page_table ? "page_table" : "cu_seqlens_q",
                ": expected q_descale, k_descale and v_descale (block scales are for fixed-length batches)");
  }
  if (args.pack_gqa == PackGqa::kOn && args.q_block_scale) {
    return fail(StatusCode::kNotSupported,
                "pack_gqa = kOn with block scales: expected kAuto or kOff (a packed query tile's rows come from "
                "several heads' query blocks)");
  }
  return Status::success();
}

// The descales of an FP8 call: float32 (batch, nheads_kv), any non-negative strides (0 broadcasts),
// on q's device, read only (not overlapping o or lse). k's dimension k_heads is nheads_kv; a
// variable-length batch's size is cu_seqlens_q's, a fixed-length one's q's dimension 0.
Status check_descales(const ForwardArgs& args, const Operand& q, const Operand& k, int k_heads,
                      const std::optional<Operand>& cu_seqlens_q, const Operand& o,
                      const std::optional<Operand>& lse) {
  FirstError checks;
  for (const auto& [name, descale] : {std::pair{"q_descale", &args.q_descale}, std::pair{"k_descale", &args.k_descale},
                                      std::pair{"v_descale", &args.v_descale}}) {
    if (!descale->has_value()) continue;
    const Operand t{name, **descale, kDescaleDims, 2};
    checks << check_rank(t) << check_dtype(t, DType::kFloat32, "descales are float32");
    if (!checks.status().ok()) return checks.status();
    checks << (cu_seqlens_q ? check_batch_matches(t, *cu_seqlens_q) : check_dim_matches(t, 0, q, 0))
           << check_dim_matches(t, 1, k, k_heads);
    for (int d = 0; d < 2; ++d) {
      if (t.desc.stride[d] < 0) {
        checks << invalid(name, ".stride[", d, "] = ", t.desc.stride[d], ": expected >= 0 (0 broadcasts one value)");
      }
    }
    checks << check_data(t, sizeof(float)) << check_same_device(t, q) << check_no_overlap(o, t);
    if (lse) checks << check_no_overlap(*lse, t);
  }
  if (!checks.status().ok() || !args.q_block_scale) return checks.status();
  // Block scales: a key tile of the FP8 kernels must lie in one block (every head dim but 192).
  if (q.dim(3) == 192) {
    return fail(StatusCode::kNotSupported, dim_label(q, 3),
                " = 192 with block scales: expected another head dim (the FP8 kernels' key tiles of 96 keys "
                "straddle the blocks of 128)");
  }
  const auto blocks = [](std::int64_t rows) { return (rows + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows; };
  for (const auto& [name, scale, rows, heads] :
       {std::tuple{"q_block_scale", &args.q_block_scale, q.dim(1), q.dim(2)},
        std::tuple{"k_block_scale", &args.k_block_scale, k.dim(1), k.dim(2)},
        std::tuple{"v_block_scale", &args.v_block_scale, k.dim(1), k.dim(2)}}) {
    const bool is_q = name[0] == 'q';
    const Operand t{name, **scale, is_q ? kQBlockScaleDims : kKVBlockScaleDims, 3};
    checks << check_rank(t) << check_dtype(t, DType::kFloat32, "scales are float32");
    if (!checks.status().ok()) return checks.status();
    const std::int64_t expected[] = {q.dim(0), heads, blocks(rows)};
    for (int d = 0; d < 3; ++d) {
      if (t.dim(d) != expected[d]) {
        checks << invalid(dim_label(t, d), " = ", t.dim(d), ": expected ", expected[d]);
      }
      if (t.desc.stride[d] < 0) {
        checks << invalid(name, ".stride[", d, "] = ", t.desc.stride[d], ": expected >= 0 (0 broadcasts one value)");
      }
    }
    checks << check_data(t, sizeof(float)) << check_same_device(t, q) << check_no_overlap(o, t);
    if (lse) checks << check_no_overlap(*lse, t);
  }
  return checks.status();
}

// ---- variable-length batches (cu_seqlens) -------------------------------------------------------

constexpr const char* kVarlenQDims[] = {"total_q", "nheads", "head_dim"};
constexpr const char* kVarlenKDims[] = {"total_k", "nheads_kv", "head_dim"};
constexpr const char* kVarlenVDims[] = {"total_k", "nheads_kv", "head_dim_v"};
constexpr const char* kVarlenODims[] = {"total_q", "nheads", "head_dim_v"};
constexpr const char* kVarlenLseDims[] = {"nheads", "total_q"};
constexpr const char* kPagedKDims[] = {"num_pages", "page_size", "nheads_kv", "head_dim"};
constexpr const char* kPagedVDims[] = {"num_pages", "page_size", "nheads_kv", "head_dim_v"};
constexpr const char* kPageTableDims[] = {"batch", "max_pages"};
constexpr const char* kCuSeqlensDims[] = {"batch + 1"};
constexpr const char* kSequsedDims[] = {"batch"};
constexpr const char* kWithCuSeqlens = " with cu_seqlens (a variable-length batch)";
// cu_seqlens and seqused are read as int32 words.
constexpr std::int64_t kIndexAlignmentBytes = sizeof(std::int32_t);

// Which of the variable-length fields may appear together: cu_seqlens_q and cu_seqlens_k both or
// neither, or with a page table cu_seqlens_q and seqused_k without cu_seqlens_k; seqused and
// max_seqlen only with them.
Status check_varlen_fields(const ForwardArgs& args) {
  if (args.page_table) {
    if (!args.cu_seqlens_q) {
      return fail(StatusCode::kNotSupported,
                  "cu_seqlens_q = none with page_table given: expected the queries as a variable-length batch "
                  "(q (total_q, nheads, head_dim); a fixed-length batch's are cu_seqlens_q = 0, seqlen_q, ...)");
    }
    if (args.cu_seqlens_k) {
      return invalid("cu_seqlens_k is given with page_table: expected none (the pages hold each sequence's keys "
                     "from its page_table row, and seqused_k how many)");
    }
    if (!args.seqused_k) {
      return invalid("seqused_k = none with page_table given: expected each sequence's number of keys in the cache");
    }
    return Status::success();
  }
  if (args.cu_seqlens_q.has_value() != args.cu_seqlens_k.has_value()) {
    const char* given = args.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k";
    const char* missing = args.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q";
    return fail(StatusCode::kNotSupported, missing, " = none with ", given,
                " given: expected both or neither (FlashAttention-3's variable length on one side only is not "
                "supported)");
  }
  if (args.cu_seqlens_q) return Status::success();
  if (args.leftpad_k) {
    return fail(StatusCode::kNotSupported, "leftpad_k is given without cu_seqlens_q: expected it only with a "
                "variable-length batch or a KV cache");
  }
  if (args.seqused_q || args.seqused_k) {
    return fail(StatusCode::kNotSupported, args.seqused_q ? "seqused_q" : "seqused_k",
                " is given without cu_seqlens_q and cu_seqlens_k: expected only with them (the fixed-length "
                "kernels read no per-sequence lengths)");
  }
  if (args.max_seqlen_q != 0) {
    return invalid("max_seqlen_q = ", args.max_seqlen_q,
                   ": expected 0 without cu_seqlens_q (q.shape[1] is the fixed-length batch's seqlen_q)");
  }
  if (args.max_seqlen_k != 0) {
    return invalid("max_seqlen_k = ", args.max_seqlen_k,
                   ": expected 0 without cu_seqlens_k (k.shape[1] is the fixed-length batch's seqlen_k)");
  }
  return Status::success();
}

// The caller's bound on the sequences' lengths, cut at the rows there are: no sequence is longer
// than its tensor (a bound past it only costs empty tiles).
std::int64_t effective_max_seqlen(int max_seqlen, std::int64_t total) { return std::min<std::int64_t>(max_seqlen, total); }

Status check_max_seqlen(const char* name, int max_seqlen, const char* cu_seqlens) {
  if (max_seqlen < 1) {
    return invalid(name, " = ", max_seqlen, ": expected >= 1 with ", cu_seqlens,
                   " (a bound on every sequence's length, which sizes the kernels' grid)");
  }
  return Status::success();
}

// A paged cache's page size, against the TMA boxes that gather it (PagedKV in fwd_mainloop.h): a
// box's rows of a swizzle atom (the widest of 128, 64 or 32 bytes that divides a row, as the
// kernels' layouts take it) must fill 128 bytes. 16-bit rows of head dim 96 take 64-byte atoms,
// e4m3 rows of 64 and 192 too, and e4m3 rows of 96 32-byte ones.
Status check_page_size(const Operand& k, const Operand& v) {
  const std::int64_t page_size = k.dim(1);
  for (const Operand* t : {&k, &v}) {
    const std::int64_t row_bytes = t->dim(3) * static_cast<std::int64_t>(dtype_size(t->desc.dtype));
    const std::int64_t atom_bytes = row_bytes % 128 == 0 ? 128 : row_bytes % 64 == 0 ? 64 : 32;
    const std::int64_t rows = 128 / atom_bytes;
    if (page_size % rows != 0) {
      return fail(StatusCode::kNotSupported, dim_label(k, 1), " = ", page_size, ": expected a multiple of ", rows,
                  " with ", dim_label(*t, 3), " = ", t->dim(3), " in ", dtype_name(t->desc.dtype), " (", rows,
                  " rows of its ", atom_bytes, "-byte swizzle atoms fill a TMA box's 128 bytes)");
    }
  }
  return Status::success();
}

Status validate_varlen_forward(const ForwardArgs& args) {
  // With a page table, K and V are the cache's pages, and a sequence's keys (total_k) its capacity.
  const bool paged = args.page_table.has_value();
  const int kv_rank = paged ? 4 : 3;
  const int heads_kv = paged ? 2 : 1;  // the dimension of nheads_kv, then head_dim
  const Operand q{"q", args.q, kVarlenQDims, 3};
  const Operand k{"k", args.k, paged ? kPagedKDims : kVarlenKDims, kv_rank};
  const Operand v{"v", args.v, paged ? kPagedVDims : kVarlenVDims, kv_rank};
  const Operand o{"o", args.o, kVarlenODims, 3};
  const Operand cu_seqlens_q{"cu_seqlens_q", *args.cu_seqlens_q, kCuSeqlensDims, 1};
  std::optional<Operand> lse, seqused_q, seqused_k, cu_seqlens_k, page_table, leftpad_k;
  if (args.lse) lse.emplace(Operand{"lse", *args.lse, kVarlenLseDims, 2});
  if (args.seqused_q) seqused_q.emplace(Operand{"seqused_q", *args.seqused_q, kSequsedDims, 1});
  if (args.seqused_k) seqused_k.emplace(Operand{"seqused_k", *args.seqused_k, kSequsedDims, 1});
  if (args.leftpad_k) leftpad_k.emplace(Operand{"leftpad_k", *args.leftpad_k, kSequsedDims, 1});
  if (args.cu_seqlens_k) cu_seqlens_k.emplace(Operand{"cu_seqlens_k", *args.cu_seqlens_k, kCuSeqlensDims, 1});
  if (paged) page_table.emplace(Operand{"page_table", *args.page_table, kPageTableDims, 2});
  std::vector<const Operand*> indices = {&cu_seqlens_q};
  for (const std::optional<Operand>* t : {&cu_seqlens_k, &seqused_q, &seqused_k, &page_table, &leftpad_k}) {
    if (*t) indices.push_back(&**t);
  }

  FirstError checks;
  // Ranks and dtypes first: the shape and stride checks below index and size by them.
  for (const Operand* t : {&q, &o}) checks << check_rank(*t, kWithCuSeqlens);
  for (const Operand* t : {&k, &v}) checks << check_rank(*t, paged ? " with page_table (a paged KV cache)" : kWithCuSeqlens);
  if (lse) checks << check_rank(*lse, kWithCuSeqlens);
  for (const Operand* t : indices) checks << check_rank(*t);
  if (!checks.status().ok()) return checks.status();

  if (Status status = check_attention_dtypes(q, k, v, o, lse); !status.ok()) return status;
  for (const Operand* t : indices) checks << check_dtype(*t, DType::kInt32, "sequence offsets and lengths are int32");
  if (!checks.status().ok()) return checks.status();

  // Shapes. cu_seqlens_q defines batch; q total_q, nheads and head_dim; k total_k and nheads_kv;
  // v head_dim_v. The offsets are int32, so the totals must be too.
  for (const Operand* t : {&q, &k, &v, &o}) checks << check_nonnegative_dims(*t);
  if (lse) checks << check_nonnegative_dims(*lse);
  for (const Operand* t : indices) checks << check_nonnegative_dims(*t);
  checks << check_dim_at_least_one(cu_seqlens_q, 0) << check_dim_at_least_one(q, 1)
         << check_dim_at_least_one(q, 2) << check_dim_at_least_one(k, heads_kv);
  checks << check_dim_fits_int32(q, 0) << check_dim_fits_int32(q, 1) << check_dim_fits_int32(k, 0)
         << check_dim_fits_int32(k, 1) << check_dim_fits_int32(cu_seqlens_q, 0);
  if (cu_seqlens_k) checks << check_dim_matches(*cu_seqlens_k, 0, cu_seqlens_q, 0);
  if (seqused_q) checks << check_batch_matches(*seqused_q, cu_seqlens_q);
  if (seqused_k) checks << check_batch_matches(*seqused_k, cu_seqlens_q);
  if (leftpad_k) checks << check_batch_matches(*leftpad_k, cu_seqlens_q);
  if (page_table) {
    checks << check_batch_matches(*page_table, cu_seqlens_q) << check_dim_at_least_one(*page_table, 1)
           << check_dim_at_least_one(k, 0) << check_dim_at_least_one(k, 1) << check_dim_fits_int32(*page_table, 1);
    checks << check_dim_matches(v, 1, k, 1);
  }
  checks << check_dim_matches(k, heads_kv + 1, q, 2);
  checks << check_dim_matches(v, 0, k, 0) << check_dim_matches(v, heads_kv, k, heads_kv);
  checks << check_dim_matches(o, 0, q, 0) << check_dim_matches(o, 1, q, 1) << check_dim_matches(o, 2, v, heads_kv + 1);
  if (lse) checks << check_dim_matches(*lse, 0, q, 1) << check_dim_matches(*lse, 1, q, 0);
  if (!checks.status().ok()) return checks.status();
  if (q.dim(1) % k.dim(heads_kv) != 0) {
    return invalid(dim_label(k, heads_kv), " = ", k.dim(heads_kv), ": nheads (", q.dim(1),
                   ") must be a multiple of it");
  }
  if (paged) {
    if (leftpad_k && page_table->dim(1) != 1) {
      return fail(StatusCode::kNotSupported, "leftpad_k with ", dim_label(*page_table, 1), " = ", page_table->dim(1),
                  ": expected one page per sequence (a contiguous cache); a sequence's keys may not start past "
                  "row 0 of paged caches");
    }
    if (Status status = check_page_size(k, v); !status.ok()) return status;
  }
  // Each sequence's keys: at most total_k rows, or its pages' capacity.
  const std::int64_t total_k = paged ? page_table->dim(1) * k.dim(1) : k.dim(0);
  if (paged && total_k > kMaxInt32) {
    return invalid(dim_label(*page_table, 1), " * ", dim_label(k, 1), " = ", total_k,
                   ": expected <= ", kMaxInt32, " (a sequence's keys)");
  }

  // The bounds. The values of cu_seqlens and seqused lie in device memory, which validation does
  // not read: the host checks the bounds' own consistency, the kernels clamp what they read
  // (flashhop.h).
  checks << check_max_seqlen("max_seqlen_q", args.max_seqlen_q, "cu_seqlens_q")
         << check_max_seqlen("max_seqlen_k", args.max_seqlen_k, paged ? "page_table" : "cu_seqlens_k");
  if (!checks.status().ok()) return checks.status();
  const std::int64_t max_q = effective_max_seqlen(args.max_seqlen_q, q.dim(0));
  const std::int64_t max_k = effective_max_seqlen(args.max_seqlen_k, total_k);
  if (max_q + max_k > kMaxSeqlenSum) {
    return invalid("max_seqlen_q + max_seqlen_k (each cut at total_q = ", q.dim(0),
                   paged ? ", a sequence's page capacity = " : ", total_k = ", total_k, ") = ", max_q + max_k,
                   ": expected <= ", kMaxSeqlenSum);
  }
  const std::int64_t batch = cu_seqlens_q.dim(0) - 1;
  // Each query tile runs as num_splits tiles (the plan splits only batches of fewer tiles than SMs).
  const int splits = std::max(args.num_splits, 1);
  const std::int64_t tiles_per_sequence =
      (max_q + sm90::kSmallestBlockM - 1) / sm90::kSmallestBlockM * q.dim(1) * splits;
  if (batch > 0 && tiles_per_sequence > sm90::kMaxQueryTiles / batch) {
    return invalid("cu_seqlens_q.shape[0] - 1 (batch) = ", batch, ", max_seqlen_q = ", max_q, ", nheads ", q.dim(1),
                   ", num_splits = ", splits, ": batch * ceil(max_seqlen_q / ", sm90::kSmallestBlockM,
                   ") * nheads * num_splits query tiles, expected <= ", sm90::kMaxQueryTiles);
  }

  // Memory: strides, pointers, devices. cu_seqlens and seqused are contiguous int32 vectors.
  for (const Operand* t : {&q, &k, &v, &o}) {
    checks << check_strides(*t, kRowAlignmentBytes, kTmaStrideLimitBytes) << check_data(*t, kRowAlignmentBytes);
  }
  if (lse) checks << check_strides(*lse, kLseAlignmentBytes, std::nullopt) << check_data(*lse, kLseAlignmentBytes);
  for (const Operand* t : indices) {
    checks << check_strides(*t, kIndexAlignmentBytes, std::nullopt) << check_data(*t, kIndexAlignmentBytes);
  }
  std::vector<const Operand*> read = {&q, &k, &v};
  read.insert(read.end(), indices.begin(), indices.end());
  for (const Operand* input : read) checks << check_no_overlap(o, *input);
  if (lse) {
    for (const Operand* input : read) checks << check_no_overlap(*lse, *input);
    checks << check_no_overlap(*lse, o);
  }
  if (args.q.device < 0) checks << invalid("q.device = ", args.q.device, ": expected a CUDA device ordinal >= 0");
  checks << check_same_device(k, q) << check_same_device(v, q) << check_same_device(o, q);
  if (lse) checks << check_same_device(*lse, q);
  for (const Operand* t : indices) checks << check_same_device(*t, q);
  if (!checks.status().ok()) return checks.status();

  if (args.softmax_scale && !(std::isfinite(*args.softmax_scale) && *args.softmax_scale >= 0.f)) {
    return invalid("softmax_scale = ", *args.softmax_scale,
                   ": expected a finite value >= 0 (or none for 1/sqrt(head_dim))");
  }
  if (Status status = check_mask_and_softcap(args); !status.ok()) return status;
  if (Status status = check_pack_gqa(args, max_q * (q.dim(1) / k.dim(heads_kv)), "max_seqlen_q * nheads / nheads_kv");
      !status.ok()) {
    return status;
  }
  if (Status status = check_descales(args, q, k, heads_kv, cu_seqlens_q, o, lse); !status.ok()) return status;
  return check_supported_head_dims(q, v, 2, heads_kv + 1);
}

}  // namespace

Status validate_forward(const ForwardArgs& args) {
  if (Status status = check_varlen_fields(args); !status.ok()) return status;
  if (args.num_splits < 0 || args.num_splits > kMaxSplits) {
    return invalid("num_splits = ", args.num_splits, ": expected 0 (the library chooses) to ", kMaxSplits);
  }
  if (Status status = check_fp8_kind(args); !status.ok()) return status;
  if (args.cu_seqlens_q) return validate_varlen_forward(args);
  if (args.num_splits > 1) {
    return fail(StatusCode::kNotSupported, "num_splits = ", args.num_splits,
                " without cu_seqlens_q: expected 0 or 1 (a fixed-length call splits its last round of tiles by keys "
                "itself; num_splits applies to variable-length and paged calls)");
  }

  const Operand q{"q", args.q, kQDims, 4};
  const Operand k{"k", args.k, kKDims, 4};
  const Operand v{"v", args.v, kVDims, 4};
  const Operand o{"o", args.o, kODims, 4};
  std::optional<Operand> lse;
  if (args.lse) lse.emplace(Operand{"lse", *args.lse, kLseDims, 3});

  FirstError checks;
  // Ranks and dtypes first: the shape and stride checks below index and size by them.
  checks << check_rank(q) << check_rank(k) << check_rank(v) << check_rank(o);
  if (lse) checks << check_rank(*lse);
  if (!checks.status().ok()) return checks.status();

  if (Status status = check_attention_dtypes(q, k, v, o, lse); !status.ok()) return status;

  // Shapes. q defines batch, seqlen_q, nheads and head_dim; k defines seqlen_k and nheads_kv;
  // v defines head_dim_v.
  checks << check_nonnegative_dims(q) << check_nonnegative_dims(k) << check_nonnegative_dims(v)
         << check_nonnegative_dims(o);
  checks << check_dim_at_least_one(q, 2) << check_dim_at_least_one(q, 3)
         << check_dim_at_least_one(k, 2);
  checks << check_dim_fits_int32(q, 0) << check_dim_fits_int32(q, 1) << check_dim_fits_int32(q, 2)
         << check_dim_fits_int32(k, 1) << check_dim_fits_int32(k, 2);
  checks << check_dim_matches(k, 0, q, 0) << check_dim_matches(k, 3, q, 3);
  checks << check_dim_matches(v, 0, q, 0) << check_dim_matches(v, 1, k, 1) << check_dim_matches(v, 2, k, 2);
  checks << check_dim_matches(o, 0, q, 0) << check_dim_matches(o, 1, q, 1) << check_dim_matches(o, 2, q, 2)
         << check_dim_matches(o, 3, v, 3);
  if (lse) {
    checks << check_nonnegative_dims(*lse) << check_dim_matches(*lse, 0, q, 0) << check_dim_matches(*lse, 1, q, 2)
           << check_dim_matches(*lse, 2, q, 1);
  }
  if (!checks.status().ok()) return checks.status();
  // The kernels compute mask bounds up to seqlen_q + seqlen_k plus a query tile in 32 bits.
  if (q.dim(1) + k.dim(1) > kMaxSeqlenSum) {
    return invalid("q.shape[1] + k.shape[1] (seqlen_q + seqlen_k) = ", q.dim(1) + k.dim(1), ": expected <= ",
                   kMaxSeqlenSum);
  }
  if (q.dim(2) % k.dim(2) != 0) {
    return invalid(dim_label(k, 2), " = ", k.dim(2), ": nheads (", q.dim(2), ") must be a multiple of it");
  }
  if (!query_tiles_fit(q)) {
    return invalid("q.shape (batch ", q.dim(0), ", seqlen_q ", q.dim(1), ", nheads ", q.dim(2),
                   "): batch * ceil(seqlen_q / ", sm90::kSmallestBlockM, ") * nheads query tiles, expected <= ",
                   sm90::kMaxQueryTiles);
  }

  // Memory: strides, pointers, devices.
  for (const Operand* t : {&q, &k, &v, &o}) {
    checks << check_strides(*t, kRowAlignmentBytes, kTmaStrideLimitBytes) << check_data(*t, kRowAlignmentBytes);
  }
  if (lse) checks << check_strides(*lse, kLseAlignmentBytes, std::nullopt) << check_data(*lse, kLseAlignmentBytes);
  checks << check_no_overlap(o, q) << check_no_overlap(o, k) << check_no_overlap(o, v);
  if (lse) checks << check_no_overlap(*lse, q) << check_no_overlap(*lse, k) << check_no_overlap(*lse, v)
                  << check_no_overlap(*lse, o);
  if (args.q.device < 0) checks << invalid("q.device = ", args.q.device, ": expected a CUDA device ordinal >= 0");
  checks << check_same_device(k, q) << check_same_device(v, q) << check_same_device(o, q);
  if (lse) checks << check_same_device(*lse, q);
  if (!checks.status().ok()) return checks.status();

  // The online softmax subtracts the running max of the raw scores, which bounds exp() only for a
  // non-negative scale.
  if (args.softmax_scale && !(std::isfinite(*args.softmax_scale) && *args.softmax_scale >= 0.f)) {
    return invalid("softmax_scale = ", *args.softmax_scale,
                   ": expected a finite value >= 0 (or none for 1/sqrt(head_dim))");
  }
  if (Status status = check_mask_and_softcap(args); !status.ok()) return status;
  if (Status status = check_pack_gqa(args, packed_rows(q, k), "seqlen_q * nheads / nheads_kv"); !status.ok()) {
    return status;
  }
  if (Status status = check_descales(args, q, k, 2, std::nullopt, o, lse); !status.ok()) return status;
  return check_supported_head_dims(q, v);
}

namespace {

// The (head_dim, head_dim_v) pairs that have backward recipes (tools/backward_recipes.py), listed.
// `d`: the head dim's dimension (3, or 2 in the variable-length layout).
Status check_backward_head_dims(const Operand& q, const Operand& v, int d) {
  std::vector<std::string> pairs;
  for (const sm90::BackwardRecipe& recipe : sm90::kBackwardRecipes) {
    if (recipe.head_dim == q.dim(d) && recipe.head_dim_v == v.dim(d)) return Status::success();
    pairs.push_back(recipe.head_dim == recipe.head_dim_v ? std::to_string(recipe.head_dim)
                                                         : "(" + std::to_string(recipe.head_dim) + ", " +
                                                               std::to_string(recipe.head_dim_v) + ")");
  }
  return fail(StatusCode::kNotSupported, dim_label(q, d), " = ", q.dim(d), ", ", dim_label(v, d), " = ", v.dim(d),
              ": the backward pass supports head dims ", listed(pairs));
}

}  // namespace

Status validate_backward(const BackwardArgs& args) {
  // The forward call's arguments obey the forward's rules.
  ForwardArgs forward;
  forward.q = args.q;
  forward.k = args.k;
  forward.v = args.v;
  forward.o = args.o;
  forward.lse = args.lse;
  forward.softmax_scale = args.softmax_scale;
  forward.causal = args.causal;
  forward.window_left = args.window_left;
  forward.window_right = args.window_right;
  forward.softcap = args.softcap;
  forward.cu_seqlens_q = args.cu_seqlens_q;
  forward.cu_seqlens_k = args.cu_seqlens_k;
  forward.seqused_q = args.seqused_q;
  forward.seqused_k = args.seqused_k;
  forward.max_seqlen_q = args.max_seqlen_q;
  forward.max_seqlen_k = args.max_seqlen_k;
  if (Status status = validate_forward(forward); !status.ok()) return status;

  const bool varlen = args.cu_seqlens_q.has_value();
  const int rank = varlen ? 3 : 4;
  const Operand q{"q", args.q, varlen ? kVarlenQDims : kQDims, rank};
  const Operand k{"k", args.k, varlen ? kVarlenKDims : kKDims, rank};
  const Operand v{"v", args.v, varlen ? kVarlenVDims : kVDims, rank};
  const Operand o{"o", args.o, varlen ? kVarlenODims : kODims, rank};
  const Operand lse{"lse", args.lse, varlen ? kVarlenLseDims : kLseDims, rank - 1};
  const Operand dout{"dout", args.dout, o.dim_names, rank};
  const Operand dq{"dq", args.dq, q.dim_names, rank};
  const Operand dk{"dk", args.dk, k.dim_names, rank};
  const Operand dv{"dv", args.dv, v.dim_names, rank};
  const std::pair<const Operand*, const Operand*> like[] = {{&dout, &o}, {&dq, &q}, {&dk, &k}, {&dv, &v}};
  std::vector<const Operand*> read = {&q, &k, &v, &o, &lse, &dout};
  std::optional<Operand> indices[4];
  const std::pair<const char*, const std::optional<TensorDesc>*> index_args[] = {
      {"cu_seqlens_q", &args.cu_seqlens_q},
      {"cu_seqlens_k", &args.cu_seqlens_k},
      {"seqused_q", &args.seqused_q},
      {"seqused_k", &args.seqused_k}};
  for (int i = 0; i < 4; ++i) {
    const auto& [name, desc] = index_args[i];
    if (*desc) read.push_back(&indices[i].emplace(Operand{name, **desc, i < 2 ? kCuSeqlensDims : kSequsedDims, 1}));
  }

  FirstError checks;
  for (const auto& [t, source] : like) checks << check_rank(*t, varlen ? kWithCuSeqlens : "");
  if (!checks.status().ok()) return checks.status();
  for (const auto& [t, source] : like) checks << check_dtype(*t, args.q.dtype, "the dtype of q");
  for (const auto& [t, source] : like) {
    for (int d = 0; d < rank; ++d) checks << check_dim_matches(*t, d, *source, d);
  }
  if (!checks.status().ok()) return checks.status();
  // The key tiles' CTAs are numbered in 32 bits, as the query tiles are.
  if (varlen) {
    const std::int64_t batch = args.cu_seqlens_q->shape[0] - 1;
    const std::int64_t max_k = effective_max_seqlen(args.max_seqlen_k, k.dim(0));
    const std::int64_t per_sequence = (max_k + sm90::kSmallestBlockM - 1) / sm90::kSmallestBlockM * k.dim(1);
    if (batch > 0 && per_sequence > sm90::kMaxQueryTiles / batch) {
      return invalid("cu_seqlens_q.shape[0] - 1 (batch) = ", batch, ", max_seqlen_k = ", max_k, ", nheads_kv ",
                     k.dim(1), ": batch * ceil(max_seqlen_k / ", sm90::kSmallestBlockM,
                     ") * nheads_kv key tiles, expected <= ", sm90::kMaxQueryTiles);
    }
  } else if (!query_tiles_fit(k)) {
    return invalid("k.shape (batch ", k.dim(0), ", seqlen_k ", k.dim(1), ", nheads_kv ", k.dim(2),
                   "): batch * ceil(seqlen_k / ", sm90::kSmallestBlockM, ") * nheads_kv key tiles, expected <= ",
                   sm90::kMaxQueryTiles);
  }

  for (const auto& [t, source] : like) {
    checks << check_strides(*t, kRowAlignmentBytes, kTmaStrideLimitBytes) << check_data(*t, kRowAlignmentBytes)
           << check_same_device(*t, q);
  }
  for (const Operand* output : {&dq, &dk, &dv}) {
    for (const Operand* other : read) checks << check_no_overlap(*output, *other);
    for (const Operand* other : {&dq, &dk, &dv}) {
      if (other != output) checks << check_no_overlap(*output, *other);
    }
  }
  if (!checks.status().ok()) return checks.status();
  return check_backward_head_dims(q, v, rank - 1);
}

namespace {

constexpr const char* kOutPartialDims[] = {"num_splits", "rows", "nheads", "head_dim_v"};
constexpr const char* kLsePartialDims[] = {"num_splits", "rows", "nheads"};
constexpr const char* kCombineOutDims[] = {"rows", "nheads", "head_dim_v"};
constexpr const char* kCombineLseDims[] = {"nheads", "rows"};

// Strides in elements that the combine kernel follows in 64 bits: any positive stride, the last
// dimension contiguous (element alignment only).
Status check_combine_strides(const Operand& t) {
  return check_strides(t, static_cast<std::int64_t>(dtype_size(t.desc.dtype)), std::nullopt);
}

}  // namespace

Status validate_combine(const CombineArgs& args) {
  const Operand out_partial{"out_partial", args.out_partial, kOutPartialDims, 4};
  const Operand lse_partial{"lse_partial", args.lse_partial, kLsePartialDims, 3};
  const Operand out{"out", args.out, kCombineOutDims, 3};
  std::optional<Operand> lse;
  if (args.lse) lse.emplace(Operand{"lse", *args.lse, kCombineLseDims, 2});

  FirstError checks;
  checks << check_rank(out_partial) << check_rank(lse_partial) << check_rank(out);
  if (lse) checks << check_rank(*lse);
  if (!checks.status().ok()) return checks.status();
  checks << check_dtype(out_partial, DType::kFloat32, "partial results are float32")
         << check_dtype(lse_partial, DType::kFloat32, "partial results are float32");
  if (lse) checks << check_dtype(*lse, DType::kFloat32, "LSE is float32");
  if (out.desc.dtype != DType::kBFloat16 && out.desc.dtype != DType::kFloat16 && out.desc.dtype != DType::kFloat32) {
    checks << invalid("out.dtype = ", dtype_name(out.desc.dtype), ": expected bfloat16, float16 or float32");
  }
  if (!checks.status().ok()) return checks.status();

  checks << check_nonnegative_dims(out_partial) << check_dim_at_least_one(out_partial, 0)
         << check_dim_fits_int32(out_partial, 0) << check_dim_fits_int32(out_partial, 1)
         << check_dim_fits_int32(out_partial, 2);
  if (out_partial.dim(3) < 1 || out_partial.dim(3) > sm90::kMaxCombineHeadDim) {
    checks << invalid(dim_label(out_partial, 3), " = ", out_partial.dim(3), ": expected 1 to ",
                      sm90::kMaxCombineHeadDim);
  }
  for (int d = 0; d < 3; ++d) checks << check_dim_matches(lse_partial, d, out_partial, d);
  for (int d = 0; d < 3; ++d) checks << check_dim_matches(out, d, out_partial, d + 1);
  if (lse) checks << check_dim_matches(*lse, 0, out_partial, 2) << check_dim_matches(*lse, 1, out_partial, 1);
  if (!checks.status().ok()) return checks.status();

  std::vector<const Operand*> all = {&out_partial, &lse_partial, &out};
  if (lse) all.push_back(&*lse);
  for (const Operand* t : all) {
    checks << check_combine_strides(*t) << check_data(*t, static_cast<std::int64_t>(dtype_size(t->desc.dtype)))
           << check_same_device(*t, out_partial);
  }
  for (const Operand* other : {&out_partial, &lse_partial}) checks << check_no_overlap(out, *other);
  if (lse) {
    for (const Operand* other : {&out_partial, &lse_partial, &out}) checks << check_no_overlap(*lse, *other);
  }
  return checks.status();
}

namespace {

constexpr const char* kNewKDims[] = {"total_new", "nheads_kv", "head_dim"};
constexpr const char* kNewVDims[] = {"total_new", "nheads_kv", "head_dim_v"};
constexpr const char* kRotaryDims[] = {"seqlen_ro", "rotary_dim / 2"};

}  // namespace

Status validate_append_kv(const AppendKvArgs& args) {
  const Operand k_cache{"k_cache", args.k_cache, kPagedKDims, 4};
  const Operand v_cache{"v_cache", args.v_cache, kPagedVDims, 4};
  const Operand page_table{"page_table", args.page_table, kPageTableDims, 2};
  const Operand cache_seqlens{"cache_seqlens", args.cache_seqlens, kSequsedDims, 1};
  const Operand k_new{"k", args.k_new, kNewKDims, 3};
  const Operand v_new{"v", args.v_new, kNewVDims, 3};
  const Operand cu_seqlens_new{"cu_seqlens_new", args.cu_seqlens_new, kCuSeqlensDims, 1};
  std::optional<Operand> cos, sin, rotary_seqlens, q, q_rotated, cu_seqlens_q;
  if (args.rotary_cos) cos.emplace(Operand{"rotary_cos", *args.rotary_cos, kRotaryDims, 2});
  if (args.rotary_sin) sin.emplace(Operand{"rotary_sin", *args.rotary_sin, kRotaryDims, 2});
  if (args.rotary_seqlens) rotary_seqlens.emplace(Operand{"rotary_seqlens", *args.rotary_seqlens, kSequsedDims, 1});
  if (args.q) q.emplace(Operand{"q", *args.q, kVarlenQDims, 3});
  if (args.q_rotated) q_rotated.emplace(Operand{"q_rotated", *args.q_rotated, kVarlenQDims, 3});
  if (args.cu_seqlens_q) cu_seqlens_q.emplace(Operand{"cu_seqlens_q", *args.cu_seqlens_q, kCuSeqlensDims, 1});

  if (cos.has_value() != sin.has_value()) {
    return invalid(cos ? "rotary_sin = none with rotary_cos given" : "rotary_cos = none with rotary_sin given",
                   ": expected both tables or neither");
  }
  if (q.has_value() != q_rotated.has_value() || q.has_value() != cu_seqlens_q.has_value()) {
    return invalid("q, q_rotated and cu_seqlens_q: expected all three or none");
  }
  if (q && !cos) {
    return invalid("q is given without rotary_cos and rotary_sin: expected q only with the rotary embedding");
  }
  if (rotary_seqlens && !cos) {
    return invalid("rotary_seqlens is given without rotary_cos and rotary_sin: expected it only with them");
  }

  std::vector<const Operand*> all = {&k_cache, &v_cache, &page_table, &cache_seqlens, &k_new, &v_new, &cu_seqlens_new};
  for (const std::optional<Operand>* t : {&cos, &sin, &rotary_seqlens, &q, &q_rotated, &cu_seqlens_q}) {
    if (t->has_value()) all.push_back(&**t);
  }
  FirstError checks;
  for (const Operand* t : all) checks << check_rank(*t);
  if (!checks.status().ok()) return checks.status();
  const DType dtype = k_cache.desc.dtype;
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16 && dtype != DType::kFloat8E4M3) {
    return invalid("k_cache.dtype = ", dtype_name(dtype), ": expected float16, bfloat16 or float8_e4m3fn");
  }
  // e4m3 rows are appended as they are: rotating them would need their scales and a new rounding.
  if (dtype == DType::kFloat8E4M3 && cos) {
    return fail(StatusCode::kNotSupported, "rotary_cos with k_cache.dtype = float8_e4m3fn: expected the rotary "
                "embedding applied before quantizing (an FP8 cache takes new rows as they are)");
  }
  for (const Operand* t : all) {
    const bool index = t == &page_table || t == &cache_seqlens || t == &cu_seqlens_new ||
                       (rotary_seqlens && t == &*rotary_seqlens) || (cu_seqlens_q && t == &*cu_seqlens_q);
    checks << (index ? check_dtype(*t, DType::kInt32, "an index tensor")
                     : check_dtype(*t, k_cache.desc.dtype, "the dtype of k_cache"));
  }
  if (!checks.status().ok()) return checks.status();

  for (const Operand* t : all) checks << check_nonnegative_dims(*t);
  checks << check_dim_at_least_one(cu_seqlens_new, 0) << check_dim_at_least_one(k_cache, 0)
         << check_dim_at_least_one(k_cache, 1) << check_dim_at_least_one(k_cache, 2)
         << check_dim_at_least_one(k_cache, 3) << check_dim_at_least_one(page_table, 1);
  for (int d = 0; d < 3; ++d) checks << check_dim_matches(v_cache, d, k_cache, d);
  checks << check_dim_matches(k_new, 1, k_cache, 2) << check_dim_matches(k_new, 2, k_cache, 3)
         << check_dim_matches(v_new, 0, k_new, 0) << check_dim_matches(v_new, 1, k_cache, 2)
         << check_dim_matches(v_new, 2, v_cache, 3);
  checks << check_batch_matches(page_table, cu_seqlens_new) << check_batch_matches(cache_seqlens, cu_seqlens_new);
  if (rotary_seqlens) checks << check_batch_matches(*rotary_seqlens, cu_seqlens_new);
  if (cos) {
    checks << check_dim_matches(*sin, 0, *cos, 0) << check_dim_matches(*sin, 1, *cos, 1)
           << check_dim_at_least_one(*cos, 1);
    if (2 * cos->dim(1) > k_cache.dim(3)) {
      checks << invalid(dim_label(*cos, 1), " = ", cos->dim(1), ": expected rotary_dim = 2 x it <= head_dim (",
                        k_cache.dim(3), ")");
    }
  }
  if (q) {
    checks << check_dim_matches(*q, 2, k_cache, 3) << check_batch_matches(*cu_seqlens_q, cu_seqlens_new, /*offsets=*/true);
    for (int d = 0; d < 3; ++d) checks << check_dim_matches(*q_rotated, d, *q, d);
    if (q->dim(1) % k_cache.dim(2) != 0) {
      checks << invalid(dim_label(*q, 1), " = ", q->dim(1), ": expected a multiple of k_cache.shape[2] (nheads_kv) = ",
                        k_cache.dim(2));
    }
  }
  for (const Operand* t : all) {
    for (int d = 0; d < t->expected_rank; ++d) checks << check_dim_fits_int32(*t, d);
  }
  if (!checks.status().ok()) return checks.status();
  if (page_table.dim(1) * k_cache.dim(1) > kMaxInt32) {
    return invalid(dim_label(page_table, 1), " * ", dim_label(k_cache, 1), " = ", page_table.dim(1) * k_cache.dim(1),
                   ": expected <= ", kMaxInt32, " keys per sequence");
  }

  for (const Operand* t : all) {
    const auto element = static_cast<std::int64_t>(dtype_size(t->desc.dtype));
    checks << check_strides(*t, element, std::nullopt) << check_data(*t, element) << check_same_device(*t, k_cache);
  }
  std::vector<const Operand*> written = {&k_cache, &v_cache};
  if (q_rotated) written.push_back(&*q_rotated);
  // k_cache and v_cache may be interleaved views of one buffer (their elements never alias).
  for (const Operand* output : written) {
    for (const Operand* other : all) {
      const bool caches = (output == &k_cache && other == &v_cache) || (output == &v_cache && other == &k_cache);
      if (other != output && !caches) checks << check_no_overlap(*output, *other);
    }
  }
  return checks.status();
}

namespace {

constexpr const char* kQuantizeDims[] = {"batch", "seqlen", "nheads", "head_dim"};
constexpr const char* kPerTensorDescaleDims[] = {"scale"};
constexpr const char* kPerHeadDescaleDims[] = {"batch", "groups"};
constexpr const char* kPerBlockDescaleDims[] = {"batch", "nheads", "num_blocks"};
constexpr const char* kHadamardSignsDims[] = {"head_dim"};

// descale's dimensions, and the words that follow its expected rank in a message, for `scaling`.
struct DescaleLayout {
  const char* const* dim_names;
  int rank;
  const char* context;
};

std::optional<DescaleLayout> descale_layout(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      return DescaleLayout{kPerTensorDescaleDims, 1, " with per-tensor scaling"};
    case Fp8Scaling::kPerHead:
      return DescaleLayout{kPerHeadDescaleDims, 2, " with per-head scaling"};
    case Fp8Scaling::kPerBlock:
      return DescaleLayout{kPerBlockDescaleDims, 3, " with per-block scaling"};
  }
  return std::nullopt;
}

// descale's sizes for `scaling`, against x (batch, seqlen, nheads, head_dim).
Status check_descale_shape(const Operand& descale, const Operand& x, Fp8Scaling scaling, const char* context) {
  FirstError checks;
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      if (descale.dim(0) != 1) return invalid(dim_label(descale, 0), " = ", descale.dim(0), ": expected 1", context);
      break;
    case Fp8Scaling::kPerHead:
      checks << check_dim_matches(descale, 0, x, 0) << check_dim_at_least_one(descale, 1);
      if (!checks.status().ok()) return checks.status();
      if (x.dim(2) % descale.dim(1) != 0) {
        return invalid(dim_label(descale, 1), " = ", descale.dim(1), ": nheads (", x.dim(2),
                       ") must be a multiple of it");
      }
      break;
    case Fp8Scaling::kPerBlock: {
      checks << check_dim_matches(descale, 0, x, 0) << check_dim_matches(descale, 1, x, 2);
      const std::int64_t blocks = (x.dim(1) + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows;
      if (descale.dim(2) != blocks) {
        checks << invalid(dim_label(descale, 2), " = ", descale.dim(2), ": expected ", blocks, " (ceil(",
                          dim_label(x, 1), " / ", kFp8ScaleBlockRows, "))");
      }
      break;
    }
  }
  return checks.status();
}

}  // namespace

Status validate_quantize_fp8(const QuantizeFp8Args& args) {
  const std::optional<DescaleLayout> layout = descale_layout(args.scaling);
  if (!layout) {
    return invalid("scaling = ", static_cast<int>(args.scaling),
                   ": expected Fp8Scaling::kPerTensor, kPerHead or kPerBlock");
  }
  const Operand x{"x", args.x, kQuantizeDims, 4};
  const Operand out{"out", args.out, kQuantizeDims, 4};
  const Operand descale{"descale", args.descale, layout->dim_names, layout->rank};
  std::optional<Operand> signs;
  if (args.hadamard_signs) signs.emplace(Operand{"hadamard_signs", *args.hadamard_signs, kHadamardSignsDims, 1});

  // Ranks and dtypes first: the shape and stride checks below index and size by them.
  FirstError checks;
  checks << check_rank(x) << check_rank(out) << check_rank(descale, layout->context);
  if (signs) checks << check_rank(*signs);
  if (!checks.status().ok()) return checks.status();
  if (x.desc.dtype != DType::kFloat16 && x.desc.dtype != DType::kBFloat16) {
    return invalid("x.dtype = ", dtype_name(x.desc.dtype), ": expected float16 or bfloat16");
  }
  checks << check_dtype(out, DType::kFloat8E4M3, "the quantized values")
         << check_dtype(descale, DType::kFloat32, "descale is float32");
  if (signs) checks << check_dtype(*signs, DType::kFloat32, "hadamard_signs is float32");
  if (!checks.status().ok()) return checks.status();

  // Shapes. x defines every size; the kernels index rows, heads and batches in 32 bits and run one
  // CTA per tile of kFp8ScaleBlockRows rows of a head.
  checks << check_nonnegative_dims(x) << check_nonnegative_dims(out) << check_nonnegative_dims(descale);
  if (signs) checks << check_nonnegative_dims(*signs);
  if (!checks.status().ok()) return checks.status();
  std::vector<std::string> head_dims;
  for (int head_dim : sm90::kFp8QuantizeHeadDims) head_dims.push_back(std::to_string(head_dim));
  if (std::find(head_dims.begin(), head_dims.end(), std::to_string(x.dim(3))) == head_dims.end()) {
    return fail(StatusCode::kNotSupported, dim_label(x, 3), " = ", x.dim(3), ": supported head dims are ",
                listed(head_dims));
  }
  for (int d = 0; d < 3; ++d) checks << check_dim_fits_int32(x, d);
  for (int d = 0; d < 4; ++d) checks << check_dim_matches(out, d, x, d);
  checks << check_descale_shape(descale, x, args.scaling, layout->context);
  if (signs) checks << check_dim_matches(*signs, 0, x, 3);
  if (!checks.status().ok()) return checks.status();
  const std::int64_t tiles_per_batch = (x.dim(1) + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows * x.dim(2);
  if (x.dim(0) > 0 && tiles_per_batch > kMaxInt32 / x.dim(0)) {
    return invalid("x.shape (batch ", x.dim(0), ", seqlen ", x.dim(1), ", nheads ", x.dim(2), "): batch * ceil(seqlen / ",
                   kFp8ScaleBlockRows, ") * nheads tiles, expected <= ", kMaxInt32);
  }

  // Memory: 16-byte rows of x and out (the kernels' vector loads and stores), float descale and signs.
  for (const Operand* t : {&x, &out}) {
    checks << check_strides(*t, kRowAlignmentBytes, std::nullopt) << check_data(*t, kRowAlignmentBytes);
  }
  std::vector<const Operand*> floats = {&descale};
  if (signs) floats.push_back(&*signs);
  for (const Operand* t : floats) {
    checks << check_strides(*t, sizeof(float), std::nullopt) << check_data(*t, sizeof(float));
  }
  std::vector<const Operand*> read = {&x};
  if (signs) read.push_back(&*signs);
  for (const Operand* input : read) checks << check_no_overlap(out, *input) << check_no_overlap(descale, *input);
  checks << check_no_overlap(descale, out);
  if (args.x.device < 0) checks << invalid("x.device = ", args.x.device, ": expected a CUDA device ordinal >= 0");
  checks << check_same_device(out, x) << check_same_device(descale, x);
  if (signs) checks << check_same_device(*signs, x);
  return checks.status();
}

}  // namespace flashhop
