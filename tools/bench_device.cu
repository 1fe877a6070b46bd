#include "bench_device.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashhop::bench {

void cuda_check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw BenchError(std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                     cudaGetErrorString(error) + ")");
  }
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  cuda_check(cudaMalloc(&data_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

namespace {

// splitmix64's finaliser: a bijective mix whose output bits are close to independent of the input's.
__device__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

template <typename T>
__device__ T from_float(float value);
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }
template <>
__device__ __half from_float<__half>(float value) { return __float2half_rn(value); }

// Box-Muller on two 24-bit uniforms from element i of a splitmix64 stream: the stream's state starts
// at a hash of the seed, so nearby seeds give unrelated streams.
template <typename T>
__global__ void fill_normal_kernel(T* out, std::int64_t count, std::uint64_t seed) {
  constexpr std::uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;  // splitmix64's state increment
  const std::uint64_t stream_start = mix64(seed);
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const std::uint64_t bits = mix64(stream_start + std::uint64_t(i) * kGoldenGamma);
    const float u1 = float((bits >> 40) + 1) * 0x1p-24f;  // (0, 1]: log stays finite
    const float u2 = float(bits & 0xFFFFFF) * 0x1p-24f;   // [0, 1)
    out[i] = from_float<T>(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

}  // namespace

void fill_random_normal(void* data, std::int64_t count, DType dtype, std::uint64_t seed,
                        cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
  const int blocks = int(std::min<std::int64_t>((count + kThreads - 1) / kThreads, 4096));
  switch (dtype) {
    case DType::kBFloat16:
      fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed);
      break;
    case DType::kFloat16:
      fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(data), count, seed);
      break;
    default:
      throw BenchError("fill_random_normal: only float16 and bfloat16 inputs are drawn");
  }
  cuda_check(cudaGetLastError(), "fill_normal_kernel launch");
}

void poison(const DeviceBuffer& buffer, cudaStream_t stream) {
  cuda_check(cudaMemsetAsync(buffer.data(), 0xFF, buffer.bytes(), stream), "cudaMemsetAsync (poison)");
}

double median_time_ms(const std::function<void(int)>& launch, WarmUp warmup, int iters, cudaStream_t stream) {
  // Created first, so that the GPU does not idle between the warm-up and the timed calls.
  std::vector<cudaEvent_t> events(2 * std::size_t(iters));
  for (auto& event : events) cuda_check(cudaEventCreate(&event), "cudaEventCreate");
  std::vector<float> times_ms(iters);
  try {
    // The first call is waited for before the warm-up's clock starts, so that host-side work of a
    // first call (a plan built, a module loaded) does not count as warm-up (the GPU idles during it).
    launch(0);
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the first call");
    using Clock = std::chrono::steady_clock;
    Clock::time_point const begin = Clock::now();
    auto elapsed_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - begin).count(); };
    int calls = 1;
    for (; calls < warmup.calls; ++calls) launch(calls);
    if (warmup.ms > 0) {
      // Then batches of about 50 ms of calls, each waited for, so that the host's clock follows
      // the GPU's work; the batch size comes from the calls above (one call if only the first ran).
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after warm-up calls");
      double const call_ms = calls > 1 ? elapsed_ms() / (calls - 1) : 0;
      int const batch = call_ms > 0 ? std::clamp(static_cast<int>(50 / call_ms), 1, 100000) : 1;
      while (elapsed_ms() < warmup.ms) {
        for (int j = 0; j < batch; ++j) launch(calls++);
        cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize during warm-up");
      }
    }
    for (int i = 0; i < iters; ++i) {
      cuda_check(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
      launch(calls + i);
      cuda_check(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after timed runs");
    for (int i = 0; i < iters; ++i) {
      cuda_check(cudaEventElapsedTime(&times_ms[i], events[2 * i], events[2 * i + 1]),
                 "cudaEventElapsedTime");
    }
  } catch (...) {
    for (auto& event : events) cudaEventDestroy(event);
    throw;
  }
  for (auto& event : events) cudaEventDestroy(event);
  std::sort(times_ms.begin(), times_ms.end());
  return iters % 2 == 1 ? times_ms[iters / 2]
                        : 0.5 * (double(times_ms[iters / 2 - 1]) + double(times_ms[iters / 2]));
}

namespace {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw BenchError(std::string(what) + ": " + cublas_status_name(status));
  }
}

// Owns a cuBLAS handle for the duration of one measurement.
class CublasHandle {
 public:
  CublasHandle() { cublas_check(cublasCreate(&handle_), "cublasCreate"); }
  ~CublasHandle() { cublasDestroy(handle_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

double measure_gemm_bf16_tflops(int n, WarmUp warmup, int iters, cudaStream_t stream) {
  const std::int64_t elements = std::int64_t(n) * n;
  const std::size_t bytes = std::size_t(elements) * sizeof(__nv_bfloat16);
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill_random_normal(a.data(), elements, DType::kBFloat16, 0x5eed0001, stream);
  fill_random_normal(b.data(), elements, DType::kBFloat16, 0x5eed0002, stream);

  CublasHandle handle;
  cublas_check(cublasSetStream(handle.get(), stream), "cublasSetStream");
  const float alpha = 1.f, beta = 0.f;
  const double ms = median_time_ms(
      [&](int) {
        cublas_check(cublasGemmEx(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(),
                                  CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n, &beta, c.data(),
                                  CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (bf16)");
      },
      warmup, iters, stream);
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace flashhop::bench
