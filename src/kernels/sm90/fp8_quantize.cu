// The FP8 quantization kernels (fp8_quantize.h). One CTA per tile of kFp8ScaleBlockRows rows of one
// head, four lanes per row: lane l of a row holds vectors j of 8 consecutive elements, elements
// (4 j + l) * 8 .. + 7. A warp's 16-byte loads then read 64 contiguous bytes of each of its 8 rows,
// whole 32-byte sectors, and its 8-byte stores of e4m3 values write 32 contiguous bytes of each row,
// whole sectors too. (A lane holding 16 consecutive elements could store 16 bytes, but its two
// 16-byte loads would each read half sectors; the reads are two thirds of the traffic.)
//
// The rotation. The Walsh-Hadamard transform of a block of b = 2^n elements is n butterfly stages,
// one per bit of an element's index within the block, in any order. In the layout above, index bits
// 0-2 (within a vector) and the bits of j within the block are a lane's own, and bits 3-4 (the
// lane) are two shuffle stages between the row's four lanes: for every head dim the rotation costs
// n - 2 additions per element in registers, two shuffles and two fused multiply-adds.
//
// The passes. Per block: one pass over the tile, which loads it, rotates it, takes its amax (a warp
// max and an exchange through shared memory) and quantizes it from registers. Per tensor and per
// head, a scale covers many tiles: descale is reset to 0, an amax pass merges each tile's amax / 448
// into its group's entry by atomicMax on the bit pattern (non-negative floats order as their bits
// do, and rounding the division by 448 keeps that order, so the entry ends as the group's amax / 448
// with no pass of its own), then the quantize pass loads and rotates the tile again. Those two read
// x twice: 5 bytes moved per 16-bit element where a copy of the counted 3 bytes (2 read, 1 written)
// moves 3, so once x outgrows the L2 cache (50 MB on an H100) they reach at most about 60% of the
// copy bandwidth; below that the second read mostly hits L2.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda/atomic>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cutlass/numeric_types.h>

#include "kernels/sm90/fp8_quantize.h"

namespace flashhop::sm90 {
namespace {

constexpr int kLanesPerRow = 4;
constexpr int kVectorElements = 8;  // 16 bytes of bfloat16 / float16
constexpr int kThreads = kFp8ScaleBlockRows * kLanesPerRow;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullWarp = 0xffffffffu;

enum class Pass {
  kAmax,      // per tensor / per head: merge the tile's amax / 448 into descale
  kQuantize,  // per tensor / per head: quantize the tile with its group's descale
  kBlock,     // per block: amax, descale and quantization of the tile
};

// A lane's share of a row of kHeadDim elements, and its Hadamard block: the largest power of two
// dividing the head dim, kBlockVectors of the lane's vectors.
template <int kHeadDim>
struct RowShare {
  static constexpr int kVectors = kHeadDim / (kLanesPerRow * kVectorElements);
  static constexpr int kBlock = kHeadDim & -kHeadDim;
  static constexpr int kBlockVectors = kBlock / (kLanesPerRow * kVectorElements);
  static_assert(kVectors * kLanesPerRow * kVectorElements == kHeadDim && kBlockVectors >= 1,
                "a row is whole vectors of its four lanes, and a Hadamard block spans the four lanes");
  // 1 / sqrt(kBlock), rounded once: kBlock = 2^n is 2^(n / 2) times sqrt(2) for odd n.
  static constexpr float kInverseSqrtBlock =
      ((__builtin_ctz(kBlock) % 2) ? 0.70710678118654752f : 1.f) / static_cast<float>(1 << (__builtin_ctz(kBlock) / 2));
};

// Registers of a CTA: the rotated tile stays in registers across its amax, kHeadDim / 4 floats a
// thread. Up to head dim 128 two CTAs share an SM, so that one loads while the other computes.
template <int kHeadDim>
constexpr int kMinBlocksPerSm = kHeadDim <= 128 ? 2 : 1;

// Two 16-bit values of x, the low half first, as floats.
template <class Element>
__device__ float2 unpack(std::uint32_t bits) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
  } else {
    return __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)),
                                         __ushort_as_half(static_cast<unsigned short>(bits >> 16))));
  }
}

__device__ void butterfly(float& a, float& b) {
  float const sum = a + b;
  b = a - b;
  a = sum;
}

// The unnormalised Walsh-Hadamard transform of each block of the row (file comment): the stages
// within a vector, across the lane's vectors of one block, and across the row's four lanes.
template <int kHeadDim>
__device__ void hadamard(float (&v)[RowShare<kHeadDim>::kVectors][kVectorElements], int lane) {
  using Share = RowShare<kHeadDim>;
#pragma unroll
  for (int h = 1; h < kVectorElements; h *= 2) {
#pragma unroll
    for (int j = 0; j < Share::kVectors; ++j) {
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k) {
        if ((k & h) == 0) butterfly(v[j][k], v[j][k + h]);
      }
    }
  }
#pragma unroll
  for (int h = 1; h < Share::kBlockVectors; h *= 2) {
#pragma unroll
    for (int j = 0; j < Share::kVectors; ++j) {
      if ((j & h) != 0) continue;
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k) butterfly(v[j][k], v[j + h][k]);
    }
  }
#pragma unroll
  for (int h = 1; h < kLanesPerRow; h *= 2) {
    // The lane with bit h clear holds the pair's first element: a + b there, a - b in its partner.
    float const sign = (lane & h) != 0 ? -1.f : 1.f;
#pragma unroll
    for (int j = 0; j < Share::kVectors; ++j) {
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k) {
        float const other = __shfl_xor_sync(kFullWarp, v[j][k], h);
        v[j][k] = fmaf(v[j][k], sign, other);
      }
    }
  }
}

// The largest value of `value` over the CTA; every thread calls it and gets the result.
__device__ float cta_max(float value, float (&warp_max)[kWarps]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(kFullWarp, value, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = value;
  __syncthreads();
  value = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) value = fmaxf(value, warp_max[w]);
  return value;
}

template <class Element, int kHeadDim, bool kRotate, Pass kPass>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<kHeadDim>) quantize_kernel(Fp8QuantizeParams const p) {
  using Share = RowShare<kHeadDim>;
  // Per pair of elements, the XOR of their sign bits that applies hadamard_signs to x's 16-bit values.
  __shared__ alignas(16) std::uint32_t sign_masks[kRotate ? kHeadDim / 2 : 1];
  __shared__ float warp_max[kWarps];
  __shared__ float group_descale;

  // Heads vary fastest, so that neighbouring CTAs read neighbouring heads of the same rows. The
  // quantize pass walks the tiles in reverse: it starts on those the amax pass read last, which L2
  // still holds. Rows in 64 bits: the last tile's reach past a seqlen close to 2^31.
  auto const blocks = static_cast<unsigned>((std::int64_t{p.seqlen} + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows);
  unsigned const tile = kPass == Pass::kQuantize ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  int const head = static_cast<int>(tile % p.nheads);
  int const block = static_cast<int>(tile / p.nheads % blocks);
  int const batch = static_cast<int>(tile / p.nheads / blocks);
  int const lane = static_cast<int>(threadIdx.x % kLanesPerRow);
  std::int64_t const row = std::int64_t{block} * kFp8ScaleBlockRows + threadIdx.x / kLanesPerRow;
  bool const in_rows = row < p.seqlen;
  std::int64_t const descale_index = batch * p.descale_batch_stride + head / p.heads_per_group * p.descale_group_stride +
                                     block * p.descale_block_stride;

  // The row's loads go out first; rows past seqlen read as zeros, which change no amax.
  auto const* x_row = static_cast<Element const*>(p.x) + batch * p.x_batch_stride + row * p.x_row_stride +
                      head * p.x_head_stride;
  uint4 raw[Share::kVectors];
#pragma unroll
  for (int j = 0; j < Share::kVectors; ++j) {
    raw[j] = in_rows ? __ldg(reinterpret_cast<uint4 const*>(x_row + (j * kLanesPerRow + lane) * kVectorElements))
                     : make_uint4(0, 0, 0, 0);
  }

  if constexpr (kRotate) {
    if (threadIdx.x < kHeadDim / 2) {
      float const first = __ldg(p.hadamard_signs + 2 * threadIdx.x);
      float const second = __ldg(p.hadamard_signs + 2 * threadIdx.x + 1);
      sign_masks[threadIdx.x] = (first >= 0.f ? 0u : 0x8000u) | (second >= 0.f ? 0u : 0x80000000u);
    }
  }
  if constexpr (kPass == Pass::kQuantize) {
    if (threadIdx.x == 0) {
      // A group of zeros has amax 0: its descale becomes 1. Each of its CTAs stores the same 1
      // while the others may still read the 0; either value quantizes zeros to 0, and the relaxed
      // atomics keep the accesses well defined.
      cuda::atomic_ref<float, cuda::thread_scope_device> entry(p.descale[descale_index]);
      float descale = entry.load(cuda::memory_order_relaxed);
      if (descale == 0.f) {
        descale = 1.f;
        entry.store(descale, cuda::memory_order_relaxed);
      }
      group_descale = descale;
    }
  }
  if constexpr (kRotate || kPass == Pass::kQuantize) __syncthreads();

  // (kVectors, 8): the lane's elements of its row, s * x, then rotated.
  float v[Share::kVectors][kVectorElements];
#pragma unroll
  for (int j = 0; j < Share::kVectors; ++j) {
    std::uint32_t words[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
    if constexpr (kRotate) {
      uint4 const masks = reinterpret_cast<uint4 const*>(sign_masks)[j * kLanesPerRow + lane];
      words[0] ^= masks.x;
      words[1] ^= masks.y;
      words[2] ^= masks.z;
      words[3] ^= masks.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 const pair = unpack<Element>(words[i]);
      v[j][2 * i] = pair.x;
      v[j][2 * i + 1] = pair.y;
    }
  }
  if constexpr (kRotate) hadamard<kHeadDim>(v, lane);
  // y = v * normalisation: the rotation's 1 / sqrt(b) is applied with the scale.
  constexpr float kNormalisation = kRotate ? Share::kInverseSqrtBlock : 1.f;

  float descale;
  if constexpr (kPass == Pass::kQuantize) {
    descale = group_descale;
  } else {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < Share::kVectors; ++j) {
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k) amax = fmaxf(amax, fabsf(v[j][k]));
    }
    descale = cta_max(amax, warp_max) * kNormalisation / kFp8E4m3Max;
    if constexpr (kPass == Pass::kAmax) {
      if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(p.descale + descale_index), __float_as_int(descale));
      return;
    } else {
      if (descale == 0.f) descale = 1.f;
      if (threadIdx.x == 0) p.descale[descale_index] = descale;
    }
  }

  if (!in_rows) return;
  float const scale = kNormalisation / descale;
  auto* out_row = static_cast<std::uint8_t*>(p.out) + batch * p.out_batch_stride + row * p.out_row_stride +
                  head * p.out_head_stride;
#pragma unroll
  for (int j = 0; j < Share::kVectors; ++j) {
    std::uint32_t words[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float const* q = &v[j][4 * i];
      std::uint32_t const low =
          __nv_cvt_float2_to_fp8x2(make_float2(q[0] * scale, q[1] * scale), __NV_SATFINITE, __NV_E4M3);
      std::uint32_t const high =
          __nv_cvt_float2_to_fp8x2(make_float2(q[2] * scale, q[3] * scale), __NV_SATFINITE, __NV_E4M3);
      words[i] = low | high << 16;
    }
    __stcs(reinterpret_cast<uint2*>(out_row + (j * kLanesPerRow + lane) * kVectorElements),
           make_uint2(words[0], words[1]));
  }
}

// Sets the scale_batches x scale_groups entries of descale to `value`.
__global__ void fill_descale_kernel(Fp8QuantizeParams const p, float value) {
  std::int64_t const entries = std::int64_t{p.scale_batches} * p.scale_groups;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < entries;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    p.descale[i / p.scale_groups * p.descale_batch_stride + i % p.scale_groups * p.descale_group_stride] = value;
  }
}

template <class Element, int kHeadDim, bool kRotate>
void launch_passes(Fp8QuantizeParams const& p, std::int64_t tiles, cudaStream_t stream) {
  auto const grid = static_cast<unsigned>(tiles);
  if (p.scaling == Fp8Scaling::kPerBlock) {
    if (tiles > 0) quantize_kernel<Element, kHeadDim, kRotate, Pass::kBlock><<<grid, kThreads, 0, stream>>>(p);
    return;
  }
  // Without elements every group's amax is 0, and its descale 1.
  constexpr int kFillThreads = 256;
  std::int64_t const entries = std::int64_t{p.scale_batches} * p.scale_groups;
  auto const fill_blocks = static_cast<unsigned>(std::min<std::int64_t>((entries + kFillThreads - 1) / kFillThreads, 1024));
  if (fill_blocks > 0) fill_descale_kernel<<<fill_blocks, kFillThreads, 0, stream>>>(p, tiles > 0 ? 0.f : 1.f);
  if (tiles == 0) return;
  quantize_kernel<Element, kHeadDim, kRotate, Pass::kAmax><<<grid, kThreads, 0, stream>>>(p);
  quantize_kernel<Element, kHeadDim, kRotate, Pass::kQuantize><<<grid, kThreads, 0, stream>>>(p);
}

template <class Element, int kHeadDim>
void launch_head_dim(Fp8QuantizeParams const& p, std::int64_t tiles, cudaStream_t stream) {
  if (p.hadamard_signs != nullptr) {
    launch_passes<Element, kHeadDim, true>(p, tiles, stream);
  } else {
    launch_passes<Element, kHeadDim, false>(p, tiles, stream);
  }
}

}  // namespace

// The head dim (kFp8QuantizeHeadDims) and the rotation become template arguments here; the dtype in
// dispatch.cu.
template <class Element>
Status launch_quantize_fp8(Fp8QuantizeParams const& p, cudaStream_t stream) {
  std::int64_t const blocks = (std::int64_t{p.seqlen} + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows;
  std::int64_t const tiles = std::int64_t{p.batch} * p.nheads * blocks;
  switch (p.head_dim) {
    case 64:
      launch_head_dim<Element, 64>(p, tiles, stream);
      break;
    case 96:
      launch_head_dim<Element, 96>(p, tiles, stream);
      break;
    case 128:
      launch_head_dim<Element, 128>(p, tiles, stream);
      break;
    case 192:
      launch_head_dim<Element, 192>(p, tiles, stream);
      break;
    case 256:
      launch_head_dim<Element, 256>(p, tiles, stream);
      break;
    default:
      return {StatusCode::kNotSupported,
              "x.shape[3] (head_dim) = " + std::to_string(p.head_dim) + ": no quantization kernel of this head dim"};
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("quantize_fp8 kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

template Status launch_quantize_fp8<cutlass::bfloat16_t>(Fp8QuantizeParams const&, cudaStream_t);
template Status launch_quantize_fp8<cutlass::half_t>(Fp8QuantizeParams const&, cudaStream_t);

}  // namespace flashhop::sm90
