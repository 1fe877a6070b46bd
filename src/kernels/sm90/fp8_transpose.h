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
// LayoutV (kKeys, kDims, stage) and LayoutVt (kDims, kKeys, stage) are the rings' swizzled layouts.
template <int kKeys, int kDims, int kThreads, class LayoutV, class LayoutVt>
struct VTransposer {
  static_assert(kKeys % 32 == 0, "P's columns come in blocks of 32 keys");
  static_assert(kDims % 16 == 0 && kThreads % 32 == 0, "d in 16-byte chunks, whole warps");
  static constexpr int kTasks = kKeys / 4 * (kDims / 4);
  static_assert(kTasks % kThreads == 0, "every thread takes as many tasks");
  static constexpr int kRounds = kTasks / kThreads;
  // A thread's tasks differ by rounds of kThreads tasks, which move d and the column by multiples
  // of 32 only: below the swizzles' 1024-byte period such a move sets offset bits that the
  // thread's own offsets leave clear and that no swizzle reads (it XORs in), above it whole atoms
  // (it adds). So each access costs one LOP3 on offsets computed once (see `moved`).
  static_assert(kThreads == 64, "the thread's own bits of d and of the column stay below 32");
  // Bytes per stage of either ring (test_fp8_layout.cu checks every stage's layout against them).
  static constexpr int kStageBytes = kKeys * kDims;
  static_assert(kStageBytes % 1024 == 0, "stages of whole swizzle periods");

  // Task t's first column of V (d) and of Vt (P's column c): t's bits 0-1 d's word in its chunk,
  // 2-3 c's word in its chunk, 4 c's chunk within a pair, the rest d's chunk and then c's pair.
  static CUTLASS_HOST_DEVICE int d_of(int task) {
    unsigned const t = task;
    return 16 * (t / 32 % (kDims / 16)) + 4 * (t % 4);
  }
  static CUTLASS_HOST_DEVICE int column_of(int task) {
    unsigned const t = task;
    return 32 * (t / 32 / (kDims / 16)) + 16 * (t / 16 % 2) + 4 * (t / 4 % 4);
  }

  // Byte offsets, swizzle included, of V's (key, d) and Vt's (d, column) in the rings' stage 0.
  static CUTLASS_HOST_DEVICE std::uint32_t v_offset(int key, int d) {
    return cute::get_swizzle_portion(LayoutV{})(cute::get_nonswizzle_portion(LayoutV{})(key, d, 0));
  }
  static CUTLASS_HOST_DEVICE std::uint32_t vt_offset(int d, int column) {
    return cute::get_swizzle_portion(LayoutVt{})(cute::get_nonswizzle_portion(LayoutVt{})(d, column, 0));
  }

  // The offsets of a task's four loads (columns c .. c + 3 hold keys key + {0, 1, 8, 9}) and four
  // stores (rows d .. d + 3 of Vt).
  struct TaskOffsets {
    std::uint32_t load[4];
    std::uint32_t store[4];
  };
  static CUTLASS_HOST_DEVICE TaskOffsets offsets_of(int task) {
    int const d = d_of(task), column = column_of(task), key = fp8_key_of(column);
    TaskOffsets offsets;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) offsets.load[j] = v_offset(key + j % 2 + 8 * (j / 2), d);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) offsets.store[i] = vt_offset(d + i, column);
    return offsets;
  }
  // The offset of the same access `rounds` rounds on: `round_part` is thread 0's offset there.
  static CUTLASS_HOST_DEVICE std::uint32_t moved(std::uint32_t mine, std::uint32_t round_part) {
    return (mine ^ (round_part & 1023u)) + (round_part & ~1023u);
  }

  // v and vt: the stages' first bytes; mine: offsets_of(thread), thread in [0, kThreads).
  static CUTLASS_HOST_DEVICE void transpose(std::uint8_t const* v, std::uint8_t* vt, TaskOffsets mine) {
#if defined(__CUDA_ARCH__)
    // Opaque to the compiler in each call: else it hoists every round's offsets (kRounds x 8) out
    // of the caller's loop over stages and spills them, the producer warps having 40 registers.
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(mine.load[j]), "+r"(mine.store[j]));
#endif
    CUTLASS_PRAGMA_UNROLL
    for (int round = 0; round < kRounds; ++round) {
      int const first = round * kThreads;  // thread 0's task: only the round's part of d and c
      std::uint32_t const v_round = v_offset(fp8_key_of(column_of(first)), d_of(first));
      std::uint32_t const vt_round = vt_offset(d_of(first), column_of(first));
      std::uint32_t in[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) in[j] = *reinterpret_cast<std::uint32_t const*>(v + moved(mine.load[j], v_round));
      std::uint32_t out[4];
      transpose_bytes(in, out);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) *reinterpret_cast<std::uint32_t*>(vt + moved(mine.store[i], vt_round)) = out[i];
    }
  }
};

}  // namespace flashhop::sm90
