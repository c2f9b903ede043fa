/// @file load_rows.cuh
/// @brief Step 14's tile loader, included by every later mma.sync step: step 10's load_tile_async
/// (same tile, same swizzle, same zero fill) with the addressing a larger tile can afford in registers.
#pragma once

#include "10_async_pipeline/cp_async.cuh"

#include <cstdint>

namespace fa::tc {

/// Starts copying rows [row0, row0 + Rows) of one head of Q, K or V (row r at
/// head + r * stride) into a swizzled Rows x D shared tile; rows at or past
/// `len` are zero-filled, as load_tile_async does. The difference is the
/// addressing: a thread keeps one chunk column and steps down the tile
/// kThreads / (D / 8) rows at a time, so its addresses are one pointer plus
/// compile-time multiples of the stride. load_tile_async recomputes a row and a
/// chunk per copy; that costs registers the 32-row warp tiles of step 14 on
/// need (without it their larger tiles spill), while steps 10-13, which have
/// registers to spare, measured faster with step 10's form.
template <int Rows, int D, int kThreads, class T>
__device__ __forceinline__ void load_rows_async(std::uint32_t tile, const T* head, int row0, int len, int stride,
                                                int tid) {
  constexpr int kChunksPerRow = D / kChunkElems;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // rows the block covers per pass
  static_assert(kThreads % kChunksPerRow == 0 && Rows % kRowsPerPass == 0,
                "every thread copies the same number of chunks");
  const int row = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
  const T* src = head + (row0 + row) * stride + chunk * kChunkElems;
  const int rows_left = len - row0 - row;  // this thread's rows at or past len are zero-filled
#pragma unroll
  for (int pass = 0; pass < Rows / kRowsPerPass; ++pass) {
    const bool in_range = pass * kRowsPerPass < rows_left;
    // Out-of-range rows read nothing, but still name a valid address.
    cp_async_16(tile + swizzled_offset<D>(row + pass * kRowsPerPass, chunk),
                in_range ? src + pass * kRowsPerPass * stride : head, in_range ? 16 : 0);
  }
}

}  // namespace fa::tc
