/// @file float_dq.cuh
/// @brief Step 27's float dQ, written once here and included by every later backward step that adds dQ
/// with atomics: its workspace (beside D), and its rounding to dQ's type after the main kernel.
#pragma once

#include "26_naive_backward/row_dot.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::bwd {

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

}  // namespace fa::bwd
