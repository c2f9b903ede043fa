/// @file row_dot.cuh
/// @brief Step 26's D_i = dO_i . O_i, written once here and included by every later backward step: the
/// row sum of P o dP, from O.
#pragma once

#include "fa/kit.cuh"

#include <cstdint>

namespace fa::bwd {

constexpr int kRowThreads = 256;  ///< threads per block of the one-thread-per-element kernels of the backward

/// Blocks of kRowThreads threads for one thread per element of `count`.
inline dim3 row_blocks(std::int64_t count) { return kit::grid_1d((count + kRowThreads - 1) / kRowThreads); }

/// Thread (b, h, i) computes D_i = dO_i . O_i: the row sum of P o dP, from O instead of from P. D has
/// LSE's layout, [batch, q_heads, q_len].
template <class T>
__global__ void row_dot_kernel(kit::Grads<T> s, float* __restrict__ D_rows, std::int64_t rows) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows) return;
  const int i = int(idx % s.q_len);
  const int h = int((idx / s.q_len) % s.q_heads);
  const int b = int(idx / (std::int64_t(s.q_len) * s.q_heads));
  const T* __restrict__ o_row = s.o_head(b, h) + i * s.q_stride();
  const T* __restrict__ do_row = s.do_head(b, h) + i * s.q_stride();
  float D = 0.f;
  for (int c = 0; c < s.head_dim; ++c) D += kit::to_float(do_row[c]) * kit::to_float(o_row[c]);
  D_rows[idx] = D;  // idx is (b, h, i)
}

}  // namespace fa::bwd
