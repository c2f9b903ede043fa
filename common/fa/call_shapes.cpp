/// @file call_shapes.cpp
/// @brief A call's tensors checked against the problem they describe: shape_text, problem_from, check_backward_shapes.
#include "fa/call_shapes.hpp"

#include "fa/host_tensor.hpp"

#include <stdexcept>

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
    throw std::invalid_argument(lse.name + ": LSE must be float32 [B, Hq, Nq] = " + shape_text(lse_shape(p)) +
                                "; got " + shape_text(lse.shape) + " " + to_string(lse.dtype));
}

}  // namespace fa
