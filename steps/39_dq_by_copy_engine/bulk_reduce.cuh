/// @file bulk_reduce.cuh
/// @brief Step 39's copies out: the copy engine adds a box of shared memory to global memory
/// (`cp.reduce.async.bulk.tensor ... .add`), in bulk groups that the issuing thread commits and waits on. Each
/// function is one PTX instruction.
///
/// A bulk group is the copies-out one thread issued since its last commit. `wait_group.read N` returns once at most
/// N groups may still be reading their shared memory (the rest may still be writing global memory): the source may
/// then be overwritten. `wait_group N` returns once at most N groups are unfinished, global writes included.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace fa::hopper {

/// Adds the box of `map` at coordinates (c0, c1, c2, c3), innermost first, read from shared memory at `src` (laid out
/// and swizzled as the map says), to global memory: element by element, atomically. Elements past the tensor's
/// bounds are left out. Issued by one thread; joins the thread's current bulk group.
__device__ __forceinline__ void bulk_reduce_add_4d(const CUtensorMap* map, std::uint32_t src, int c0, int c1, int c2,
                                                   int c3) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
               ::"l"(reinterpret_cast<std::uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

/// Closes the copies-out issued since the last commit into one bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

/// Waits until at most `kPending` bulk groups may still read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

/// Waits until at most `kPending` bulk groups are unfinished (their global writes included).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace fa::hopper
