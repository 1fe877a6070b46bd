// V^T for the 8-bit P V of the FP8 forward. wgmma reads both operands of an 8-bit GEMM K-major, so
// O += P V needs V^T (dv, keys) with the keys contiguous, where TMA brings V (keys, dv) with dv
// contiguous. Two warps of the producer warpgroup copy each V stage, transposed, into a stage of a
// second ring (Vt), its keys in the order of P's register columns (fp8_key_of, gmma_utils.h), so
// that P goes from the score accumulator to the A operand without crossing threads.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "kernels/sm90/gmma_utils.h"

namespace flashhop::sm90 {

// prmt (__byte_perm): byte i of the result is byte (selector >> 4 i) & 7 of the eight bytes of
// (low, high), low's first. The host's copy serves the tests.
CUTLASS_HOST_DEVICE std::uint32_t byte_perm(std::uint32_t low, std::uint32_t high, std::uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(low, high, selector);
#else
  std::uint64_t const bytes = (std::uint64_t{high} << 32) | low;
  std::uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= static_cast<std::uint32_t>((bytes >> (8 * ((selector >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return out;
#endif
}

// A 4 x 4 byte transpose: byte j of out[i] is byte i of in[j].
CUTLASS_HOST_DEVICE void transpose_bytes(std::uint32_t const (&in)[4], std::uint32_t (&out)[4]) {
  std::uint32_t const low01 = byte_perm(in[0], in[1], 0x5140);   // in0.0 in1.0 in0.1 in1.1
  std::uint32_t const high01 = byte_perm(in[0], in[1], 0x7362);  // in0.2 in1.2 in0.3 in1.3
  std::uint32_t const low23 = byte_perm(in[2], in[3], 0x5140);
  std::uint32_t const high23 = byte_perm(in[2], in[3], 0x7362);
  out[0] = byte_perm(low01, low23, 0x5410);
  out[1] = byte_perm(low01, low23, 0x7632);
  out[2] = byte_perm(high01, high23, 0x5410);
  out[3] = byte_perm(high01, high23, 0x7632);
}

// kThreads threads (whole warps) transpose a (kKeys, kDims) stage of 8-bit V into its (kDims, kKeys)
// stage of Vt, in tasks of 4 x 4 bytes: four keys (P's columns c .. c + 3) by four columns
// d .. d + 3 of V, read as four 4-byte words (one per key), transposed by byte permutes, written
// as four 4-byte words (one per column). The lanes of a warp split both ways, so that neither side
// piles its words into a few banks: lane bits 0-1 pick d's word in a 16-byte chunk of V's row,
// bits 2-3 the column's word in a 16-byte chunk of Vt's row, bit 4 one of two such chunks. A
// warp's load or store then takes two wavefronts (a store four at 96-key tiles, whose 96-byte Vt
// rows take 32-byte swizzle atoms), where lanes along d alone made each store take 8 to 16 (every
// lane the same column): test_fp8_layout.cu counts them on each recipe's layouts.
template <int kKeys, int kDims, int kThreads>
struct VTransposer {
  static_assert(kKeys % 32 == 0, "P's columns come in blocks of 32 keys");
  static_assert(kDims % 16 == 0 && kThreads % 32 == 0, "d in 16-byte chunks, whole warps");
  static constexpr int kTasks = kKeys / 4 * (kDims / 4);
  static_assert(kTasks % kThreads == 0, "every thread takes as many tasks");

  // Task t's first column of V (d) and of Vt (P's column c): t's bits 0-1 d's word in its chunk,
  // 2-3 c's word in its chunk, 4 c's chunk within a pair, the rest d's chunk and then c's pair.
  static CUTLASS_HOST_DEVICE int d_of(int task) { return 16 * (task / 32 % (kDims / 16)) + 4 * (task % 4); }
  static CUTLASS_HOST_DEVICE int column_of(int task) {
    return 32 * (task / 32 / (kDims / 16)) + 16 * (task / 16 % 2) + 4 * (task / 4 % 4);
  }

  // sV: (kKeys, kDims) and sVt: (kDims, kKeys) of one stage; thread in [0, kThreads).
  template <class TensorV, class TensorVt>
  static CUTLASS_HOST_DEVICE void transpose(TensorV const& sV, TensorVt&& sVt, int thread) {
    // Not unrolled: the producer warps have 40 registers (barriers.h).
    CUTLASS_PRAGMA_NO_UNROLL
    for (int task = thread; task < kTasks; task += kThreads) {
      int const d = d_of(task);
      int const column = column_of(task);
      int const key = fp8_key_of(column);  // columns c .. c + 3 hold keys key + {0, 1, 8, 9}
      std::uint32_t in[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        in[j] = *reinterpret_cast<std::uint32_t const*>(&sV(key + j % 2 + 8 * (j / 2), d));
      }
      std::uint32_t out[4];
      transpose_bytes(in, out);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) *reinterpret_cast<std::uint32_t*>(&sVt(d + i, column)) = out[i];
    }
  }
};

}  // namespace flashhop::sm90
