/// @file lag.cuh
/// @brief A schedule perturbation for the test builds: one role of a block made late at its barriers, so
/// that a missing or misplaced barrier becomes a wrong answer instead of a race that never happens.
///
/// A barrier left out between two roles (warpgroups, warps) shows only if one role runs a whole stage
/// behind the other, which a GPU never does by chance; compute-sanitizer's racecheck does not see wgmma's
/// or the copy engine's accesses either. So the barrier helpers the steps include (tma.cuh, roles.cuh,
/// named_barrier.cuh, cp_async.cuh) call FA_LAG(site) once each, and a build that defines the macros
/// below makes ONE role spin there for a while:
///
///   FA_LAG_ROLE_THREADS  threads per role: 128 (a warpgroup, threadIdx.x / 128) or 32 (a warp)
///   FA_LAG_ROLE          which role lags: threadIdx.x / FA_LAG_ROLE_THREADS == FA_LAG_ROLE
///   FA_LAG_SITES         where, FA_LAG_BEFORE_ARRIVE (mbarrier arrive and arrive.expect_tx, bar.arrive,
///                        bar.sync), FA_LAG_BEFORE_WAIT (mbarrier try_wait loop, bar.sync,
///                        cp.async.wait_group), FA_LAG_AFTER_WAIT (the same waits, once they return) or
///                        FA_LAG_HERE (only where a mutant's own lines call FA_LAG(FA_LAG_HERE), e.g. at
///                        a plain __syncthreads()), or several joined with |
///   FA_LAG_NS            how long, in nanoseconds, per call (measured on %globaltimer)
///
/// The mutation suite sets them from a spec's `lag:` line (tests/fa_patch.cpp). Without FA_LAG_NS,
/// FA_LAG(site) is nothing: the steps compile to exactly what they were.
#pragma once

/// A site: before an arrive (mbarrier arrive, arrive.expect_tx, bar.arrive, bar.sync).
#define FA_LAG_BEFORE_ARRIVE 1
/// A site: before a wait (the mbarrier try_wait loop, bar.sync, cp.async.wait_group).
#define FA_LAG_BEFORE_WAIT 2
/// A site: after a wait returns.
#define FA_LAG_AFTER_WAIT 4
/// A site a mutant's own text marks (a barrier that is a plain __syncthreads()).
#define FA_LAG_HERE 8

#ifdef FA_LAG_NS
#include <cstdint>

namespace fa::lag {

/// Spins FA_LAG_NS nanoseconds when this thread's role is FA_LAG_ROLE and `site` is one of FA_LAG_SITES.
__device__ __forceinline__ void at(int site) {
  if (!(site & (FA_LAG_SITES)) || threadIdx.x / (FA_LAG_ROLE_THREADS) != (FA_LAG_ROLE)) return;
  std::uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start) :: "memory");
  do {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) :: "memory");
  } while (now - start < std::uint64_t(FA_LAG_NS));
}

}  // namespace fa::lag

/// The lag of one site: the chosen role spins here in a lag build.
#define FA_LAG(site) ::fa::lag::at(site)
#else
/// The lag of one site: nothing outside a lag build.
#define FA_LAG(site) ((void)0)
#endif
