/// @file host_tensor.cpp
/// @brief Host tensors in any dtype, filled at random or from .npy files.
#include "fa/host_tensor.hpp"

#include <cstring>

namespace fa {

HostTensor::HostTensor(DType dtype_, std::vector<std::int64_t> shape_)
    : dtype(dtype_), shape(std::move(shape_)) {
  bytes.resize(static_cast<std::size_t>(numel()) * size_of(dtype));
}

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (auto extent : shape) n *= extent;
  return n;
}

double HostTensor::get(std::int64_t i) const {
  if (dtype == DType::f32) {
    float value;
    std::memcpy(&value, bytes.data() + i * 4, 4);
    return value;
  }
  unsigned short bits;
  std::memcpy(&bits, bytes.data() + i * 2, 2);
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

void HostTensor::set(std::int64_t i, double value) {
  // double -> float -> half/bf16 rounds twice; the values we store (random
  // inputs, test edits) are far from the ties where that could differ.
  const float f = static_cast<float>(value);
  if (dtype == DType::f32) {
    std::memcpy(bytes.data() + i * 4, &f, 4);
  } else {
    const unsigned short bits = dtype == DType::f16 ? float_to_half_bits(f) : float_to_bf16_bits(f);
    std::memcpy(bytes.data() + i * 2, &bits, 2);
  }
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[i] = get(i);
  return out;
}

HostTensor converted(const HostTensor& tensor, DType dtype) {
  HostTensor out(dtype, tensor.shape);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) out.set(i, tensor.get(i));
  return out;
}

std::vector<std::int64_t> q_shape(const AttentionProblem& p) {
  return {p.batch, p.q_len, p.q_heads, p.head_dim};
}

std::vector<std::int64_t> kv_shape(const AttentionProblem& p) {
  return {p.batch, p.kv_len, p.kv_heads, p.head_dim};
}

std::vector<std::int64_t> lse_shape(const AttentionProblem& p) { return {p.batch, p.q_heads, p.q_len}; }

namespace {
/// splitmix64: tiny, fast, and identical everywhere (std distributions are not).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                         double lo, double hi) {
  HostTensor t(dtype, std::move(shape));
  std::uint64_t state = seed;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double unit = double(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    t.set(i, lo + (hi - lo) * unit);
  }
  return t;
}

AttentionInputs random_inputs(const AttentionProblem& p, std::uint64_t seed, double q_range) {
  return {random_tensor(p.dtype, q_shape(p), seed * 3 + 1, -q_range, q_range),
          random_tensor(p.dtype, kv_shape(p), seed * 3 + 2),
          random_tensor(p.dtype, kv_shape(p), seed * 3 + 3)};
}

}  // namespace fa
