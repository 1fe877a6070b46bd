// The C API: status codes, null arguments, C-only fields (causal, use_softmax_scale,
// lse pointer, use_window, deterministic), the backward's entries and the per-thread last-error
// message.
#include "flashhop/flashhop_c.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>

#include "test_utils.h"

namespace flashhop_test {
namespace {

flashhop_tensor_t to_c(const TensorDesc& desc) {
  flashhop_tensor_t tensor{};
  tensor.data = desc.data;
  tensor.dtype = static_cast<flashhop_dtype_t>(desc.dtype);
  tensor.rank = desc.rank;
  for (int d = 0; d < 4; ++d) {
    tensor.shape[d] = desc.shape[d];
    tensor.stride[d] = desc.stride[d];
  }
  tensor.device = desc.device;
  return tensor;
}

// A valid call: q (2, 33, 8, 128), k and v (2, 65, 2, 128), bf16, with lse.
struct CArgs {
  flashhop_forward_args_t args{};
  flashhop_tensor_t lse{};

  CArgs() {
    const ForwardPlan plan = contiguous_plan({2, 33, 65, 8, 2, 128}, DType::kBFloat16);
    const flashhop::ForwardArgs cpp = bind_args(plan, fake_bases(plan), /*with_lse=*/true);
    args.q = to_c(cpp.q);
    args.k = to_c(cpp.k);
    args.v = to_c(cpp.v);
    args.o = to_c(cpp.o);
    lse = to_c(*cpp.lse);
    args.lse = &lse;
  }
  CArgs(const CArgs&) = delete;
};

std::string last_error() { return flashhop_last_error(); }

bool mentions(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

TEST(CApi, DtypeValuesMatchTheCppEnum) {
  EXPECT_EQ(FLASHHOP_FLOAT16, static_cast<int>(DType::kFloat16));
  EXPECT_EQ(FLASHHOP_BFLOAT16, static_cast<int>(DType::kBFloat16));
  EXPECT_EQ(FLASHHOP_FLOAT32, static_cast<int>(DType::kFloat32));
  EXPECT_EQ(FLASHHOP_INT32, static_cast<int>(DType::kInt32));
  EXPECT_EQ(FLASHHOP_FLOAT8_E4M3, static_cast<int>(DType::kFloat8E4M3));
}

TEST(CApi, WorkspaceSizeOfValidCall) {
  CArgs c;
  size_t bytes = 123;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(last_error(), "");
}

TEST(CApi, NullArguments) {
  size_t bytes = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(nullptr, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "args = null")) << last_error();
  EXPECT_EQ(flashhop_forward(nullptr, nullptr, 0, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "args = null")) << last_error();

  CArgs c;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "bytes")) << last_error();
}

TEST(CApi, InvalidArgumentCarriesTheMessage) {
  CArgs c;
  c.args.k.shape[2] = c.args.v.shape[2] = 3;
  EXPECT_EQ(flashhop_forward(&c.args, nullptr, 0, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "k.shape[2] (nheads_kv) = 3: nheads (8) must be a multiple of it");
}

TEST(CApi, UnsupportedHeadDim) {
  CArgs c;
  c.args.q.shape[3] = c.args.k.shape[3] = c.args.v.shape[3] = c.args.o.shape[3] = 80;
  size_t bytes = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_NOT_SUPPORTED);
  EXPECT_TRUE(mentions(last_error(), "q.shape[3] (head_dim) = 80")) << last_error();
}

TEST(CApi, DtypeOutsideTheEnum) {
  CArgs c;
  c.args.v.dtype = static_cast<flashhop_dtype_t>(9);
  size_t bytes = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "v.dtype = unknown")) << last_error();
}

TEST(CApi, CausalMustBeZeroOrOne) {
  CArgs c;
  size_t bytes = 0;
  c.args.causal = 1;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.causal = 2;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "causal = 2: expected 0 or 1");
}

// A zero-initialised struct has no window; the widths count only with use_window = 1.
TEST(CApi, WindowAppliesOnlyWithUseWindow) {
  CArgs c;
  size_t bytes = 0;
  c.args.window_left = -7;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.use_window = 1;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "window_left = -7")) << last_error();
  c.args.window_left = 16;
  c.args.window_right = -1;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.use_window = 2;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "use_window = 2: expected 0 or 1");
}

TEST(CApi, SoftcapIsPassedOn) {
  CArgs c;
  size_t bytes = 0;
  c.args.softcap = 50.f;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.softcap = -1.f;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "softcap = -1")) << last_error();
}

TEST(CApi, PackGqaValues) {
  EXPECT_EQ(FLASHHOP_PACK_GQA_AUTO, static_cast<int>(flashhop::PackGqa::kAuto));
  EXPECT_EQ(FLASHHOP_PACK_GQA_OFF, static_cast<int>(flashhop::PackGqa::kOff));
  EXPECT_EQ(FLASHHOP_PACK_GQA_ON, static_cast<int>(flashhop::PackGqa::kOn));
  CArgs c;
  size_t bytes = 0;
  c.args.pack_gqa = FLASHHOP_PACK_GQA_ON;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.pack_gqa = static_cast<flashhop_pack_gqa_t>(3);
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "pack_gqa = 3: expected FLASHHOP_PACK_GQA_AUTO (0), _OFF (1) or _ON (2)");
}

TEST(CApi, SoftmaxScaleAppliesOnlyWithUseSoftmaxScale) {
  CArgs c;
  size_t bytes = 0;
  c.args.softmax_scale = NAN;  // ignored without use_softmax_scale
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.use_softmax_scale = 1;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "softmax_scale = nan")) << last_error();
  c.args.softmax_scale = 0.f;  // a scale of its own, not the default
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  c.args.use_softmax_scale = 2;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "use_softmax_scale = 2: expected 0 or 1");
}

TEST(CApi, NullLseMeansNotWritten) {
  CArgs c;
  c.lse.rank = 1;  // invalid, but ignored once the pointer is null
  size_t bytes = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "lse.rank = 1")) << last_error();
  c.args.lse = nullptr;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
}

TEST(CApi, SuccessClearsTheLastError) {
  CArgs c;
  size_t bytes = 0;
  c.args.causal = 5;
  ASSERT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  ASSERT_NE(last_error(), "");
  c.args.causal = 0;
  ASSERT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS);
  EXPECT_EQ(last_error(), "");
}

TEST(CApi, LastErrorIsPerThread) {
  CArgs c;
  c.args.causal = 7;
  size_t bytes = 0;
  ASSERT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  const std::string main_error = last_error();

  std::string other_before, other_after;
  std::thread other([&] {
    other_before = last_error();
    size_t other_bytes = 0;
    flashhop_forward_workspace_size(nullptr, &other_bytes);
    other_after = last_error();
  });
  other.join();

  EXPECT_EQ(other_before, "");
  EXPECT_TRUE(mentions(other_after, "args = null")) << other_after;
  EXPECT_EQ(last_error(), main_error);
}

// Valid arguments reach the device checks: without a GPU the device cannot be asked; on a GPU
// other than Hopper the kernels cannot run; on Hopper the made-up addresses are not device memory.
TEST(CApi, ForwardChecksTheDeviceAfterValidation) {
  CArgs c;
  const flashhop_status_t status = flashhop_forward(&c.args, nullptr, 0, nullptr);
  if (hopper_available()) {
    EXPECT_EQ(status, FLASHHOP_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions(last_error(), "q.data")) << last_error();
  } else if (gpu_available()) {
    EXPECT_EQ(status, FLASHHOP_NOT_SUPPORTED);
    EXPECT_TRUE(mentions(last_error(), "compute capability")) << last_error();
  } else {
    EXPECT_EQ(status, FLASHHOP_CUDA_ERROR);  // the current device cannot be asked
    EXPECT_TRUE(mentions(last_error(), "cudaGetDevice")) << last_error();
  }
}

// A variable-length call: q (100, 8, 128), k and v (300, 2, 128), o like q, lse (8, 100), three
// sequences (cu_seqlens int32 (4), seqused_k int32 (3)), bf16.
struct CVarlenArgs {
  flashhop_forward_args_t args{};
  flashhop_tensor_t lse{}, cu_seqlens_q{}, cu_seqlens_k{}, seqused_k{};

  CVarlenArgs() {
    const auto at = [](std::uintptr_t gib) {
      return reinterpret_cast<void*>(std::uintptr_t{0x7f2000000000} + (gib << 32));
    };
    using flashhop::make_contiguous;
    args.q = to_c(make_contiguous(at(0), DType::kBFloat16, {100, 8, 128}));
    args.k = to_c(make_contiguous(at(1), DType::kBFloat16, {300, 2, 128}));
    args.v = to_c(make_contiguous(at(2), DType::kBFloat16, {300, 2, 128}));
    args.o = to_c(make_contiguous(at(3), DType::kBFloat16, {100, 8, 128}));
    lse = to_c(make_contiguous(at(4), DType::kFloat32, {8, 100}));
    cu_seqlens_q = to_c(make_contiguous(at(5), DType::kInt32, {4}));
    cu_seqlens_k = to_c(make_contiguous(at(6), DType::kInt32, {4}));
    seqused_k = to_c(make_contiguous(at(7), DType::kInt32, {3}));
    args.lse = &lse;
    args.cu_seqlens_q = &cu_seqlens_q;
    args.cu_seqlens_k = &cu_seqlens_k;
    args.seqused_k = &seqused_k;
    args.max_seqlen_q = 50;
    args.max_seqlen_k = 200;
  }
  CVarlenArgs(const CVarlenArgs&) = delete;
};

TEST(CApi, VarlenFieldsArePassedOn) {
  CVarlenArgs c;
  size_t bytes = 0;
  ASSERT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  EXPECT_EQ(bytes, 16u + (3u * 3u + 1u) * 4u);  // the tile list: a header, 3 ints per sequence and one more

  c.seqused_k.shape[0] = 4;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "seqused_k.shape[0] (batch) = 4: expected 3")) << last_error();
  c.seqused_k.shape[0] = 3;

  c.args.max_seqlen_k = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "max_seqlen_k = 0: expected >= 1")) << last_error();
  c.args.max_seqlen_k = 200;

  c.args.cu_seqlens_k = nullptr;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_NOT_SUPPORTED);
  EXPECT_TRUE(mentions(last_error(), "cu_seqlens_k = none with cu_seqlens_q given")) << last_error();
}

TEST(CApi, NumSplitsIsPassedOn) {
  CVarlenArgs c;
  size_t bytes = 0;
  c.args.num_splits = -1;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "num_splits = -1: expected 0 (the library chooses) to 256")) << last_error();
  c.args.num_splits = 3;
  ASSERT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_SUCCESS) << last_error();
  EXPECT_GT(bytes, 16u + (3u * 3u + 1u) * 4u);  // the tile list, then the partial results
}

// The append and combine entry points: null arguments and flags named, validation passed through.
TEST(CApi, AppendAndCombineArguments) {
  EXPECT_EQ(flashhop_append_kv(nullptr, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "args = null: expected append arguments")) << last_error();
  EXPECT_EQ(flashhop_combine(nullptr, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "args = null: expected combine arguments")) << last_error();
  flashhop_append_kv_args_t append{};
  append.rotary_interleaved = 2;
  EXPECT_EQ(flashhop_append_kv(&append, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "rotary_interleaved = 2: expected 0 or 1")) << last_error();
  append.rotary_interleaved = 0;
  EXPECT_EQ(flashhop_append_kv(&append, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "k_cache.rank = 0")) << last_error();
  flashhop_combine_args_t combine{};
  EXPECT_EQ(flashhop_combine(&combine, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "out_partial.rank = 0")) << last_error();
}

// A zero-initialised variable-length part is a fixed-length call, whatever else the struct holds.
TEST(CApi, ZeroVarlenFieldsMeanFixedLength) {
  CArgs c;
  EXPECT_EQ(c.args.cu_seqlens_q, nullptr);
  c.args.seqused_q = &c.lse;
  size_t bytes = 0;
  EXPECT_EQ(flashhop_forward_workspace_size(&c.args, &bytes), FLASHHOP_NOT_SUPPORTED);
  EXPECT_TRUE(mentions(last_error(), "seqused_q is given without cu_seqlens_q")) << last_error();
}

// Without the workspace it asked for, a variable-length call is refused before anything runs, on
// any machine (or, where the build left its kernel out, answered so).
TEST(CApi, VarlenForwardNeedsItsWorkspace) {
  CVarlenArgs c;
  const flashhop_status_t status = flashhop_forward(&c.args, nullptr, 0, nullptr);
  if (status == FLASHHOP_NOT_SUPPORTED) {
    EXPECT_TRUE(mentions(last_error(), "variable-length forward kernel for dtype bfloat16 and head_dim 128"))
        << last_error();
  } else {
    EXPECT_EQ(status, FLASHHOP_INVALID_ARGUMENT);
    EXPECT_EQ(last_error(),
              "workspace_bytes = 0: expected a workspace of at least 56 bytes (forward_workspace_size)");
  }
}

// The backward of CArgs's call: dout, dq, dk and dv in allocations of their own.
flashhop_backward_args_t backward_args(const CArgs& c) {
  flashhop_backward_args_t args{};
  args.q = c.args.q;
  args.k = c.args.k;
  args.v = c.args.v;
  args.o = c.args.o;
  args.lse = c.lse;
  const auto at = [](std::uintptr_t gib) { return reinterpret_cast<void*>(std::uintptr_t{0x7f1000000000} + (gib << 32)); };
  args.dout = to_c(flashhop::make_contiguous(at(0), DType::kBFloat16, {2, 33, 8, 128}));
  args.dq = to_c(flashhop::make_contiguous(at(1), DType::kBFloat16, {2, 33, 8, 128}));
  args.dk = to_c(flashhop::make_contiguous(at(2), DType::kBFloat16, {2, 65, 2, 128}));
  args.dv = to_c(flashhop::make_contiguous(at(3), DType::kBFloat16, {2, 65, 2, 128}));
  return args;
}

TEST(CApi, BackwardWorkspaceAndFlags) {
  CArgs c;
  flashhop_backward_args_t args = backward_args(c);
  size_t bytes = 0;
  EXPECT_EQ(flashhop_backward_workspace_size(&args, &bytes), FLASHHOP_SUCCESS) << last_error();
  EXPECT_GT(bytes, 0u);
  args.deterministic = 2;
  EXPECT_EQ(flashhop_backward_workspace_size(&args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "deterministic = 2: expected 0 or 1");
  args.deterministic = 1;
  args.dk.dtype = FLASHHOP_FLOAT16;
  EXPECT_EQ(flashhop_backward(&args, nullptr, 0, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "dk.dtype = float16")) << last_error();
  EXPECT_EQ(flashhop_backward_workspace_size(nullptr, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "args = null: expected backward arguments");
}

// The variable-length fields reach the backward: CVarlenArgs's call's workspace (8 heads of
// ceil(100 / 64) + 3 row blocks of 64 rows: LSE, D and d = 128 floats of dq each), and a missing
// bound named.
TEST(CApi, BackwardVarlenFieldsArePassedOn) {
  CVarlenArgs c;
  flashhop_backward_args_t args{};
  args.q = c.args.q;
  args.k = c.args.k;
  args.v = c.args.v;
  args.o = c.args.o;
  args.lse = c.lse;
  const auto at = [](std::uintptr_t gib) { return reinterpret_cast<void*>(std::uintptr_t{0x7f3000000000} + (gib << 32)); };
  args.dout = to_c(flashhop::make_contiguous(at(0), DType::kBFloat16, {100, 8, 128}));
  args.dq = to_c(flashhop::make_contiguous(at(1), DType::kBFloat16, {100, 8, 128}));
  args.dk = to_c(flashhop::make_contiguous(at(2), DType::kBFloat16, {300, 2, 128}));
  args.dv = to_c(flashhop::make_contiguous(at(3), DType::kBFloat16, {300, 2, 128}));
  args.cu_seqlens_q = c.args.cu_seqlens_q;
  args.cu_seqlens_k = c.args.cu_seqlens_k;
  args.seqused_k = c.args.seqused_k;
  args.max_seqlen_q = 50;
  args.max_seqlen_k = 200;
  size_t bytes = 0;
  ASSERT_EQ(flashhop_backward_workspace_size(&args, &bytes), FLASHHOP_SUCCESS) << last_error();
  const size_t rows = 8 * 5 * 64;
  EXPECT_EQ(bytes, rows * 4 * (2 + 128));
  args.max_seqlen_k = 0;
  EXPECT_EQ(flashhop_backward_workspace_size(&args, &bytes), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "max_seqlen_k = 0: expected >= 1 with cu_seqlens_k")) << last_error();
}

// A valid quantization: x (2, 300, 8, 128) bf16, out e4m3, descale (2, 4) per head, signs (128).
struct CQuantizeArgs {
  flashhop_quantize_fp8_args_t args{};
  flashhop_tensor_t signs{};

  CQuantizeArgs() {
    const auto at = [](std::uintptr_t gib) {
      return reinterpret_cast<void*>(std::uintptr_t{0x7f5000000000} + (gib << 32));
    };
    using flashhop::make_contiguous;
    args.x = to_c(make_contiguous(at(0), DType::kBFloat16, {2, 300, 8, 128}));
    args.out = to_c(make_contiguous(at(1), DType::kFloat8E4M3, {2, 300, 8, 128}));
    args.descale = to_c(make_contiguous(at(2), DType::kFloat32, {2, 4}));
    args.scaling = FLASHHOP_FP8_PER_HEAD;
    signs = to_c(make_contiguous(at(3), DType::kFloat32, {128}));
    args.hadamard_signs = &signs;
  }
  CQuantizeArgs(const CQuantizeArgs&) = delete;
};

// The quantization entry: null arguments, the scaling enum and the optional signs named; valid
// arguments reach the device checks.
TEST(CApi, QuantizeFp8Arguments) {
  EXPECT_EQ(FLASHHOP_FP8_PER_TENSOR, static_cast<int>(flashhop::Fp8Scaling::kPerTensor));
  EXPECT_EQ(FLASHHOP_FP8_PER_HEAD, static_cast<int>(flashhop::Fp8Scaling::kPerHead));
  EXPECT_EQ(FLASHHOP_FP8_PER_BLOCK, static_cast<int>(flashhop::Fp8Scaling::kPerBlock));
  EXPECT_EQ(flashhop_quantize_fp8(nullptr, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "args = null: expected quantize arguments");

  CQuantizeArgs c;
  c.args.scaling = static_cast<flashhop_fp8_scaling_t>(3);
  EXPECT_EQ(flashhop_quantize_fp8(&c.args, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "scaling = 3: expected FLASHHOP_FP8_PER_TENSOR (0), _PER_HEAD (1) or _PER_BLOCK (2)");
  c.args.scaling = FLASHHOP_FP8_PER_BLOCK;
  EXPECT_EQ(flashhop_quantize_fp8(&c.args, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "descale.rank = 2: expected 3 (batch, nheads, num_blocks) with per-block scaling"))
      << last_error();
  c.args.scaling = FLASHHOP_FP8_PER_HEAD;

  c.signs.shape[0] = 64;
  EXPECT_EQ(flashhop_quantize_fp8(&c.args, nullptr), FLASHHOP_INVALID_ARGUMENT);
  EXPECT_TRUE(mentions(last_error(), "hadamard_signs.shape[0] (head_dim) = 64")) << last_error();
  c.args.hadamard_signs = nullptr;  // the wrong length is no longer read

  const flashhop_status_t status = flashhop_quantize_fp8(&c.args, nullptr);
  if (gpu_available()) {
    EXPECT_EQ(status, FLASHHOP_INVALID_ARGUMENT);  // the made-up addresses are not device memory
    EXPECT_TRUE(mentions(last_error(), "x.data")) << last_error();
  } else {
    EXPECT_EQ(status, FLASHHOP_CUDA_ERROR);
    EXPECT_TRUE(mentions(last_error(), "cudaGetDevice")) << last_error();
  }
}

}  // namespace
}  // namespace flashhop_test
