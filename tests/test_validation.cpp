// Argument validation: every rule rejects with the right code and a message that names the
// argument; valid calls (including empty sequences and strided layouts) pass. No device is touched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "api/dispatch.h"
#include "api/plan.h"
#include "flashhop/flashhop.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::ForwardArgs;
using flashhop::Status;
using flashhop::StatusCode;

// q (2, 33, 8, 128), k and v (2, 65, 2, 128), o like q, lse (2, 8, 33); bf16.
const Problem kProblem{2, 33, 65, 8, 2, 128};

ForwardArgs valid_args(DType dtype = DType::kBFloat16, const Problem& problem = kProblem) {
  const ForwardPlan plan = contiguous_plan(problem, dtype);
  return bind_args(plan, fake_bases(plan), /*with_lse=*/true);
}

char* shifted(void* data, std::int64_t bytes) { return static_cast<char*>(data) + bytes; }

struct InvalidCase {
  const char* name;
  std::function<void(ForwardArgs&)> change;
  StatusCode code;
  std::vector<std::string> message_parts;  // each must appear in the message
};

void PrintTo(const InvalidCase& c, std::ostream* out) { *out << c.name; }

// `args` changed by case `c` is rejected with c's code and a message holding each of its parts;
// the other entry points validate first and report the same error, before touching the device.
void expect_rejected(ForwardArgs args, const InvalidCase& c) {
  c.change(args);
  const Status status = flashhop::validate_forward(args);
  EXPECT_EQ(status.code, c.code) << status.message;
  for (const std::string& part : c.message_parts) {
    EXPECT_NE(status.message.find(part), std::string::npos) << "message: " << status.message << "\nmissing: " << part;
  }
  std::size_t bytes = 0;
  const Status size_status = flashhop::forward_workspace_size(args, &bytes);
  EXPECT_EQ(size_status.code, status.code);
  EXPECT_EQ(size_status.message, status.message);
  const Status forward_status = flashhop::forward(args, nullptr, 0, nullptr);
  EXPECT_EQ(forward_status.code, status.code);
  EXPECT_EQ(forward_status.message, status.message);
}

class InvalidArguments : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidArguments, RejectedWithCodeAndNamedArgument) { expect_rejected(valid_args(), GetParam()); }

constexpr std::int64_t kBeyondInt32 = std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1;
constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kNotSupported = StatusCode::kNotSupported;

const InvalidCase kInvalidCases[] = {
    // dtypes
    {"q_float32", [](ForwardArgs& a) { a.q.dtype = DType::kFloat32; }, kInvalid,
     {"q.dtype = float32", "expected float16, bfloat16 or float8_e4m3fn"}},
    {"k_dtype_differs", [](ForwardArgs& a) { a.k.dtype = DType::kFloat16; }, kInvalid,
     {"k.dtype = float16", "expected bfloat16"}},
    {"v_dtype_differs", [](ForwardArgs& a) { a.v.dtype = DType::kFloat16; }, kInvalid, {"v.dtype = float16"}},
    {"o_dtype_differs", [](ForwardArgs& a) { a.o.dtype = DType::kFloat32; }, kInvalid, {"o.dtype = float32"}},
    {"lse_not_float32", [](ForwardArgs& a) { a.lse->dtype = DType::kBFloat16; }, kInvalid,
     {"lse.dtype = bfloat16", "expected float32"}},
    {"dtype_not_an_enum_value", [](ForwardArgs& a) { a.q.dtype = static_cast<DType>(7); }, kInvalid,
     {"q.dtype = unknown"}},
    // FP8: e4m3 q, k and v write bfloat16 O
    {"fp8_o_float8",
     [](ForwardArgs& a) {
       for (TensorDesc* t : {&a.q, &a.k, &a.v, &a.o}) t->dtype = DType::kFloat8E4M3;
     },
     kInvalid, {"o.dtype = float8_e4m3fn: expected bfloat16 (FP8 attention writes bfloat16)"}},
    {"fp8_v_bfloat16",
     [](ForwardArgs& a) { a.q.dtype = a.k.dtype = DType::kFloat8E4M3; },
     kInvalid, {"v.dtype = bfloat16: expected float8_e4m3fn (the dtype of q)"}},
    {"k_float8", [](ForwardArgs& a) { a.k.dtype = DType::kFloat8E4M3; }, kInvalid,
     {"k.dtype = float8_e4m3fn: expected bfloat16 (the dtype of q)"}},
    {"lse_float8", [](ForwardArgs& a) { a.lse->dtype = DType::kFloat8E4M3; }, kInvalid,
     {"lse.dtype = float8_e4m3fn: expected float32"}},
    // ranks
    {"q_rank_3", [](ForwardArgs& a) { a.q.rank = 3; }, kInvalid,
     {"q.rank = 3", "expected 4 (batch, seqlen_q, nheads, head_dim)"}},
    {"v_rank_5", [](ForwardArgs& a) { a.v.rank = 5; }, kInvalid, {"v.rank = 5", "expected 4"}},
    {"o_rank_2", [](ForwardArgs& a) { a.o.rank = 2; }, kInvalid, {"o.rank = 2"}},
    {"lse_rank_4", [](ForwardArgs& a) { a.lse->rank = 4; }, kInvalid,
     {"lse.rank = 4", "expected 3 (batch, nheads, seqlen_q)"}},
    // sizes
    {"seqlen_q_negative", [](ForwardArgs& a) { a.q.shape[1] = -1; }, kInvalid,
     {"q.shape[1] (seqlen_q) = -1", "expected >= 0"}},
    {"seqlen_k_negative", [](ForwardArgs& a) { a.k.shape[1] = a.v.shape[1] = -1; }, kInvalid,
     {"k.shape[1] (seqlen_k) = -1"}},
    {"nheads_0", [](ForwardArgs& a) { a.q.shape[2] = a.o.shape[2] = a.lse->shape[1] = 0; }, kInvalid,
     {"q.shape[2] (nheads) = 0", "expected >= 1"}},
    {"nheads_kv_0", [](ForwardArgs& a) { a.k.shape[2] = a.v.shape[2] = 0; }, kInvalid,
     {"k.shape[2] (nheads_kv) = 0", "expected >= 1"}},
    {"head_dim_0", [](ForwardArgs& a) { a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.o.shape[3] = 0; },
     kInvalid, {"q.shape[3] (head_dim) = 0", "expected >= 1"}},
    {"seqlen_q_beyond_int32",
     [](ForwardArgs& a) { a.q.shape[1] = a.o.shape[1] = a.lse->shape[2] = kBeyondInt32; }, kInvalid,
     {"q.shape[1] (seqlen_q) = 2147483648", "expected <= 2147483647"}},
    {"seqlen_k_beyond_int32", [](ForwardArgs& a) { a.k.shape[1] = a.v.shape[1] = kBeyondInt32; }, kInvalid,
     {"k.shape[1] (seqlen_k) = 2147483648"}},
    {"batch_beyond_int32",
     [](ForwardArgs& a) {
       a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.o.shape[0] = a.lse->shape[0] = kBeyondInt32;
     },
     kInvalid, {"q.shape[0] (batch) = 2147483648"}},
    // consistency between operands
    {"k_batch_differs", [](ForwardArgs& a) { a.k.shape[0] = 3; }, kInvalid,
     {"k.shape[0] (batch) = 3", "expected 2 (q.shape[0] (batch))"}},
    {"k_head_dim_differs", [](ForwardArgs& a) { a.k.shape[3] = 64; }, kInvalid,
     {"k.shape[3] (head_dim) = 64", "expected 128"}},
    {"v_batch_differs", [](ForwardArgs& a) { a.v.shape[0] = 1; }, kInvalid, {"v.shape[0] (batch) = 1"}},
    {"v_seqlen_differs", [](ForwardArgs& a) { a.v.shape[1] = 64; }, kInvalid,
     {"v.shape[1] (seqlen_k) = 64", "expected 65 (k.shape[1] (seqlen_k))"}},
    {"v_heads_differ", [](ForwardArgs& a) { a.v.shape[2] = 4; }, kInvalid, {"v.shape[2] (nheads_kv) = 4"}},
    {"o_batch_differs", [](ForwardArgs& a) { a.o.shape[0] = 1; }, kInvalid, {"o.shape[0] (batch) = 1"}},
    {"o_seqlen_differs", [](ForwardArgs& a) { a.o.shape[1] = 32; }, kInvalid,
     {"o.shape[1] (seqlen_q) = 32", "expected 33"}},
    {"o_heads_differ", [](ForwardArgs& a) { a.o.shape[2] = 2; }, kInvalid, {"o.shape[2] (nheads) = 2"}},
    {"o_head_dim_v_differs", [](ForwardArgs& a) { a.o.shape[3] = 64; }, kInvalid,
     {"o.shape[3] (head_dim_v) = 64", "expected 128 (v.shape[3] (head_dim_v))"}},
    {"lse_batch_differs", [](ForwardArgs& a) { a.lse->shape[0] = 1; }, kInvalid, {"lse.shape[0] (batch) = 1"}},
    {"lse_heads_differ", [](ForwardArgs& a) { a.lse->shape[1] = 2; }, kInvalid,
     {"lse.shape[1] (nheads) = 2", "expected 8 (q.shape[2] (nheads))"}},
    {"lse_seqlen_differs", [](ForwardArgs& a) { a.lse->shape[2] = 65; }, kInvalid,
     {"lse.shape[2] (seqlen_q) = 65", "expected 33"}},
    {"nheads_not_multiple_of_nheads_kv", [](ForwardArgs& a) { a.k.shape[2] = a.v.shape[2] = 3; }, kInvalid,
     {"k.shape[2] (nheads_kv) = 3: nheads (8) must be a multiple of it"}},
    // strides
    {"q_last_dim_not_contiguous", [](ForwardArgs& a) { a.q.stride[3] = 2; }, kInvalid,
     {"q.stride[3] = 2", "expected 1"}},
    {"k_rows_not_16_byte_aligned", [](ForwardArgs& a) { a.k.stride[1] += 4; }, kInvalid,
     {"k.stride[1] = 260", "multiple of 8 elements"}},
    {"v_head_stride_0", [](ForwardArgs& a) { a.v.stride[2] = 0; }, kInvalid, {"v.stride[2] = 0"}},
    {"o_batch_stride_negative", [](ForwardArgs& a) { a.o.stride[0] = -a.o.stride[0]; }, kInvalid,
     {"o.stride[0] = -"}},
    {"lse_last_dim_not_contiguous", [](ForwardArgs& a) { a.lse->stride[2] = 2; }, kInvalid,
     {"lse.stride[2] = 2", "expected 1"}},
    {"lse_head_stride_0", [](ForwardArgs& a) { a.lse->stride[1] = 0; }, kInvalid, {"lse.stride[1] = 0"}},
    {"q_batch_stride_at_the_tma_limit", [](ForwardArgs& a) { a.q.stride[0] = std::int64_t{1} << 39; }, kInvalid,
     {"q.stride[0] = 549755813888", "expected below 549755813888 elements (2^40 bytes"}},
    {"v_row_stride_past_the_tma_limit", [](ForwardArgs& a) { a.v.stride[1] = std::int64_t{1} << 45; }, kInvalid,
     {"v.stride[1] = 35184372088832"}},
    // outputs that share memory with another tensor
    {"o_is_q", [](ForwardArgs& a) { a.o.data = a.q.data; }, kInvalid, {"o.data = 0x", "overlaps q's"}},
    {"o_ends_inside_v",
     [](ForwardArgs& a) { a.o.data = shifted(a.v.data, -(2 * 33 * 8 * 128 * 2) + 16); },  // o's 2*33*8*128 bf16
     kInvalid, {"o.data", "overlaps v's"}},
    {"o_starts_inside_k_through_a_stride",
     [](ForwardArgs& a) {
       a.o.data = shifted(a.k.data, 2 * 65 * 2 * 128 * 2 + 4096);
       a.k.stride[0] *= 2;  // k's batches lie twice as far apart and reach over o
     },
     kInvalid, {"o.data", "overlaps k's"}},
    {"lse_inside_o", [](ForwardArgs& a) { a.lse->data = shifted(a.o.data, 64); }, kInvalid,
     {"lse.data", "overlaps o's"}},
    // the tile schedulers' 32-bit tile numbers
    {"query_tiles_past_their_limit",
     [](ForwardArgs& a) {
       a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.o.shape[0] = a.lse->shape[0] = 16;
       a.q.shape[1] = a.o.shape[1] = a.lse->shape[2] = std::int64_t{1} << 30;  // 2^24 tiles x 8 heads x 16
     },
     kInvalid, {"q.shape (batch 16, seqlen_q 1073741824, nheads 8)", "query tiles, expected <= 2147418111"}},
    // pointers
    {"q_null", [](ForwardArgs& a) { a.q.data = nullptr; }, kInvalid, {"q.data = null"}},
    {"v_null", [](ForwardArgs& a) { a.v.data = nullptr; }, kInvalid, {"v.data = null"}},
    {"lse_null", [](ForwardArgs& a) { a.lse->data = nullptr; }, kInvalid, {"lse.data = null"}},
    {"k_not_16_byte_aligned", [](ForwardArgs& a) { a.k.data = shifted(a.k.data, 8); }, kInvalid,
     {"k.data = 0x", "16-byte aligned"}},
    {"o_not_16_byte_aligned", [](ForwardArgs& a) { a.o.data = shifted(a.o.data, 2); }, kInvalid, {"o.data"}},
    {"lse_not_4_byte_aligned", [](ForwardArgs& a) { a.lse->data = shifted(a.lse->data, 2); }, kInvalid,
     {"lse.data", "4-byte aligned"}},
    // devices
    {"q_device_negative",
     [](ForwardArgs& a) { a.q.device = a.k.device = a.v.device = a.o.device = a.lse->device = -1; }, kInvalid,
     {"q.device = -1"}},
    {"k_on_other_device", [](ForwardArgs& a) { a.k.device = 1; }, kInvalid, {"k.device = 1", "expected 0"}},
    {"lse_on_other_device", [](ForwardArgs& a) { a.lse->device = 2; }, kInvalid, {"lse.device = 2"}},
    // scale
    {"softmax_scale_nan", [](ForwardArgs& a) { a.softmax_scale = std::nanf(""); }, kInvalid,
     {"softmax_scale = nan", "finite"}},
    {"softmax_scale_inf", [](ForwardArgs& a) { a.softmax_scale = INFINITY; }, kInvalid, {"softmax_scale = inf"}},
    {"softmax_scale_negative", [](ForwardArgs& a) { a.softmax_scale = -1.f; }, kInvalid,
     {"softmax_scale = -1", ">= 0"}},
    {"seqlen_sum_past_its_limit",
     [](ForwardArgs& a) { a.k.shape[1] = a.v.shape[1] = std::numeric_limits<std::int32_t>::max() - 65536 - 32; },
     kInvalid, {"q.shape[1] + k.shape[1] (seqlen_q + seqlen_k) = 2147418112", "expected <= 2147418111"}},
    // window and softcap
    {"window_left_below_minus_one", [](ForwardArgs& a) { a.window_left = -2; }, kInvalid,
     {"window_left = -2", "-1 (unbounded) or a width >= 0"}},
    {"window_right_below_minus_one", [](ForwardArgs& a) { a.window_right = -5; }, kInvalid, {"window_right = -5"}},
    {"causal_with_right_window",
     [](ForwardArgs& a) {
       a.causal = true;
       a.window_right = 3;
     },
     kInvalid, {"window_right = 3", "-1 or 0 with causal"}},
    {"softcap_nan", [](ForwardArgs& a) { a.softcap = std::nanf(""); }, kInvalid, {"softcap = nan", "finite"}},
    {"softcap_negative", [](ForwardArgs& a) { a.softcap = -2.f; }, kInvalid, {"softcap = -2", ">= 0 (0: off)"}},
    // packed GQA rows
    {"pack_gqa_outside_the_enum", [](ForwardArgs& a) { a.pack_gqa = static_cast<flashhop::PackGqa>(7); }, kInvalid,
     {"pack_gqa = 7", "kAuto, kOff or kOn"}},
    {"pack_gqa_on_past_the_row_limit",
     [](ForwardArgs& a) {
       a.pack_gqa = flashhop::PackGqa::kOn;
       a.q.shape[1] = a.o.shape[1] = a.lse->shape[2] = std::int64_t{1} << 29;  // x 4 heads per KV head
       a.o.data = shifted(a.q.data, std::int64_t{1} << 42);  // past q's 2^40 bytes
       a.lse->data = shifted(a.q.data, std::int64_t{1} << 43);
     },
     kInvalid, {"pack_gqa = on: seqlen_q * nheads / nheads_kv = 2147483648", "expected <= 2147418111"}},
    {"leftpad_k_fixed_length", [](ForwardArgs& a) { a.leftpad_k = flashhop::make_contiguous(a.q.data, DType::kInt32, {2}); },
     kNotSupported, {"leftpad_k is given without cu_seqlens_q"}},
    // splits by keys: variable-length and paged calls only
    {"num_splits_negative", [](ForwardArgs& a) { a.num_splits = -1; }, kInvalid,
     {"num_splits = -1", "expected 0 (the library chooses) to 256"}},
    {"num_splits_past_the_most", [](ForwardArgs& a) { a.num_splits = 257; }, kInvalid, {"num_splits = 257"}},
    {"num_splits_fixed_length", [](ForwardArgs& a) { a.num_splits = 2; }, kNotSupported,
     {"num_splits = 2 without cu_seqlens_q", "expected 0 or 1", "applies to variable-length and paged calls"}},
    // variable-length fields without cu_seqlens
    {"seqused_q_without_cu_seqlens",
     [](ForwardArgs& a) { a.seqused_q = flashhop::make_contiguous(a.q.data, DType::kInt32, {2}); }, kNotSupported,
     {"seqused_q is given without cu_seqlens_q and cu_seqlens_k", "expected only with them"}},
    {"max_seqlen_q_without_cu_seqlens", [](ForwardArgs& a) { a.max_seqlen_q = 33; }, kInvalid,
     {"max_seqlen_q = 33: expected 0 without cu_seqlens_q"}},
    {"max_seqlen_k_without_cu_seqlens", [](ForwardArgs& a) { a.max_seqlen_k = 65; }, kInvalid,
     {"max_seqlen_k = 65: expected 0 without cu_seqlens_k"}},
    {"cu_seqlens_k_alone",
     [](ForwardArgs& a) { a.cu_seqlens_k = flashhop::make_contiguous(a.q.data, DType::kInt32, {3}); }, kNotSupported,
     {"cu_seqlens_q = none with cu_seqlens_k given: expected both or neither"}},
    // valid but not supported
    {"head_dim_80", [](ForwardArgs& a) { a.q.shape[3] = a.k.shape[3] = a.v.shape[3] = a.o.shape[3] = 80; },
     kNotSupported, {"q.shape[3] (head_dim) = 80", "64, 96, 128, 192 and 256"}},
    {"head_dim_v_differs_from_head_dim", [](ForwardArgs& a) { a.v.shape[3] = a.o.shape[3] = 64; }, kNotSupported,
     {"v.shape[3] (head_dim_v) = 64", "expected head_dim (128);", "(192, 128) only"}},
    {"head_dim_192_head_dim_v_64",
     [](ForwardArgs& a) {
       a.q.shape[3] = a.k.shape[3] = 192;
       a.v.shape[3] = a.o.shape[3] = 64;
     },
     kNotSupported, {"v.shape[3] (head_dim_v) = 64", "expected head_dim (192) or 128"}},
};

INSTANTIATE_TEST_SUITE_P(Validation, InvalidArguments, ::testing::ValuesIn(kInvalidCases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

struct ValidCase {
  const char* name;
  std::function<ForwardArgs()> make;
};

void PrintTo(const ValidCase& c, std::ostream* out) { *out << c.name; }

class ValidArguments : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidArguments, Accepted) {
  const ForwardArgs args = GetParam().make();
  const Status status = flashhop::validate_forward(args);
  EXPECT_TRUE(status.ok()) << status.message;
  std::size_t bytes = 1;
  EXPECT_TRUE(flashhop::forward_workspace_size(args, &bytes).ok());
  // A band's tiles run from a queue, whose counter takes 4 bytes, where there are tiles. Without
  // one, these shapes' few key tiles split nothing, but for the 2^31 keys of seqlen_sum_at_its_limit,
  // whose few tiles' one round splits over the SMs where a device is present (split_round.h).
  const bool has_tiles = args.q.shape[0] > 0 && args.q.shape[1] > 0;
  if (flashhop::detail::plan_forward(args, {}).recipe_of().local() && has_tiles) {
    EXPECT_EQ(bytes, 4u);
  } else if (std::string(GetParam().name) != "seqlen_sum_at_its_limit") {
    EXPECT_EQ(bytes, 0u);
  }
}

ForwardArgs with_problem(const Problem& problem) { return valid_args(DType::kBFloat16, problem); }

const ValidCase kValidCases[] = {
    {"bf16", [] { return valid_args(DType::kBFloat16); }},
    {"fp16", [] { return valid_args(DType::kFloat16); }},
    {"head_dim_64", [] { return with_problem({2, 33, 65, 8, 2, 64}); }},
    {"head_dim_96", [] { return with_problem({2, 33, 65, 8, 2, 96}); }},
    {"head_dim_192", [] { return with_problem({2, 33, 65, 8, 2, 192}); }},
    {"head_dim_192_head_dim_v_128", [] { return with_problem({2, 33, 65, 8, 2, 192, 128}); }},
    {"head_dim_256", [] { return with_problem({2, 33, 65, 8, 2, 256}); }},
    {"sliding_window_softcap",
     [] {
       ForwardArgs args = valid_args();
       args.window_left = 0;
       args.window_right = 7;
       args.softcap = 30.f;
       return args;
     }},
    {"causal_window_left",
     [] {
       ForwardArgs args = valid_args();
       args.causal = true;
       args.window_left = 100;
       args.window_right = 0;
       return args;
     }},
    {"without_lse",
     [] {
       ForwardArgs args = valid_args();
       args.lse.reset();
       return args;
     }},
    {"causal_with_scale",
     [] {
       ForwardArgs args = valid_args();
       args.causal = true;
       args.softmax_scale = 0.01f;
       return args;
     }},
    {"mqa_all_heads_share_one", [] { return with_problem({1, 17, 17, 16, 1, 128}); }},
    {"batch_0_null_everywhere",
     [] {
       const ForwardPlan plan = contiguous_plan({0, 33, 65, 8, 2, 128}, DType::kBFloat16);
       return bind_args(plan, {nullptr, nullptr, nullptr, nullptr, nullptr}, true, Masking{/*causal=*/true});
     }},
    {"query_tiles_at_their_limit",
     [] {
       // 2^24 tiles of 64 rows x 8 heads x 15 batches = 2013265920 tiles. The 2^30 rows take about
       // 2^41 bytes of q and of o and 2^32 of lse, so o and lse move past the others.
       ForwardArgs args = valid_args();
       args.q.shape[0] = args.k.shape[0] = args.v.shape[0] = args.o.shape[0] = args.lse->shape[0] = 15;
       args.q.shape[1] = args.o.shape[1] = args.lse->shape[2] = std::int64_t{1} << 30;
       args.o.data = shifted(args.q.data, std::int64_t{1} << 43);
       args.lse->data = shifted(args.q.data, std::int64_t{1} << 44);
       return args;
     }},
    {"o_right_after_v",
     [] {
       ForwardArgs args = valid_args();
       args.o.data = shifted(args.v.data, 2 * 65 * 2 * 128 * 2);
       return args;
     }},
    {"q_and_k_and_v_share_memory",
     [] {
       ForwardArgs args = valid_args();
       args.k.data = args.v.data = args.q.data;
       return args;
     }},
    {"unit_dimensions_with_any_stride",
     [] {
       ForwardArgs args = with_problem({1, 1, 65, 8, 2, 128});
       args.q.stride[0] = std::int64_t{1} << 45;
       args.q.stride[1] = 0;
       args.o.stride[0] = -8;
       args.k.stride[0] = 7;
       return args;
     }},
    {"seqlen_q_0_null_q_o_lse",
     [] {
       const ForwardPlan plan = contiguous_plan({1, 0, 5, 2, 1, 128}, DType::kBFloat16);
       return bind_args(plan, {nullptr, fake_bases(plan)[1], fake_bases(plan)[2], nullptr, nullptr}, true, Masking{/*causal=*/true});
     }},
    {"seqlen_k_0_null_k_v",
     [] {
       const ForwardPlan plan = contiguous_plan({1, 5, 0, 2, 1, 128}, DType::kBFloat16);
       std::vector<void*> bases = fake_bases(plan);
       bases[1] = bases[2] = nullptr;
       return bind_args(plan, bases, true, Masking{/*causal=*/true});
     }},
    {"seqlen_sum_at_its_limit",
     [] {
       ForwardArgs args = valid_args();  // seqlen_q = 33
       args.k.shape[1] = args.v.shape[1] = std::numeric_limits<std::int32_t>::max() - 65536 - 33;
       // k and v now take about 2^40 bytes each: o and lse move past them.
       args.o.data = shifted(args.k.data, std::int64_t{1} << 42);
       args.lse->data = shifted(args.k.data, std::int64_t{1} << 43);
       return args;
     }},
    {"packed_qkv_padded_o_and_lse",
     [] {
       const ForwardPlan plan = strided_plan({2, 40, 40, 8, 2, 128}, DType::kFloat16);
       return bind_args(plan, fake_bases(plan), true);
     }},
    {"unaligned_but_unused_lse_absent",
     [] {
       ForwardArgs args = valid_args();
       args.lse->data = shifted(args.lse->data, 1);
       args.lse.reset();
       return args;
     }},
};

INSTANTIATE_TEST_SUITE_P(Validation, ValidArguments, ::testing::ValuesIn(kValidCases),
                         [](const ::testing::TestParamInfo<ValidCase>& info) { return info.param.name; });

TEST(Validation, WorkspaceSizeNeedsAnOutputPointer) {
  const Status status = flashhop::forward_workspace_size(valid_args(), nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("bytes"), std::string::npos) << status.message;
}

// Causal and window calls run their tiles from a queue and ask for its 4-byte counter; forward()
// rejects a missing, short or misaligned workspace before touching the device.
TEST(Validation, TileQueueAsksForAWorkspace) {
  const auto args_of = [](const Problem& problem, Masking masking) {
    const ForwardPlan plan = contiguous_plan(problem, DType::kBFloat16);
    return bind_args(plan, fake_bases(plan), true, masking);
  };
  const Masking causal{/*causal=*/true};
  const struct {
    Problem problem;
    Masking masking;
    std::size_t bytes;
  } cases[] = {
      {{1, 1, 1, 8, 8, 128}, causal, 0},  // one query and one key: nothing to mask
      {{0, 1024, 1024, 8, 8, 64}, causal, 0},  // no batch, no tiles
      {{1, 0, 1024, 8, 8, 64}, causal, 0},
      {{1, 1024, 1024, 8, 8, 64}, causal, 4},
      {{1, 1024, 1024, 8, 8, 128}, Masking{}, 0},  // 64 tiles of 8 key tiles: a split saves too little
      {{1, 8192, 8192, 8, 8, 128}, Masking{false, 256, 256}, 4},
      {{1, 1024, 1024, 8, 8, 128}, Masking{false, 1023, 1023}, 0},  // a band as wide as the keys: no mask
  };
  for (const auto& c : cases) {
    std::size_t bytes = 99;
    ASSERT_TRUE(flashhop::forward_workspace_size(args_of(c.problem, c.masking), &bytes).ok());
    EXPECT_EQ(bytes, c.bytes) << "seqlen " << c.problem.seqlen_q << ", causal " << c.masking.causal << ", window "
                              << c.masking.window_left << ", " << c.masking.window_right;
  }

  const ForwardArgs args = args_of({1, 1025, 1025, 8, 8, 128}, causal);
  Status status = flashhop::forward(args, nullptr, 0, nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("workspace_bytes = 0: expected a workspace of at least 4 bytes"), std::string::npos)
      << status.message;
  status = flashhop::forward(args, reinterpret_cast<void*>(std::uintptr_t{0x7f0000001008}), 8, nullptr);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("aligned to 16 bytes"), std::string::npos) << status.message;
}

TEST(Plan, FlattensPackedLayout) {
  const Problem problem{2, 40, 40, 8, 2, 64};
  const ForwardPlan plan = strided_plan(problem, DType::kFloat16);
  ForwardArgs args = bind_args(plan, fake_bases(plan), true, Masking{/*causal=*/true});
  ASSERT_TRUE(flashhop::validate_forward(args).ok());

  const flashhop::detail::ForwardPlan plan_of_call = flashhop::detail::plan_forward(args, {});
  const flashhop::sm90::ForwardParams& params = plan_of_call.params;
  EXPECT_EQ(plan_of_call.dtype, DType::kFloat16);
  EXPECT_EQ(plan_of_call.recipe_of().head_dim, 64);
  EXPECT_EQ(plan_of_call.recipe_of().head_dim_v, 64);
  EXPECT_EQ(params.q, args.q.data);
  EXPECT_EQ(params.k, args.k.data);
  EXPECT_EQ(params.v, args.v.data);
  EXPECT_EQ(params.o, args.o.data);
  EXPECT_EQ(params.lse, args.lse->data);
  EXPECT_EQ(params.batch, 2);
  EXPECT_EQ(params.seqlen_q, 40);
  EXPECT_EQ(params.seqlen_k, 40);
  EXPECT_EQ(params.nheads, 8);
  EXPECT_EQ(params.nheads_kv, 2);

  const std::int64_t qkv_row = (8 + 2 * 2) * 64;
  for (const auto& [batch, row, head] :
       {std::tuple{params.q_batch_stride, params.q_row_stride, params.q_head_stride},
        std::tuple{params.k_batch_stride, params.k_row_stride, params.k_head_stride},
        std::tuple{params.v_batch_stride, params.v_row_stride, params.v_head_stride}}) {
    EXPECT_EQ(batch, 40 * qkv_row);
    EXPECT_EQ(row, qkv_row);
    EXPECT_EQ(head, 64);
  }
  const std::int64_t o_head = 64 + kOHeadPadding;
  EXPECT_EQ(params.o_batch_stride, 40 * 8 * o_head);
  EXPECT_EQ(params.o_row_stride, 8 * o_head);
  EXPECT_EQ(params.o_head_stride, o_head);
  const std::int64_t lse_row = 40 + kLseRowPadding;
  EXPECT_EQ(params.lse_batch_stride, 8 * lse_row);
  EXPECT_EQ(params.lse_head_stride, lse_row);
  EXPECT_EQ(params.lse_row_stride, 1);

  EXPECT_FLOAT_EQ(params.softmax_scale, 0.125f);  // 1 / sqrt(64)
  // Causal: the band (unbounded, 0), the left side written as seqlen_k.
  EXPECT_TRUE(plan_of_call.recipe_of().local());
  EXPECT_EQ(params.window_left, 40);
  EXPECT_EQ(params.window_right, 0);
  EXPECT_EQ(params.softcap, 0.f);
}

struct WindowCase {
  const char* name;
  int seqlen_q, seqlen_k;
  bool causal;
  int window_left, window_right;
  bool local;  // expected: the band hides some key from some query
  int left, right;  // expected widths in ForwardParams
};

class PlanWindow : public ::testing::TestWithParam<WindowCase> {};

TEST_P(PlanWindow, BandWidthsAndWhetherItMasks) {
  const WindowCase& c = GetParam();
  ForwardArgs args = with_problem({1, c.seqlen_q, c.seqlen_k, 2, 1, 128});
  args.causal = c.causal;
  args.window_left = c.window_left;
  args.window_right = c.window_right;
  ASSERT_TRUE(flashhop::validate_forward(args).ok());
  const flashhop::detail::ForwardPlan plan_of_call = flashhop::detail::plan_forward(args, {});
  const flashhop::sm90::ForwardParams& params = plan_of_call.params;
  EXPECT_EQ(plan_of_call.recipe_of().local(), c.local);
  EXPECT_EQ(params.window_left, c.left);
  EXPECT_EQ(params.window_right, c.right);
}

INSTANTIATE_TEST_SUITE_P(
    Windows, PlanWindow,
    ::testing::Values(WindowCase{"none", 100, 300, false, -1, -1, false, 300, 100},
                      WindowCase{"causal", 100, 300, true, -1, -1, true, 300, 0},
                      WindowCase{"causal_window_right_0", 100, 300, true, -1, 0, true, 300, 0},
                      WindowCase{"both_sides", 100, 300, false, 3, 5, true, 3, 5},
                      // Wide enough for every row: the last row reaches key 0, the first the last key.
                      WindowCase{"covers_everything", 100, 300, false, 299, 99, false, 299, 99},
                      // Wider than the keys: written as the width that just reaches past them.
                      WindowCase{"wider_than_the_keys", 100, 300, false, 5000, 7000, false, 300, 100},
                      WindowCase{"wide_left_narrow_right", 100, 300, false, 5000, 3, true, 300, 3},
                      WindowCase{"one_short_on_the_left", 100, 300, false, 298, 99, true, 298, 99},
                      WindowCase{"one_short_on_the_right", 100, 300, false, 299, 98, true, 299, 98},
                      // One query row at the bottom sees every key under a causal mask (decoding).
                      WindowCase{"causal_single_query", 1, 300, true, -1, -1, false, 300, 0}),
    [](const ::testing::TestParamInfo<WindowCase>& info) { return info.param.name; });

struct PackGqaCase {
  const char* name;
  flashhop::PackGqa mode;
  int seqlen_q, heads_per_kv_head;
  bool packed;  // expected
  int tile_rows = 128;
  int packed_tile_rows = 128;
};

class PlanPackGqa : public ::testing::TestWithParam<PackGqaCase> {};

TEST_P(PlanPackGqa, PacksWhenAskedOrWhenTilesFillBetter) {
  const PackGqaCase& c = GetParam();
  EXPECT_EQ(flashhop::detail::use_pack_gqa(c.mode, c.seqlen_q, c.heads_per_kv_head, c.tile_rows, c.packed_tile_rows),
            c.packed);
}

INSTANTIATE_TEST_SUITE_P(
    PackGqa, PlanPackGqa,
    ::testing::Values(PackGqaCase{"decode", flashhop::PackGqa::kAuto, 1, 4, true},
                      PackGqaCase{"decode_off", flashhop::PackGqa::kOff, 1, 4, false},
                      PackGqaCase{"no_groups", flashhop::PackGqa::kAuto, 1, 1, false},
                      PackGqaCase{"no_groups_on", flashhop::PackGqa::kOn, 1000, 1, true},
                      // Whole tiles either way: nothing to gain.
                      PackGqaCase{"full_tiles", flashhop::PackGqa::kAuto, 1024, 8, false},
                      PackGqaCase{"full_tiles_on", flashhop::PackGqa::kOn, 1024, 8, true},
                      // In 192-row tiles 1024 rows fill 89%, 8192 packed rows 99%.
                      PackGqaCase{"full_tiles_of_128_not_of_192", flashhop::PackGqa::kAuto, 1024, 8, true, 192, 192},
                      // 100 rows fill 78% of 128-row tiles; 400 packed rows 78% of those too, but
                      // 89% of 64-row ones (d = 64's packed tiles).
                      PackGqaCase{"packed_tiles_of_128", flashhop::PackGqa::kAuto, 100, 4, false},
                      PackGqaCase{"packed_tiles_of_64", flashhop::PackGqa::kAuto, 100, 4, true, 128, 64},
                      // 65 rows fill 51% of their tiles, 260 packed rows 68%.
                      PackGqaCase{"half_tile", flashhop::PackGqa::kAuto, 65, 4, true},
                      // 1000 rows fill 98% of theirs: packing cannot gain 10%.
                      PackGqaCase{"long", flashhop::PackGqa::kAuto, 1000, 3, false},
                      // Packed rows past the 32-bit limit stay unpacked.
                      PackGqaCase{"too_many_rows", flashhop::PackGqa::kAuto, 1 << 28, 16, false}),
    [](const ::testing::TestParamInfo<PackGqaCase>& info) { return info.param.name; });

struct WideBandCase {
  const char* name;
  Problem problem;
  Masking masking;
  flashhop::PackGqa pack_gqa;
  flashhop::sm90::TileChoice choice;  // expected: the planned recipe's tile choice
};

constexpr flashhop::sm90::TileChoice kNarrow = flashhop::sm90::TileChoice::kNarrowBand;
constexpr flashhop::sm90::TileChoice kWide = flashhop::sm90::TileChoice::kWideBand;
constexpr flashhop::sm90::TileChoice kShort = flashhop::sm90::TileChoice::kShortRows;

class PlanWideBand : public ::testing::TestWithParam<WideBandCase> {};

TEST_P(PlanWideBand, WideWhenTheMiddleRowSeesEnoughKeys) {
  const WideBandCase& c = GetParam();
  const ForwardPlan plan = contiguous_plan(c.problem, DType::kBFloat16);
  ForwardArgs args = bind_args(plan, fake_bases(plan), true, c.masking);
  args.pack_gqa = c.pack_gqa;
  ASSERT_TRUE(flashhop::validate_forward(args).ok());
  EXPECT_EQ(flashhop::detail::plan_forward(args, {}).recipe_of().tile_choice, c.choice);
}

constexpr flashhop::PackGqa kAutoPack = flashhop::PackGqa::kAuto;

// wide_band_keys(d) keys for the middle query row (without a mask: seqlen_k): 1024 at d = 64, 2048
// at d = 128 and 256; d = 64 without a mask and d = 128 take short rows by the query rows first. A
// head dim without tiles of its own for a choice takes the default choice's recipe.
INSTANTIATE_TEST_SUITE_P(
    WideBands, PlanWideBand,
    ::testing::Values(WideBandCase{"causal_8k", {1, 8192, 8192, 4, 4, 64}, {true}, kAutoPack, kWide},
                      WideBandCase{"causal_8k_d128", {1, 8192, 8192, 4, 4, 128}, {true}, kAutoPack, kWide},
                      // The middle row of causal 4k sees 2049 keys, of 2k 1025.
                      WideBandCase{"causal_4k_d128", {1, 4096, 4096, 4, 4, 128}, {true}, kAutoPack, kWide},
                      WideBandCase{"causal_2k_d128", {1, 2048, 2048, 4, 4, 128}, {true}, kAutoPack, kNarrow},
                      WideBandCase{"window_2046_narrow_d128", {1, 8192, 8192, 4, 4, 128}, {false, 2046, 0}, kAutoPack,
                                   kNarrow},
                      WideBandCase{"causal_2k", {1, 2048, 2048, 4, 4, 64}, {true}, kAutoPack, kWide},
                      // The middle row of causal 2046 sees 1024 keys, of 2044 1023.
                      WideBandCase{"causal_2046", {1, 2046, 2046, 4, 4, 64}, {true}, kAutoPack, kWide},
                      WideBandCase{"causal_2044", {1, 2044, 2044, 4, 4, 64}, {true}, kAutoPack, kNarrow},
                      WideBandCase{"causal_1k", {1, 1024, 1024, 4, 4, 64}, {true}, kAutoPack, kNarrow},
                      // The middle row (500) sees 500 + 4000 + 1 keys.
                      WideBandCase{"causal_short_queries", {1, 1000, 5000, 4, 4, 64}, {true}, kAutoPack, kWide},
                      WideBandCase{"no_mask_8k", {1, 8192, 8192, 4, 4, 64}, {}, kAutoPack, kWide},
                      // Without a mask at d = 64: whether seqlen_q fills the 192-row tiles to 4/5.
                      WideBandCase{"no_mask_4095_keys", {1, 8192, 4095, 4, 4, 64}, {}, kAutoPack, kWide},
                      WideBandCase{"no_mask_128_queries", {1, 128, 8192, 4, 4, 64}, {}, kAutoPack, kShort},
                      WideBandCase{"no_mask_307_queries", {1, 307, 1024, 4, 4, 64}, {}, kAutoPack, kShort},
                      WideBandCase{"no_mask_308_queries", {1, 308, 1024, 4, 4, 64}, {}, kAutoPack, kWide},
                      WideBandCase{"no_mask_128_queries_d128", {1, 128, 8192, 4, 4, 128}, {}, kAutoPack, kWide},
                      WideBandCase{"no_mask_2k_d256", {1, 512, 2048, 4, 4, 256}, {}, kAutoPack, kWide},
                      WideBandCase{"no_mask_2047_keys_d256", {1, 4096, 2047, 4, 4, 256}, {}, kAutoPack, kNarrow},
                      // A window as wide as the keys is no mask.
                      WideBandCase{"window_as_wide_as_keys_d256", {1, 1024, 1024, 4, 4, 256}, {false, 1023, 1023},
                                   kAutoPack, kNarrow},
                      WideBandCase{"window_1023_wide", {1, 16384, 16384, 4, 4, 64}, {false, 1023, 0}, kAutoPack, kWide},
                      WideBandCase{"window_1022_narrow", {1, 16384, 16384, 4, 4, 64}, {false, 1022, 0}, kAutoPack,
                                   kNarrow},
                      WideBandCase{"both_sides", {1, 16384, 16384, 4, 4, 64}, {false, 2000, 2100}, kAutoPack, kWide},
                      // Packed GQA rows keep their own tiles.
                      WideBandCase{"causal_8k_packed", {1, 8192, 8192, 8, 2, 64}, {true}, flashhop::PackGqa::kOn,
                                   kNarrow},
                      WideBandCase{"no_mask_short_keys_packed", {1, 1, 512, 8, 2, 256}, {}, kAutoPack, kWide},
                      WideBandCase{"causal_8k_gqa_unpacked", {1, 8192, 8192, 8, 2, 64}, {true}, kAutoPack, kWide},
                      WideBandCase{"causal_4k_d256", {1, 4096, 4096, 4, 4, 256}, {true}, kAutoPack, kWide},
                      WideBandCase{"causal_2k_d256", {1, 2048, 2048, 4, 4, 256}, {true}, kAutoPack, kNarrow},
                      WideBandCase{"window_2047_wide_d256", {1, 16384, 16384, 4, 4, 256}, {false, 2047, 0}, kAutoPack,
                                   kWide},
                      WideBandCase{"window_2046_narrow_d256", {1, 16384, 16384, 4, 4, 256}, {false, 2046, 0}, kAutoPack,
                                   kNarrow},
                      // d = 128: the query rows, masked or not (short up to 64 and from 129 to 192).
                      WideBandCase{"no_mask_64_queries_d128", {1, 64, 8192, 4, 4, 128}, {}, kAutoPack, kShort},
                      WideBandCase{"causal_16_queries_d128", {1, 16, 8192, 4, 4, 128}, {true}, kAutoPack, kShort},
                      WideBandCase{"causal_192_queries_d128", {1, 192, 192, 4, 4, 128}, {true}, kAutoPack, kShort},
                      WideBandCase{"no_mask_193_queries_d128", {1, 193, 1024, 4, 4, 128}, {}, kAutoPack, kWide},
                      // 16 queries of 4 heads per KV head pack (64 rows of a 128-row tile against 16
                      // of a 64-row one) and take the default width; 48 of 2 fill both tiles alike.
                      WideBandCase{"short_queries_packed_d128", {1, 16, 8192, 32, 8, 128}, {}, kAutoPack, kWide},
                      WideBandCase{"short_queries_gqa_unpacked_d128", {1, 48, 1000, 4, 2, 128}, {}, kAutoPack, kShort}),
    [](const ::testing::TestParamInfo<WideBandCase>& info) { return info.param.name; });

TEST(Plan, ResolvesPackGqa) {
  ForwardArgs args = with_problem({2, 1, 500, 32, 8, 128});
  ASSERT_TRUE(flashhop::validate_forward(args).ok());
  EXPECT_TRUE(flashhop::detail::plan_forward(args, {}).recipe_of().pack_gqa);
  args.pack_gqa = flashhop::PackGqa::kOff;
  EXPECT_FALSE(flashhop::detail::plan_forward(args, {}).recipe_of().pack_gqa);
}

TEST(Plan, GivenScaleAndAbsentLse) {
  ForwardArgs args = valid_args();
  args.softmax_scale = 0.3f;
  args.lse.reset();
  const flashhop::detail::ForwardPlan plan_of_call = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(plan_of_call.params.softmax_scale, 0.3f);
  EXPECT_EQ(plan_of_call.params.lse, nullptr);
  EXPECT_FALSE(plan_of_call.recipe_of().local());
}

// A dimension of size 1 is never stepped over: any stride is taken, and the kernel gets one that
// TMA accepts (below 2^40 bytes, a multiple of 16 bytes), whatever was given.
TEST(Plan, UnitDimensionsTakeAnyStride) {
  ForwardArgs args = with_problem({1, 1, 65, 8, 2, 128});
  args.q.stride[0] = std::int64_t{1} << 45;
  args.q.stride[1] = 0;
  args.o.stride[0] = -8;
  const flashhop::sm90::ForwardParams params = flashhop::detail::plan_forward(args, {}).params;
  EXPECT_EQ(params.q_batch_stride, 8 * 128);  // the extent of the heads
  EXPECT_EQ(params.q_row_stride, 8 * 128);
  EXPECT_EQ(params.q_head_stride, 128);
  EXPECT_EQ(params.o_batch_stride, 8 * 128);
  EXPECT_EQ(params.k_batch_stride, args.k.stride[1] * 65);
}

TEST(Plan, DeviceFactsSizeTheWorkspaceAndTheGrid) {
  // d = 128 without a mask, 8 tiles of 64 key tiles: one round, which splits over 132 SMs.
  const ForwardArgs args = with_problem({1, 1024, 8192, 1, 1, 128});
  const flashhop::detail::ForwardPlan none = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(none.workspace_bytes, 0u);
  const flashhop::detail::ForwardPlan h100 = flashhop::detail::plan_forward(args, {132, 50ll << 20});
  EXPECT_GT(h100.workspace_bytes, 0u);
  EXPECT_EQ(h100.params.num_sms, 132);
  EXPECT_EQ(h100.params.l2_bytes, 50ll << 20);
}

TEST(Plan, ComputeCapabilityNineZeroOnly) {
  EXPECT_TRUE(flashhop::detail::check_compute_capability(9, 0).ok());
  for (auto [major, minor] : {std::pair{8, 0}, {8, 9}, {10, 0}, {12, 0}}) {
    const Status status = flashhop::detail::check_compute_capability(major, minor);
    EXPECT_EQ(status.code, StatusCode::kNotSupported);
    const std::string found = std::to_string(major) + "." + std::to_string(minor);
    EXPECT_NE(status.message.find("compute capability " + found), std::string::npos) << status.message;
    EXPECT_NE(status.message.find("need 9.0"), std::string::npos) << status.message;
  }
}

TEST(TensorDesc, MakeContiguous) {
  int storage = 0;
  const TensorDesc desc = flashhop::make_contiguous(&storage, DType::kFloat16, {2, 3, 4, 5}, 1);
  EXPECT_EQ(desc.data, &storage);
  EXPECT_EQ(desc.dtype, DType::kFloat16);
  EXPECT_EQ(desc.rank, 4);
  EXPECT_EQ(desc.device, 1);
  const std::int64_t expected_shape[] = {2, 3, 4, 5}, expected_stride[] = {60, 20, 5, 1};
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(desc.shape[d], expected_shape[d]) << d;
    EXPECT_EQ(desc.stride[d], expected_stride[d]) << d;
  }
}

TEST(TensorDesc, MakeContiguousKeepsStridesPositiveForEmptyDims) {
  const TensorDesc desc = flashhop::make_contiguous(nullptr, DType::kBFloat16, {1, 0, 8, 64});
  const std::int64_t expected_stride[] = {512, 512, 64, 1};
  for (int d = 0; d < 4; ++d) EXPECT_EQ(desc.stride[d], expected_stride[d]) << d;
}

TEST(TensorDesc, MakeContiguousRecordsRankBeyondMax) {
  const TensorDesc desc = flashhop::make_contiguous(nullptr, DType::kBFloat16, {1, 2, 3, 4, 5});
  EXPECT_EQ(desc.rank, 5);
  ForwardArgs args;
  args.q = args.k = args.v = args.o = desc;
  const Status status = flashhop::validate_forward(args);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("q.rank = 5"), std::string::npos) << status.message;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(flashhop::dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(flashhop::dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(flashhop::dtype_size(DType::kFloat32), 4u);
  EXPECT_STREQ(flashhop::dtype_name(DType::kFloat16), "float16");
  EXPECT_STREQ(flashhop::dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(flashhop::dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(flashhop::dtype_size(DType::kInt32), 4u);
  EXPECT_STREQ(flashhop::dtype_name(DType::kInt32), "int32");
  EXPECT_EQ(flashhop::dtype_size(DType::kFloat8E4M3), 1u);
  EXPECT_STREQ(flashhop::dtype_name(DType::kFloat8E4M3), "float8_e4m3fn");
}

// ---- variable-length batches -------------------------------------------------------------------

// Three sequences packed: q (100, 8, 128), k and v (300, 2, 128), o like q, lse (8, 100), bf16;
// cu_seqlens_q and cu_seqlens_k int32 (4), seqused_q and seqused_k int32 (3); max_seqlen_q 50,
// max_seqlen_k 200. Each tensor 4 GiB apart from the next.
ForwardArgs valid_varlen_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f2000000000} + (gib << 32));
  };
  using flashhop::make_contiguous;
  ForwardArgs a;
  a.q = make_contiguous(at(0), DType::kBFloat16, {100, 8, 128});
  a.k = make_contiguous(at(1), DType::kBFloat16, {300, 2, 128});
  a.v = make_contiguous(at(2), DType::kBFloat16, {300, 2, 128});
  a.o = make_contiguous(at(3), DType::kBFloat16, {100, 8, 128});
  a.lse = make_contiguous(at(4), DType::kFloat32, {8, 100});
  a.cu_seqlens_q = make_contiguous(at(5), DType::kInt32, {4});
  a.cu_seqlens_k = make_contiguous(at(6), DType::kInt32, {4});
  a.seqused_q = make_contiguous(at(7), DType::kInt32, {3});
  a.seqused_k = make_contiguous(at(8), DType::kInt32, {3});
  a.max_seqlen_q = 50;
  a.max_seqlen_k = 200;
  return a;
}

// Sets total_q in q, o and lse.
void set_total_q(ForwardArgs& a, std::int64_t total_q) { a.q.shape[0] = a.o.shape[0] = a.lse->shape[1] = total_q; }

// e4m3 q, k and v (o stays bfloat16) and float32 (batch, nheads_kv) descales, each 4 GiB apart.
void set_fp8_varlen(ForwardArgs& a) {
  a.q.dtype = a.k.dtype = a.v.dtype = DType::kFloat8E4M3;
  a.q_descale = flashhop::make_contiguous(shifted(a.q.data, std::int64_t{20} << 32), DType::kFloat32, {3, 2});
  a.k_descale = flashhop::make_contiguous(shifted(a.q.data, std::int64_t{21} << 32), DType::kFloat32, {3, 2});
  a.v_descale = flashhop::make_contiguous(shifted(a.q.data, std::int64_t{22} << 32), DType::kFloat32, {3, 2});
}

// Sets the batch in cu_seqlens_q, cu_seqlens_k, seqused_q and seqused_k.
void set_batch(ForwardArgs& a, std::int64_t batch) {
  a.cu_seqlens_q->shape[0] = a.cu_seqlens_k->shape[0] = batch + 1;
  a.seqused_q->shape[0] = a.seqused_k->shape[0] = batch;
}

class InvalidVarlenArguments : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidVarlenArguments, RejectedWithCodeAndNamedArgument) { expect_rejected(valid_varlen_args(), GetParam()); }

const InvalidCase kInvalidVarlenCases[] = {
    // which fields come together
    {"cu_seqlens_q_alone", [](ForwardArgs& a) { a.cu_seqlens_k.reset(); }, kNotSupported,
     {"cu_seqlens_k = none with cu_seqlens_q given: expected both or neither"}},
    // ranks: 3-D tensors with cu_seqlens
    {"q_rank_4", [](ForwardArgs& a) { a.q.rank = 4; }, kInvalid,
     {"q.rank = 4", "expected 3 (total_q, nheads, head_dim) with cu_seqlens"}},
    {"v_rank_4", [](ForwardArgs& a) { a.v.rank = 4; }, kInvalid, {"v.rank = 4", "(total_k, nheads_kv, head_dim_v)"}},
    {"o_rank_2", [](ForwardArgs& a) { a.o.rank = 2; }, kInvalid, {"o.rank = 2", "expected 3 (total_q, nheads, head_dim_v)"}},
    {"lse_rank_3", [](ForwardArgs& a) { a.lse->rank = 3; }, kInvalid,
     {"lse.rank = 3", "expected 2 (nheads, total_q) with cu_seqlens"}},
    {"cu_seqlens_q_rank_2", [](ForwardArgs& a) { a.cu_seqlens_q->rank = 2; }, kInvalid,
     {"cu_seqlens_q.rank = 2", "expected 1 (batch + 1)"}},
    {"seqused_k_rank_0", [](ForwardArgs& a) { a.seqused_k->rank = 0; }, kInvalid,
     {"seqused_k.rank = 0", "expected 1 (batch)"}},
    // dtypes
    {"cu_seqlens_q_float32", [](ForwardArgs& a) { a.cu_seqlens_q->dtype = DType::kFloat32; }, kInvalid,
     {"cu_seqlens_q.dtype = float32: expected int32"}},
    {"cu_seqlens_k_bfloat16", [](ForwardArgs& a) { a.cu_seqlens_k->dtype = DType::kBFloat16; }, kInvalid,
     {"cu_seqlens_k.dtype = bfloat16: expected int32"}},
    {"seqused_q_float16", [](ForwardArgs& a) { a.seqused_q->dtype = DType::kFloat16; }, kInvalid,
     {"seqused_q.dtype = float16: expected int32"}},
    {"q_int32", [](ForwardArgs& a) { a.q.dtype = DType::kInt32; }, kInvalid,
     {"q.dtype = int32: expected float16, bfloat16 or float8_e4m3fn"}},
    {"q_float8_alone", [](ForwardArgs& a) { a.q.dtype = DType::kFloat8E4M3; }, kInvalid,
     {"k.dtype = bfloat16", "the dtype of q"}},
    {"cu_seqlens_q_float8", [](ForwardArgs& a) { a.cu_seqlens_q->dtype = DType::kFloat8E4M3; }, kInvalid,
     {"cu_seqlens_q.dtype = float8_e4m3fn: expected int32"}},
    {"lse_bfloat16", [](ForwardArgs& a) { a.lse->dtype = DType::kBFloat16; }, kInvalid, {"lse.dtype = bfloat16"}},
    // shapes: batch from cu_seqlens_q
    {"cu_seqlens_q_empty",
     [](ForwardArgs& a) {
       a.cu_seqlens_q->shape[0] = a.cu_seqlens_k->shape[0] = 0;
       a.seqused_q.reset();
       a.seqused_k.reset();
     },
     kInvalid, {"cu_seqlens_q.shape[0] (batch + 1) = 0: expected >= 1"}},
    {"cu_seqlens_k_other_batch", [](ForwardArgs& a) { a.cu_seqlens_k->shape[0] = 5; }, kInvalid,
     {"cu_seqlens_k.shape[0] (batch + 1) = 5: expected 4 (cu_seqlens_q.shape[0] (batch + 1))"}},
    {"seqused_q_other_batch", [](ForwardArgs& a) { a.seqused_q->shape[0] = 4; }, kInvalid,
     {"seqused_q.shape[0] (batch) = 4: expected 3 (cu_seqlens_q.shape[0] - 1)"}},
    {"seqused_k_other_batch", [](ForwardArgs& a) { a.seqused_k->shape[0] = 2; }, kInvalid,
     {"seqused_k.shape[0] (batch) = 2: expected 3"}},
    {"total_q_negative", [](ForwardArgs& a) { set_total_q(a, -1); }, kInvalid, {"q.shape[0] (total_q) = -1"}},
    {"total_q_beyond_int32", [](ForwardArgs& a) { set_total_q(a, kBeyondInt32); }, kInvalid,
     {"q.shape[0] (total_q) = 2147483648", "expected <= 2147483647"}},
    {"total_k_beyond_int32", [](ForwardArgs& a) { a.k.shape[0] = a.v.shape[0] = kBeyondInt32; }, kInvalid,
     {"k.shape[0] (total_k) = 2147483648"}},
    {"nheads_0", [](ForwardArgs& a) { a.q.shape[1] = a.o.shape[1] = a.lse->shape[0] = 0; }, kInvalid,
     {"q.shape[1] (nheads) = 0", "expected >= 1"}},
    {"k_head_dim_differs", [](ForwardArgs& a) { a.k.shape[2] = 64; }, kInvalid,
     {"k.shape[2] (head_dim) = 64", "expected 128 (q.shape[2] (head_dim))"}},
    {"v_total_k_differs", [](ForwardArgs& a) { a.v.shape[0] = 299; }, kInvalid,
     {"v.shape[0] (total_k) = 299", "expected 300 (k.shape[0] (total_k))"}},
    {"o_total_q_differs", [](ForwardArgs& a) { a.o.shape[0] = 99; }, kInvalid,
     {"o.shape[0] (total_q) = 99", "expected 100 (q.shape[0] (total_q))"}},
    {"o_head_dim_v_differs", [](ForwardArgs& a) { a.o.shape[2] = 64; }, kInvalid, {"o.shape[2] (head_dim_v) = 64"}},
    {"lse_total_q_differs", [](ForwardArgs& a) { a.lse->shape[1] = 101; }, kInvalid,
     {"lse.shape[1] (total_q) = 101", "expected 100 (q.shape[0] (total_q))"}},
    {"lse_heads_differ", [](ForwardArgs& a) { a.lse->shape[0] = 2; }, kInvalid,
     {"lse.shape[0] (nheads) = 2", "expected 8 (q.shape[1] (nheads))"}},
    {"nheads_not_multiple_of_nheads_kv", [](ForwardArgs& a) { a.k.shape[1] = a.v.shape[1] = 3; }, kInvalid,
     {"k.shape[1] (nheads_kv) = 3: nheads (8) must be a multiple of it"}},
    // bounds
    {"max_seqlen_q_0", [](ForwardArgs& a) { a.max_seqlen_q = 0; }, kInvalid,
     {"max_seqlen_q = 0: expected >= 1 with cu_seqlens_q"}},
    {"max_seqlen_k_negative", [](ForwardArgs& a) { a.max_seqlen_k = -3; }, kInvalid,
     {"max_seqlen_k = -3: expected >= 1 with cu_seqlens_k"}},
    {"max_seqlen_sum_past_its_limit",
     [](ForwardArgs& a) {
       set_total_q(a, std::int64_t{1} << 30);
       a.k.shape[0] = a.v.shape[0] = std::int64_t{1} << 30;
       a.max_seqlen_q = a.max_seqlen_k = 1 << 30;
     },
     kInvalid, {"max_seqlen_q + max_seqlen_k (each cut at total_q = 1073741824", "= 2147483648: expected <= 2147418111"}},
    {"query_tiles_past_their_limit",
     [](ForwardArgs& a) {
       set_batch(a, 1 << 20);
       set_total_q(a, std::int64_t{1} << 30);
       a.max_seqlen_q = 1 << 16;  // 1024 tiles x 8 heads x 2^20 sequences
     },
     kInvalid, {"cu_seqlens_q.shape[0] - 1 (batch) = 1048576, max_seqlen_q = 65536, nheads 8",
                "query tiles, expected <= 2147418111"}},
    // strides
    {"q_last_dim_not_contiguous", [](ForwardArgs& a) { a.q.stride[2] = 2; }, kInvalid,
     {"q.stride[2] = 2", "expected 1"}},
    {"k_rows_not_16_byte_aligned", [](ForwardArgs& a) { a.k.stride[0] += 4; }, kInvalid,
     {"k.stride[0] = 260", "multiple of 8 elements"}},
    {"lse_rows_not_contiguous", [](ForwardArgs& a) { a.lse->stride[1] = 2; }, kInvalid, {"lse.stride[1] = 2"}},
    {"cu_seqlens_q_strided", [](ForwardArgs& a) { a.cu_seqlens_q->stride[0] = 2; }, kInvalid,
     {"cu_seqlens_q.stride[0] = 2: expected 1"}},
    {"seqused_k_strided", [](ForwardArgs& a) { a.seqused_k->stride[0] = 0; }, kInvalid, {"seqused_k.stride[0] = 0"}},
    // pointers
    {"cu_seqlens_k_null", [](ForwardArgs& a) { a.cu_seqlens_k->data = nullptr; }, kInvalid,
     {"cu_seqlens_k.data = null"}},
    {"seqused_q_not_4_byte_aligned", [](ForwardArgs& a) { a.seqused_q->data = shifted(a.seqused_q->data, 2); },
     kInvalid, {"seqused_q.data = 0x", "4-byte aligned"}},
    {"q_not_16_byte_aligned", [](ForwardArgs& a) { a.q.data = shifted(a.q.data, 8); }, kInvalid, {"q.data = 0x"}},
    // outputs that share memory with what the kernels read
    {"o_over_cu_seqlens_q", [](ForwardArgs& a) { a.cu_seqlens_q->data = shifted(a.o.data, 64); }, kInvalid,
     {"o.data = 0x", "overlaps cu_seqlens_q's"}},
    {"lse_over_seqused_k", [](ForwardArgs& a) { a.seqused_k->data = a.lse->data; }, kInvalid,
     {"lse.data", "overlaps seqused_k's"}},
    {"o_is_k", [](ForwardArgs& a) { a.o.data = a.k.data; }, kInvalid, {"o.data", "overlaps k's"}},
    // devices
    {"cu_seqlens_k_on_other_device", [](ForwardArgs& a) { a.cu_seqlens_k->device = 1; }, kInvalid,
     {"cu_seqlens_k.device = 1: expected 0 (q.device)"}},
    {"seqused_q_on_other_device", [](ForwardArgs& a) { a.seqused_q->device = 3; }, kInvalid,
     {"seqused_q.device = 3"}},
    // options, as without cu_seqlens
    {"softcap_negative", [](ForwardArgs& a) { a.softcap = -1.f; }, kInvalid, {"softcap = -1"}},
    {"causal_with_right_window",
     [](ForwardArgs& a) {
       a.causal = true;
       a.window_right = 2;
     },
     kInvalid, {"window_right = 2", "-1 or 0 with causal"}},
    {"pack_gqa_on_past_the_row_limit",
     [](ForwardArgs& a) {
       a.pack_gqa = flashhop::PackGqa::kOn;
       set_total_q(a, std::int64_t{1} << 29);
       a.max_seqlen_q = 1 << 29;  // x 4 heads per KV head
       a.o.data = shifted(a.q.data, std::int64_t{1} << 42);  // past q's 2^40 bytes
       a.lse->data = shifted(a.q.data, std::int64_t{1} << 43);
     },
     kInvalid, {"pack_gqa = on: max_seqlen_q * nheads / nheads_kv = 2147483648", "expected <= 2147418111"}},
    // valid but not supported
    {"head_dim_80", [](ForwardArgs& a) { a.q.shape[2] = a.k.shape[2] = a.v.shape[2] = a.o.shape[2] = 80; },
     kNotSupported, {"q.shape[2] (head_dim) = 80", "64, 96, 128, 192 and 256"}},
    {"head_dim_v_64", [](ForwardArgs& a) { a.v.shape[2] = a.o.shape[2] = 64; }, kNotSupported,
     {"v.shape[2] (head_dim_v) = 64", "expected head_dim (128)"}},
    {"leftpad_k_batch", [](ForwardArgs& a) { a.leftpad_k = flashhop::make_contiguous(a.seqused_k->data, DType::kInt32, {4}); },
     kInvalid, {"leftpad_k.shape[0] (batch) = 4", "expected 3"}},
    {"leftpad_k_dtype", [](ForwardArgs& a) { a.leftpad_k = flashhop::make_contiguous(a.seqused_k->data, DType::kFloat32, {3}); },
     kInvalid, {"leftpad_k.dtype = float32", "int32"}},
    {"num_splits_past_the_most", [](ForwardArgs& a) { a.num_splits = 300; }, kInvalid,
     {"num_splits = 300", "expected 0 (the library chooses) to 256"}},
    {"num_splits_past_the_tile_count",
     [](ForwardArgs& a) {
       a.num_splits = 256;  // 100 x 16384 x 8 x 256 tiles
       set_batch(a, 100);
       set_total_q(a, 1 << 20);
       a.max_seqlen_q = 1 << 20;
       a.o.data = shifted(a.q.data, std::int64_t{1} << 36);
       a.lse->data = shifted(a.q.data, std::int64_t{1} << 37);
     },
     kInvalid, {"num_splits = 256", "nheads * num_splits query tiles, expected <= 2147418111"}},
    // FP8: descales of (batch, nheads_kv), batch from cu_seqlens_q; no block scales
    {"fp8_descale_of_total_q",
     [](ForwardArgs& a) {
       set_fp8_varlen(a);
       a.q_descale->shape[0] = 100;
     },
     kInvalid, {"q_descale.shape[0] (batch) = 100", "expected 3 (cu_seqlens_q.shape[0] - 1)"}},
    {"fp8_descale_per_query_head",
     [](ForwardArgs& a) {
       set_fp8_varlen(a);
       a.v_descale->shape[1] = 8;
     },
     kInvalid, {"v_descale.shape[1] (nheads_kv) = 8", "expected 2"}},
    {"fp8_block_scales",
     [](ForwardArgs& a) {
       set_fp8_varlen(a);
       a.q_descale = a.k_descale = a.v_descale = std::nullopt;
       a.q_block_scale = flashhop::make_contiguous(shifted(a.q.data, std::int64_t{1} << 40), DType::kFloat32, {3, 8, 1});
       a.k_block_scale = a.v_block_scale = a.q_block_scale;
     },
     kNotSupported, {"block scales with cu_seqlens_q", "q_descale, k_descale and v_descale"}},
};

INSTANTIATE_TEST_SUITE_P(Varlen, InvalidVarlenArguments, ::testing::ValuesIn(kInvalidVarlenCases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

class ValidVarlenArguments : public ::testing::TestWithParam<ValidCase> {};

// Accepted, planned, and answered with the missing kernels' kNotSupported by forward.
TEST_P(ValidVarlenArguments, AcceptedAndPlanned) {
  const ForwardArgs args = GetParam().make();
  const Status status = flashhop::validate_forward(args);
  ASSERT_TRUE(status.ok()) << status.message;
  std::size_t bytes = 1;
  ASSERT_TRUE(flashhop::forward_workspace_size(args, &bytes).ok());
  const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
  ASSERT_TRUE(plan.varlen.has_value());
  EXPECT_EQ(bytes, plan.varlen->workspace_bytes);
}

const ValidCase kValidVarlenCases[] = {
    {"three_sequences", [] { return valid_varlen_args(); }},
    {"fp8_with_descales",
     [] {
       ForwardArgs a = valid_varlen_args();
       set_fp8_varlen(a);
       return a;
     }},
    {"without_seqused",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.seqused_q.reset();
       a.seqused_k.reset();
       return a;
     }},
    {"seqused_k_only",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.seqused_q.reset();
       return a;
     }},
    {"without_lse",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.lse.reset();
       return a;
     }},
    {"no_sequences",  // batch 0: cu_seqlens hold the one 0, seqused nothing (null is fine)
     [] {
       ForwardArgs a = valid_varlen_args();
       set_batch(a, 0);
       a.seqused_q->data = a.seqused_k->data = nullptr;
       return a;
     }},
    {"no_rows",
     [] {
       ForwardArgs a = valid_varlen_args();
       set_total_q(a, 0);
       a.k.shape[0] = a.v.shape[0] = 0;
       a.q.data = a.k.data = a.v.data = a.o.data = a.lse->data = nullptr;
       return a;
     }},
    {"bounds_past_the_totals",  // FlashAttention-3 accepts them; the plan cuts them at the totals
     [] {
       ForwardArgs a = valid_varlen_args();
       a.max_seqlen_q = a.max_seqlen_k = std::numeric_limits<int>::max();
       return a;
     }},
    {"causal_gqa_pack_on",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.causal = true;
       a.pack_gqa = flashhop::PackGqa::kOn;
       return a;
     }},
    {"window_softcap_scale",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.window_left = 32;
       a.window_right = 8;
       a.softcap = 30.f;
       a.softmax_scale = 0.1f;
       return a;
     }},
    {"strided_q_inside_a_packed_qkv",  // q, k, v as slices of one (total, 8 + 2 + 2, 128) tensor
     [] {
       ForwardArgs a = valid_varlen_args();
       set_total_q(a, 300);
       a.q.stride[0] = a.k.stride[0] = a.v.stride[0] = 12 * 128;
       a.k.data = shifted(a.q.data, 8 * 128 * 2);
       a.v.data = shifted(a.q.data, 10 * 128 * 2);
       return a;
     }},
    {"head_dims_192_128",
     [] {
       ForwardArgs a = valid_varlen_args();
       a.q.shape[2] = a.k.shape[2] = 192;
       a.v.shape[2] = a.o.shape[2] = 128;
       a.q.stride[1] = a.k.stride[1] = 192;
       a.q.stride[0] = 8 * 192;
       a.k.stride[0] = 2 * 192;
       return a;
     }},
};

INSTANTIATE_TEST_SUITE_P(Varlen, ValidVarlenArguments, ::testing::ValuesIn(kValidVarlenCases),
                         [](const ::testing::TestParamInfo<ValidCase>& info) { return info.param.name; });

// The bound on query tiles, the tile list's bytes and the packed tensors' strides.
TEST(VarlenPlan, TileBoundWorkspaceAndStrides) {
  const ForwardArgs args = valid_varlen_args();
  const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {132, 50ll << 20});
  ASSERT_TRUE(plan.varlen.has_value());
  const flashhop::detail::VarlenPlan& varlen = *plan.varlen;
  EXPECT_EQ(varlen.batch, 3);
  EXPECT_EQ(varlen.total_q, 100);
  EXPECT_EQ(varlen.total_k, 300);
  EXPECT_EQ(varlen.max_seqlen_q, 50);
  EXPECT_EQ(varlen.max_seqlen_k, 200);
  EXPECT_EQ(varlen.cu_seqlens_q, args.cu_seqlens_q->data);
  EXPECT_EQ(varlen.cu_seqlens_k, args.cu_seqlens_k->data);
  EXPECT_EQ(varlen.seqused_q, args.seqused_q->data);
  EXPECT_EQ(varlen.seqused_k, args.seqused_k->data);

  // The unmasked recipe of the head dims with a variable-length kernel, packed: 50 queries of 4
  // heads per KV head fill 128-row tiles better than 50 alone.
  const flashhop::sm90::ForwardRecipe& recipe = plan.recipe_of();
  EXPECT_EQ(recipe.head_dim, 128);
  EXPECT_TRUE(recipe.varlen);
  EXPECT_TRUE(recipe.pack_gqa);
  EXPECT_FALSE(recipe.local());
  EXPECT_EQ(varlen.num_tiles_bound, 3 * ((50 * 4 + recipe.block_m - 1) / recipe.block_m) * 2);
  // Not split: each split would be shorter than 4 key tiles. The tile list: a 16-byte header,
  // then 3 ints per sequence and one more.
  EXPECT_EQ(plan.params.num_splits, 1);
  EXPECT_EQ(varlen.workspace_bytes, 16u + (3u * 3u + 1u) * 4u);
  EXPECT_EQ(plan.workspace_bytes, varlen.workspace_bytes);

  const flashhop::sm90::ForwardParams& p = plan.params;
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seqlen_q, 50);
  EXPECT_EQ(p.seqlen_k, 200);
  EXPECT_EQ(p.nheads, 8);
  EXPECT_EQ(p.nheads_kv, 2);
  EXPECT_EQ(p.q_batch_stride, 0);
  EXPECT_EQ(p.q_row_stride, 8 * 128);
  EXPECT_EQ(p.q_head_stride, 128);
  EXPECT_EQ(p.k_batch_stride, 0);
  EXPECT_EQ(p.k_row_stride, 2 * 128);
  EXPECT_EQ(p.o_row_stride, 8 * 128);
  EXPECT_EQ(p.lse, args.lse->data);
  EXPECT_EQ(p.lse_batch_stride, 0);
  EXPECT_EQ(p.lse_head_stride, 100);
  EXPECT_EQ(p.lse_row_stride, 1);
}

// ---- paged KV caches ----------------------------------------------------------------------------

// The three sequences of valid_varlen_args over a paged cache: k and v (40, 16, 2, 128) pages,
// page_table int32 (3, 20), seqused_k the keys; no cu_seqlens_k.
ForwardArgs valid_paged_args() {
  ForwardArgs a = valid_varlen_args();
  a.cu_seqlens_k.reset();
  a.k = flashhop::make_contiguous(a.k.data, DType::kBFloat16, {40, 16, 2, 128});
  a.v = flashhop::make_contiguous(a.v.data, DType::kBFloat16, {40, 16, 2, 128});
  a.page_table = flashhop::make_contiguous(shifted(a.seqused_k->data, std::int64_t{1} << 32), DType::kInt32, {3, 20});
  return a;
}

class InvalidPagedArguments : public ::testing::TestWithParam<InvalidCase> {};

// valid_paged_args() turned into an e4m3 call at `head_dim` over pages of `page_size` rows.
std::function<void(ForwardArgs&)> fp8_pages(std::int64_t page_size, std::int64_t head_dim) {
  return [=](ForwardArgs& a) {
    a.q = flashhop::make_contiguous(a.q.data, DType::kFloat8E4M3, {100, 8, head_dim});
    a.o = flashhop::make_contiguous(a.o.data, DType::kBFloat16, {100, 8, head_dim});
    a.k = flashhop::make_contiguous(a.k.data, DType::kFloat8E4M3, {40, page_size, 2, head_dim});
    a.v = flashhop::make_contiguous(a.v.data, DType::kFloat8E4M3, {40, page_size, 2, head_dim});
  };
}

TEST_P(InvalidPagedArguments, RejectedWithCodeAndNamedArgument) { expect_rejected(valid_paged_args(), GetParam()); }

const InvalidCase kInvalidPagedCases[] = {
    {"leftpad_k_over_pages",
     [](ForwardArgs& a) { a.leftpad_k = flashhop::make_contiguous(a.seqused_q->data, DType::kInt32, {3}); }, kNotSupported,
     {"leftpad_k with page_table.shape[1] (max_pages) = 20", "expected one page per sequence"}},
    // which fields come together
    {"without_cu_seqlens_q", [](ForwardArgs& a) { a.cu_seqlens_q.reset(); }, kNotSupported,
     {"cu_seqlens_q = none with page_table given"}},
    {"with_cu_seqlens_k",
     [](ForwardArgs& a) { a.cu_seqlens_k = flashhop::make_contiguous(a.seqused_q->data, DType::kInt32, {4}); },
     kInvalid, {"cu_seqlens_k is given with page_table: expected none"}},
    {"without_seqused_k", [](ForwardArgs& a) { a.seqused_k.reset(); }, kInvalid,
     {"seqused_k = none with page_table given"}},
    // ranks, dtypes and shapes
    {"k_rank_3", [](ForwardArgs& a) { a.k.rank = 3; }, kInvalid,
     {"k.rank = 3", "expected 4 (num_pages, page_size, nheads_kv, head_dim) with page_table"}},
    {"page_table_rank_1", [](ForwardArgs& a) { a.page_table->rank = 1; }, kInvalid,
     {"page_table.rank = 1", "expected 2 (batch, max_pages)"}},
    {"page_table_float32", [](ForwardArgs& a) { a.page_table->dtype = DType::kFloat32; }, kInvalid,
     {"page_table.dtype = float32: expected int32"}},
    {"page_table_batch", [](ForwardArgs& a) { a.page_table->shape[0] = 4; }, kInvalid,
     {"page_table.shape[0] (batch) = 4: expected 3 (cu_seqlens_q.shape[0] - 1)"}},
    {"page_table_without_pages", [](ForwardArgs& a) { a.page_table->shape[1] = 0; }, kInvalid,
     {"page_table.shape[1] (max_pages) = 0: expected >= 1"}},
    {"v_page_size", [](ForwardArgs& a) { a.v.shape[1] = 32; }, kInvalid,
     {"v.shape[1] (page_size) = 32: expected 16 (k.shape[1] (page_size))"}},
    {"v_num_pages", [](ForwardArgs& a) { a.v.shape[0] = 39; }, kInvalid, {"v.shape[0] (num_pages) = 39: expected 40"}},
    {"k_nheads_kv_not_dividing", [](ForwardArgs& a) { a.k.shape[2] = a.v.shape[2] = 3; }, kInvalid,
     {"k.shape[2] (nheads_kv) = 3: nheads (8) must be a multiple of it"}},
    {"k_head_dim", [](ForwardArgs& a) { a.k.shape[3] = 64; }, kInvalid, {"k.shape[3] (head_dim) = 64: expected 128"}},
    {"capacity_past_int32",
     [](ForwardArgs& a) {
       a.page_table->shape[1] = 1 << 28;
       a.page_table->stride[0] = 1 << 28;
     },
     kInvalid, {"page_table.shape[1] (max_pages) * k.shape[1] (page_size) = 4294967296", "a sequence's keys"}},
    // memory
    {"page_table_last_dim_strided", [](ForwardArgs& a) { a.page_table->stride[1] = 2; }, kInvalid,
     {"page_table.stride[1] = 2: expected 1"}},
    {"k_page_stride_not_16_byte_aligned", [](ForwardArgs& a) { a.k.stride[0] += 4; }, kInvalid,
     {"k.stride[0] = ", "multiple of 8 elements"}},
    {"o_over_page_table", [](ForwardArgs& a) { a.page_table->data = a.o.data; }, kInvalid,
     {"o.data", "overlaps page_table's"}},
    {"page_table_on_other_device", [](ForwardArgs& a) { a.page_table->device = 2; }, kInvalid,
     {"page_table.device = 2: expected 0 (q.device)"}},
    // valid but not supported
    {"odd_pages_at_head_dim_96",
     [](ForwardArgs& a) {
       a.q.shape[2] = a.o.shape[2] = 96;
       a.k = flashhop::make_contiguous(a.k.data, DType::kBFloat16, {40, 15, 2, 96});
       a.v = flashhop::make_contiguous(a.v.data, DType::kBFloat16, {40, 15, 2, 96});
       a.q.stride[1] = a.o.stride[1] = 96;
       a.q.stride[0] = a.o.stride[0] = 8 * 96;
     },
     kNotSupported, {"k.shape[1] (page_size) = 15: expected a multiple of 2 with k.shape[3] (head_dim) = 96 in bfloat16"}},
    {"fp8_pages_of_two_at_head_dim_96", fp8_pages(2, 96), kNotSupported,
     {"k.shape[1] (page_size) = 2: expected a multiple of 4", "float8_e4m3fn", "32-byte swizzle atoms"}},
    {"fp8_odd_pages_at_head_dim_64", fp8_pages(3, 64), kNotSupported,
     {"k.shape[1] (page_size) = 3: expected a multiple of 2 with k.shape[3] (head_dim) = 64"}},
};

INSTANTIATE_TEST_SUITE_P(Paged, InvalidPagedArguments, ::testing::ValuesIn(kInvalidPagedCases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

// Pages of any size (and odd sizes at d = 96 where the page size is even), planned with the page
// stride as the batch stride, a sequence's capacity as total_k.
TEST(PagedPlan, PagesStridesAndCapacity) {
  for (int page_size : {1, 3, 16, 256}) {
    ForwardArgs args = valid_paged_args();
    args.k = flashhop::make_contiguous(args.k.data, DType::kBFloat16, {40, page_size, 2, 128});
    args.v = flashhop::make_contiguous(args.v.data, DType::kBFloat16, {40, page_size, 2, 128});
    ASSERT_TRUE(flashhop::validate_forward(args).ok()) << page_size;
    const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {132, 50ll << 20});
    ASSERT_TRUE(plan.varlen.has_value());
    EXPECT_TRUE(plan.recipe_of().varlen);
    EXPECT_EQ(plan.varlen->total_k, 20 * page_size);
    EXPECT_EQ(plan.varlen->max_seqlen_k, std::min(200, 20 * page_size));
    EXPECT_EQ(plan.varlen->workspace_bytes, 16u + (3u * 3u + 1u) * 4u);
    const flashhop::sm90::ForwardParams& p = plan.params;
    EXPECT_EQ(p.page_table, args.page_table->data);
    EXPECT_EQ(p.page_table_stride, 20);
    EXPECT_EQ(p.page_size, page_size);
    EXPECT_EQ(p.num_pages, 40);
    EXPECT_EQ(p.max_pages, 20);
    EXPECT_EQ(p.cu_seqlens_k, nullptr);
    EXPECT_EQ(p.seqused_k, args.seqused_k->data);
    EXPECT_EQ(p.total_k, 20 * page_size);
    EXPECT_EQ(p.k_batch_stride, std::int64_t{page_size} * 2 * 128);
    EXPECT_EQ(p.k_row_stride, page_size > 1 ? 2 * 128 : 40 * 2 * 128);  // a size-1 dimension: the span
    EXPECT_EQ(p.k_head_stride, 128);
    EXPECT_EQ(p.v_batch_stride, std::int64_t{page_size} * 2 * 128);
  }
}

// Left padding: with packed K / V, or with one page per sequence; the plan hands it to the kernels.
TEST(PagedPlan, LeftPaddingWithOnePagePerSequence) {
  ForwardArgs args = valid_paged_args();
  args.k = flashhop::make_contiguous(args.k.data, DType::kBFloat16, {3, 320, 2, 128});
  args.v = flashhop::make_contiguous(args.v.data, DType::kBFloat16, {3, 320, 2, 128});
  args.page_table->shape[1] = 1;
  args.leftpad_k = flashhop::make_contiguous(shifted(args.seqused_k->data, 64), DType::kInt32, {3});
  ASSERT_TRUE(flashhop::validate_forward(args).ok()) << flashhop::validate_forward(args).message;
  EXPECT_EQ(flashhop::detail::plan_forward(args, {}).params.leftpad_k, args.leftpad_k->data);
  ForwardArgs packed = valid_varlen_args();
  packed.leftpad_k = args.leftpad_k;
  ASSERT_TRUE(flashhop::validate_forward(packed).ok()) << flashhop::validate_forward(packed).message;
  EXPECT_EQ(flashhop::detail::plan_forward(packed, {}).params.leftpad_k, args.leftpad_k->data);
}

// A bound of one row per sequence does not make the row stride a size-1 dimension's.
TEST(VarlenPlan, StridesOfAPackedQkvWhateverTheBounds) {
  ForwardArgs args = valid_varlen_args();
  set_total_q(args, 300);
  args.q.stride[0] = args.k.stride[0] = args.v.stride[0] = 12 * 128;
  args.k.data = shifted(args.q.data, 8 * 128 * 2);
  args.v.data = shifted(args.q.data, 10 * 128 * 2);
  args.max_seqlen_q = args.max_seqlen_k = 1;
  ASSERT_TRUE(flashhop::validate_forward(args).ok());
  const flashhop::sm90::ForwardParams p = flashhop::detail::plan_forward(args, {}).params;
  EXPECT_EQ(p.q_row_stride, 12 * 128);
  EXPECT_EQ(p.k_row_stride, 12 * 128);
  EXPECT_EQ(p.v_row_stride, 12 * 128);
  EXPECT_EQ(p.k_head_stride, 128);
  EXPECT_EQ(p.o_row_stride, 8 * 128);
  EXPECT_EQ(p.seqlen_q, 1);
}

// Unpacked when asked, and whenever packing fills the tiles no better.
TEST(VarlenPlan, PacksQueryHeadsAsTheFixedLengthPlan) {
  ForwardArgs args = valid_varlen_args();
  args.pack_gqa = flashhop::PackGqa::kOff;
  EXPECT_FALSE(flashhop::detail::plan_forward(args, {}).recipe_of().pack_gqa);
  args.pack_gqa = flashhop::PackGqa::kAuto;
  args.max_seqlen_q = 100;  // 4 x 100 rows fill 128-row tiles no better than 100
  EXPECT_FALSE(flashhop::detail::plan_forward(args, {}).recipe_of().pack_gqa);
  args.causal = true;
  args.max_seqlen_q = 3;
  const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
  EXPECT_TRUE(plan.recipe_of().pack_gqa);
  EXPECT_TRUE(plan.recipe_of().local());
  EXPECT_TRUE(plan.recipe_of().varlen);
}

// Decoding a few sequences over many keys: split about as many ways as fill the SMs, each split at
// least 4 key tiles; an explicit count as given; none without the device's SM count or when the
// tiles already fill the SMs. The workspace holds the tile list, then the partials 256-byte aligned.
TEST(VarlenPlan, SplitsByKeysWhenTilesAreFewerThanSms) {
  using flashhop::make_contiguous;
  ForwardArgs args = valid_paged_args();
  args.q = make_contiguous(args.q.data, DType::kBFloat16, {2, 32, 128});
  args.o = make_contiguous(args.o.data, DType::kBFloat16, {2, 32, 128});
  args.lse = make_contiguous(args.lse->data, DType::kFloat32, {32, 2});
  args.k = make_contiguous(args.k.data, DType::kBFloat16, {1 << 14, 16, 8, 128});
  args.v = make_contiguous(args.v.data, DType::kBFloat16, {1 << 14, 16, 8, 128});
  const auto set_paged_batch = [&](std::int64_t batch) {
    args.cu_seqlens_q->shape[0] = batch + 1;
    args.seqused_q->shape[0] = args.seqused_k->shape[0] = batch;
  };
  set_paged_batch(2);
  args.page_table = make_contiguous(args.page_table->data, DType::kInt32, {2, 1 << 13});
  args.max_seqlen_q = 1;
  args.max_seqlen_k = 100000;
  ASSERT_TRUE(flashhop::validate_forward(args).ok()) << flashhop::validate_forward(args).message;
  const auto plan_of = [&](int num_splits, int num_sms) {
    args.num_splits = num_splits;
    return flashhop::detail::plan_forward(args, {num_sms, 50ll << 20});
  };
  flashhop::detail::ForwardPlan plan = plan_of(0, 132);
  ASSERT_TRUE(plan.recipe_of().pack_gqa);  // 4 query heads per KV head: 2 x 8 tiles
  EXPECT_EQ(plan.varlen->num_tiles_bound, 16);
  const int ctas = 132 * flashhop::sm90::ctas_per_sm(plan.recipe_of().consumer_warpgroups());
  EXPECT_EQ(plan.params.num_splits, ctas / 16);
  using Partials = flashhop::sm90::VarlenSplitPartials;
  EXPECT_EQ(Partials::o_offset(2), 256u);
  EXPECT_EQ(plan.workspace_bytes, 256u + std::size_t(ctas / 16) * 2 * 32 * (128 + 1) * 4);

  plan = plan_of(3, 132);
  EXPECT_EQ(plan.params.num_splits, 3);
  EXPECT_EQ(plan.workspace_bytes, Partials::bytes(2, 3, 2, 32, 128));
  EXPECT_EQ(plan_of(1, 132).params.num_splits, 1);
  EXPECT_EQ(plan_of(1, 132).workspace_bytes, flashhop::sm90::VarlenTileList::bytes(2));
  EXPECT_EQ(plan_of(0, 0).params.num_splits, 1);
  // Short caches: each split at least 4 key tiles of 128.
  args.max_seqlen_k = 400;
  EXPECT_EQ(plan_of(0, 132).params.num_splits, 1);
  args.max_seqlen_k = 1000;
  EXPECT_EQ(plan_of(0, 132).params.num_splits, 2);
  args.max_seqlen_k = 4096;
  EXPECT_EQ(plan_of(0, 132).params.num_splits, 8);
  // 128 sequences fill the SMs without splits.
  set_paged_batch(128);
  args.q.shape[0] = args.o.shape[0] = args.lse->shape[1] = 128;
  args.page_table->shape[0] = 128;
  args.max_seqlen_k = 100000;
  EXPECT_EQ(plan_of(0, 132).params.num_splits, 1);
}

TEST(VarlenPlan, BoundsCutAtTheTotalsAndNoRowsNoWorkspace) {
  ForwardArgs args = valid_varlen_args();
  args.max_seqlen_q = 1 << 20;
  args.max_seqlen_k = 1 << 20;
  flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(plan.varlen->max_seqlen_q, 100);
  EXPECT_EQ(plan.varlen->max_seqlen_k, 300);
  EXPECT_EQ(plan.varlen->num_tiles_bound, 3 * ((100 + plan.recipe_of().block_m - 1) / plan.recipe_of().block_m) * 8);

  set_total_q(args, 0);
  plan = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(plan.varlen->workspace_bytes, 0u);
  EXPECT_EQ(plan.varlen->num_tiles_bound, 0);

  args = valid_varlen_args();
  set_batch(args, 0);
  plan = flashhop::detail::plan_forward(args, {});
  EXPECT_EQ(plan.varlen->batch, 0);
  EXPECT_EQ(plan.varlen->workspace_bytes, 0u);
}

// The mask decides the recipe as for sequences of the bounds' lengths.
TEST(VarlenPlan, MaskedCallsTakeLocalRecipes) {
  ForwardArgs args = valid_varlen_args();
  EXPECT_FALSE(flashhop::detail::plan_forward(args, {}).recipe_of().local());
  args.causal = true;
  EXPECT_TRUE(flashhop::detail::plan_forward(args, {}).recipe_of().local());
  args.causal = false;
  args.window_left = 16;
  EXPECT_TRUE(flashhop::detail::plan_forward(args, {}).recipe_of().local());
}

TEST(VarlenPlan, FixedLengthCallsHaveNone) { EXPECT_FALSE(flashhop::detail::plan_forward(valid_args(), {}).varlen); }

// Every mask kind and head dim plans a recipe with a variable-length kernel; where the build left
// that kernel out, a valid call is answered so, naming it, before the workspace or the device is
// looked at.
TEST(VarlenDispatch, PlansRecipesWithVariableLengthKernels) {
  for (auto [d, dv] : {std::pair{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}}) {
    for (bool causal : {false, true}) {
      ForwardArgs args = valid_varlen_args();
      using flashhop::make_contiguous;
      args.q = make_contiguous(args.q.data, DType::kBFloat16, {100, 8, d});
      args.k = make_contiguous(args.k.data, DType::kBFloat16, {300, 2, d});
      args.v = make_contiguous(args.v.data, DType::kBFloat16, {300, 2, dv});
      args.o = make_contiguous(args.o.data, DType::kBFloat16, {100, 8, dv});
      args.causal = causal;
      ASSERT_TRUE(flashhop::validate_forward(args).ok()) << d << "x" << dv;
      const flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(args, {});
      const flashhop::sm90::ForwardRecipe& recipe = plan.recipe_of();
      EXPECT_TRUE(recipe.varlen) << recipe.name;
      EXPECT_EQ(recipe.head_dim, d);
      EXPECT_EQ(recipe.head_dim_v, dv);
      EXPECT_EQ(recipe.local(), causal);
      if (flashhop::detail::varlen_forward_kernel_compiled(plan.dtype, plan.recipe)) continue;
      const Status status = flashhop::forward(args, nullptr, 0, nullptr);
      EXPECT_EQ(status.code, StatusCode::kNotSupported);
      EXPECT_EQ(status.message, std::string("variable-length forward kernel for dtype bfloat16 and head_dim ") +
                                    std::to_string(d) + ", head_dim_v " + std::to_string(dv) + " (" + recipe.name +
                                    ") is not compiled into this build (see FLASHHOP_DTYPES and FLASHHOP_HEAD_DIMS)");
    }
  }
}

// ---- combine -----------------------------------------------------------------------------------

flashhop::CombineArgs valid_combine_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f3000000000} + (gib << 32));
  };
  using flashhop::make_contiguous;
  flashhop::CombineArgs a;
  a.out_partial = make_contiguous(at(0), DType::kFloat32, {4, 10, 8, 128});
  a.lse_partial = make_contiguous(at(1), DType::kFloat32, {4, 10, 8});
  a.out = make_contiguous(at(2), DType::kBFloat16, {10, 8, 128});
  a.lse = make_contiguous(at(3), DType::kFloat32, {8, 10});
  return a;
}

TEST(CombineValidation, NamesTheArgument) {
  EXPECT_TRUE(flashhop::validate_combine(valid_combine_args()).ok());
  const struct {
    std::function<void(flashhop::CombineArgs&)> change;
    std::vector<std::string> parts;
  } cases[] = {
      {[](flashhop::CombineArgs& a) { a.out_partial.rank = 5; }, {"out_partial.rank = 5", "(num_splits, rows, nheads, head_dim_v)"}},
      {[](flashhop::CombineArgs& a) { a.lse_partial.dtype = DType::kBFloat16; }, {"lse_partial.dtype = bfloat16", "float32"}},
      {[](flashhop::CombineArgs& a) { a.out.dtype = DType::kInt32; }, {"out.dtype = int32"}},
      {[](flashhop::CombineArgs& a) { a.out.dtype = DType::kFloat8E4M3; },
       {"out.dtype = float8_e4m3fn: expected bfloat16, float16 or float32"}},
      {[](flashhop::CombineArgs& a) { a.out_partial.dtype = DType::kFloat8E4M3; },
       {"out_partial.dtype = float8_e4m3fn", "expected float32"}},
      {[](flashhop::CombineArgs& a) { a.out_partial.shape[0] = a.lse_partial.shape[0] = 0; }, {"out_partial.shape[0] (num_splits) = 0", ">= 1"}},
      {[](flashhop::CombineArgs& a) { a.lse_partial.shape[1] = 11; }, {"lse_partial.shape[1] (rows) = 11", "expected 10"}},
      {[](flashhop::CombineArgs& a) { a.out.shape[2] = 64; }, {"out.shape[2] (head_dim_v) = 64", "expected 128"}},
      {[](flashhop::CombineArgs& a) { a.lse->shape[0] = 9; }, {"lse.shape[0] (nheads) = 9", "expected 8"}},
      {[](flashhop::CombineArgs& a) {
         a.out_partial.shape[3] = a.out.shape[2] = 513;
         a.out_partial = flashhop::make_contiguous(a.out_partial.data, DType::kFloat32, {4, 10, 8, 513});
         a.out = flashhop::make_contiguous(a.out.data, DType::kBFloat16, {10, 8, 513});
       },
       {"out_partial.shape[3] (head_dim_v) = 513", "expected 1 to 512"}},
      {[](flashhop::CombineArgs& a) { a.out.stride[2] = 2; }, {"out.stride[2] = 2", "contiguous"}},
      {[](flashhop::CombineArgs& a) { a.out.data = shifted(a.out_partial.data, 64); }, {"out.data", "overlaps out_partial"}},
      {[](flashhop::CombineArgs& a) { a.lse->device = 1; }, {"lse.device = 1", "(out_partial.device)"}},
  };
  for (const auto& c : cases) {
    flashhop::CombineArgs args = valid_combine_args();
    c.change(args);
    const Status status = flashhop::validate_combine(args);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << status.message;
    for (const std::string& part : c.parts) {
      EXPECT_NE(status.message.find(part), std::string::npos) << "message: " << status.message << "\nmissing: " << part;
    }
    // combine validates first: the same error, before touching the device.
    EXPECT_EQ(flashhop::combine(args, nullptr).message, status.message);
  }
}

// ---- append_kv ---------------------------------------------------------------------------------

flashhop::AppendKvArgs valid_append_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f4000000000} + (gib << 32));
  };
  using flashhop::make_contiguous;
  flashhop::AppendKvArgs a;
  a.k_cache = make_contiguous(at(0), DType::kBFloat16, {40, 16, 2, 128});
  a.v_cache = make_contiguous(at(1), DType::kBFloat16, {40, 16, 2, 128});
  a.page_table = make_contiguous(at(2), DType::kInt32, {3, 20});
  a.cache_seqlens = make_contiguous(at(3), DType::kInt32, {3});
  a.k_new = make_contiguous(at(4), DType::kBFloat16, {6, 2, 128});
  a.v_new = make_contiguous(at(5), DType::kBFloat16, {6, 2, 128});
  a.cu_seqlens_new = make_contiguous(at(6), DType::kInt32, {4});
  a.rotary_cos = make_contiguous(at(7), DType::kBFloat16, {4096, 32});
  a.rotary_sin = make_contiguous(at(8), DType::kBFloat16, {4096, 32});
  a.q = make_contiguous(at(9), DType::kBFloat16, {3, 8, 128});
  a.q_rotated = make_contiguous(at(10), DType::kBFloat16, {3, 8, 128});
  a.cu_seqlens_q = make_contiguous(at(11), DType::kInt32, {4});
  return a;
}

TEST(AppendKvValidation, NamesTheArgument) {
  EXPECT_TRUE(flashhop::validate_append_kv(valid_append_args()).ok()) << flashhop::validate_append_kv(valid_append_args()).message;
  using A = flashhop::AppendKvArgs;
  const struct {
    std::function<void(A&)> change;
    std::vector<std::string> parts;
  } cases[] = {
      {[](A& a) { a.rotary_sin.reset(); }, {"rotary_sin = none with rotary_cos given", "both tables or neither"}},
      {[](A& a) { a.q_rotated.reset(); }, {"q, q_rotated and cu_seqlens_q: expected all three or none"}},
      {[](A& a) { a.rotary_cos.reset(); a.rotary_sin.reset(); }, {"q is given without rotary_cos and rotary_sin"}},
      {[](A& a) { a.k_cache.rank = 3; }, {"k_cache.rank = 3", "(num_pages, page_size, nheads_kv, head_dim)"}},
      {[](A& a) { a.k_cache.dtype = a.v_cache.dtype = DType::kFloat32; }, {"k_cache.dtype = float32", "float16, bfloat16 or float8_e4m3fn"}},
      {[](A& a) { a.v_new.dtype = DType::kFloat16; }, {"v.dtype = float16", "the dtype of k_cache"}},
      {[](A& a) { a.cache_seqlens.dtype = DType::kFloat32; }, {"cache_seqlens.dtype = float32", "int32"}},
      {[](A& a) { a.k_new.dtype = DType::kFloat8E4M3; }, {"k.dtype = float8_e4m3fn", "the dtype of k_cache"}},
      {[](A& a) { a.page_table.dtype = DType::kFloat8E4M3; }, {"page_table.dtype = float8_e4m3fn", "int32"}},
      {[](A& a) { a.page_table.shape[0] = 4; }, {"page_table.shape[0] (batch) = 4", "expected 3 (cu_seqlens_new.shape[0] - 1)"}},
      {[](A& a) { a.k_new.shape[1] = 4; }, {"k.shape[1] (nheads_kv) = 4", "expected 2"}},
      {[](A& a) { a.v_new.shape[0] = 5; }, {"v.shape[0] (total_new) = 5", "expected 6"}},
      {[](A& a) { a.rotary_cos->shape[1] = a.rotary_sin->shape[1] = 80; }, {"rotary_cos.shape[1] (rotary_dim / 2) = 80", "<= head_dim (128)"}},
      {[](A& a) { a.rotary_sin->shape[0] = 100; }, {"rotary_sin.shape[0] (seqlen_ro) = 100", "expected 4096"}},
      {[](A& a) { a.q->shape[1] = a.q_rotated->shape[1] = 7; }, {"q.shape[1] (nheads) = 7", "multiple of k_cache.shape[2] (nheads_kv) = 2"}},
      {[](A& a) { a.cu_seqlens_q->shape[0] = 3; }, {"cu_seqlens_q.shape[0] (batch + 1) = 3", "expected 4 (cu_seqlens_new.shape[0])"}},
      {[](A& a) { a.k_new.stride[2] = 2; }, {"k.stride[2] = 2", "contiguous"}},
      {[](A& a) { a.q_rotated->data = a.q->data; }, {"q_rotated.data", "overlaps q's"}},
      {[](A& a) { a.k_cache.data = a.k_new.data; }, {"k_cache.data", "overlaps k's"}},
      {[](A& a) { a.cu_seqlens_new.device = 1; }, {"cu_seqlens_new.device = 1", "(k_cache.device)"}},
  };
  for (const auto& c : cases) {
    A args = valid_append_args();
    c.change(args);
    const Status status = flashhop::validate_append_kv(args);
    EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << status.message;
    for (const std::string& part : c.parts) {
      EXPECT_NE(status.message.find(part), std::string::npos) << "message: " << status.message << "\nmissing: " << part;
    }
    EXPECT_EQ(flashhop::append_kv(args, nullptr).message, status.message);
  }
  // k_cache and v_cache may interleave in one buffer.
  A interleaved = valid_append_args();
  interleaved.k_cache.stride[0] = interleaved.v_cache.stride[0] = 2 * 16 * 2 * 128;
  interleaved.v_cache.data = shifted(interleaved.k_cache.data, 16 * 2 * 128 * 2);
  EXPECT_TRUE(flashhop::validate_append_kv(interleaved).ok()) << flashhop::validate_append_kv(interleaved).message;
}

// An e4m3 cache takes e4m3 rows as they are; rotating them is refused.
TEST(AppendKvValidation, TakesFp8RowsWithoutRotation) {
  flashhop::AppendKvArgs args = valid_append_args();
  for (TensorDesc* t : {&args.k_cache, &args.v_cache, &args.k_new, &args.v_new}) t->dtype = DType::kFloat8E4M3;
  const Status rotated = flashhop::validate_append_kv(args);
  EXPECT_EQ(rotated.code, StatusCode::kNotSupported) << rotated.message;
  EXPECT_NE(rotated.message.find("rotary_cos with k_cache.dtype = float8_e4m3fn"), std::string::npos) << rotated.message;
  args.rotary_cos = args.rotary_sin = args.q = args.q_rotated = args.cu_seqlens_q = std::nullopt;
  const Status copied = flashhop::validate_append_kv(args);
  EXPECT_TRUE(copied.ok()) << copied.message;
  args.v_new.dtype = DType::kBFloat16;
  EXPECT_NE(flashhop::validate_append_kv(args).message.find("v.dtype = bfloat16"), std::string::npos);
}

// ---- FP8 ---------------------------------------------------------------------------------------

// kProblem's call with e4m3 q, k and v (o stays bfloat16) and float32 (batch, nheads_kv) descales,
// each in an allocation of its own.
ForwardArgs valid_fp8_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f4000000000} + (gib << 32));
  };
  ForwardArgs a = valid_args();
  a.q.dtype = a.k.dtype = a.v.dtype = DType::kFloat8E4M3;
  a.q_descale = flashhop::make_contiguous(at(0), DType::kFloat32, {2, 2});
  a.k_descale = flashhop::make_contiguous(at(1), DType::kFloat32, {2, 2});
  a.v_descale = flashhop::make_contiguous(at(2), DType::kFloat32, {2, 2});
  return a;
}

class InvalidFp8Arguments : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidFp8Arguments, RejectedWithCodeAndNamedArgument) { expect_rejected(valid_fp8_args(), GetParam()); }

const InvalidCase kInvalidFp8Cases[] = {
    {"descale_without_fp8",
     [](ForwardArgs& a) { a.q.dtype = a.k.dtype = a.v.dtype = DType::kBFloat16; }, kInvalid,
     {"q_descale is given with q.dtype = bfloat16: expected scales only with float8_e4m3fn q, k and v"}},
    {"o_float16", [](ForwardArgs& a) { a.o.dtype = DType::kFloat16; }, kInvalid,
     {"o.dtype = float16: expected bfloat16 (FP8 attention writes bfloat16)"}},
    {"q_descale_rank_1", [](ForwardArgs& a) { a.q_descale->rank = 1; }, kInvalid,
     {"q_descale.rank = 1", "expected 2 (batch, nheads_kv)"}},
    {"k_descale_float16", [](ForwardArgs& a) { a.k_descale->dtype = DType::kFloat16; }, kInvalid,
     {"k_descale.dtype = float16: expected float32 (descales are float32)"}},
    {"v_descale_per_query_head", [](ForwardArgs& a) { a.v_descale->shape[1] = 8; }, kInvalid,
     {"v_descale.shape[1] (nheads_kv) = 8: expected 2 (k.shape[2] (nheads_kv))"}},
    {"q_descale_batch_differs", [](ForwardArgs& a) { a.q_descale->shape[0] = 3; }, kInvalid,
     {"q_descale.shape[0] (batch) = 3: expected 2 (q.shape[0] (batch))"}},
    {"k_descale_negative_stride", [](ForwardArgs& a) { a.k_descale->stride[0] = -2; }, kInvalid,
     {"k_descale.stride[0] = -2: expected >= 0"}},
    {"v_descale_null", [](ForwardArgs& a) { a.v_descale->data = nullptr; }, kInvalid, {"v_descale.data = null"}},
    {"v_descale_misaligned", [](ForwardArgs& a) { a.v_descale->data = shifted(a.v_descale->data, 2); }, kInvalid,
     {"v_descale.data"}},
    {"o_over_q_descale", [](ForwardArgs& a) { a.q_descale->data = shifted(a.o.data, 64); }, kInvalid,
     {"overlaps q_descale's"}},
    {"q_descale_on_other_device", [](ForwardArgs& a) { a.q_descale->device = 1; }, kInvalid,
     {"q_descale.device = 1"}},
};

INSTANTIATE_TEST_SUITE_P(Validation, InvalidFp8Arguments, ::testing::ValuesIn(kInvalidFp8Cases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

// valid_fp8_args() with block scales instead of the descales: kProblem's 33 queries and 65 keys are
// one block of 128 rows each.
ForwardArgs valid_block_scaled_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f5000000000} + (gib << 32));
  };
  ForwardArgs a = valid_fp8_args();
  a.q_descale = a.k_descale = a.v_descale = std::nullopt;
  a.q_block_scale = flashhop::make_contiguous(at(0), DType::kFloat32, {2, 8, 1});
  a.k_block_scale = flashhop::make_contiguous(at(1), DType::kFloat32, {2, 2, 1});
  a.v_block_scale = flashhop::make_contiguous(at(2), DType::kFloat32, {2, 2, 1});
  return a;
}

class InvalidBlockScaledArguments : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidBlockScaledArguments, RejectedWithCodeAndNamedArgument) {
  expect_rejected(valid_block_scaled_args(), GetParam());
}

const InvalidCase kInvalidBlockScaledCases[] = {
    {"pack_gqa_on", [](ForwardArgs& a) { a.pack_gqa = flashhop::PackGqa::kOn; }, kNotSupported,
     {"pack_gqa = kOn with block scales"}},
    {"v_block_scale_missing", [](ForwardArgs& a) { a.v_block_scale.reset(); }, kInvalid,
     {"q_block_scale, k_block_scale and v_block_scale: 2 given, expected all three or none"}},
    {"with_descales",
     [](ForwardArgs& a) { a.q_descale = flashhop::make_contiguous(a.o.data, DType::kFloat32, {2, 2}); }, kInvalid,
     {"descales given with block scales: expected one kind of scaling"}},
    {"q_block_scale_per_kv_head", [](ForwardArgs& a) { a.q_block_scale->shape[1] = 2; }, kInvalid,
     {"q_block_scale.shape[1] (nheads) = 2: expected 8"}},
    {"k_block_scale_two_blocks", [](ForwardArgs& a) { a.k_block_scale->shape[2] = 2; }, kInvalid,
     {"k_block_scale.shape[2] (blocks of 128 keys) = 2: expected 1"}},
    {"v_block_scale_rank_2", [](ForwardArgs& a) { a.v_block_scale->rank = 2; }, kInvalid,
     {"v_block_scale.rank = 2", "expected 3"}},
    {"q_block_scale_bfloat16", [](ForwardArgs& a) { a.q_block_scale->dtype = DType::kBFloat16; }, kInvalid,
     {"q_block_scale.dtype = bfloat16: expected float32 (scales are float32)"}},
    {"k_block_scale_negative_stride", [](ForwardArgs& a) { a.k_block_scale->stride[1] = -1; }, kInvalid,
     {"k_block_scale.stride[1] = -1: expected >= 0"}},
    {"o_over_v_block_scale", [](ForwardArgs& a) { a.v_block_scale->data = shifted(a.o.data, 16); }, kInvalid,
     {"overlaps v_block_scale's"}},
};

INSTANTIATE_TEST_SUITE_P(Validation, InvalidBlockScaledArguments, ::testing::ValuesIn(kInvalidBlockScaledCases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(Fp8Validation, BlockScalesAtHeadDim192AreNotBuilt) {
  ForwardArgs a = valid_block_scaled_args();
  const Status ok = flashhop::validate_forward(a);
  EXPECT_TRUE(ok.ok()) << ok.message;
  for (TensorDesc* t : {&a.q, &a.k, &a.v, &a.o}) {
    t->shape[3] = 192;
    t->stride[2] = 192;
    t->stride[1] = 192 * t->shape[2];
    t->stride[0] = t->stride[1] * t->shape[1];
  }
  const Status status = flashhop::validate_forward(a);
  EXPECT_EQ(status.code, StatusCode::kNotSupported) << status.message;
  EXPECT_NE(status.message.find("q.shape[3] (head_dim) = 192 with block scales"), std::string::npos) << status.message;
}

TEST(Fp8Validation, AcceptsDescalesPerHeadBroadcastOrNone) {
  ForwardArgs a = valid_fp8_args();
  EXPECT_TRUE(flashhop::validate_forward(a).ok()) << flashhop::validate_forward(a).message;
  a.q_descale->stride[0] = a.q_descale->stride[1] = 0;  // one value for every (batch, KV head)
  EXPECT_TRUE(flashhop::validate_forward(a).ok()) << flashhop::validate_forward(a).message;
  a.q_descale.reset();
  a.k_descale.reset();
  a.v_descale.reset();
  EXPECT_TRUE(flashhop::validate_forward(a).ok()) << flashhop::validate_forward(a).message;
}

TEST(Fp8Plan, TakesTheFp8RecipeOfTheMaskKindAndTheDescales) {
  ForwardArgs a = valid_fp8_args();
  a.pack_gqa = flashhop::PackGqa::kOff;
  a.k_descale->stride[0] = 0;  // broadcast over the batch
  flashhop::detail::ForwardPlan plan = flashhop::detail::plan_forward(a, {});
  EXPECT_STREQ(plan.recipe_of().name, "fp8_hdim128_nomask");
  EXPECT_EQ(plan.dtype, DType::kFloat8E4M3);
  EXPECT_EQ(plan.params.q_descale, a.q_descale->data);
  EXPECT_EQ(plan.params.q_descale_batch_stride, 2);
  EXPECT_EQ(plan.params.q_descale_head_stride, 1);
  EXPECT_EQ(plan.params.k_descale_batch_stride, 0);
  EXPECT_EQ(plan.params.v_descale, a.v_descale->data);
  a.causal = true;
  EXPECT_STREQ(flashhop::detail::plan_forward(a, {}).recipe_of().name, "fp8_hdim128_local");
  // Packed rows as for the other dtypes: on request, or where they fill the tiles better (33
  // queries of 4 heads per KV head fill a 128-row tile to 0.26 unpacked, to 0.52 packed).
  a.pack_gqa = flashhop::PackGqa::kOn;
  EXPECT_STREQ(flashhop::detail::plan_forward(a, {}).recipe_of().name, "fp8_hdim128_local_packgqa");
  a.pack_gqa = flashhop::PackGqa::kAuto;
  EXPECT_STREQ(flashhop::detail::plan_forward(a, {}).recipe_of().name, "fp8_hdim128_local_packgqa");
  // bfloat16 calls never take an FP8 recipe.
  EXPECT_FALSE(flashhop::detail::plan_forward(valid_args(), {}).recipe_of().fp8);
  // Block scales: their pointers and strides (a size-1 dimension's stride is never followed: 0).
  ForwardArgs blocks = valid_block_scaled_args();
  plan = flashhop::detail::plan_forward(blocks, {});
  EXPECT_EQ(plan.params.q_descale, nullptr);
  EXPECT_EQ(plan.params.q_block_scale.data, blocks.q_block_scale->data);
  EXPECT_EQ(plan.params.q_block_scale.batch_stride, 8);
  EXPECT_EQ(plan.params.q_block_scale.head_stride, 1);
  EXPECT_EQ(plan.params.q_block_scale.block_stride, 0);
  EXPECT_EQ(plan.params.v_block_scale.data, blocks.v_block_scale->data);
  // Block scales never take packed rows.
  blocks.q.shape[1] = blocks.o.shape[1] = blocks.lse->shape[2] = 1;
  EXPECT_FALSE(flashhop::detail::plan_forward(blocks, {}).recipe_of().pack_gqa);
}

// ---- backward ----------------------------------------------------------------------------------

// The backward arguments of kProblem's forward call: q, k, v, o and lse as valid_args() places
// them, dout, dq, dk and dv in buffers of their own.
flashhop::BackwardArgs valid_backward_args(const Problem& problem = kProblem) {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f1000000000} + (gib << 32));
  };
  const auto tensor = [](void* data, std::initializer_list<std::int64_t> shape) {
    return flashhop::make_contiguous(data, DType::kBFloat16, shape);
  };
  const Problem& p = problem;
  return backward_args_of(valid_args(DType::kBFloat16, problem),
                          tensor(at(0), {p.batch, p.seqlen_q, p.nheads, p.dv()}),
                          tensor(at(1), {p.batch, p.seqlen_q, p.nheads, p.head_dim}),
                          tensor(at(2), {p.batch, p.seqlen_k, p.nheads_kv, p.head_dim}),
                          tensor(at(3), {p.batch, p.seqlen_k, p.nheads_kv, p.dv()}));
}

struct InvalidBackwardCase {
  const char* name;
  std::function<void(flashhop::BackwardArgs&)> change;
  StatusCode code;
  std::vector<std::string> message_parts;
};

void PrintTo(const InvalidBackwardCase& c, std::ostream* out) { *out << c.name; }

// `args` with c's change rejected by validation, the workspace size and the call alike.
void expect_backward_rejected(flashhop::BackwardArgs args, const InvalidBackwardCase& c) {
  c.change(args);
  const Status status = flashhop::validate_backward(args);
  EXPECT_EQ(status.code, c.code) << status.message;
  for (const std::string& part : c.message_parts) {
    EXPECT_NE(status.message.find(part), std::string::npos) << "message: " << status.message << "\nmissing: " << part;
  }
  std::size_t bytes = 0;
  EXPECT_EQ(flashhop::backward_workspace_size(args, &bytes).message, status.message);
  EXPECT_EQ(flashhop::backward(args, nullptr, 0, nullptr).message, status.message);
}

class InvalidBackwardArguments : public ::testing::TestWithParam<InvalidBackwardCase> {};

TEST_P(InvalidBackwardArguments, RejectedWithCodeAndNamedArgument) {
  expect_backward_rejected(valid_backward_args(), GetParam());
}

const InvalidBackwardCase kInvalidBackwardCases[] = {
    {"forward_rule_q_float32", [](flashhop::BackwardArgs& a) { a.q.dtype = DType::kFloat32; }, kInvalid,
     {"q.dtype = float32"}},
    {"dout_rank_3", [](flashhop::BackwardArgs& a) { a.dout.rank = 3; }, kInvalid, {"dout.rank = 3", "expected 4"}},
    {"dq_float16", [](flashhop::BackwardArgs& a) { a.dq.dtype = DType::kFloat16; }, kInvalid,
     {"dq.dtype = float16", "expected bfloat16 (the dtype of q)"}},
    {"dq_float8", [](flashhop::BackwardArgs& a) { a.dq.dtype = DType::kFloat8E4M3; }, kInvalid,
     {"dq.dtype = float8_e4m3fn", "expected bfloat16 (the dtype of q)"}},
    {"forward_rule_v_float8", [](flashhop::BackwardArgs& a) { a.v.dtype = DType::kFloat8E4M3; }, kInvalid,
     {"v.dtype = float8_e4m3fn", "expected bfloat16 (the dtype of q)"}},
    {"dout_seqlen_differs", [](flashhop::BackwardArgs& a) { a.dout.shape[1] = 32; }, kInvalid,
     {"dout.shape[1] (seqlen_q) = 32", "expected 33 (o.shape[1] (seqlen_q))"}},
    {"dk_heads_differ", [](flashhop::BackwardArgs& a) { a.dk.shape[2] = 8; }, kInvalid,
     {"dk.shape[2] (nheads_kv) = 8", "expected 2 (k.shape[2] (nheads_kv))"}},
    {"dv_last_dim_strided", [](flashhop::BackwardArgs& a) { a.dv.stride[3] = 2; }, kInvalid, {"dv.stride[3] = 2"}},
    {"dq_null", [](flashhop::BackwardArgs& a) { a.dq.data = nullptr; }, kInvalid, {"dq.data = null"}},
    {"dk_on_other_device", [](flashhop::BackwardArgs& a) { a.dk.device = 1; }, kInvalid, {"dk.device = 1"}},
    {"dq_is_q", [](flashhop::BackwardArgs& a) { a.dq.data = a.q.data; }, kInvalid, {"dq.data", "overlaps q's"}},
    {"dv_is_dk", [](flashhop::BackwardArgs& a) { a.dv.data = a.dk.data; }, kInvalid, {"dk.data", "overlaps dv's"}},
    {"dk_inside_dout", [](flashhop::BackwardArgs& a) { a.dk.data = shifted(a.dout.data, 512); }, kInvalid,
     {"dk.data", "overlaps dout's"}},
    {"head_dim_80",
     [](flashhop::BackwardArgs& a) {
       for (TensorDesc* t : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv}) {
         t->shape[3] = 80;
         t->stride[2] = 80;
         t->stride[1] = 80 * t->shape[2];
         t->stride[0] = t->stride[1] * t->shape[1];
       }
     },
     kNotSupported, {"q.shape[3] (head_dim) = 80", "64, 96, 128, 192 and 256"}},
};

INSTANTIATE_TEST_SUITE_P(Validation, InvalidBackwardArguments, ::testing::ValuesIn(kInvalidBackwardCases),
                         [](const ::testing::TestParamInfo<InvalidBackwardCase>& info) { return info.param.name; });

// valid_varlen_args()'s forward call's backward: dout, dq, dk and dv packed in buffers of their own.
flashhop::BackwardArgs valid_varlen_backward_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f3000000000} + (gib << 32));
  };
  const ForwardArgs f = valid_varlen_args();
  flashhop::BackwardArgs b = backward_args_of(f, flashhop::make_contiguous(at(0), DType::kBFloat16, {100, 8, 128}),
                                              flashhop::make_contiguous(at(1), DType::kBFloat16, {100, 8, 128}),
                                              flashhop::make_contiguous(at(2), DType::kBFloat16, {300, 2, 128}),
                                              flashhop::make_contiguous(at(3), DType::kBFloat16, {300, 2, 128}));
  b.cu_seqlens_q = f.cu_seqlens_q;
  b.cu_seqlens_k = f.cu_seqlens_k;
  b.seqused_q = f.seqused_q;
  b.seqused_k = f.seqused_k;
  b.max_seqlen_q = f.max_seqlen_q;
  b.max_seqlen_k = f.max_seqlen_k;
  return b;
}

class InvalidVarlenBackwardArguments : public ::testing::TestWithParam<InvalidBackwardCase> {};

TEST_P(InvalidVarlenBackwardArguments, RejectedWithCodeAndNamedArgument) {
  expect_backward_rejected(valid_varlen_backward_args(), GetParam());
}

const InvalidBackwardCase kInvalidVarlenBackwardCases[] = {
    {"forward_rule_cu_seqlens_k_missing", [](flashhop::BackwardArgs& a) { a.cu_seqlens_k.reset(); }, kNotSupported,
     {"cu_seqlens_k = none with cu_seqlens_q given"}},
    {"forward_rule_max_seqlen_q_0", [](flashhop::BackwardArgs& a) { a.max_seqlen_q = 0; }, kInvalid,
     {"max_seqlen_q = 0: expected >= 1 with cu_seqlens_q"}},
    {"forward_rule_seqused_k_float32", [](flashhop::BackwardArgs& a) { a.seqused_k->dtype = DType::kFloat32; },
     kInvalid, {"seqused_k.dtype = float32", "expected int32"}},
    {"dq_rank_4", [](flashhop::BackwardArgs& a) { a.dq.rank = 4; }, kInvalid,
     {"dq.rank = 4", "expected 3 (total_q, nheads, head_dim) with cu_seqlens"}},
    {"dk_rows_differ", [](flashhop::BackwardArgs& a) { a.dk.shape[0] = 299; }, kInvalid,
     {"dk.shape[0] (total_k) = 299", "expected 300 (k.shape[0] (total_k))"}},
    {"dout_heads_differ", [](flashhop::BackwardArgs& a) { a.dout.shape[1] = 4; }, kInvalid,
     {"dout.shape[1] (nheads) = 4", "expected 8 (o.shape[1] (nheads))"}},
    {"dq_over_cu_seqlens_q", [](flashhop::BackwardArgs& a) { a.dq.data = a.cu_seqlens_q->data; }, kInvalid,
     {"dq.data", "overlaps cu_seqlens_q's"}},
    {"dv_over_seqused_k", [](flashhop::BackwardArgs& a) { a.dv.data = shifted(a.seqused_k->data, -64); }, kInvalid,
     {"dv.data", "overlaps seqused_k's"}},
    {"head_dim_80",
     [](flashhop::BackwardArgs& a) {
       for (TensorDesc* t : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv}) {
         t->shape[2] = 80;
         t->stride[1] = 80;
         t->stride[0] = 80 * t->shape[1];
       }
     },
     kNotSupported, {"q.shape[2] (head_dim) = 80", "64, 96, 128, 192 and 256"}},
};

INSTANTIATE_TEST_SUITE_P(Validation, InvalidVarlenBackwardArguments, ::testing::ValuesIn(kInvalidVarlenBackwardCases),
                         [](const ::testing::TestParamInfo<InvalidBackwardCase>& info) { return info.param.name; });

TEST(BackwardValidation, AcceptsTheForwardCallsArguments) {
  for (const Problem& problem : {kProblem, Problem{1, 0, 65, 8, 2, 64}, Problem{0, 33, 65, 8, 2, 96}}) {
    const flashhop::BackwardArgs args = valid_backward_args(problem);
    const Status status = flashhop::validate_backward(args);
    EXPECT_TRUE(status.ok()) << status.message;
  }
}

TEST(BackwardPlan, WorkspaceHoldsRowValuesAndTheDqAccumulator) {
  flashhop::BackwardArgs args = valid_backward_args();  // batch 2, seqlen_q 33 (one block of 64), 8 heads, d 128
  std::size_t bytes = 0;
  ASSERT_TRUE(flashhop::backward_workspace_size(args, &bytes).ok());
  const std::size_t rows = 2 * 8 * 64;
  EXPECT_EQ(bytes, rows * 4 + rows * 4 + rows * 128 * 4);
  args.deterministic = true;
  ASSERT_TRUE(flashhop::backward_workspace_size(args, &bytes).ok());
  EXPECT_EQ(bytes, rows * 4 + rows * 4 + rows * 128 * 4 + 256);  // 16 semaphores, rounded up to 256 bytes
  const flashhop::detail::BackwardPlan plan = flashhop::detail::plan_backward(args);
  EXPECT_EQ(plan.recipe_of().head_dim, 128);
  EXPECT_FALSE(plan.recipe_of().local());
  args.causal = true;
  EXPECT_TRUE(flashhop::detail::plan_backward(args).recipe_of().local());
}

TEST(BackwardPlan, WorkspaceBlocksAreTheRecipesQueryTiles) {
  // d = 64 walks query tiles of 128 rows: batch 2, seqlen_q 200 (two blocks of 128), 8 heads.
  flashhop::BackwardArgs args = valid_backward_args(Problem{2, 200, 65, 8, 2, 64});
  const flashhop::detail::BackwardPlan plan = flashhop::detail::plan_backward(args);
  ASSERT_EQ(plan.recipe_of().block_m, 128);
  args.deterministic = true;
  std::size_t bytes = 0;
  ASSERT_TRUE(flashhop::backward_workspace_size(args, &bytes).ok());
  const std::size_t rows = 2 * 8 * 2 * 128;
  EXPECT_EQ(bytes, rows * 4 + rows * 4 + rows * 64 * 4 + 256);  // 32 semaphores, rounded up to 256 bytes
}

TEST(BackwardPlan, VariableLengthWorkspaceGivesEachSequenceItsOwnRowBlocks) {
  // 3 sequences in 100 query rows, max_seqlen_q 50, 8 heads, d 128: each head holds ceil(100 / 64)
  // + 3 row blocks, and the semaphores are 3 * 8 * ceil(50 / 64).
  flashhop::BackwardArgs args = valid_varlen_backward_args();
  ASSERT_TRUE(flashhop::validate_backward(args).ok()) << flashhop::validate_backward(args).message;
  std::size_t bytes = 0;
  ASSERT_TRUE(flashhop::backward_workspace_size(args, &bytes).ok());
  const std::size_t rows = 8 * 5 * 64;
  EXPECT_EQ(bytes, rows * 4 + rows * 4 + rows * 128 * 4);
  args.deterministic = true;
  ASSERT_TRUE(flashhop::backward_workspace_size(args, &bytes).ok());
  EXPECT_EQ(bytes, rows * 4 + rows * 4 + rows * 128 * 4 + 256);
  // The band against the bounds; strides of the packed rows, batch strides 0.
  args.causal = true;
  const flashhop::detail::BackwardPlan plan = flashhop::detail::plan_backward(args);
  EXPECT_TRUE(plan.recipe_of().local());
  EXPECT_EQ(plan.params.batch, 3);
  EXPECT_EQ(plan.params.seqlen_q, 50);
  EXPECT_EQ(plan.params.seqlen_k, 200);
  EXPECT_EQ(plan.params.total_q, 100);
  EXPECT_EQ(plan.params.total_k, 300);
  EXPECT_EQ(plan.params.q_batch_stride, 0);
  EXPECT_EQ(plan.params.q_row_stride, 8 * 128);
  EXPECT_EQ(plan.params.dk_row_stride, 2 * 128);
  EXPECT_EQ(plan.params.lse_head_stride, 100);
  EXPECT_EQ(plan.params.lse_row_stride, 1);
  EXPECT_EQ(plan.params.window_right, 0);
  EXPECT_EQ(plan.params.cu_seqlens_q, args.cu_seqlens_q->data);
  EXPECT_EQ(plan.params.seqused_k, args.seqused_k->data);
}

// ---- quantize_fp8 ---------------------------------------------------------------------------

using flashhop::Fp8Scaling;
using flashhop::QuantizeFp8Args;

// x (2, 300, 8, 128) bf16, out like x in e4m3, descale (2, 4) per head (2 heads a group),
// hadamard_signs (128); each 4 GiB apart.
QuantizeFp8Args valid_quantize_args() {
  const auto at = [](std::uintptr_t gib) {
    return reinterpret_cast<void*>(std::uintptr_t{0x7f5000000000} + (gib << 32));
  };
  using flashhop::make_contiguous;
  QuantizeFp8Args a;
  a.x = make_contiguous(at(0), DType::kBFloat16, {2, 300, 8, 128});
  a.out = make_contiguous(at(1), DType::kFloat8E4M3, {2, 300, 8, 128});
  a.descale = make_contiguous(at(2), DType::kFloat32, {2, 4});
  a.scaling = Fp8Scaling::kPerHead;
  a.hadamard_signs = make_contiguous(at(3), DType::kFloat32, {128});
  return a;
}

// Sets the head dim of x, out and hadamard_signs, contiguous.
void set_quantize_head_dim(QuantizeFp8Args& a, std::int64_t head_dim) {
  const std::int64_t* s = a.x.shape;
  a.x = flashhop::make_contiguous(a.x.data, a.x.dtype, {s[0], s[1], s[2], head_dim});
  a.out = flashhop::make_contiguous(a.out.data, a.out.dtype, {s[0], s[1], s[2], head_dim});
  a.hadamard_signs = flashhop::make_contiguous(a.hadamard_signs->data, DType::kFloat32, {head_dim});
}

struct InvalidQuantizeCase {
  const char* name;
  std::function<void(QuantizeFp8Args&)> change;
  StatusCode code;
  std::vector<std::string> message_parts;
};

void PrintTo(const InvalidQuantizeCase& c, std::ostream* out) { *out << c.name; }

class InvalidQuantizeArguments : public ::testing::TestWithParam<InvalidQuantizeCase> {};

// Rejected by validation with the case's code and message, and by quantize_fp8 with the same
// message before it touches the device.
TEST_P(InvalidQuantizeArguments, RejectedWithCodeAndNamedArgument) {
  const InvalidQuantizeCase& c = GetParam();
  QuantizeFp8Args args = valid_quantize_args();
  c.change(args);
  const Status status = flashhop::validate_quantize_fp8(args);
  EXPECT_EQ(status.code, c.code) << status.message;
  for (const std::string& part : c.message_parts) {
    EXPECT_NE(status.message.find(part), std::string::npos) << "message: " << status.message << "\nmissing: " << part;
  }
  const Status call = flashhop::quantize_fp8(args, nullptr);
  EXPECT_EQ(call.code, status.code);
  EXPECT_EQ(call.message, status.message);
}

const InvalidQuantizeCase kInvalidQuantizeCases[] = {
    {"scaling_not_an_enum_value", [](QuantizeFp8Args& a) { a.scaling = static_cast<Fp8Scaling>(3); }, kInvalid,
     {"scaling = 3: expected Fp8Scaling::kPerTensor, kPerHead or kPerBlock"}},
    // ranks
    {"x_rank_3", [](QuantizeFp8Args& a) { a.x.rank = 3; }, kInvalid,
     {"x.rank = 3: expected 4 (batch, seqlen, nheads, head_dim)"}},
    {"out_rank_5", [](QuantizeFp8Args& a) { a.out.rank = 5; }, kInvalid, {"out.rank = 5: expected 4"}},
    {"descale_rank_per_head", [](QuantizeFp8Args& a) { a.descale.rank = 1; }, kInvalid,
     {"descale.rank = 1: expected 2 (batch, groups) with per-head scaling"}},
    {"descale_rank_per_tensor", [](QuantizeFp8Args& a) { a.scaling = Fp8Scaling::kPerTensor; }, kInvalid,
     {"descale.rank = 2: expected 1 (scale) with per-tensor scaling"}},
    {"descale_rank_per_block", [](QuantizeFp8Args& a) { a.scaling = Fp8Scaling::kPerBlock; }, kInvalid,
     {"descale.rank = 2: expected 3 (batch, nheads, num_blocks) with per-block scaling"}},
    {"signs_rank_2", [](QuantizeFp8Args& a) { a.hadamard_signs->rank = 2; }, kInvalid,
     {"hadamard_signs.rank = 2: expected 1 (head_dim)"}},
    // dtypes
    {"x_float32", [](QuantizeFp8Args& a) { a.x.dtype = DType::kFloat32; }, kInvalid,
     {"x.dtype = float32: expected float16 or bfloat16"}},
    {"x_float8", [](QuantizeFp8Args& a) { a.x.dtype = DType::kFloat8E4M3; }, kInvalid,
     {"x.dtype = float8_e4m3fn: expected float16 or bfloat16"}},
    {"out_bfloat16", [](QuantizeFp8Args& a) { a.out.dtype = DType::kBFloat16; }, kInvalid,
     {"out.dtype = bfloat16: expected float8_e4m3fn"}},
    {"descale_bfloat16", [](QuantizeFp8Args& a) { a.descale.dtype = DType::kBFloat16; }, kInvalid,
     {"descale.dtype = bfloat16: expected float32"}},
    {"signs_int32", [](QuantizeFp8Args& a) { a.hadamard_signs->dtype = DType::kInt32; }, kInvalid,
     {"hadamard_signs.dtype = int32: expected float32"}},
    // shapes
    {"head_dim_80", [](QuantizeFp8Args& a) { set_quantize_head_dim(a, 80); }, kNotSupported,
     {"x.shape[3] (head_dim) = 80: supported head dims are 64, 96, 128, 192 and 256"}},
    {"head_dim_512", [](QuantizeFp8Args& a) { set_quantize_head_dim(a, 512); }, kNotSupported,
     {"x.shape[3] (head_dim) = 512"}},
    {"seqlen_negative", [](QuantizeFp8Args& a) { a.x.shape[1] = -1; }, kInvalid,
     {"x.shape[1] (seqlen) = -1: expected >= 0"}},
    {"seqlen_beyond_int32", [](QuantizeFp8Args& a) { a.x.shape[1] = a.out.shape[1] = kBeyondInt32; }, kInvalid,
     {"x.shape[1] (seqlen) = 2147483648: expected <= 2147483647"}},
    {"out_seqlen_differs", [](QuantizeFp8Args& a) { a.out.shape[1] = 299; }, kInvalid,
     {"out.shape[1] (seqlen) = 299: expected 300 (x.shape[1] (seqlen))"}},
    {"descale_batch_differs", [](QuantizeFp8Args& a) { a.descale.shape[0] = 3; }, kInvalid,
     {"descale.shape[0] (batch) = 3: expected 2 (x.shape[0] (batch))"}},
    {"groups_do_not_divide_nheads", [](QuantizeFp8Args& a) { a.descale.shape[1] = 3; }, kInvalid,
     {"descale.shape[1] (groups) = 3: nheads (8) must be a multiple of it"}},
    {"groups_zero", [](QuantizeFp8Args& a) { a.descale.shape[1] = 0; }, kInvalid,
     {"descale.shape[1] (groups) = 0: expected >= 1"}},
    {"per_tensor_two_scales",
     [](QuantizeFp8Args& a) {
       a.scaling = Fp8Scaling::kPerTensor;
       a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {2});
     },
     kInvalid, {"descale.shape[0] (scale) = 2: expected 1 with per-tensor scaling"}},
    {"per_block_blocks",
     [](QuantizeFp8Args& a) {
       a.scaling = Fp8Scaling::kPerBlock;
       a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {2, 8, 2});
     },
     kInvalid, {"descale.shape[2] (num_blocks) = 2: expected 3 (ceil(x.shape[1] (seqlen) / 128))"}},
    {"per_block_heads",
     [](QuantizeFp8Args& a) {
       a.scaling = Fp8Scaling::kPerBlock;
       a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {2, 4, 3});
     },
     kInvalid, {"descale.shape[1] (nheads) = 4: expected 8 (x.shape[2] (nheads))"}},
    {"signs_length", [](QuantizeFp8Args& a) { a.hadamard_signs->shape[0] = 64; }, kInvalid,
     {"hadamard_signs.shape[0] (head_dim) = 64: expected 128 (x.shape[3] (head_dim))"}},
    {"too_many_tiles",
     [](QuantizeFp8Args& a) {
       for (TensorDesc* t : {&a.x, &a.out}) {
         *t = flashhop::make_contiguous(t->data, t->dtype, {1 << 16, 1 << 20, 8, 128});
       }
       a.descale.shape[0] = 1 << 16;
     },
     kInvalid, {"x.shape (batch 65536, seqlen 1048576, nheads 8): batch * ceil(seqlen / 128) * nheads tiles",
                "expected <= 2147483647"}},
    // memory
    {"x_last_dim_strided", [](QuantizeFp8Args& a) { a.x.stride[3] = 2; }, kInvalid,
     {"x.stride[3] = 2: expected 1 (the last dimension must be contiguous)"}},
    {"x_unaligned_rows", [](QuantizeFp8Args& a) { a.x.stride[2] = 132; }, kInvalid,
     {"x.stride[2] = 132: expected a positive multiple of 8 elements (16-byte aligned bfloat16 rows)"}},
    {"out_unaligned_rows", [](QuantizeFp8Args& a) { a.out.stride[2] = 136; }, kInvalid,
     {"out.stride[2] = 136: expected a positive multiple of 16 elements (16-byte aligned float8_e4m3fn rows)"}},
    {"x_unaligned_data", [](QuantizeFp8Args& a) { a.x.data = shifted(a.x.data, 8); }, kInvalid,
     {"x.data = 0x", ": expected a 16-byte aligned address"}},
    {"out_null", [](QuantizeFp8Args& a) { a.out.data = nullptr; }, kInvalid,
     {"out.data = null: expected a device pointer"}},
    {"descale_strided", [](QuantizeFp8Args& a) { a.descale.stride[1] = 2; }, kInvalid,
     {"descale.stride[1] = 2: expected 1"}},
    {"descale_unaligned", [](QuantizeFp8Args& a) { a.descale.data = shifted(a.descale.data, 2); }, kInvalid,
     {"descale.data = 0x", "expected a 4-byte aligned address"}},
    {"signs_strided", [](QuantizeFp8Args& a) { a.hadamard_signs->stride[0] = 2; }, kInvalid,
     {"hadamard_signs.stride[0] = 2: expected 1"}},
    {"out_is_x", [](QuantizeFp8Args& a) { a.out.data = a.x.data; }, kInvalid, {"out.data", "overlaps x's"}},
    {"out_over_signs", [](QuantizeFp8Args& a) { a.out.data = shifted(a.hadamard_signs->data, -64); }, kInvalid,
     {"out.data", "overlaps hadamard_signs's"}},
    {"descale_inside_x", [](QuantizeFp8Args& a) { a.descale.data = shifted(a.x.data, 4096); }, kInvalid,
     {"descale.data", "overlaps x's"}},
    {"descale_inside_out", [](QuantizeFp8Args& a) { a.descale.data = shifted(a.out.data, 64); }, kInvalid,
     {"descale.data", "overlaps out's"}},
    {"descale_is_signs", [](QuantizeFp8Args& a) { a.descale.data = a.hadamard_signs->data; }, kInvalid,
     {"descale.data", "overlaps hadamard_signs's"}},
    {"x_device_negative", [](QuantizeFp8Args& a) { a.x.device = a.out.device = a.descale.device = a.hadamard_signs->device = -1; },
     kInvalid, {"x.device = -1: expected a CUDA device ordinal >= 0"}},
    {"out_on_other_device", [](QuantizeFp8Args& a) { a.out.device = 1; }, kInvalid,
     {"out.device = 1: expected 0 (x.device)"}},
    {"signs_on_other_device", [](QuantizeFp8Args& a) { a.hadamard_signs->device = 1; }, kInvalid,
     {"hadamard_signs.device = 1: expected 0 (x.device)"}},
};

INSTANTIATE_TEST_SUITE_P(Quantize, InvalidQuantizeArguments, ::testing::ValuesIn(kInvalidQuantizeCases),
                         [](const ::testing::TestParamInfo<InvalidQuantizeCase>& info) { return info.param.name; });

TEST(QuantizeValidation, AcceptsEveryScalingHeadDimAndLayout) {
  using flashhop::make_contiguous;
  EXPECT_TRUE(flashhop::validate_quantize_fp8(valid_quantize_args()).ok())
      << flashhop::validate_quantize_fp8(valid_quantize_args()).message;
  for (std::int64_t head_dim : {64, 96, 128, 192, 256}) {
    QuantizeFp8Args a = valid_quantize_args();
    set_quantize_head_dim(a, head_dim);
    a.x.dtype = DType::kFloat16;
    EXPECT_TRUE(flashhop::validate_quantize_fp8(a).ok()) << head_dim << ": " << flashhop::validate_quantize_fp8(a).message;
  }
  void* const descale = valid_quantize_args().descale.data;
  const std::pair<Fp8Scaling, TensorDesc> scalings[] = {
      {Fp8Scaling::kPerTensor, make_contiguous(descale, DType::kFloat32, {1})},
      {Fp8Scaling::kPerHead, make_contiguous(descale, DType::kFloat32, {2, 1})},
      {Fp8Scaling::kPerHead, make_contiguous(descale, DType::kFloat32, {2, 8})},
      {Fp8Scaling::kPerBlock, make_contiguous(descale, DType::kFloat32, {2, 8, 3})}};
  for (const auto& [scaling, shape] : scalings) {
    QuantizeFp8Args a = valid_quantize_args();
    a.scaling = scaling;
    a.descale = shape;
    a.hadamard_signs.reset();
    EXPECT_TRUE(flashhop::validate_quantize_fp8(a).ok()) << flashhop::validate_quantize_fp8(a).message;
  }
  // x: the query heads of a packed (batch, seqlen, 8 + 2 + 2 heads, 128) projection; out with 16
  // bytes of padding after each head.
  QuantizeFp8Args strided = valid_quantize_args();
  strided.x.stride[1] = 12 * 128;
  strided.x.stride[0] = 300 * 12 * 128;
  strided.out.stride[2] = 144;
  strided.out.stride[1] = 8 * 144;
  strided.out.stride[0] = 300 * 8 * 144;
  EXPECT_TRUE(flashhop::validate_quantize_fp8(strided).ok()) << flashhop::validate_quantize_fp8(strided).message;
  // Empty: no rows (every per-head scale is then 1), no batch.
  QuantizeFp8Args no_rows = valid_quantize_args();
  no_rows.x.shape[1] = no_rows.out.shape[1] = 0;
  EXPECT_TRUE(flashhop::validate_quantize_fp8(no_rows).ok()) << flashhop::validate_quantize_fp8(no_rows).message;
  QuantizeFp8Args no_batch = valid_quantize_args();
  no_batch.x.shape[0] = no_batch.out.shape[0] = no_batch.descale.shape[0] = 0;
  no_batch.x.data = no_batch.out.data = no_batch.descale.data = nullptr;
  EXPECT_TRUE(flashhop::validate_quantize_fp8(no_batch).ok()) << flashhop::validate_quantize_fp8(no_batch).message;
}

// The kernels' arguments: strides (those of size-1 dimensions 0), and descale's addressing, which
// covers the three scalings with one formula (fp8_quantize.h).
TEST(QuantizePlan, StridesAndDescaleAddressing) {
  QuantizeFp8Args a = valid_quantize_args();
  a.x.stride[1] = 12 * 128;
  a.x.stride[0] = 300 * 12 * 128;
  flashhop::sm90::Fp8QuantizeParams p = flashhop::detail::plan_quantize_fp8(a);
  EXPECT_EQ(p.x, a.x.data);
  EXPECT_EQ(p.x_batch_stride, 300 * 12 * 128);
  EXPECT_EQ(p.x_row_stride, 12 * 128);
  EXPECT_EQ(p.x_head_stride, 128);
  EXPECT_EQ(p.out_row_stride, 8 * 128);
  EXPECT_EQ(p.hadamard_signs, a.hadamard_signs->data);
  EXPECT_EQ((std::vector<int>{p.batch, p.seqlen, p.nheads, p.head_dim}), (std::vector<int>{2, 300, 8, 128}));
  EXPECT_EQ(p.descale_batch_stride, 4);
  EXPECT_EQ(p.descale_group_stride, 1);
  EXPECT_EQ(p.descale_block_stride, 0);
  EXPECT_EQ(p.heads_per_group, 2);
  EXPECT_EQ(p.scale_batches, 2);
  EXPECT_EQ(p.scale_groups, 4);

  a.scaling = Fp8Scaling::kPerTensor;
  a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {1});
  a.hadamard_signs.reset();
  p = flashhop::detail::plan_quantize_fp8(a);
  EXPECT_EQ(p.hadamard_signs, nullptr);
  EXPECT_EQ(p.descale_batch_stride, 0);
  EXPECT_EQ(p.descale_group_stride, 0);
  EXPECT_EQ(p.descale_block_stride, 0);
  EXPECT_EQ(p.scale_batches, 1);
  EXPECT_EQ(p.scale_groups, 1);

  a.scaling = Fp8Scaling::kPerBlock;
  a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {2, 8, 3});
  p = flashhop::detail::plan_quantize_fp8(a);
  EXPECT_EQ(p.descale_batch_stride, 24);
  EXPECT_EQ(p.descale_group_stride, 3);
  EXPECT_EQ(p.descale_block_stride, 1);
  EXPECT_EQ(p.heads_per_group, 1);

  // One batch entry and one row: their strides are never followed.
  a.x = flashhop::make_contiguous(a.x.data, DType::kBFloat16, {1, 1, 8, 128});
  a.x.stride[0] = -5;
  a.out = flashhop::make_contiguous(a.out.data, DType::kFloat8E4M3, {1, 1, 8, 128});
  a.descale = flashhop::make_contiguous(a.descale.data, DType::kFloat32, {1, 8, 1});
  ASSERT_TRUE(flashhop::validate_quantize_fp8(a).ok()) << flashhop::validate_quantize_fp8(a).message;
  p = flashhop::detail::plan_quantize_fp8(a);
  EXPECT_EQ(p.x_batch_stride, 0);
  EXPECT_EQ(p.x_row_stride, 0);
  EXPECT_EQ(p.descale_batch_stride, 0);
}

}  // namespace
}  // namespace flashhop_test
