/// @file named_barrier.cuh
/// @brief Step 22's turn-taking: named barriers, which let some warps of a block wait for others
/// without stopping the whole block. Each function is one PTX instruction.
///
/// A block has 16 hardware barriers; __syncthreads() is barrier 0 with every thread counted. bar.sync
/// and bar.arrive name another barrier and how many threads its phase counts (a multiple of 32).
/// bar.sync counts the caller and waits for the phase to complete; bar.arrive counts it and goes on.
/// So one warpgroup can arrive ("your turn") while another waits ("is it my turn?").
#pragma once

namespace fa::hopper {

/// Counts this thread on named barrier `id` and waits until `threads` threads have reached it.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Counts this thread on named barrier `id` (of `threads` threads) and goes on without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace fa::hopper
