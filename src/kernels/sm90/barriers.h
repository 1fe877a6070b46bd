// Warp roles, named-barrier ids and register budgets of the sm90 forward kernel.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace flashhop::sm90 {

inline constexpr int kThreadsPerWarpGroup = 128;

// One producer warpgroup issues TMA; two consumer warpgroups each own 64 query rows.
enum class WarpGroupRole { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };
inline constexpr int kConsumerWarpGroups = 2;
inline constexpr int kConsumerThreads = kConsumerWarpGroups * kThreadsPerWarpGroup;
inline constexpr int kForwardThreads = (1 + kConsumerWarpGroups) * kThreadsPerWarpGroup;

// setmaxnreg budgets: the producer only computes addresses; the consumers hold S, P and O.
// 128 x (24 + 2 x 240) = 64512 <= 65536 registers of the SM.
inline constexpr int kProducerRegisters = 24;
inline constexpr int kConsumerRegisters = 240;
static_assert(kThreadsPerWarpGroup * (kProducerRegisters + kConsumerWarpGroups * kConsumerRegisters) <=
              65536);

// Named barriers (ids above CUTLASS's reserved ones, offset by cutlass::arch::NamedBarrier).
enum class ForwardBarrier : unsigned {
  kEpilogueConsumer0 = 0,    // consumer 0's epilogue steps around its rows of the O buffer and their store
  kMmaScheduleConsumer0 = 1, // consumer 0 may issue its next GEMMs
  kMmaScheduleConsumer1 = 2, // consumer 1 may issue its next GEMMs
  kEpilogueConsumer1 = 3,    // as kEpilogueConsumer0, for consumer 1
};

// Synchronises the 128 threads of consumer warpgroup `consumer` in its epilogue.
CUTLASS_DEVICE void sync_epilogue(int consumer) {
  ForwardBarrier const id = consumer == 0 ? ForwardBarrier::kEpilogueConsumer0 : ForwardBarrier::kEpilogueConsumer1;
  cutlass::arch::NamedBarrier::sync(kThreadsPerWarpGroup, static_cast<unsigned>(id));
}

// Orders the two consumer warpgroups' GEMM issue (ping-pong): while one warpgroup runs its softmax,
// the other's GEMMs hold the tensor cores. Consumer c waits on its own barrier before issuing and,
// once issued, lets the other one go. Each barrier counts both warpgroups (one arrives, one syncs).
// kEnabled = false turns every call into nothing (the consumers then issue independently).
template <bool kEnabled>
struct MmaScheduler {
  static constexpr unsigned kThreads = 2 * kThreadsPerWarpGroup;

  static CUTLASS_DEVICE unsigned barrier_of(int consumer) {
    return static_cast<unsigned>(ForwardBarrier::kMmaScheduleConsumer0) + consumer;
  }
  // Consumer 0 goes first: its barrier starts with one arrival.
  static CUTLASS_DEVICE void init(int consumer) {
    if (kEnabled && consumer == 0) cutlass::arch::NamedBarrier::arrive(kThreads, barrier_of(0));
  }
  static CUTLASS_DEVICE void wait_turn(int consumer) {
    if (kEnabled) cutlass::arch::NamedBarrier::sync(kThreads, barrier_of(consumer));
  }
  static CUTLASS_DEVICE void pass_turn(int consumer) {
    if (kEnabled) cutlass::arch::NamedBarrier::arrive(kThreads, barrier_of(1 - consumer));
  }
  // Consumer 0 takes the turn consumer 1 passed last (or init's), so no barrier is left half-arrived.
  static CUTLASS_DEVICE void finish(int consumer) {
    if (consumer == 0) wait_turn(0);
  }
};

}  // namespace flashhop::sm90
