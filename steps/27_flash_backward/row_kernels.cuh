/// @file row_kernels.cuh
/// @brief Step 27's kernels around the backward's main one, written once here and included by every
/// later backward step: D_i = dO_i . O_i before it, and the float dQ rounded to dQ's type after it.
#pragma once

#include "fa/kit.cuh"

#include <cstdint>

namespace fa::bwd {

constexpr int kRowThreads = 256;  ///< threads per block of the one-thread-per-element kernels below

/// Thread (b, h, i) computes D_i = dO_i . O_i, which every K/V tile's dS_ij = P_ij (dP_ij - D_i) needs.
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
  D_rows[idx] = D;  // D is [batch, q_heads, q_len], like LSE: idx is (b, h, i)
}

/// Thread e rounds element e of the float dQ to dQ's type, and sets it back to zero: the workspace
/// starts zero (problem.hpp), and the next call's atomics add to zeros again.
template <class T>
__global__ void convert_dq_kernel(float* __restrict__ dQ_acc, T* __restrict__ dQ, std::int64_t total) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  dQ[idx] = kit::from_float<T>(dQ_acc[idx]);
  dQ_acc[idx] = 0.f;
}

/// Bytes of the float dQ (shaped like Q) and of D (one float per query row): the workspace of every
/// backward step that adds dQ with atomics.
inline std::size_t workspace_bytes(const AttentionProblem& p) {
  return std::size_t(p.q_elements() + p.lse_elements()) * sizeof(float);
}

/// Blocks of kRowThreads threads for one thread per element of `count`.
inline dim3 row_blocks(std::int64_t count) { return kit::grid_1d((count + kRowThreads - 1) / kRowThreads); }

}  // namespace fa::bwd
