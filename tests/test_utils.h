// Helpers shared by the tests: where the operands of a forward call live (contiguous or packed and
// padded), host images of device allocations in fp16 / bf16 / fp32 / e4m3, random inputs, device buffers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"

namespace flashhop_test {

using flashhop::DType;
using flashhop::TensorDesc;

struct Problem {
  int batch = 1, seqlen_q = 0, seqlen_k = 0, nheads = 1, nheads_kv = 1, head_dim = 128;
  int head_dim_v = 0;  // 0: head_dim

  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  flashhop::reference::AttentionShape shape() const {
    return {batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, dv()};
  }
  std::int64_t q_elements() const { return std::int64_t{batch} * seqlen_q * nheads * head_dim; }
  std::int64_t k_elements() const { return std::int64_t{batch} * seqlen_k * nheads_kv * head_dim; }
  std::int64_t v_elements() const { return std::int64_t{batch} * seqlen_k * nheads_kv * dv(); }
  std::int64_t o_elements() const { return std::int64_t{batch} * seqlen_q * nheads * dv(); }
  std::int64_t lse_elements() const { return std::int64_t{batch} * nheads * seqlen_q; }
};

// What a call does to the scores besides the scale (flashhop::ForwardArgs's fields).
struct Masking {
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
};

// One operand of a forward call: which allocation of the plan holds it, at which element offset,
// and its view (shape and strides; data is filled in by bind_args()).
struct Placement {
  int buffer = 0;
  std::int64_t offset = 0;
  TensorDesc view;
};

// The allocations of a forward call and where q, k, v, o and lse sit in them.
struct ForwardPlan {
  std::vector<DType> buffer_dtypes;
  std::vector<std::int64_t> buffer_elements;
  Placement q, k, v, o, lse;
};

inline TensorDesc strided_view(DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride) {
  TensorDesc desc = flashhop::make_contiguous(nullptr, dtype, shape);
  int d = 0;
  for (std::int64_t s : stride) desc.stride[d++] = s;
  return desc;
}

// Every operand in its own contiguous allocation: buffers q, k, v, o, lse.
inline ForwardPlan contiguous_plan(const Problem& p, DType dtype) {
  ForwardPlan plan;
  plan.buffer_dtypes = {dtype, dtype, dtype, dtype, DType::kFloat32};
  plan.buffer_elements = {p.q_elements(), p.k_elements(), p.v_elements(), p.o_elements(), p.lse_elements()};
  plan.q = {0, 0, flashhop::make_contiguous(nullptr, dtype, {p.batch, p.seqlen_q, p.nheads, p.head_dim})};
  plan.k = {1, 0, flashhop::make_contiguous(nullptr, dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.head_dim})};
  plan.v = {2, 0, flashhop::make_contiguous(nullptr, dtype, {p.batch, p.seqlen_k, p.nheads_kv, p.dv()})};
  plan.o = {3, 0, flashhop::make_contiguous(nullptr, dtype, {p.batch, p.seqlen_q, p.nheads, p.dv()})};
  plan.lse = {4, 0, flashhop::make_contiguous(nullptr, DType::kFloat32, {p.batch, p.nheads, p.seqlen_q})};
  return plan;
}

// Elements of padding after each head of o (16 bytes) and after each row of lse.
inline constexpr std::int64_t kOHeadPadding = 8;
inline constexpr std::int64_t kLseRowPadding = 3;

// q, k and v as slices of one packed (batch, seqlen, nheads + 2 * nheads_kv, head_dim) tensor, as a
// fused QKV projection leaves them (needs seqlen_q == seqlen_k and dv == d); o with kOHeadPadding
// elements after each head, lse with kLseRowPadding after each row. Buffers: qkv, o, lse.
inline ForwardPlan strided_plan(const Problem& p, DType dtype) {
  if (p.seqlen_q != p.seqlen_k) throw std::invalid_argument("strided_plan: a packed QKV needs seqlen_q == seqlen_k");
  if (p.dv() != p.head_dim) throw std::invalid_argument("strided_plan: a packed QKV needs head_dim_v == head_dim");
  const std::int64_t d = p.head_dim, seqlen = p.seqlen_q;
  const std::int64_t qkv_row = (p.nheads + 2 * p.nheads_kv) * d;
  const std::int64_t o_head = d + kOHeadPadding, o_row = p.nheads * o_head;
  const std::int64_t lse_row = seqlen + kLseRowPadding;

  ForwardPlan plan;
  plan.buffer_dtypes = {dtype, dtype, DType::kFloat32};
  plan.buffer_elements = {p.batch * seqlen * qkv_row, p.batch * seqlen * o_row, p.batch * p.nheads * lse_row};
  const auto qkv_view = [&](int heads) {
    return strided_view(dtype, {p.batch, seqlen, heads, d}, {seqlen * qkv_row, qkv_row, d, 1});
  };
  plan.q = {0, 0, qkv_view(p.nheads)};
  plan.k = {0, p.nheads * d, qkv_view(p.nheads_kv)};
  plan.v = {0, (p.nheads + p.nheads_kv) * d, qkv_view(p.nheads_kv)};
  plan.o = {1, 0, strided_view(dtype, {p.batch, seqlen, p.nheads, d}, {seqlen * o_row, o_row, o_head, 1})};
  plan.lse = {2, 0,
              strided_view(DType::kFloat32, {p.batch, p.nheads, seqlen}, {p.nheads * lse_row, lse_row, 1})};
  return plan;
}

// The call's arguments with each operand's data at bases[buffer] + offset (null stays null: an
// empty allocation).
inline flashhop::ForwardArgs bind_args(const ForwardPlan& plan, const std::vector<void*>& bases, bool with_lse,
                                       const Masking& masking = {}) {
  const auto placed = [&](const Placement& placement) {
    TensorDesc desc = placement.view;
    char* base = static_cast<char*>(bases.at(placement.buffer));
    desc.data = base ? base + placement.offset * static_cast<std::int64_t>(flashhop::dtype_size(desc.dtype)) : nullptr;
    return desc;
  };
  flashhop::ForwardArgs args;
  args.q = placed(plan.q);
  args.k = placed(plan.k);
  args.v = placed(plan.v);
  args.o = placed(plan.o);
  if (with_lse) args.lse = placed(plan.lse);
  args.causal = masking.causal;
  args.window_left = masking.window_left;
  args.window_right = masking.window_right;
  args.softcap = masking.softcap;
  return args;
}

// The backward of forward call `f` (which has an lse): its q, k, v, o, lse and options, and the
// given dout and gradients.
inline flashhop::BackwardArgs backward_args_of(const flashhop::ForwardArgs& f, const TensorDesc& dout,
                                               const TensorDesc& dq, const TensorDesc& dk, const TensorDesc& dv) {
  flashhop::BackwardArgs b;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.o = f.o;
  b.lse = *f.lse;
  b.dout = dout;
  b.dq = dq;
  b.dk = dk;
  b.dv = dv;
  b.softmax_scale = f.softmax_scale;
  b.causal = f.causal;
  b.window_left = f.window_left;
  b.window_right = f.window_right;
  b.softcap = f.softcap;
  return b;
}

// One 16-byte aligned address per buffer of `plan`, 4 GiB apart, for tests that only validate: the
// addresses are never dereferenced.
inline std::vector<void*> fake_bases(const ForwardPlan& plan) {
  std::vector<void*> bases;
  for (std::size_t i = 0; i < plan.buffer_dtypes.size(); ++i) {
    bases.push_back(reinterpret_cast<void*>(std::uintptr_t{0x7f0000000000} + (std::uintptr_t{i} << 32)));
  }
  return bases;
}

// ---- host images of device memory --------------------------------------------------------------

// e4m3 values round to nearest even and saturate to +-448 (NaN stays NaN), as the kernels convert.
inline void store_element(DType dtype, float value, unsigned char* at) {
  if (dtype == DType::kFloat32) {
    std::memcpy(at, &value, sizeof value);
  } else if (dtype == DType::kFloat8E4M3) {
    *at = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
  } else if (dtype == DType::kBFloat16) {
    const __nv_bfloat16 converted = __float2bfloat16_rn(value);
    std::memcpy(at, &converted, sizeof converted);
  } else {
    const __half converted = __float2half_rn(value);
    std::memcpy(at, &converted, sizeof converted);
  }
}

inline float load_element(DType dtype, const unsigned char* at) {
  if (dtype == DType::kFloat32) {
    float value;
    std::memcpy(&value, at, sizeof value);
    return value;
  }
  if (dtype == DType::kBFloat16) {
    __nv_bfloat16 value;
    std::memcpy(&value, at, sizeof value);
    return __bfloat162float(value);
  }
  if (dtype == DType::kFloat8E4M3) return __half2float(__half(__nv_cvt_fp8_to_halfraw(*at, __NV_E4M3)));
  __half value;
  std::memcpy(&value, at, sizeof value);
  return __half2float(value);
}

inline float round_to(DType dtype, float value) {
  unsigned char bytes[sizeof(float)];
  store_element(dtype, value, bytes);
  return load_element(dtype, bytes);
}

// Host image of an allocation with every element NaN, so that unwritten outputs show.
inline std::vector<unsigned char> poisoned_storage(DType dtype, std::int64_t elements) {
  const std::size_t size = flashhop::dtype_size(dtype);
  std::vector<unsigned char> storage(static_cast<std::size_t>(elements) * size);
  for (std::size_t at = 0; at < storage.size(); at += size) {
    store_element(dtype, std::numeric_limits<float>::quiet_NaN(), &storage[at]);
  }
  return storage;
}

inline std::int64_t count_non_nan(const std::vector<unsigned char>& storage, DType dtype) {
  const std::size_t size = flashhop::dtype_size(dtype);
  std::int64_t count = 0;
  for (std::size_t at = 0; at < storage.size(); at += size) count += !std::isnan(load_element(dtype, &storage[at]));
  return count;
}

// Calls visit(logical_index, storage_index) for every element of `view` placed at `offset`, the
// logical index running in row-major order.
template <typename Visit>
void for_each_element(const TensorDesc& view, std::int64_t offset, Visit visit) {
  std::int64_t shape[flashhop::kMaxRank], stride[flashhop::kMaxRank];
  for (int d = 0; d < flashhop::kMaxRank; ++d) {
    const bool used = d < view.rank;
    shape[d] = used ? view.shape[d] : 1;
    stride[d] = used ? view.stride[d] : 0;
  }
  std::int64_t logical = 0;
  for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (std::int64_t i3 = 0; i3 < shape[3]; ++i3)
          visit(logical++, offset + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]);
}

// Writes row-major `values` into the view `placement` of `storage` (converted to the view's dtype).
inline void scatter(const std::vector<float>& values, const Placement& placement, std::vector<unsigned char>* storage) {
  const std::size_t size = flashhop::dtype_size(placement.view.dtype);
  for_each_element(placement.view, placement.offset, [&](std::int64_t logical, std::int64_t index) {
    store_element(placement.view.dtype, values.at(logical), &storage->at(index * size));
  });
}

// Reads the view `placement` of `storage` into row-major floats.
inline std::vector<float> gather(const std::vector<unsigned char>& storage, const Placement& placement) {
  const std::size_t size = flashhop::dtype_size(placement.view.dtype);
  std::vector<float> values;
  for_each_element(placement.view, placement.offset, [&](std::int64_t, std::int64_t index) {
    values.push_back(load_element(placement.view.dtype, &storage.at(index * size)));
  });
  return values;
}

// Standard normal values, already rounded to `dtype` so that host and device see the same inputs.
inline std::vector<float> random_normal(std::int64_t count, DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = round_to(dtype, normal(rng));
  return values;
}

// The largest magnitude of `values`.
template <typename T>
double max_abs(const std::vector<T>& values) {
  double m = 0;
  for (T x : values) m = std::max(m, std::abs(double(x)));
  return m;
}

// The largest Euclidean norm of the `count` rows of `cols` values from x.
inline double max_row_norm(const float* x, std::int64_t count, int cols) {
  double m = 0;
  for (std::int64_t row = 0; row < count; ++row) {
    double sum = 0;
    for (int c = 0; c < cols; ++c) sum += double(x[row * cols + c]) * x[row * cols + c];
    m = std::max(m, std::sqrt(sum));
  }
  return m;
}

// `rows` rows of `heads` heads of `cols` values from x, each head times the scale of its KV head:
// kv_scales[head / group] (FP8 inputs dequantized by their descales).
inline std::vector<float> scaled_by_kv_head(const float* x, std::int64_t rows, int heads, int cols,
                                            const float* kv_scales, int group) {
  std::vector<float> out(x, x + rows * heads * cols);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] *= kv_scales[i / cols % heads / group];
  return out;
}

// Largest |got - expected| and where (the first NaN counts as the largest; an infinity equal to the
// expected one counts as 0), and how many are NaN.
struct Error {
  double max = 0;
  std::size_t at = 0;
  std::size_t nan = 0;
};
inline Error max_error(const std::vector<float>& got, const std::vector<double>& expected) {
  Error error;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double difference =
        std::isinf(expected[i]) && double{got[i]} == expected[i] ? 0.0 : std::abs(double{got[i]} - expected[i]);
    if (std::isnan(difference)) {
      if (error.nan++ == 0) error.max = difference, error.at = i;
    } else if (error.nan == 0 && difference > error.max) {
      error.max = difference, error.at = i;
    }
  }
  return error;
}

// ---- device -------------------------------------------------------------------------------------

inline void cuda_check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

inline bool gpu_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();  // "no device" must not linger as the last error
  return ok;
}

// A GPU the kernels run on: the current device has compute capability 9.0 (sm_90a).
inline bool hopper_available() {
  if (!gpu_available()) return false;
  int device = 0, major = 0, minor = 0;
  const bool ok = cudaGetDevice(&device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
  cudaGetLastError();
  return ok && major == 9 && minor == 0;
}

// GPU tests skip themselves without a Hopper GPU.
class RequiresGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU (compute capability 9.0)";
  }
};

template <typename Param>
class GpuTestWithParam : public RequiresGpu, public ::testing::WithParamInterface<Param> {};

// cudaMalloc'ed memory owned by the object; an empty buffer holds a null pointer.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) cuda_check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr && cudaFree(data_) != cudaSuccess) ADD_FAILURE() << "cudaFree failed";
  }

  void* data() const { return data_; }

  void upload(const std::vector<unsigned char>& host) {
    if (host.size() != bytes_) throw std::invalid_argument("DeviceBuffer::upload: size mismatch");
    if (bytes_ == 0) return;
    cuda_check(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // From pageable memory cudaMemcpy may return before the copy lands; the tests' kernels run on
    // non-blocking streams, which do not wait for it.
    cuda_check(cudaDeviceSynchronize(), "synchronize after cudaMemcpy H2D");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes_);
    if (bytes_ > 0) cuda_check(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// int32 values (cu_seqlens, seqused, page tables) in device memory.
inline DeviceBuffer upload_ints(const std::vector<int>& values) {
  std::vector<unsigned char> image(values.size() * sizeof(int));
  if (!values.empty()) std::memcpy(image.data(), values.data(), image.size());
  DeviceBuffer buffer(image.size());
  buffer.upload(image);
  return buffer;
}

// A contiguous device tensor read and written through host images of its values (as floats).
struct DeviceTensor {
  TensorDesc desc;
  DeviceBuffer buffer;

  DeviceTensor(DType dtype, std::initializer_list<std::int64_t> shape)
      : desc(flashhop::make_contiguous(nullptr, dtype, shape)), buffer(bytes_of(desc)) {
    desc.data = buffer.data();
  }
  static std::size_t bytes_of(const TensorDesc& desc) {
    std::size_t elements = 1;
    for (int d = 0; d < desc.rank; ++d) elements *= static_cast<std::size_t>(desc.shape[d]);
    return elements * flashhop::dtype_size(desc.dtype);
  }
  std::int64_t elements() const { return static_cast<std::int64_t>(bytes_of(desc) / flashhop::dtype_size(desc.dtype)); }
  void upload(const std::vector<float>& values) {
    std::vector<unsigned char> image(bytes_of(desc));
    for (std::size_t i = 0; i < values.size(); ++i) {
      store_element(desc.dtype, values[i], &image[i * flashhop::dtype_size(desc.dtype)]);
    }
    buffer.upload(image);
  }
  void poison() { buffer.upload(poisoned_storage(desc.dtype, elements())); }
  std::vector<float> download() const {
    const std::vector<unsigned char> image = buffer.download();
    std::vector<float> values(static_cast<std::size_t>(elements()));
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = load_element(desc.dtype, &image[i * flashhop::dtype_size(desc.dtype)]);
    }
    return values;
  }
};

// call(args, workspace, bytes, stream) with the workspace size(args, &bytes) asks for, poisoned so
// that a kernel relying on its contents rather than on the call's own initialisation fails; waits
// for `stream` before freeing it. (size, call): forward_workspace_size and forward, or the backward's.
template <typename Args, typename Size, typename Call>
flashhop::Status with_workspace(const Args& args, Size size, Call call, cudaStream_t stream) {
  std::size_t bytes = 0;
  if (const flashhop::Status status = size(args, &bytes); !status.ok()) return status;
  DeviceBuffer workspace(bytes);
  workspace.upload(std::vector<unsigned char>(bytes, 0xff));
  const flashhop::Status status = call(args, workspace.data(), bytes, stream);
  cuda_check(cudaStreamSynchronize(stream), "synchronize after the call");
  return status;
}

}  // namespace flashhop_test
