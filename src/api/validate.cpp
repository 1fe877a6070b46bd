// Every check on forward arguments, in one place. validate_forward() reads only the descriptors
// (no device calls), so it also serves bindings and tests; make_forward_params() trusts its verdict.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "api/forward_params.h"
#include "flashhop/flashhop.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop {
namespace {

// TMA moves tiles only between 16-byte aligned global addresses, so every row start must be one.
constexpr std::int64_t kRowAlignmentBytes = 16;
// LSE is written as plain float32 stores.
constexpr std::int64_t kLseAlignmentBytes = sizeof(float);
// The kernels index sequences and heads with 32-bit integers.
constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
// ... and the mask band's bounds, which reach past seqlen_q + seqlen_k by up to one query tile.
constexpr std::int64_t kMaxSeqlenSum = kMaxInt32 - 65536;

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

Status check_rank(const Operand& t) {
  if (t.desc.rank != t.expected_rank) {
    std::ostringstream dims;
    for (int d = 0; d < t.expected_rank; ++d) dims << (d ? ", " : "") << t.dim_names[d];
    return invalid(t.name, ".rank = ", t.desc.rank, ": expected ", t.expected_rank, " (", dims.str(), ")");
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

// Last dimension contiguous; every other stride positive and a whole number of `alignment_bytes`.
Status check_strides(const Operand& t, std::int64_t alignment_bytes) {
  const int last = t.expected_rank - 1;
  if (t.desc.stride[last] != 1) {
    return invalid(t.name, ".stride[", last, "] = ", t.desc.stride[last],
                   ": expected 1 (the last dimension must be contiguous)");
  }
  const std::int64_t multiple = alignment_bytes / static_cast<std::int64_t>(dtype_size(t.desc.dtype));
  for (int d = 0; d < last; ++d) {
    const std::int64_t stride = t.desc.stride[d];
    if (stride < 1 || stride % multiple != 0) {
      return invalid(t.name, ".stride[", d, "] = ", stride, ": expected a positive multiple of ", multiple,
                     " elements (", alignment_bytes, "-byte aligned ", dtype_name(t.desc.dtype), " rows)");
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

Status check_same_device(const Operand& t, const Operand& q) {
  if (t.desc.device != q.desc.device) {
    return invalid(t.name, ".device = ", t.desc.device, ": expected ", q.desc.device, " (q.device)");
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

// The (head_dim, head_dim_v) pairs the kernels are written for.
Status check_supported_head_dims(const Operand& q, const Operand& v) {
  const std::int64_t head_dim = q.dim(3), head_dim_v = v.dim(3);
  if (head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 192 && head_dim != 256) {
    return fail(StatusCode::kNotSupported, dim_label(q, 3), " = ", head_dim,
                ": supported head dims are 64, 96, 128, 192 and 256");
  }
  if (head_dim_v != head_dim && !(head_dim == 192 && head_dim_v == 128)) {
    return fail(StatusCode::kNotSupported, dim_label(v, 3), " = ", head_dim_v, ": expected head_dim (", head_dim,
                ")", head_dim == 192 ? " or 128" : "", "; head_dim_v != head_dim is supported for (192, 128) only");
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

// Packed rows are seqlen_q * (nheads / nheads_kv) per KV head, indexed in 32 bits like sequences.
std::int64_t packed_rows(const Operand& q, const Operand& k) { return q.dim(1) * (q.dim(2) / k.dim(2)); }

Status check_pack_gqa(const ForwardArgs& args, const Operand& q, const Operand& k) {
  switch (args.pack_gqa) {
    case PackGqa::kAuto:
    case PackGqa::kOff:
      return Status::success();
    case PackGqa::kOn:
      if (packed_rows(q, k) > kMaxSeqlenSum) {
        return invalid("pack_gqa = on: seqlen_q * nheads / nheads_kv = ", packed_rows(q, k), ": expected <= ",
                       kMaxSeqlenSum, " packed query rows");
      }
      return Status::success();
  }
  return invalid("pack_gqa = ", static_cast<int>(args.pack_gqa), ": expected PackGqa::kAuto, kOff or kOn");
}

}  // namespace

Status validate_forward(const ForwardArgs& args) {
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

  if (args.q.dtype != DType::kFloat16 && args.q.dtype != DType::kBFloat16) {
    return invalid("q.dtype = ", dtype_name(args.q.dtype), ": expected float16 or bfloat16");
  }
  checks << check_dtype(k, args.q.dtype, "the dtype of q") << check_dtype(v, args.q.dtype, "the dtype of q")
         << check_dtype(o, args.q.dtype, "the dtype of q");
  if (lse) checks << check_dtype(*lse, DType::kFloat32, "LSE is float32");
  if (!checks.status().ok()) return checks.status();

  // Shapes. q defines batch, seqlen_q, nheads and head_dim; k defines seqlen_k and nheads_kv;
  // v defines head_dim_v.
  checks << check_nonnegative_dims(q) << check_nonnegative_dims(k) << check_nonnegative_dims(v)
         << check_nonnegative_dims(o);
  checks << check_dim_at_least_one(q, 0) << check_dim_at_least_one(q, 2) << check_dim_at_least_one(q, 3)
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

  // Memory: strides, pointers, devices.
  for (const Operand* t : {&q, &k, &v, &o}) {
    checks << check_strides(*t, kRowAlignmentBytes) << check_data(*t, kRowAlignmentBytes);
  }
  if (lse) checks << check_strides(*lse, kLseAlignmentBytes) << check_data(*lse, kLseAlignmentBytes);
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
  if (Status status = check_pack_gqa(args, q, k); !status.ok()) return status;
  return check_supported_head_dims(q, v);
}

namespace detail {

bool use_pack_gqa(PackGqa mode, int seqlen_q, int heads_per_kv_head, int tile_rows, int packed_tile_rows) {
  if (mode != PackGqa::kAuto) return mode == PackGqa::kOn;
  const std::int64_t packed = std::int64_t{seqlen_q} * heads_per_kv_head;
  if (heads_per_kv_head == 1 || packed > kMaxSeqlenSum) return false;
  // The fraction of a query tile's rows that hold queries, the last tile of each head counted.
  const auto fill = [](std::int64_t rows, int tile) {
    return static_cast<double>(rows) / static_cast<double>((rows + tile - 1) / tile * tile);
  };
  return fill(seqlen_q, tile_rows) < 0.9 * fill(packed, packed_tile_rows);
}

namespace {

// Keys that the band (window_left, window_right, in ForwardParams' non-negative widths) shows query
// row seqlen_q / 2: about the mean over the rows for a causal mask and a sliding window alike.
int middle_row_keys(int seqlen_q, int seqlen_k, int window_left, int window_right) {
  const std::int64_t diagonal = std::int64_t{seqlen_q / 2} + seqlen_k - seqlen_q;
  const std::int64_t first = std::max<std::int64_t>(0, diagonal - window_left);
  const std::int64_t end = std::min<std::int64_t>(seqlen_k, diagonal + window_right + 1);
  return static_cast<int>(std::max<std::int64_t>(0, end - first));
}

}  // namespace

ForwardParams make_forward_params(const ForwardArgs& args) {
  ForwardParams params;
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.o = args.o.data;
  params.dtype = args.q.dtype;

  params.batch = static_cast<int>(args.q.shape[0]);
  params.seqlen_q = static_cast<int>(args.q.shape[1]);
  params.nheads = static_cast<int>(args.q.shape[2]);
  params.head_dim = static_cast<int>(args.q.shape[3]);
  params.seqlen_k = static_cast<int>(args.k.shape[1]);
  params.nheads_kv = static_cast<int>(args.k.shape[2]);
  params.head_dim_v = static_cast<int>(args.v.shape[3]);

  params.q_batch_stride = args.q.stride[0];
  params.q_row_stride = args.q.stride[1];
  params.q_head_stride = args.q.stride[2];
  params.k_batch_stride = args.k.stride[0];
  params.k_row_stride = args.k.stride[1];
  params.k_head_stride = args.k.stride[2];
  params.v_batch_stride = args.v.stride[0];
  params.v_row_stride = args.v.stride[1];
  params.v_head_stride = args.v.stride[2];
  params.o_batch_stride = args.o.stride[0];
  params.o_row_stride = args.o.stride[1];
  params.o_head_stride = args.o.stride[2];
  if (args.lse) {
    params.lse = static_cast<float*>(args.lse->data);
    params.lse_batch_stride = args.lse->stride[0];
    params.lse_head_stride = args.lse->stride[1];
    params.lse_row_stride = args.lse->stride[2];
  }

  params.softmax_scale =
      args.softmax_scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(params.head_dim))));
  params.softcap = args.softcap;

  // The band in non-negative widths: an unbounded side, and any wider one, becomes the width that
  // reaches past every key (seqlen_k on the left, seqlen_q on the right). The band hides nothing
  // when each row's reaches back to key 0 (the last row, window_left >= seqlen_k - 1) and on to the
  // last key (the first row, window_right >= seqlen_q - 1).
  const int right = args.causal ? 0 : args.window_right;
  params.window_left = args.window_left < 0 ? params.seqlen_k : std::min(args.window_left, params.seqlen_k);
  params.window_right = right < 0 ? params.seqlen_q : std::min(right, params.seqlen_q);
  params.local = params.window_left < params.seqlen_k - 1 || params.window_right < params.seqlen_q - 1;
  // Without a mask the band is all seqlen_k keys (the widths above reach past every key). Packed rows
  // take the default choice; the unpacked rows' tiles, which packing is weighed against, their own.
  const sm90::TileChoice default_choice = sm90::default_tile_choice(params.local);
  const sm90::TileChoice unpacked_choice =
      sm90::tile_choice(params.head_dim, params.local, params.seqlen_q,
                        middle_row_keys(params.seqlen_q, params.seqlen_k, params.window_left, params.window_right));
  const int unpacked_block_m =
      sm90::forward_tile_config(params.head_dim, params.local, unpacked_choice, /*pack_gqa=*/false).block_m;
  const int packed_block_m =
      sm90::forward_tile_config(params.head_dim, params.local, default_choice, /*pack_gqa=*/true).block_m;
  params.pack_gqa = use_pack_gqa(args.pack_gqa, params.seqlen_q, params.nheads / params.nheads_kv,
                                 unpacked_block_m, packed_block_m);
  params.tile_choice = params.pack_gqa ? default_choice : unpacked_choice;
  params.device = args.q.device;
  return params;
}

}  // namespace detail
}  // namespace flashhop
