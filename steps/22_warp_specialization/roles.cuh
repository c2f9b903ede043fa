/// @file roles.cuh
/// @brief Step 22's two instructions for splitting a block into a producer and consumers: a plain
/// mbarrier arrive (a consumer says "I am done with this stage") and setmaxnreg (a warpgroup gives
/// registers back, or takes them). Each function is one PTX instruction.
///
/// Step 21's tma.cuh has the rest of the mbarrier protocol: init, arrive with expect_tx, wait on a
/// phase's parity. Here a barrier also counts consumer threads: an "empty" barrier initialized for
/// 256 arrivals completes its phase when all 256 consumer threads have arrived.
#pragma once

#include "fa/lag.cuh"  // FA_LAG: nothing, except in the mutation suite's lag builds

#include <cstdint>

namespace fa::hopper {

/// Arrives on the mbarrier at `bar` (one of the arrivals its phase waits for), without bytes.
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
  FA_LAG(FA_LAG_BEFORE_ARRIVE);
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/// The registers per thread a block of kThreads threads starts with when it is launched one per SM
/// (__launch_bounds__(kThreads, 1)): the SM's 65536 shared evenly, rounded down to the granule of 8.
/// This is the block's register pool, kThreads times that many: setmaxnreg moves registers between
/// the warpgroups of one block, inside this pool, never in from the rest of the SM. The warpgroups'
/// registers after setmaxnreg must fit in it, or a setmaxnreg_inc waits forever.
template <int kThreads>
constexpr int launch_registers() {
  return 65536 / kThreads / 8 * 8 > 255 ? 255 : 65536 / kThreads / 8 * 8;
}

/// Lowers this warpgroup's registers per thread to kRegisters (a multiple of 8, 24 to 256): the freed
/// registers go back to the block's pool, for another warpgroup's setmaxnreg_inc. All 128 threads of
/// the warpgroup execute it together.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, by 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters) : "memory");
}

/// Raises this warpgroup's registers per thread to kRegisters, waiting until the block's pool has them.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, by 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters) : "memory");
}

}  // namespace fa::hopper
