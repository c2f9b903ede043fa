/// @file named_barrier.cuh
/// @brief Step 23's turn-taking: named barriers, which let some warps of a block wait for others
/// without stopping the whole block. Each function is one PTX instruction.
///
/// A block has 16 hardware barriers; __syncthreads() is barrier 0 with every thread counted. bar.sync
/// and bar.arrive name another barrier and how many threads its phase counts (a multiple of 32).
/// bar.sync counts the caller and waits for the phase to complete; bar.arrive counts it and goes on.
/// So one warpgroup can arrive ("your turn") while another waits ("is it my turn?").
#pragma once

#include "fa/lag.cuh"  // FA_LAG: nothing, except in the mutation suite's lag builds

namespace fa::hopper {

/// Counts this thread on named barrier kId and waits until kThreads threads have reached it. The id
/// and the count are immediates in the instruction, so ptxas knows which barriers the kernel uses (with
/// an id in a register it must assume all 16).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "barriers 1..15 (0 is __syncthreads'), whole warps");
  FA_LAG(FA_LAG_BEFORE_ARRIVE | FA_LAG_BEFORE_WAIT);
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
  FA_LAG(FA_LAG_AFTER_WAIT);
}

/// Counts this thread on named barrier kId (of kThreads threads) and goes on without waiting.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "barriers 1..15 (0 is __syncthreads'), whole warps");
  FA_LAG(FA_LAG_BEFORE_ARRIVE);
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}

}  // namespace fa::hopper
