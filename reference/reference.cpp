/// @file reference.cpp
/// @brief Attention and the matrix trace on the CPU in double precision: the ground truth.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>

namespace fa {

namespace {
/// Row i of head h of sequence b in a [batch, q_len, q_heads, head_dim] tensor (Q, O, dO, dQ).
const double* q_row_of(const AttentionProblem& p, const double* t, int b, int i, int h) {
  return t + ((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim;
}
/// Row j of KV head kv_head of sequence b in a [batch, kv_len, kv_heads, head_dim] tensor (K, V, dK, dV).
const double* kv_row_of(const AttentionProblem& p, const double* t, int b, int j, int kv_head) {
  return t + ((std::int64_t(b) * p.kv_len + j) * p.kv_heads + kv_head) * p.head_dim;
}
/// Where row (b, i) of head h sits in LSE (and in the backward's D): [batch, q_heads, q_len].
std::int64_t lse_index(const AttentionProblem& p, int b, int i, int h) {
  return (std::int64_t(b) * p.q_heads + h) * p.q_len + i;
}

/// x·y over n elements, added in order.
double dot(const double* x, const double* y, int n) {
  double sum = 0;
  for (int c = 0; c < n; ++c) sum += x[c] * y[c];
  return sum;
}

/// The scores scale * q_i·k_j of the keys row (b, i, h) sees (keys 0 .. p.keys_seen(b, i) - 1: the causal mask
/// and the sequence's length), into scores[0:keys]; returns their maximum, -inf when the row sees none.
double row_scores(const AttentionProblem& p, const double* q, const double* k, int b, int i, int h,
                  double* scores) {
  const int keys = p.keys_seen(b, i), kv_head = h / p.group_size();
  const double scale = p.softmax_scale();
  const double* q_row = q_row_of(p, q, b, i, h);
  double row_max = -INFINITY;
  for (int j = 0; j < keys; ++j) {
    scores[j] = scale * dot(q_row, kv_row_of(p, k, b, j, kv_head), p.head_dim);
    row_max = std::max(row_max, scores[j]);
  }
  return row_max;
}

/// Threads parallel_for uses for count items: one per core (at most 64), no more than items, at least 1.
int workers_for(std::int64_t count) {
  const std::int64_t cores = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 64u);
  return int(std::max<std::int64_t>(1, std::min(count, cores)));
}

/// work(worker, index) for every index in [0, count), worker < workers_for(count), spread over the cores.
/// Worker w takes indices w, w + workers, ...: interleaved, so causal rows of every length are shared out.
template <class Work>
void parallel_for(std::int64_t count, Work work) {
  const int workers = workers_for(count);
  auto run = [&](int worker) {
    for (std::int64_t index = worker; index < count; index += workers) work(worker, index);
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
}

/// Throws std::invalid_argument("<function>: <tensor> has N elements; <problem> needs M") on a mismatch.
void check_size(const char* function, const char* tensor, std::size_t size, std::int64_t expected,
                const AttentionProblem& p) {
  if (std::int64_t(size) != expected)
    throw std::invalid_argument(std::string(function) + ": " + tensor + " has " + std::to_string(size) +
                                " elements; " + p.describe() + " needs " + std::to_string(expected));
}
}  // namespace

double reference_attention_row(const AttentionProblem& p, const double* q, const double* k,
                               const double* v, int b, int i, int h, double* out_row, double* lse) {
  const int d = p.head_dim;
  const int kv_head = h / p.group_size();
  const int keys = p.keys_seen(b, i);  // the mask and the sequence's length

  std::fill(out_row, out_row + d, 0.0);
  if (keys == 0) {  // a row that sees no key: O = 0, LSE = -inf (the empty sum)
    if (lse) *lse = -INFINITY;
    return 0;
  }
  std::vector<double> scores(keys);
  const double row_max = row_scores(p, q, k, b, i, h, scores.data());
  double max_abs = 0;
  for (int j = 0; j < keys; ++j) max_abs = std::max(max_abs, std::abs(scores[j]));
  double row_sum = 0;
  for (int j = 0; j < keys; ++j) {
    scores[j] = std::exp(scores[j] - row_max);  // safe softmax: every exponent <= 0
    row_sum += scores[j];
  }
  if (lse) *lse = row_max + std::log(row_sum);  // row_sum >= 1: the maximum's term is exp(0)
  for (int j = 0; j < keys; ++j) {
    const double* v_row = kv_row_of(p, v, b, j, kv_head);
    const double weight = scores[j] / row_sum;
    for (int c = 0; c < d; ++c) out_row[c] += weight * v_row[c];
  }
  return max_abs;
}

std::vector<double> reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        double* max_abs_score, std::vector<double>* lse) {
  validate(p);
  check_size("reference_attention", "q", q.size(), p.q_elements(), p);
  check_size("reference_attention", "k", k.size(), p.kv_elements(), p);
  check_size("reference_attention", "v", v.size(), p.kv_elements(), p);
  std::vector<double> out(q.size());
  if (lse) lse->assign(p.lse_elements(), 0.0);
  const std::int64_t rows = std::int64_t(p.batch) * p.q_len * p.q_heads;
  std::vector<double> worker_max(workers_for(rows), 0.0);
  // Row r is (b, i, h) in the output's own order, so each row is contiguous.
  parallel_for(rows, [&](int worker, std::int64_t r) {
    const int h = int(r % p.q_heads);
    const int i = int((r / p.q_heads) % p.q_len);
    const int b = int(r / (std::int64_t(p.q_heads) * p.q_len));
    const double row_max = reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h,
                                                   out.data() + r * p.head_dim,
                                                   lse ? lse->data() + lse_index(p, b, i, h) : nullptr);
    worker_max[worker] = std::max(worker_max[worker], row_max);
  });
  if (max_abs_score) *max_abs_score = *std::max_element(worker_max.begin(), worker_max.end());
  return out;
}

std::vector<double> reference_lse(const AttentionProblem& p, const std::vector<double>& q,
                                  const std::vector<double>& k) {
  validate(p);
  check_size("reference_lse", "q", q.size(), p.q_elements(), p);
  check_size("reference_lse", "k", k.size(), p.kv_elements(), p);
  std::vector<double> lse(p.lse_elements());
  // Index r is (b, h, i), LSE's own order.
  parallel_for(p.lse_elements(), [&](int, std::int64_t r) {
    const int i = int(r % p.q_len);
    const int h = int((r / p.q_len) % p.q_heads);
    const int b = int(r / (std::int64_t(p.q_heads) * p.q_len));
    std::vector<double> scores(p.keys_seen(b, i));
    const double row_max = row_scores(p, q.data(), k.data(), b, i, h, scores.data());
    double row_sum = 0;
    for (double s : scores) row_sum += std::exp(s - row_max);
    lse[r] = scores.empty() ? -INFINITY : row_max + std::log(row_sum);  // no key: the empty sum's log
  });
  return lse;
}

ReferenceGradients reference_attention_backward(const AttentionProblem& p, const std::vector<double>& q,
                                                const std::vector<double>& k, const std::vector<double>& v,
                                                const std::vector<double>& d_o) {
  validate(p);
  const char* self = "reference_attention_backward";
  check_size(self, "q", q.size(), p.q_elements(), p);
  check_size(self, "k", k.size(), p.kv_elements(), p);
  check_size(self, "v", v.size(), p.kv_elements(), p);
  check_size(self, "d_o", d_o.size(), p.q_elements(), p);
  const int d = p.head_dim, g = p.group_size();
  const double scale = p.softmax_scale();
  ReferenceGradients grads{std::vector<double>(q.size()), std::vector<double>(k.size()),
                           std::vector<double>(v.size())};
  // Per query row, what the key pass needs: LSE_i (to recompute P_ij) and D_i = dO_i·O_i.
  std::vector<double> lse(p.lse_elements()), delta(p.lse_elements());

  // Pass 1, over query rows r = (b, i, h) in dQ's order: P, the exact O, D_i, and
  // dQ_i = scale sum_j P_ij (dO_i·V_j - D_i) K_j.
  parallel_for(std::int64_t(p.batch) * p.q_len * p.q_heads, [&](int, std::int64_t r) {
    const int h = int(r % p.q_heads);
    const int i = int((r / p.q_heads) % p.q_len);
    const int b = int(r / (std::int64_t(p.q_heads) * p.q_len));
    const int keys = p.keys_seen(b, i), kv_head = h / g;
    if (keys == 0) {  // a row that sees no key: O = 0, so D = 0, and dQ = 0 (already)
      lse[lse_index(p, b, i, h)] = -INFINITY;
      return;
    }
    std::vector<double> probs(keys), o(d, 0.0);
    const double row_max = row_scores(p, q.data(), k.data(), b, i, h, probs.data());
    double row_sum = 0;
    for (int j = 0; j < keys; ++j) row_sum += probs[j] = std::exp(probs[j] - row_max);
    for (int j = 0; j < keys; ++j) {
      probs[j] /= row_sum;  // P_ij
      const double* v_row = kv_row_of(p, v.data(), b, j, kv_head);
      for (int c = 0; c < d; ++c) o[c] += probs[j] * v_row[c];
    }
    const double* do_row = q_row_of(p, d_o.data(), b, i, h);
    const double D = dot(do_row, o.data(), d);
    lse[lse_index(p, b, i, h)] = row_max + std::log(row_sum);
    delta[lse_index(p, b, i, h)] = D;
    double* dq_row = grads.dq.data() + r * d;
    for (int j = 0; j < keys; ++j) {
      const double dS = probs[j] * (dot(do_row, kv_row_of(p, v.data(), b, j, kv_head), d) - D);
      const double* k_row = kv_row_of(p, k.data(), b, j, kv_head);
      for (int c = 0; c < d; ++c) dq_row[c] += dS * k_row[c];
    }
    for (int c = 0; c < d; ++c) dq_row[c] *= scale;
  });

  // Pass 2, over keys r = (b, j, kv_head) in dK's order: every query row of every head of the group
  // that sees key j (p.keys_seen(b, i) > j: the mask and the sequence's length) adds its share; only this
  // item writes row r. A key past its sequence's length, or one no row sees, gets 0.
  parallel_for(std::int64_t(p.batch) * p.kv_len * p.kv_heads, [&](int, std::int64_t r) {
    const int kv_head = int(r % p.kv_heads);
    const int j = int((r / p.kv_heads) % p.kv_len);
    const int b = int(r / (std::int64_t(p.kv_heads) * p.kv_len));
    const double* k_row = kv_row_of(p, k.data(), b, j, kv_head);
    const double* v_row = kv_row_of(p, v.data(), b, j, kv_head);
    double* dk_row = grads.dk.data() + r * d;
    double* dv_row = grads.dv.data() + r * d;
    for (int h = kv_head * g; h < (kv_head + 1) * g; ++h)
      for (int i = 0; i < p.q_len; ++i) {
        if (p.keys_seen(b, i) <= j) continue;
        const double* q_row = q_row_of(p, q.data(), b, i, h);
        const double* do_row = q_row_of(p, d_o.data(), b, i, h);
        const double P = std::exp(scale * dot(q_row, k_row, d) - lse[lse_index(p, b, i, h)]);
        const double dS = P * (dot(do_row, v_row, d) - delta[lse_index(p, b, i, h)]);
        for (int c = 0; c < d; ++c) {
          dv_row[c] += P * do_row[c];
          dk_row[c] += dS * q_row[c];
        }
      }
    for (int c = 0; c < d; ++c) dk_row[c] *= scale;
  });
  return grads;
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
