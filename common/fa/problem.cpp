/// @file problem.cpp
/// @brief The attention problem: its validation, and the messages that name what is wrong.
#include "fa/problem.hpp"

#include <cmath>
#include <limits>
#include <sstream>

namespace fa {

float AttentionProblem::softmax_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::int64_t AttentionProblem::q_elements() const {
  return std::int64_t{batch} * q_len * q_heads * head_dim;
}

std::int64_t AttentionProblem::kv_elements() const {
  return std::int64_t{batch} * kv_len * kv_heads * head_dim;
}

std::int64_t AttentionProblem::lse_elements() const { return std::int64_t{batch} * q_heads * q_len; }

const char* to_string(Pass pass) { return pass == Pass::backward ? "backward" : "forward"; }

double AttentionProblem::flops() const {
  const double full = 4.0 * batch * q_heads * double(q_len) * double(kv_len) * head_dim;
  return causal ? full / 2 : full;
}

std::string AttentionProblem::describe() const {
  std::ostringstream out;
  out << "B=" << batch << " Nq=" << q_len << " Nkv=" << kv_len << " H=" << q_heads << "/"
      << kv_heads << " d=" << head_dim << " " << to_string(dtype) << (causal ? " causal" : "");
  if (scale) out << " scale=" << *scale;
  return out.str();
}

namespace {
/// Throws InvalidProblem unless value >= 1.
void require_positive(const char* field, int value) {
  if (value < 1)
    throw InvalidProblem(std::string("attention problem: ") + field + " = " +
                         std::to_string(value) + " must be >= 1");
}
}  // namespace

void validate(const AttentionProblem& p) {
  require_positive("batch", p.batch);
  require_positive("q_len", p.q_len);
  require_positive("kv_len", p.kv_len);
  require_positive("q_heads", p.q_heads);
  require_positive("kv_heads", p.kv_heads);
  require_positive("head_dim", p.head_dim);
  if (p.q_heads % p.kv_heads != 0)
    throw InvalidProblem("attention problem: q_heads = " + std::to_string(p.q_heads) +
                         " is not a multiple of kv_heads = " + std::to_string(p.kv_heads));
  if (p.scale && !std::isfinite(*p.scale))
    throw InvalidProblem("attention problem: scale = " + std::to_string(*p.scale) +
                         " must be finite");
  // Kernels add a 64-bit offset per (batch, head) and index inside one sequence with 32-bit offsets
  // (row * heads * head_dim + column): one sequence of Q (or O) and of K (or V) must stay below 2^31
  // elements. The batch, and so the whole problem, may be larger.
  constexpr std::int64_t kMaxElements = std::numeric_limits<std::int32_t>::max();
  const std::int64_t q_sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  const std::int64_t kv_sequence = std::int64_t(p.kv_len) * p.kv_heads * p.head_dim;
  if (q_sequence > kMaxElements)
    throw InvalidProblem("attention problem: one sequence of Q has q_len * q_heads * head_dim = " +
                         std::to_string(q_sequence) + " elements; at most 2^31-1 are supported " +
                         "(steps index within a sequence with 32-bit offsets; the batch may be any size)");
  if (kv_sequence > kMaxElements)
    throw InvalidProblem("attention problem: one sequence of K/V has kv_len * kv_heads * head_dim = " +
                         std::to_string(kv_sequence) + " elements; at most 2^31-1 are supported " +
                         "(steps index within a sequence with 32-bit offsets; the batch may be any size)");
}

void throw_unsupported(const char* step, const char* field, const std::string& value,
                       const std::string& supported) {
  throw InvalidProblem(std::string(step) + ": " + field + " = " + value +
                       " is not supported; supported: " + supported);
}

}  // namespace fa
