/// @file host_tensor.hpp
/// @brief Host tensors in the problem's element type, and seeded random inputs.
#pragma once

#include "fa/dtype.hpp"
#include "fa/problem.hpp"

#include <cstdint>
#include <vector>

namespace fa {

/// A contiguous host tensor whose elements are stored in `dtype` (f32, f16 or bf16 bits).
struct HostTensor {
  DType dtype = DType::f32;           ///< element type of the stored bits
  std::vector<std::int64_t> shape;    ///< sizes, outermost first
  std::vector<unsigned char> bytes;   ///< the elements, contiguous, row-major

  HostTensor() = default;
  /// A zero-filled tensor of this type and shape.
  HostTensor(DType dtype, std::vector<std::int64_t> shape);

  /// Number of elements (the product of shape).
  std::int64_t numel() const;
  /// Bytes the elements occupy.
  std::size_t byte_size() const { return bytes.size(); }
  /// Element i converted to double (exact for every dtype).
  double get(std::int64_t i) const;
  /// Stores value rounded to the tensor's type.
  void set(std::int64_t i, double value);
  /// Every element as double, for the reference.
  std::vector<double> to_double() const;
};

/// The same values in another dtype, each rounded to nearest (exact when widening).
HostTensor converted(const HostTensor& tensor, DType dtype);

/// [batch, q_len, q_heads, head_dim] (also the shape of O), or packed [total_q, q_heads, head_dim] (varlen).
std::vector<std::int64_t> q_shape(const AttentionProblem& p);
/// [batch, kv_len, kv_heads, head_dim], or packed [total_k, kv_heads, head_dim] (varlen).
std::vector<std::int64_t> kv_shape(const AttentionProblem& p);
/// [batch, q_heads, q_len]: the row log-sum-exp, always f32; [q_heads, total_q] with varlen.
std::vector<std::int64_t> lse_shape(const AttentionProblem& p);

/// Uniform values in [lo, hi) from a seeded generator (splitmix64, the same
/// stream on every platform), rounded to dtype.
HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                         double lo = -1.0, double hi = 1.0);

/// Q, K and V for a problem, drawn from one seed; with sinks, their logits too, uniform in [-2, 2).
struct AttentionInputs {
  HostTensor q;  ///< [batch, q_len, q_heads, head_dim]
  HostTensor k;  ///< [batch, kv_len, kv_heads, head_dim]
  HostTensor v;  ///< [batch, kv_len, kv_heads, head_dim]
  HostTensor sinks{};  ///< f32 [q_heads]: each query head's sink logit, with AttentionProblem::sinks (else empty)
};
/// What the backward reads besides Q, K and V: the forward's outputs and the gradient flowing in.
struct BackwardInputs {
  HostTensor o;    ///< O, [batch, q_len, q_heads, head_dim], the problem's dtype
  HostTensor lse;  ///< LSE, f32 [batch, q_heads, q_len]
  HostTensor d_o;  ///< dO, shaped and typed like O
};

/// dQ, dK and dV as a backward step returns them (the problem's dtype), and with sinks their gradient.
struct Gradients {
  HostTensor dq;  ///< [batch, q_len, q_heads, head_dim]
  HostTensor dk;  ///< [batch, kv_len, kv_heads, head_dim]
  HostTensor dv;  ///< [batch, kv_len, kv_heads, head_dim]
  HostTensor dsinks{};  ///< f32 [q_heads]: dLoss/dsink_h, with AttentionProblem::sinks (else empty)
};

/// A page table for a paged problem: int32 [batch, kv_len / page_size], every sequence's pages distinct pages of
/// the pool, in an order shuffled by `seed` (so that no kernel can get away with sequence b's pages being
/// consecutive). Throws InvalidProblem unless p is paged and its pool holds batch * kv_len / page_size pages.
std::vector<int> shuffled_page_table(const AttentionProblem& p, std::uint64_t seed);

/// K or V ([batch, kv_len, kv_heads, head_dim], contiguous) stored as p's page pool, [pages, page_size,
/// kv_heads, head_dim]: key j of sequence b in page table[b * kv_len / page_size + j / page_size], row
/// j % page_size. The pool's pages no sequence uses are NaN, so that reading one shows.
HostTensor to_pages(const AttentionProblem& p, const HostTensor& kv, const std::vector<int>& table);

/// The inverse of to_pages: each sequence's pages gathered back into [batch, kv_len, kv_heads, head_dim].
HostTensor from_pages(const AttentionProblem& p, const HostTensor& pool, const std::vector<int>& table);

/// Q uniform in [-q_range, q_range), K and V uniform in [-1, 1), all from one
/// seed. A larger q_range spreads the scores (logits) wider: with d = 64 and the
/// default scale their standard deviation is about q_range / 3.
AttentionInputs random_inputs(const AttentionProblem& p, std::uint64_t seed, double q_range = 1.0);

}  // namespace fa
