// Device-side helpers of flashhop-bench: owned allocations, random inputs, output poisoning,
// event timing and the cuBLAS GEMM ceiling. Every failure throws BenchError with the CUDA message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "flashhop/flashhop.h"

namespace flashhop::bench {

struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws BenchError naming `what` when `error` is not cudaSuccess.
void cuda_check(cudaError_t error, const char* what);

// One cudaMalloc'd block, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Fills `count` elements of a float16/bfloat16 buffer with standard normal values. The values are a
// pure function of (seed, index), so a set drawn with another seed is independent of this one.
void fill_random_normal(void* data, std::int64_t count, DType dtype, std::uint64_t seed,
                        cudaStream_t stream);

// Sets every byte to 0xFF: NaN in float16, bfloat16 and float32 alike, so an element the kernel
// never wrote stays NaN and the check finds it.
void poison(const DeviceBuffer& buffer, cudaStream_t stream);

// How long the calls before the timed ones run: at least `calls` calls and at least `ms`
// milliseconds of wall-clock time. A GPU held at its power limit runs faster for a while after
// lighter work (its clocks follow the power drawn over about a second), so a warm-up by count
// alone times short calls in whatever state the work before them left (docs/PERFORMANCE.md).
struct WarmUp {
  int calls = 10;
  double ms = 0;
};

// Runs launch(i) for the warm-up (at least one call, which is waited for before the warm-up by
// time starts), then `iters` times with an event pair around each call, and returns the median of
// the timed calls in milliseconds. `launch` enqueues work on `stream` and
// throws on error.
double median_time_ms(const std::function<void(int)>& launch, WarmUp warmup, int iters, cudaStream_t stream);

// The bf16 GEMM rate of cuBLAS on this device, in TFLOP/s: C = A B with n x n x n, bf16 inputs and
// output, fp32 accumulation, random normal data, median of `iters` runs after the warm-up.
double measure_gemm_bf16_tflops(int n, WarmUp warmup, int iters, cudaStream_t stream);

}  // namespace flashhop::bench
