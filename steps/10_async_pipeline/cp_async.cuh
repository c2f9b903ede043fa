/// @file cp_async.cuh
/// @brief Step 10's asynchronous copies, written once here and included by every later step:
/// cp.async (global -> shared without holding up the thread), its commit groups and waits, and a
/// whole swizzled tile started that way. cp.async exists from sm_80 on.
#pragma once

#include "09_tensor_cores/mma.cuh"
#include "fa/lag.cuh"  // FA_LAG: nothing, except in the mutation suite's lag builds

#include <cstdint>

namespace fa::tc {

/// Starts a 16-byte copy global -> shared that does not hold up the thread
/// (cp.async.cg: through L2 only). src_bytes = 0 copies nothing and fills the
/// 16 bytes with zeros, which is how rows past the end of Q, K or V are padded.
__device__ __forceinline__ void cp_async_16(std::uint32_t shared_address, const void* global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global),
               "r"(src_bytes)
               : "memory");
}
/// Closes the group of cp.async issued so far by this thread.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most `Pending` of this thread's committed groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  FA_LAG(FA_LAG_BEFORE_WAIT);
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
  FA_LAG(FA_LAG_AFTER_WAIT);
}

/// Starts copying rows [row0, row0 + Rows) of one head of Q, K or V (row r at
/// head + r * stride) into a swizzled Rows x D shared tile; rows at or past
/// `len` are zero-filled. Consecutive threads take consecutive 16-byte chunks
/// of a row, so the global reads are coalesced and each 8-thread store phase
/// covers one row's 8 chunks, permuted: conflict-free.
template <int Rows, int D, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(std::uint32_t tile, const T* head, int row0, int len, int stride,
                                                int tid) {
  constexpr int kChunksPerRow = D / kChunkElems;
  static_assert(Rows * kChunksPerRow % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < Rows * kChunksPerRow / kThreads; ++it) {
    const int e = it * kThreads + tid;
    const int row = e / kChunksPerRow, chunk = e % kChunksPerRow;
    const bool in_range = row0 + row < len;
    // Out-of-range rows read nothing, but still name a valid address.
    const T* src = head + (in_range ? (row0 + row) * stride + chunk * kChunkElems : 0);
    cp_async_16(tile + swizzled_offset<D>(row, chunk), src, in_range ? 16 : 0);
  }
}

}  // namespace fa::tc
