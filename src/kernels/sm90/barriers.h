// Warp roles, named-barrier ids and register budgets of the sm90 forward kernel.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/sm90/fwd_recipe.h"

namespace flashhop::sm90 {

inline constexpr int kThreadsPerWarpGroup = 128;
inline constexpr int kMaxConsumerWarpGroups = 3;  // the named-barrier ids below are laid out for this many

// Warpgroup 0 is the producer (TMA issue); warpgroups 1 .. kConsumers each own 64 query rows.
// setmaxnreg budgets: the producer only computes addresses; the consumers hold S, P and O.
// Two consumers: 128 x (24 + 2 x 240) = 64512 of the SM's 65536 registers;
// three: 128 x (24 + 3 x 160), as many. One consumer (d = 64's packed GQA rows: the recipe table):
// two CTAs per SM, each 128 x (24 + 232) = 32768, half the SM's registers. Where producer warps
// transpose V (kTransposeV, the FP8 forward: fp8_transpose.h), the producer keeps 40 (four
// ldmatrix results in flight) and two consumers 232: 128 x (40 + 2 x 232) = 64512; with three
// consumers 32 and 160: 128 x (32 + 3 x 160) = 65536.
template <int kConsumers_, bool kTransposeV = false>
struct WarpGroups {
  static constexpr int kConsumers = kConsumers_;
  static_assert(kConsumers >= 1 && kConsumers <= kMaxConsumerWarpGroups, "one to three consumer warpgroups");
  static_assert(!kTransposeV || kConsumers >= 2, "V transposed for two or three consumer warpgroups");
  static constexpr int kConsumerThreads = kConsumers * kThreadsPerWarpGroup;
  static constexpr int kThreads = (1 + kConsumers) * kThreadsPerWarpGroup;
  static constexpr int kCtasPerSm = ctas_per_sm(kConsumers);
  static constexpr int kProducerRegisters = kTransposeV ? (kConsumers == 2 ? 40 : 32) : 24;
  static constexpr int kConsumerRegisters =
      kTransposeV && kConsumers == 2 ? 232 : kConsumers == 1 ? 232 : kConsumers == 2 ? 240 : 160;
  // The producer warps that transpose V: warps 2 and 3 (warp 0 issues TMA, warp 1 gathers packed Q).
  static constexpr int kFirstTransposeWarp = 2;
  static constexpr int kTransposeThreads = kTransposeV ? 64 : 0;
  static_assert(kThreadsPerWarpGroup * (kProducerRegisters + kConsumers * kConsumerRegisters) * kCtasPerSm <= 65536);
};

// Named barriers (ids above CUTLASS's reserved ones, offset by cutlass::arch::NamedBarrier): per
// consumer warpgroup c, one around its epilogue's use of its rows of the O buffer and their store,
// one that lets it issue its next GEMMs (MmaScheduler), and one that lets it write an O buffer
// that the warpgroups take in turn (OBufferTurns).
CUTLASS_DEVICE unsigned epilogue_barrier(int consumer) { return static_cast<unsigned>(consumer); }
CUTLASS_DEVICE unsigned mma_turn_barrier(int consumer) {
  return static_cast<unsigned>(kMaxConsumerWarpGroups + consumer);
}
CUTLASS_DEVICE unsigned o_turn_barrier(int consumer) {
  return static_cast<unsigned>(2 * kMaxConsumerWarpGroups + consumer);
}
static_assert(cutlass::arch::NamedBarrier::ReservedNamedBarrierCount + 2 * kMaxConsumerWarpGroups + 2 <=
                  cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
              "more named barriers than the hardware has");

// Synchronises the 128 threads of consumer warpgroup `consumer` in its epilogue.
CUTLASS_DEVICE void sync_epilogue(int consumer) {
  cutlass::arch::NamedBarrier::sync(kThreadsPerWarpGroup, epilogue_barrier(consumer));
}

// Orders the consumer warpgroups' GEMM issue round robin (ping-pong with two): while one warpgroup
// runs its softmax, the others' GEMMs hold the tensor cores. Consumer c waits on its own barrier
// before issuing and, once issued, lets consumer c + 1 (mod kConsumers) go. Each barrier counts two
// warpgroups (the previous one arrives, the owner syncs). kEnabled = false turns every call into
// nothing (the consumers then issue independently).
template <bool kEnabled, int kConsumers>
struct MmaScheduler {
  static constexpr unsigned kThreads = 2 * kThreadsPerWarpGroup;

  // Consumer 0 goes first: its barrier starts with one arrival.
  static CUTLASS_DEVICE void init(int consumer) {
    if (kEnabled && consumer == 0) cutlass::arch::NamedBarrier::arrive(kThreads, mma_turn_barrier(0));
  }
  static CUTLASS_DEVICE void wait_turn(int consumer) {
    if (kEnabled) cutlass::arch::NamedBarrier::sync(kThreads, mma_turn_barrier(consumer));
  }
  static CUTLASS_DEVICE void pass_turn(int consumer) {
    if (kEnabled) {
      cutlass::arch::NamedBarrier::arrive(kThreads, mma_turn_barrier(consumer == kConsumers - 1 ? 0 : consumer + 1));
    }
  }
  // Every consumer takes as many turns as the others; consumer 0 takes the turn the last consumer
  // passed last (or init's), so no barrier is left half-arrived.
  static CUTLASS_DEVICE void finish(int consumer) {
    if (consumer == 0) wait_turn(0);
  }
};

// Hands one O buffer between the two consumer warpgroups (epilogue.h, ForwardEpilogue::kTakeTurns):
// warpgroup c waits on its own barrier before it writes the buffer, and warp 0 of the other
// arrives there once that one's TMA store has read it. Each barrier counts the 128 waiting threads
// and the 32 arriving ones. Per tile each warpgroup writes once, warpgroup 0 first.
struct OBufferTurns {
  static constexpr unsigned kThreads = kThreadsPerWarpGroup + 32;

  // By warp 0 of consumer 0: its first wait finds the buffer free.
  static CUTLASS_DEVICE void init() { cutlass::arch::NamedBarrier::arrive(kThreads, o_turn_barrier(0)); }
  static CUTLASS_DEVICE void wait(int consumer) {
    cutlass::arch::NamedBarrier::sync(kThreads, o_turn_barrier(consumer));
  }
  // By a whole warp (warp 0 of the warpgroup), after its TMA store has read the buffer.
  static CUTLASS_DEVICE void pass(int consumer) {
    cutlass::arch::NamedBarrier::arrive(kThreads, o_turn_barrier(1 - consumer));
  }
  // Consumer 0 takes the last pass of consumer 1, so that no barrier is left half-arrived.
  static CUTLASS_DEVICE void finish(int consumer) {
    if (consumer == 0) wait(0);
  }
};

}  // namespace flashhop::sm90
