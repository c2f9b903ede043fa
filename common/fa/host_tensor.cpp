/// @file host_tensor.cpp
/// @brief Host tensors in any dtype, filled at random or from .npy files.
#include "fa/host_tensor.hpp"

#include "fa/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

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
  constexpr std::int64_t kChunk = std::int64_t(1) << 16;  // elements a worker converts at a time
  parallel_for((numel() + kChunk - 1) / kChunk, [&](int, std::int64_t chunk) {
    for (std::int64_t i = chunk * kChunk; i < std::min((chunk + 1) * kChunk, numel()); ++i) out[i] = get(i);
  });
  return out;
}

HostTensor converted(const HostTensor& tensor, DType dtype) {
  HostTensor out(dtype, tensor.shape);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) out.set(i, tensor.get(i));
  return out;
}

std::vector<std::int64_t> q_shape(const AttentionProblem& p) {
  if (p.varlen()) return {p.total_q(), p.q_heads, p.head_dim};
  return {p.batch, p.q_len, p.q_heads, p.head_dim};
}

std::vector<std::int64_t> kv_shape(const AttentionProblem& p) {
  if (p.varlen()) return {p.total_k(), p.kv_heads, p.head_dim};
  return {p.batch, p.kv_len, p.kv_heads, p.head_dim};
}

std::vector<std::int64_t> lse_shape(const AttentionProblem& p) {
  if (p.varlen()) return {p.q_heads, p.total_q()};
  return {p.batch, p.q_heads, p.q_len};
}

namespace {
constexpr std::uint64_t kSplitmixStep = 0x9E3779B97F4A7C15ull;  ///< splitmix64's increment of its state a draw

/// splitmix64: tiny, fast, and identical everywhere (std distributions are not).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += kSplitmixStep);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                         double lo, double hi) {
  HostTensor t(dtype, std::move(shape));
  // splitmix64's state after i draws is seed + i x its increment, so element i is the same drawn in any order: the
  // elements go out in chunks over the cores (one loop took 0.9 s for a decode cache's K of 2^26 elements).
  constexpr std::int64_t kChunk = std::int64_t(1) << 16;  // elements a worker draws at a time
  parallel_for((t.numel() + kChunk - 1) / kChunk, [&](int, std::int64_t chunk) {
    const std::int64_t begin = chunk * kChunk, end = std::min(begin + kChunk, t.numel());
    std::uint64_t state = seed + std::uint64_t(begin) * kSplitmixStep;
    for (std::int64_t i = begin; i < end; ++i) {
      const double unit = double(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
      t.set(i, lo + (hi - lo) * unit);
    }
  });
  return t;
}

std::vector<int> shuffled_page_table(const AttentionProblem& p, std::uint64_t seed) {
  if (!p.paged()) throw InvalidProblem("shuffled_page_table: " + p.describe() + " is not paged (page_size = 0)");
  const std::int64_t used = std::int64_t(p.batch) * p.pages_per_sequence();
  if (p.pages < used)
    throw InvalidProblem("shuffled_page_table: pages = " + std::to_string(p.pages) + " cannot hold batch * kv_len / " +
                         "page_size = " + std::to_string(used) + " distinct pages");
  // A Fisher-Yates shuffle of the pool's page numbers (splitmix64, the same order everywhere); the first
  // `used` of them are the sequences' pages, in order.
  std::vector<int> order(std::size_t(p.pages));
  std::iota(order.begin(), order.end(), 0);
  std::uint64_t state = seed;
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(state) % i]);
  order.resize(std::size_t(used));
  return order;
}

namespace {
/// Copies key rows between a contiguous K/V tensor and a page pool, one page-table entry at a time: the pages each
/// sequence's length reaches (validate_page_table checks their entries); the others are never read.
void copy_pages(const AttentionProblem& p, const std::vector<int>& table, const HostTensor& from, HostTensor& to,
                bool into_pool) {
  validate_page_table(p, table);
  const std::size_t page_bytes = std::size_t(p.page_size) * p.kv_heads * p.head_dim * size_of(p.dtype);
  for (std::size_t n = 0; n < table.size(); ++n) {  // logical page n: sequence n / pages_per_sequence
    const int b = int(n / std::size_t(p.pages_per_sequence())), i = int(n % std::size_t(p.pages_per_sequence()));
    if (std::int64_t(i) * p.page_size >= p.kv_len_of(b)) continue;  // past the sequence's length
    const std::size_t logical = n * page_bytes, physical = std::size_t(table[n]) * page_bytes;
    if (into_pool) std::memcpy(to.bytes.data() + physical, from.bytes.data() + logical, page_bytes);
    else std::memcpy(to.bytes.data() + logical, from.bytes.data() + physical, page_bytes);
  }
}

/// A tensor of `shape` whose every element is NaN: one element converted, its bytes repeated.
HostTensor nan_tensor(DType dtype, std::vector<std::int64_t> shape) {
  HostTensor t(dtype, std::move(shape));
  if (t.numel() == 0) return t;
  t.set(0, NAN);
  const std::size_t size = size_of(dtype);
  for (std::size_t at = size; at < t.bytes.size(); at += size) std::memcpy(t.bytes.data() + at, t.bytes.data(), size);
  return t;
}
}  // namespace

HostTensor to_pages(const AttentionProblem& p, const HostTensor& kv, const std::vector<int>& table) {
  if (kv.dtype != p.dtype || kv.shape != kv_shape(p))
    throw InvalidProblem("to_pages: K/V is not [batch, kv_len, kv_heads, head_dim] in the dtype of " + p.describe());
  HostTensor pool = nan_tensor(p.dtype, {p.pages, p.page_size, p.kv_heads, p.head_dim});
  copy_pages(p, table, kv, pool, true);
  return pool;
}

HostTensor from_pages(const AttentionProblem& p, const HostTensor& pool, const std::vector<int>& table) {
  if (pool.dtype != p.dtype || pool.shape != std::vector<std::int64_t>{p.pages, p.page_size, p.kv_heads, p.head_dim})
    throw InvalidProblem("from_pages: the pool is not [pages, page_size, kv_heads, head_dim] in the dtype of " +
                         p.describe());
  HostTensor kv = nan_tensor(p.dtype, kv_shape(p));  // the pages past each length: never read
  copy_pages(p, table, pool, kv, false);
  return kv;
}

AttentionInputs random_inputs(const AttentionProblem& p, std::uint64_t seed, double q_range) {
  AttentionInputs in{random_tensor(p.dtype, q_shape(p), seed * 3 + 1, -q_range, q_range),
                     random_tensor(p.dtype, kv_shape(p), seed * 3 + 2), random_tensor(p.dtype, kv_shape(p), seed * 3 + 3),
                     HostTensor()};
  if (p.sinks) in.sinks = random_tensor(DType::f32, {p.q_heads}, seed * 3 + 5, -2.0, 2.0);
  return in;
}

}  // namespace fa
