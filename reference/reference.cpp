/// @file reference.cpp
/// @brief Attention and the matrix trace on the CPU in double precision: the ground truth.
#include "reference.hpp"

#include "fa/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fa {

namespace {
/// Row i of head h of sequence b in a [batch, q_len, q_heads, head_dim] tensor (Q, O, dO, dQ), or a packed
/// [total_q, q_heads, head_dim] one (varlen).
const double* q_row_of(const AttentionProblem& p, const double* t, int b, int i, int h) {
  return t + (p.q_row(b, i) * p.q_heads + h) * p.head_dim;
}
/// Row j of KV head kv_head of sequence b in a [batch, kv_len, kv_heads, head_dim] tensor (K, V, dK, dV), or a
/// packed [total_k, kv_heads, head_dim] one.
const double* kv_row_of(const AttentionProblem& p, const double* t, int b, int j, int kv_head) {
  return t + (p.kv_row(b, j) * p.kv_heads + kv_head) * p.head_dim;
}
/// Where row (b, i) of head h sits in LSE (and in the backward's D): [batch, q_heads, q_len], or
/// [q_heads, total_q] (varlen).
std::int64_t lse_index(const AttentionProblem& p, int b, int i, int h) { return p.lse_index(b, i, h); }

/// A query row by its sequence, its row in the sequence and its head.
struct QueryRow {
  int b;  ///< the sequence
  int i;  ///< the row in the sequence
  int h;  ///< the query head
};
/// Query row r = (row of Q, head) of the output's own order, [total_q, q_heads]: its sequence, row and head.
QueryRow query_row(const AttentionProblem& p, std::int64_t r) {
  const std::int64_t row = r / p.q_heads;
  const int b = p.sequence_of_q_row(row);
  return {b, int(row - p.q_row(b, 0)), int(r % p.q_heads)};
}

/// x·y over n elements, added in order.
double dot(const double* x, const double* y, int n) {
  double sum = 0;
  for (int c = 0; c < n; ++c) sum += x[c] * y[c];
  return sum;
}

/// One score: s = scale q·k, soft-capped to softcap tanh(s / softcap) when the problem caps.
double score_of(const AttentionProblem& p, const double* q_row, const double* k_row) {
  const double s = p.softmax_scale() * dot(q_row, k_row, p.head_dim);
  return p.softcap > 0 ? p.softcap * std::tanh(s / p.softcap) : s;
}

/// d score / d (scale q·k) at a score s (already capped): 1, or 1 - (s / softcap)^2 under soft-capping.
double cap_slope(const AttentionProblem& p, double s) {
  return p.softcap > 0 ? 1.0 - (s / p.softcap) * (s / p.softcap) : 1.0;
}

/// The scores of the keys row (b, i, h) sees (keys [first, last) of p.keys_range(b, i): the mask, the window and
/// the sequence's length), key first + x into scores[x]; returns their maximum, -inf when the row sees none.
double row_scores(const AttentionProblem& p, const double* q, const double* k, int b, int i, int h,
                  double* scores) {
  const KeyRange keys = p.keys_range(b, i);
  const int kv_head = h / p.group_size();
  const double* q_row = q_row_of(p, q, b, i, h);
  double row_max = -INFINITY;
  for (int j = keys.first; j < keys.last; ++j) {
    scores[j - keys.first] = score_of(p, q_row, kv_row_of(p, k, b, j, kv_head));
    row_max = std::max(row_max, scores[j - keys.first]);
  }
  return row_max;
}

/// Head h's sink logit, or -inf (exp(-inf) = 0: no sink) when the problem has none.
double sink_of(const AttentionProblem& p, const std::vector<double>* sinks, int h) {
  return p.sinks ? (*sinks)[std::size_t(h)] : -INFINITY;
}

/// Throws std::invalid_argument("<function>: <tensor> has N elements; <problem> needs M") on a mismatch.
void check_size(const char* function, const char* tensor, std::size_t size, std::int64_t expected,
                const AttentionProblem& p) {
  if (std::int64_t(size) != expected)
    throw std::invalid_argument(std::string(function) + ": " + tensor + " has " + std::to_string(size) +
                                " elements; " + p.describe() + " needs " + std::to_string(expected));
}

/// Throws std::invalid_argument when the problem has sinks and `sinks` is not q_heads values, or has none and
/// `sinks` is given.
void check_sinks(const char* function, const std::vector<double>* sinks, const AttentionProblem& p) {
  if (p.sinks && !sinks)
    throw std::invalid_argument(std::string(function) + ": " + p.describe() + " has sinks; pass their values");
  if (!p.sinks && sinks)
    throw std::invalid_argument(std::string(function) + ": sink values given, but " + p.describe() +
                                " has no sinks (AttentionProblem::sinks)");
  if (sinks) check_size(function, "sinks", sinks->size(), p.q_heads, p);
}
}  // namespace

double reference_attention_row(const AttentionProblem& p, const double* q, const double* k,
                               const double* v, int b, int i, int h, double* out_row, double* lse,
                               const std::vector<double>* sinks) {
  const int d = p.head_dim;
  const int kv_head = h / p.group_size();
  const KeyRange range = p.keys_range(b, i);  // the mask, the window and the sequence's length
  const int keys = range.count();
  const double sink = sink_of(p, sinks, h);

  std::fill(out_row, out_row + d, 0.0);
  if (keys == 0) {  // a row that sees no key: O = 0, LSE = -inf (the empty sum), or the sink's logit
    if (lse) *lse = sink;
    return 0;
  }
  std::vector<double> scores(keys);
  const double row_max = std::max(row_scores(p, q, k, b, i, h, scores.data()), sink);
  double max_abs = 0;
  for (int x = 0; x < keys; ++x) max_abs = std::max(max_abs, std::abs(scores[x]));
  double row_sum = std::exp(sink - row_max);  // the sink's term (0 without one): in the sum, with no value
  for (int x = 0; x < keys; ++x) {
    scores[x] = std::exp(scores[x] - row_max);  // safe softmax: every exponent <= 0
    row_sum += scores[x];
  }
  if (lse) *lse = row_max + std::log(row_sum);  // row_sum >= 1: the maximum's term is exp(0)
  for (int x = 0; x < keys; ++x) {
    const double* v_row = kv_row_of(p, v, b, range.first + x, kv_head);
    const double weight = scores[x] / row_sum;
    for (int c = 0; c < d; ++c) out_row[c] += weight * v_row[c];
  }
  return max_abs;
}

std::vector<double> reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        double* max_abs_score, std::vector<double>* lse,
                                        const std::vector<double>* sinks) {
  validate(p);
  check_sinks("reference_attention", sinks, p);
  check_size("reference_attention", "q", q.size(), p.q_elements(), p);
  check_size("reference_attention", "k", k.size(), p.kv_elements(), p);
  check_size("reference_attention", "v", v.size(), p.kv_elements(), p);
  std::vector<double> out(q.size());
  if (lse) lse->assign(p.lse_elements(), 0.0);
  const std::int64_t rows = p.total_q() * p.q_heads;
  std::vector<double> worker_max(workers_for(rows), 0.0);
  // Row r is (b, i, h) in the output's own order, so each row is contiguous.
  parallel_for(rows, [&](int worker, std::int64_t r) {
    const auto [b, i, h] = query_row(p, r);
    const double row_max = reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h,
                                                   out.data() + r * p.head_dim,
                                                   lse ? lse->data() + lse_index(p, b, i, h) : nullptr, sinks);
    worker_max[worker] = std::max(worker_max[worker], row_max);
  });
  if (max_abs_score) *max_abs_score = *std::max_element(worker_max.begin(), worker_max.end());
  return out;
}

std::vector<double> reference_lse(const AttentionProblem& p, const std::vector<double>& q,
                                  const std::vector<double>& k, const std::vector<double>* sinks) {
  validate(p);
  check_sinks("reference_lse", sinks, p);
  check_size("reference_lse", "q", q.size(), p.q_elements(), p);
  check_size("reference_lse", "k", k.size(), p.kv_elements(), p);
  std::vector<double> lse(p.lse_elements());
  // Index r is (b, i, h) in Q's order; each writes its own LSE entry.
  parallel_for(p.lse_elements(), [&](int, std::int64_t r) {
    const auto [b, i, h] = query_row(p, r);
    std::vector<double> scores(p.keys_range(b, i).count());
    const double sink = sink_of(p, sinks, h);
    const double row_max = std::max(row_scores(p, q.data(), k.data(), b, i, h, scores.data()), sink);
    double row_sum = std::exp(sink - row_max);
    for (double s : scores) row_sum += std::exp(s - row_max);
    // No key and no sink: the empty sum's log, -inf.
    lse[std::size_t(lse_index(p, b, i, h))] = row_max == -INFINITY ? -INFINITY : row_max + std::log(row_sum);
  });
  return lse;
}

ReferenceGradients reference_attention_backward(const AttentionProblem& p, const std::vector<double>& q,
                                                const std::vector<double>& k, const std::vector<double>& v,
                                                const std::vector<double>& d_o, const std::vector<double>* sinks,
                                                const std::vector<double>* stored_o) {
  validate(p);
  const char* self = "reference_attention_backward";
  check_sinks(self, sinks, p);
  if (stored_o) check_size(self, "stored_o", stored_o->size(), p.q_elements(), p);
  check_size(self, "q", q.size(), p.q_elements(), p);
  check_size(self, "k", k.size(), p.kv_elements(), p);
  check_size(self, "v", v.size(), p.kv_elements(), p);
  check_size(self, "d_o", d_o.size(), p.q_elements(), p);
  const int d = p.head_dim, g = p.group_size();
  const double scale = p.softmax_scale();
  ReferenceGradients grads{std::vector<double>(q.size()), std::vector<double>(k.size()),
                           std::vector<double>(v.size()), {}};
  // Per query row, what the key pass needs: LSE_i (to recompute P_ij) and D_i = dO_i·O_i (of stored_o, where given).
  std::vector<double> lse(p.lse_elements()), delta(p.lse_elements());

  // Pass 1, over query rows r = (b, i, h) in dQ's order: P, the exact O, D_i, and
  // dQ_i = scale sum_j P_ij (dO_i·V_j - D_i) c'(s_ij) K_j, c' the soft-cap's slope (1 without one).
  parallel_for(p.total_q() * p.q_heads, [&](int, std::int64_t r) {
    const auto [b, i, h] = query_row(p, r);
    const KeyRange range = p.keys_range(b, i);
    const int keys = range.count(), kv_head = h / g;
    const double sink = sink_of(p, sinks, h);
    if (keys == 0) {  // a row that sees no key: O = 0, so D = 0, and dQ = 0 (already); LSE the sink's, or -inf
      lse[lse_index(p, b, i, h)] = sink;
      return;
    }
    std::vector<double> probs(keys), capped(keys), o(d, 0.0);
    const double row_max = std::max(row_scores(p, q.data(), k.data(), b, i, h, capped.data()), sink);
    double row_sum = std::exp(sink - row_max);
    for (int x = 0; x < keys; ++x) row_sum += probs[x] = std::exp(capped[x] - row_max);
    for (int x = 0; x < keys; ++x) {
      probs[x] /= row_sum;  // P_ij
      const double* v_row = kv_row_of(p, v.data(), b, range.first + x, kv_head);
      for (int c = 0; c < d; ++c) o[c] += probs[x] * v_row[c];
    }
    const double* do_row = q_row_of(p, d_o.data(), b, i, h);
    const double D = dot(do_row, stored_o ? q_row_of(p, stored_o->data(), b, i, h) : o.data(), d);
    lse[lse_index(p, b, i, h)] = row_max + std::log(row_sum);
    delta[lse_index(p, b, i, h)] = D;
    double* dq_row = grads.dq.data() + r * d;
    for (int x = 0; x < keys; ++x) {
      const int j = range.first + x;
      const double dS =
          probs[x] * (dot(do_row, kv_row_of(p, v.data(), b, j, kv_head), d) - D) * cap_slope(p, capped[x]);
      const double* k_row = kv_row_of(p, k.data(), b, j, kv_head);
      for (int c = 0; c < d; ++c) dq_row[c] += dS * k_row[c];
    }
    for (int c = 0; c < d; ++c) dq_row[c] *= scale;
  });

  // Pass 2, over keys r = (b, j, kv_head) in dK's order: every query row of every head of the group
  // that sees key j (j in p.keys_range(b, i): the mask, the window and the sequence's length) adds its share;
  // only this item writes row r. A key past its sequence's length, or one no row sees, gets 0.
  parallel_for(p.total_k() * p.kv_heads, [&](int, std::int64_t r) {
    const int kv_head = int(r % p.kv_heads);
    const int b = p.sequence_of_kv_row(r / p.kv_heads);
    const int j = int(r / p.kv_heads - p.kv_row(b, 0));
    const double* k_row = kv_row_of(p, k.data(), b, j, kv_head);
    const double* v_row = kv_row_of(p, v.data(), b, j, kv_head);
    double* dk_row = grads.dk.data() + r * d;
    double* dv_row = grads.dv.data() + r * d;
    for (int h = kv_head * g; h < (kv_head + 1) * g; ++h)
      for (int i = 0; i < p.q_len_of(b); ++i) {
        const KeyRange range = p.keys_range(b, i);
        if (j < range.first || j >= range.last) continue;
        const double* q_row = q_row_of(p, q.data(), b, i, h);
        const double* do_row = q_row_of(p, d_o.data(), b, i, h);
        const double s = score_of(p, q_row, k_row);
        const double P = std::exp(s - lse[lse_index(p, b, i, h)]);
        const double dS = P * (dot(do_row, v_row, d) - delta[lse_index(p, b, i, h)]) * cap_slope(p, s);
        for (int c = 0; c < d; ++c) {
          dv_row[c] += P * do_row[c];
          dk_row[c] += dS * q_row[c];
        }
      }
    for (int c = 0; c < d; ++c) dk_row[c] *= scale;
  });
  // The sinks': dL/dsink_h = -sum over the head's rows of P_sink,i D_i, P_sink,i = exp(sink_h - LSE_i) (the sink
  // takes its share of each row's weight, and has no value: each O_i moves by -P_sink,i O_i).
  if (p.sinks) {
    grads.dsinks.assign(std::size_t(p.q_heads), 0.0);
    for (int h = 0; h < p.q_heads; ++h)
      for (int b = 0; b < p.batch; ++b)
        for (int i = 0; i < p.q_len_of(b); ++i) {
          const std::int64_t x = lse_index(p, b, i, h);
          if (lse[x] != -INFINITY) grads.dsinks[std::size_t(h)] -= std::exp((*sinks)[std::size_t(h)] - lse[x]) * delta[x];
        }
  }
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
