/// @file roles.cuh
/// @brief Step 21's two instructions for splitting a block into a producer and consumers: a plain
/// mbarrier arrive (a consumer says "I am done with this stage") and setmaxnreg (a warpgroup gives
/// registers back, or takes them). Each function is one PTX instruction.
///
/// Step 20's tma.cuh has the rest of the mbarrier protocol: init, arrive with expect_tx, wait on a
/// phase's parity. Here a barrier also counts consumer threads: an "empty" barrier initialized for
/// 256 arrivals completes its phase when all 256 consumer threads have arrived.
#pragma once

#include <cstdint>

namespace fa::hopper {

/// Arrives on the mbarrier at `bar` (one of the arrivals its phase waits for), without bytes.
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/// Lowers this warpgroup's registers per thread to kRegisters (a multiple of 8, 24 to 256): the freed
/// registers go back to the SM's pool, for another warpgroup's setmaxnreg_inc. All 128 threads of the
/// warpgroup execute it together.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, by 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters) : "memory");
}

/// Raises this warpgroup's registers per thread to kRegisters, waiting until the pool has them.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, by 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters) : "memory");
}

}  // namespace fa::hopper
