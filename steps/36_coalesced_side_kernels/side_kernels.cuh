/// @file side_kernels.cuh
/// @brief Step 36's two side kernels of the backward, reading and writing memory as the main kernel does: in
/// 16-byte pieces, each row read whole by consecutive lanes. D = rowsum(dO o O) with head_dim / 8 lanes per
/// query row, and dQ's rounding four floats per thread. Included by every later backward step.
#pragma once

#include "09_tensor_cores/mma.cuh"
#include "26_naive_backward/row_dot.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::bwd {

/// Lanes that share one query row in row_dot_wide_kernel: each reads 8 elements (16 bytes) of dO and of O.
template <int D> constexpr int kRowLanes = D / 8;

/// Blocks of row_dot_wide_kernel for `rows` query rows: kRowLanes<D> threads a row.
template <int D> dim3 row_dot_wide_blocks(std::int64_t rows) { return row_blocks(rows * kRowLanes<D>); }

/// D_i = dO_i . O_i as row_dot_kernel computes it, with kRowLanes<D> consecutive threads per row (8 at d = 64,
/// 16 at d = 128): thread `chunk` of a row reads its 16-byte chunk of dO_i and of O_i, and the row's lanes sum
/// their dot products with shuffles. A warp's load takes whole rows of each tensor (two at d = 128, four at d = 64),
/// each row contiguous: 16 sectors of 32 bytes, every byte used, where row_dot_kernel's warp read 2 bytes from each
/// of 32 rows head_dim * q_heads * 2 bytes apart: 32 sectors for 64 bytes. kRowLanes
/// divides 32, so a row's lanes sit in one warp; every lane reaches the shuffles, rows past the last with 0.
/// row_dot_wide is one thread's part: every lane of the row gets D_i (0 past the last row); the kernel stores it.
template <class T, int D>
__device__ __forceinline__ float row_dot_wide(const kit::Grads<T, D>& s, std::int64_t row, int chunk,
                                              std::int64_t rows) {
  constexpr int kLanes = kRowLanes<D>;
  static_assert(tc::kWarpSize % kLanes == 0, "a row's lanes in one warp");
  float dot = 0.f;
  if (row < rows) {
    const int i = int(row % s.q_len);
    const int h = int((row / s.q_len) % s.q_heads);
    const int b = int(row / (std::int64_t(s.q_len) * s.q_heads));
    const std::int64_t at = std::int64_t(i) * s.q_stride() + 8 * chunk;
    const uint4 o = *reinterpret_cast<const uint4*>(s.o_head(b, h) + at);  // 16-byte aligned: head_dim % 8 == 0
    const uint4 g = *reinterpret_cast<const uint4*>(s.do_head(b, h) + at);
    const T* o8 = reinterpret_cast<const T*>(&o);
    const T* g8 = reinterpret_cast<const T*>(&g);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += kit::to_float(g8[e]) * kit::to_float(o8[e]);
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  return dot;
}

/// The kernel: kRowLanes<D> threads a row, (b, h, i) in LSE's layout; the row's first lane stores D_i.
template <class T, int D>
__global__ void row_dot_wide_kernel(kit::Grads<T, D> s, float* __restrict__ D_rows, std::int64_t rows) {
  constexpr int kLanes = kRowLanes<D>;
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t row = idx / kLanes;  // (b, h, i), LSE's layout
  const int chunk = int(idx % kLanes);     // elements 8 chunk .. 8 chunk + 7 of the row
  const float dot = row_dot_wide(s, row, chunk, rows);
  if (row < rows && chunk == 0) D_rows[row] = dot;
}

/// Blocks of convert_dq_wide_kernel for `total` elements of dQ: four a thread.
inline dim3 convert_dq_wide_blocks(std::int64_t total) { return row_blocks(total / 4); }

/// convert_dq_kernel four elements at a time: thread e reads floats 4e .. 4e + 3 of the float dQ (16 bytes),
/// writes them rounded to dQ's type (8 bytes) and writes zeros back (16 bytes), so that the next call's atomics
/// add to zeros again. `total` is a multiple of 4: head_dim is 64 or 128.
template <class T>
__global__ void convert_dq_wide_kernel(float* __restrict__ dQ_acc, T* __restrict__ dQ, std::int64_t total) {
  const std::int64_t idx = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (idx >= total) return;
  const float4 v = *reinterpret_cast<const float4*>(dQ_acc + idx);
  *reinterpret_cast<uint2*>(dQ + idx) = make_uint2(tc::pack2<T>(v.x, v.y), tc::pack2<T>(v.z, v.w));
  *reinterpret_cast<float4*>(dQ_acc + idx) = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace fa::bwd
