/// @file reference.hpp
/// @brief Attention (and step 02's matrix trace) on the CPU in double precision: the ground truth.
///
/// O[b,i,h,:] = sum_j softmax_j(scale * Q[b,i,h,:]·K[b,j,h/g,:]) V[b,j,h/g,:],
/// with g = q_heads / kv_heads and, when causal, only keys j <= i. The softmax
/// subtracts the row maximum before exponentiating, so no score overflows.
#pragma once

#include "fa/problem.hpp"

#include <vector>

namespace fa {

/// One output row O[b, i, h, 0:head_dim] into out_row. q, k, v are whole
/// tensors in the problem's layout, as doubles. Returns the largest |score|
/// (|scale q.k|) of the keys the row sees.
double reference_attention_row(const AttentionProblem& p, const double* q, const double* k,
                               const double* v, int b, int i, int h, double* out_row);

/// The whole output, rows spread over the machine's cores. Validates p.
/// With max_abs_score, also the largest |score| of the whole problem (the
/// tolerances grow with it: see tolerance_for).
std::vector<double> reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        double* max_abs_score = nullptr);

/// The trace of a row-major rows x cols matrix: the sum of its min(rows, cols)
/// diagonal elements, added in double (exact for int sums below 2^53).
/// 0 for an empty matrix; throws std::invalid_argument for a negative size.
double reference_trace(const int* matrix, int rows, int cols);
/// The trace of a row-major rows x cols float matrix, added in double (see the int overload).
double reference_trace(const float* matrix, int rows, int cols);

}  // namespace fa
