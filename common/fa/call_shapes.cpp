/// @file call_shapes.cpp
/// @brief A call's tensors checked against the problem they describe: shape_text, problem_from, check_backward_shapes.
#include "fa/call_shapes.hpp"

#include "fa/host_tensor.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace fa {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

AttentionProblem problem_from(const TensorShape& q, const TensorShape& k, const TensorShape& v,
                              const std::string& dtype_hint) {
  const TensorShape* tensors[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (tensors[i]->shape.size() != 4)
      throw std::invalid_argument(tensors[i]->name + ": " + "QKV"[i] + " must have 4 dimensions [B, N, H, d]; got " +
                                  shape_text(tensors[i]->shape));
  if (k.shape != v.shape)
    throw std::invalid_argument("K " + shape_text(k.shape) + " (" + k.name + ") and V " + shape_text(v.shape) + " (" +
                                v.name + ") must have the same shape");
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    throw std::invalid_argument(std::string("Q, K and V must have one dtype; got Q ") + to_string(q.dtype) + ", K " +
                                to_string(k.dtype) + ", V " + to_string(v.dtype) +
                                (dtype_hint.empty() ? "" : " " + dtype_hint));
  // Each dimension by the problem's field it gives, so a zero-length one is named with its tensor.
  const char* fields[2][4] = {{"batch", "q_len", "q_heads", "head_dim"}, {"batch", "kv_len", "kv_heads", "head_dim"}};
  for (int i = 0; i < 2; ++i)
    for (int dim = 0; dim < 4; ++dim) {
      const std::int64_t extent = tensors[i]->shape[dim];
      if (extent < 1 || extent > (1 << 30))
        throw std::invalid_argument(tensors[i]->name + ": " + "QK"[i] + " " + shape_text(tensors[i]->shape) + " has " +
                                    fields[i][dim] + " (dim " + std::to_string(dim) + ") = " + std::to_string(extent) +
                                    "; every dimension must be between 1 and 2^30");
    }
  if (q.shape[0] != k.shape[0] || q.shape[3] != k.shape[3])
    throw std::invalid_argument("Q " + shape_text(q.shape) + " and K " + shape_text(k.shape) +
                                " must agree on batch (dim 0) and head_dim (dim 3)");
  AttentionProblem p;
  p.batch = int(q.shape[0]);
  p.q_len = int(q.shape[1]);
  p.q_heads = int(q.shape[2]);
  p.head_dim = int(q.shape[3]);
  p.kv_len = int(k.shape[1]);
  p.kv_heads = int(k.shape[2]);
  p.dtype = q.dtype;
  return p;
}

AttentionProblem problem_from_packed(const TensorShape& q, const TensorShape& k, const TensorShape& v,
                                     const std::vector<int>& cu_seqlens_q, const std::vector<int>& cu_seqlens_k,
                                     const std::string& dtype_hint) {
  const TensorShape* tensors[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (tensors[i]->shape.size() != 3)
      throw std::invalid_argument(tensors[i]->name + ": " + "QKV"[i] + " of a pack must have 3 dimensions [total, H, d] "
                                  "(FlashAttention's varlen layout); got " + shape_text(tensors[i]->shape));
  // The checks of the unpacked form, on the pack as one sequence: same K and V, one dtype, dimensions in range.
  auto one_sequence = [](const TensorShape& t) {
    TensorShape s = t;
    s.shape.insert(s.shape.begin(), 1);
    return s;
  };
  AttentionProblem p = problem_from(one_sequence(q), one_sequence(k), one_sequence(v), dtype_hint);
  const std::pair<const TensorShape*, const std::vector<int>*> packs[2] = {{&q, &cu_seqlens_q}, {&k, &cu_seqlens_k}};
  for (const auto& [tensor, offsets] : packs) {
    const char* name = offsets == &cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k";
    if (offsets->size() < 2)
      throw std::invalid_argument(std::string(name) + " has " + std::to_string(offsets->size()) +
                                  " entries; a pack of B sequences needs B + 1 offsets (0, then where each ends)");
    if (offsets->back() != tensor->shape[0])
      throw std::invalid_argument(std::string(name) + "[B] = " + std::to_string(offsets->back()) + " must be the " +
                                  tensor->name + "'s rows, " + std::to_string(tensor->shape[0]) + " (" +
                                  shape_text(tensor->shape) + ": the pack ends where the tensor does)");
  }
  if (cu_seqlens_q.size() != cu_seqlens_k.size())
    throw std::invalid_argument("cu_seqlens_q has " + std::to_string(cu_seqlens_q.size()) + " entries and cu_seqlens_k " +
                                std::to_string(cu_seqlens_k.size()) + ": one offset each per sequence, and one more");
  p.batch = int(cu_seqlens_q.size()) - 1;
  p.cu_seqlens_q = cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_k;
  p.q_len = p.kv_len = 1;
  for (int b = 0; b < p.batch; ++b)  // the longest (FlashAttention's max_seqlen); validate() checks the offsets
    p.q_len = std::max(p.q_len, cu_seqlens_q[std::size_t(b) + 1] - cu_seqlens_q[std::size_t(b)]),
    p.kv_len = std::max(p.kv_len, cu_seqlens_k[std::size_t(b) + 1] - cu_seqlens_k[std::size_t(b)]);
  return p;
}

void check_backward_shapes(const AttentionProblem& p, const TensorShape& o, const TensorShape& lse,
                           const TensorShape& d_o) {
  const TensorShape* tensors[2] = {&o, &d_o};
  const char* names[2] = {"O", "dO"};
  for (int i = 0; i < 2; ++i)
    if (tensors[i]->shape != q_shape(p) || tensors[i]->dtype != p.dtype)
      throw std::invalid_argument(tensors[i]->name + ": " + names[i] + " must have Q's shape " +
                                  shape_text(q_shape(p)) + " and dtype " + to_string(p.dtype) + "; got " +
                                  shape_text(tensors[i]->shape) + " " + to_string(tensors[i]->dtype));
  if (lse.shape != lse_shape(p) || lse.dtype != DType::f32)
    throw std::invalid_argument(lse.name + ": LSE must be float32 " + (p.varlen() ? "[Hq, total_q]" : "[B, Hq, Nq]") +
                                " = " + shape_text(lse_shape(p)) +
                                "; got " + shape_text(lse.shape) + " " + to_string(lse.dtype));
}

}  // namespace fa
