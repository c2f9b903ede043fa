/// @file tma.cuh
/// @brief Step 21's loads: the copy engine (TMA) moves a tile into shared memory and reports on an
/// mbarrier; threads wait on the barrier's phase. Each function is one PTX instruction.
///
/// An mbarrier is 8 bytes of shared memory that counts two things down: arrivals (threads calling
/// arrive) and transaction bytes (bytes the copy engine has written). When both reach zero its phase
/// completes and flips parity (0, 1, 0, ...), and it re-arms itself for the next phase. Here each
/// barrier expects one arrival, the thread that issues the copies announcing how many bytes are coming
/// (`expect_tx`), and the copies' bytes; waiters ask "has phase p completed?" with try_wait.parity.
#pragma once

#include "20_wgmma/wgmma.cuh"  // smem_address
#include "fa/lag.cuh"          // FA_LAG: nothing, except in the mutation suite's lag builds

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace fa::hopper {

/// Initializes the mbarrier at `bar` to expect `arrivals` arrivals per phase (phase 0 in progress).
__device__ __forceinline__ void mbarrier_init(std::uint32_t bar, std::uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

/// Makes initialized mbarriers visible to the copy engine (the async proxy) before it signals them.
/// Then a __syncthreads() makes them visible to the other threads.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Arrives on `bar` and adds `bytes` to the transaction bytes the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  FA_LAG(FA_LAG_BEFORE_ARRIVE);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

/// Waits until the phase of `bar` with parity `parity` has completed. try_wait suspends the thread
/// for a while in hardware before it answers false, so the loop does not spin hot.
__device__ __forceinline__ void mbarrier_wait(std::uint32_t bar, std::uint32_t parity) {
  FA_LAG(FA_LAG_BEFORE_WAIT);
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        "  .reg .pred complete;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
  FA_LAG(FA_LAG_AFTER_WAIT);
}

/// Fetches a tensor map into the constant cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

/// One copy-engine load: the box of `map` whose first element is at coordinates (c0, c1, c2, c3),
/// innermost first, into shared memory at `dst`; its bytes count down the transaction count of `bar`.
/// Issued by one thread; the copy runs while every thread goes on.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const CUtensorMap* map, std::uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

}  // namespace fa::hopper
