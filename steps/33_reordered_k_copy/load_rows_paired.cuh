/// @file load_rows_paired.cuh
/// @brief Step 33's second copy of K: load_rows_async's swizzled tile, with the 4-byte column pairs of each
/// group of 16 columns reordered, so that an mma reading it gives each lane four adjacent output columns.
#pragma once

#include "09_tensor_cores/mma.cuh"

#include <cstdint>

namespace fa::tc {

/// Where pair a (columns 2a, 2a + 1) of a row goes in a 16-column group of the reordered tile: the even pairs
/// 0, 2, 4, 6 first, then the odd ones 1, 3, 5, 7. An n8 tile read from the first half holds columns
/// 4t, 4t + 1 of the group at its columns 2t, 2t + 1; one read from the second half holds 4t + 2, 4t + 3.
__host__ __device__ constexpr int paired_slot(int a) { return (a & ~7) + ((a & 7) >> 1) + 4 * (a & 1); }

/// Starts copying rows [row0, row0 + Rows) of one head of K (row r at head + r * stride) into a swizzled
/// Rows x D shared tile with each row's pairs at paired_slot; rows at or past `len` are zero-filled, as
/// load_rows_async does. A pair is 4 bytes, so each copy is a 4-byte cp.async (.ca: 16 bytes is the only size
/// .cg takes): four times load_rows_async's copies, once per block. Consecutive threads take consecutive pairs
/// of a row, so the global reads stay coalesced.
template <int Rows, int D, int kThreads, class T>
__device__ __forceinline__ void load_rows_paired_async(std::uint32_t tile, const T* head, int row0, int len, int stride,
                                                       int tid) {
  constexpr int kPairsPerRow = D / 2;
  static_assert(D % 16 == 0 && Rows * kPairsPerRow % kThreads == 0, "every thread copies the same number of pairs");
#pragma unroll 4
  for (int it = 0; it < Rows * kPairsPerRow / kThreads; ++it) {
    const int e = it * kThreads + tid;
    const int row = e / kPairsPerRow, a = e % kPairsPerRow, slot = paired_slot(a);
    const bool in_range = row0 + row < len;
    // Out-of-range rows read nothing, but still name a valid address.
    const T* src = head + (in_range ? (row0 + row) * stride + 2 * a : 0);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(tile + swizzled_offset<D>(row, slot / 4) +
                                                                       4 * (slot % 4)),
                 "l"(src), "r"(in_range ? 4 : 0)
                 : "memory");
  }
}

}  // namespace fa::tc
