/// @file tma.hpp
/// @brief Tensor maps: the host-built descriptions of Q, K and V that Hopper's copy engine (TMA) reads.
///
/// A kernel that loads tiles with `cp.async.bulk.tensor` names a tensor map instead of a pointer: a
/// 128-byte descriptor, built on the host with the driver's `cuTensorMapEncodeTiled`, that holds the
/// tensor's base address, sizes and strides, the box (tile) one copy moves, and how the box is laid
/// out in shared memory (swizzled). The kernel takes it as a `const __grid_constant__ CUtensorMap`
/// parameter. Rows of a box past the end of the tensor arrive as zeros, so a kernel needs no bounds
/// checks on its loads.
#pragma once

#include "fa/dtype.hpp"

#include <cuda.h>

namespace fa::kit {

/// The tensor map of one attention tensor, [batch, seq, heads, head_dim] contiguous, seen by the copy
/// engine as 4-D (head_dim, heads, seq, batch: innermost first) and read in boxes of `box_rows` rows of
/// one head by 128 bytes: 64 columns of 16-bit elements, one row of the 128-byte swizzle that wgmma
/// reads (bytes' 16-byte chunk c of row r land at chunk c ^ (r % 8)). A head of d = 128 is two boxes.
/// Rows at or past `seq` (of each sequence: batch is its own dimension) read as zeros.
/// f32 (a float accumulator the copy engine adds to, step 39) has boxes of 32 columns, 128 bytes too;
/// rows at or past `seq` are then left untouched.
/// Throws InvalidProblem for a dtype other than f16, bf16 or f32, a head_dim not a multiple of the
/// box's columns or box_rows outside 1..256; std::runtime_error naming the tensor when the driver
/// refuses the map.
CUtensorMap heads_tensor_map(const void* base, DType dtype, int batch, int seq, int heads, int head_dim,
                             int box_rows);

}  // namespace fa::kit
