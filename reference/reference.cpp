/// @file reference.cpp
/// @brief Attention and the matrix trace on the CPU in double precision: the ground truth.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

namespace fa {

double reference_attention_row(const AttentionProblem& p, const double* q, const double* k,
                               const double* v, int b, int i, int h, double* out_row) {
  const int d = p.head_dim;
  const int kv_head = h / p.group_size();
  const int keys = p.causal ? std::min(i + 1, p.kv_len) : p.kv_len;  // top-left causal: j <= i
  const double scale = p.softmax_scale();
  const double* q_row = q + ((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * d;
  auto kv_row = [&](const double* base, int j) {
    return base + ((std::int64_t(b) * p.kv_len + j) * p.kv_heads + kv_head) * d;
  };

  std::vector<double> scores(keys);
  double row_max = -INFINITY, max_abs = 0;
  for (int j = 0; j < keys; ++j) {
    const double* k_row = kv_row(k, j);
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += q_row[c] * k_row[c];
    scores[j] = scale * dot;
    row_max = std::max(row_max, scores[j]);
    max_abs = std::max(max_abs, std::abs(scores[j]));
  }
  double row_sum = 0;
  for (int j = 0; j < keys; ++j) {
    scores[j] = std::exp(scores[j] - row_max);  // safe softmax: every exponent <= 0
    row_sum += scores[j];
  }
  std::fill(out_row, out_row + d, 0.0);
  for (int j = 0; j < keys; ++j) {
    const double* v_row = kv_row(v, j);
    const double weight = scores[j] / row_sum;
    for (int c = 0; c < d; ++c) out_row[c] += weight * v_row[c];
  }
  return max_abs;
}

std::vector<double> reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        double* max_abs_score) {
  validate(p);
  if (std::int64_t(q.size()) != p.q_elements() || std::int64_t(k.size()) != p.kv_elements() ||
      std::int64_t(v.size()) != p.kv_elements())
    throw std::invalid_argument("reference_attention: tensor sizes do not match " + p.describe());
  std::vector<double> out(q.size());
  const std::int64_t rows = std::int64_t(p.batch) * p.q_len * p.q_heads;
  const int workers = int(std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64u)));
  std::vector<double> worker_max(workers, 0.0);
  auto work = [&](int worker) {
    // Row r is (b, i, h) in the output's own order, so each row is contiguous.
    for (std::int64_t r = worker; r < rows; r += workers) {
      const int h = int(r % p.q_heads);
      const int i = int((r / p.q_heads) % p.q_len);
      const int b = int(r / (std::int64_t(p.q_heads) * p.q_len));
      const double row_max = reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h,
                                                     out.data() + r * p.head_dim);
      worker_max[worker] = std::max(worker_max[worker], row_max);
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& t : threads) t.join();
  if (max_abs_score) *max_abs_score = *std::max_element(worker_max.begin(), worker_max.end());
  return out;
}

namespace {
/// Both overloads of reference_trace: the diagonal summed in double.
template <class T>
double trace_of(const T* matrix, int rows, int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("reference_trace: rows = " + std::to_string(rows) + ", cols = " +
                                std::to_string(cols) + ": sizes must not be negative");
  double sum = 0;
  for (std::int64_t k = 0; k < std::min(rows, cols); ++k) sum += double(matrix[k * (std::int64_t(cols) + 1)]);
  return sum;
}
}  // namespace

double reference_trace(const int* matrix, int rows, int cols) { return trace_of(matrix, rows, cols); }
double reference_trace(const float* matrix, int rows, int cols) { return trace_of(matrix, rows, cols); }

}  // namespace fa
