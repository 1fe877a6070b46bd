// V^T for the 8-bit P V of the FP8 forward. wgmma reads both operands of an 8-bit GEMM K-major, so
// O += P V needs V^T (dv, keys) with the keys contiguous, where TMA brings V (keys, dv) with dv
// contiguous. Two warps of the producer warpgroup copy each V stage, transposed, into a stage of a
// second ring (Vt), its keys in the order of P's register columns (fp8_key_of, gmma_utils.h), so
// that P goes from the score accumulator to the A operand without crossing threads.
#pragma once

#include <cstdint>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>
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

// kThreads threads (two warps) transpose a (kKeys, kDims) stage of 8-bit V into its (kDims, kKeys)
// stage of Vt, a warp a block of 16 keys by 32 columns d at a time. One ldmatrix.x4.trans reads the
// block as four 8 x 8 matrices of 16-bit pairs of d (keys k .. k + 7, then k + 8 .. k + 15, by d ..
// d + 15, then d + 16 .. d + 31) and hands lane (q, m) = (lane / 4, lane % 4) of each the bytes of
// keys k + 2m and k + 2m + 1 (+ 8) at columns d + 2q and d + 2q + 1 (+ 16). Two byte permutes per
// pair of registers (`words`) make the 4-byte words of Vt's rows d + 2q and d + 2q + 1 at P's
// columns k + 4m .. k + 4m + 3 (keys k + 2m + {0, 1, 8, 9}: fp8_key_of), and one stmatrix.x4
// writes them, each of its matrices eight rows of Vt. Lanes q >= 4 hand their odd row to the
// matrix that takes the even rows of lanes q < 4, and the reverse, so that each matrix's rows
// differ in their three low bits, which the swizzles XOR into the 16-byte chunk: neither side has
// bank conflicts (test_fp8_layout.cu counts the wavefronts on each recipe's layouts).
// LayoutV (kKeys, kDims, stage) and LayoutVt (kDims, kKeys, stage) are the rings' swizzled layouts.
template <int kKeys, int kDims, int kThreads, class LayoutV, class LayoutVt>
struct VTransposer {
  static_assert(kKeys % 32 == 0, "P's columns come in blocks of 32 keys");
  static_assert(kDims % 32 == 0, "d in blocks of 32");
  // Warp w takes blocks w, w + 2, ... (keys first): a round moves the keys by multiples of 32 and d
  // by multiples of 32, bits that a lane's own offsets (keys 0 .. 31, d 0 .. 31) leave clear: below
  // the swizzles' 1024-byte period the move XORs in, above it whole atoms add (`moved`).
  static_assert(kThreads == 64, "two warps");
  static constexpr int kKeyBlocks = kKeys / 16;
  static constexpr int kBlocks = kKeyBlocks * (kDims / 32);
  static constexpr int kRounds = kBlocks / 2;
  // Bytes per stage of either ring (test_fp8_layout.cu checks every stage's layout against them).
  static constexpr int kStageBytes = kKeys * kDims;
  static_assert(kStageBytes % 1024 == 0, "stages of whole swizzle periods");

  // Block b's first key and first column d.
  static CUTLASS_HOST_DEVICE int key_of_block(int block) { return 16 * (block % kKeyBlocks); }
  static CUTLASS_HOST_DEVICE int d_of_block(int block) { return 32 * (block / kKeyBlocks); }
  // The row lane l addresses in ldmatrix (row l % 8 of matrix l / 8) within its block: a key and d.
  static CUTLASS_HOST_DEVICE int load_key(int lane) { return 8 * (lane / 8 % 2) + lane % 8; }
  static CUTLASS_HOST_DEVICE int load_d(int lane) { return 16 * (lane / 16); }
  // The row lane l addresses in stmatrix (row j = l % 8 of matrix i = l / 8): Vt's row (a d) within
  // the block; lane j's (q = j) odd row in the even matrices where j >= 4.
  static CUTLASS_HOST_DEVICE bool odd_row_first(int q) { return q >= 4; }
  static CUTLASS_HOST_DEVICE int store_d(int lane) {
    int const i = lane / 8, j = lane % 8;
    return 16 * (i / 2) + 2 * j + ((i % 2 == 1) != odd_row_first(j) ? 1 : 0);
  }

  // Byte offsets, swizzle included, of V's (key, d) and Vt's (d, column) in the rings' stage 0.
  static CUTLASS_HOST_DEVICE std::uint32_t v_offset(int key, int d) {
    return cute::get_swizzle_portion(LayoutV{})(cute::get_nonswizzle_portion(LayoutV{})(key, d, 0));
  }
  static CUTLASS_HOST_DEVICE std::uint32_t vt_offset(int d, int column) {
    return cute::get_swizzle_portion(LayoutVt{})(cute::get_nonswizzle_portion(LayoutVt{})(d, column, 0));
  }

  // A thread's row addresses in its warp's first block, and the byte permutes that make its words
  // for stmatrix's even and odd matrices (selectors of prmt: bytes 0, 2, 4, 6 make the even row's
  // word, 1, 3, 5, 7 the odd row's).
  struct LaneOffsets {
    std::uint32_t load;
    std::uint32_t store;
    std::uint32_t select[2];
  };
  static CUTLASS_HOST_DEVICE LaneOffsets offsets_of(int thread) {
    int const warp = thread / 32, lane = thread % 32;
    int const key = key_of_block(warp), d = d_of_block(warp);
    bool const swap = odd_row_first(lane / 4);
    return {v_offset(key + load_key(lane), d + load_d(lane)), vt_offset(d + store_d(lane), key),
            {swap ? 0x7531u : 0x6420u, swap ? 0x6420u : 0x7531u}};
  }
  // ldmatrix's four registers (keys k / k + 8 at d, then at d + 16) -> stmatrix's four words.
  static CUTLASS_HOST_DEVICE void words(std::uint32_t const (&in)[4], std::uint32_t const (&select)[2],
                                        std::uint32_t (&out)[4]) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) out[i] = byte_perm(in[i / 2 * 2], in[i / 2 * 2 + 1], select[i % 2]);
  }
  // The offset of the same access `rounds` rounds on: `round_part` is lane 0's offset there.
  static CUTLASS_HOST_DEVICE std::uint32_t moved(std::uint32_t mine, std::uint32_t round_part) {
    return (mine ^ (round_part & 1023u)) + (round_part & ~1023u);
  }
  // Round r's part of V's and Vt's offsets: those of block 2r's first byte.
  static CUTLASS_HOST_DEVICE std::uint32_t v_round(int round) {
    return v_offset(key_of_block(2 * round), d_of_block(2 * round));
  }
  static CUTLASS_HOST_DEVICE std::uint32_t vt_round(int round) {
    return vt_offset(d_of_block(2 * round), key_of_block(2 * round));
  }

  // Rounds per batch: ldmatrix and stmatrix keep their order (volatile asm), so a batch's loads go
  // out together and its stores wait out one load's latency, not one each.
  static constexpr int kBatch = kRounds % 4 == 0 ? 4 : kRounds % 2 == 0 ? 2 : 1;

  // v and vt: the stages' first bytes; mine: offsets_of(thread), thread in [0, kThreads). Every
  // lane of both warps calls it (ldmatrix and stmatrix are warp-wide).
  static CUTLASS_DEVICE void transpose(std::uint8_t const* v, std::uint8_t* vt, LaneOffsets mine) {
    // Opaque to the compiler in each call: else it hoists every round's offsets out of the
    // caller's loop over stages and spills them, the producer warps having 32 or 40 registers.
    asm volatile("" : "+r"(mine.load), "+r"(mine.store));
    CUTLASS_PRAGMA_UNROLL
    for (int first = 0; first < kRounds; first += kBatch) {
      std::uint32_t in[kBatch][4];
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        cute::SM75_U16x8_LDSM_T::copy(
            *reinterpret_cast<cute::uint128_t const*>(v + moved(mine.load, v_round(first + b))),
            in[b][0], in[b][1], in[b][2], in[b][3]);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        std::uint32_t out[4];
        words(in[b], mine.select, out);
        cute::SM90_U32x4_STSM_N::copy(out[0], out[1], out[2], out[3],
                                      *reinterpret_cast<cute::uint128_t*>(vt + moved(mine.store, vt_round(first + b))));
      }
    }
  }
};

}  // namespace flashhop::sm90
