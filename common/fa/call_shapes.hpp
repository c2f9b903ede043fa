/// @file call_shapes.hpp
/// @brief A call's tensors as a caller hands them over (fa-run's .npy files, the Python module's DLPack tensors),
/// and the problem read off their shapes: one set of checks and messages for every entry point.
#pragma once

#include "fa/dtype.hpp"
#include "fa/problem.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

/// One tensor of a call: the name the messages give it (a file's path, a Python argument's name), its shape and
/// its element type.
struct TensorShape {
  std::string name;                 ///< "q.npy", or "q"
  std::vector<std::int64_t> shape;  ///< sizes, outermost first
  DType dtype = DType::f32;         ///< element type
};

/// "[2, 128, 8, 64]".
std::string shape_text(const std::vector<std::int64_t>& shape);

/// The problem read off Q [B, Nq, Hq, d] and K, V [B, Nkv, Hkv, d] (batch, lengths, heads, head_dim, dtype; the
/// caller sets causal, scale and the cache's forms). Throws std::invalid_argument naming the tensor that does not
/// fit: not 4 dimensions, K and V of different shapes, Q and K of another batch or head_dim, dtypes that differ
/// (`dtype_hint` is appended to that message: which dtypes the caller takes), a dimension outside 1 .. 2^30 (named
/// by its field: "q.npy: Q [1, 0, 2, 64] has q_len (dim 1) = 0; ...").
AttentionProblem problem_from(const TensorShape& q, const TensorShape& k, const TensorShape& v,
                              const std::string& dtype_hint = "");

/// The problem of a pack (FlashAttention's varlen): Q [total_q, Hq, d] and K, V [total_k, Hkv, d], sequence b's rows
/// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (and its keys likewise), host copies of the offsets; batch the count,
/// q_len and kv_len the longest. problem_from's checks on the pack as one sequence, and each offsets' last entry the
/// tensor's rows; validate() checks the rest (from 0, never decreasing). Throws std::invalid_argument naming what
/// does not fit.
AttentionProblem problem_from_packed(const TensorShape& q, const TensorShape& k, const TensorShape& v,
                                     const std::vector<int>& cu_seqlens_q, const std::vector<int>& cu_seqlens_k,
                                     const std::string& dtype_hint = "");

/// Refuses a backward call's O, LSE and dO that do not fit p: O and dO of Q's shape and p's dtype, LSE float32
/// [B, Hq, Nq] ([Hq, total_q] for a pack). Throws std::invalid_argument naming the tensor.
void check_backward_shapes(const AttentionProblem& p, const TensorShape& o, const TensorShape& lse,
                           const TensorShape& d_o);

}  // namespace fa
