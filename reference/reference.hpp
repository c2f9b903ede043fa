/// @file reference.hpp
/// @brief Attention (and step 02's matrix trace) on the CPU in double precision: the ground truth.
///
/// O[b,i,h,:] = sum_j softmax_j(scale * Q[b,i,h,:]·K[b,j,h/g,:]) V[b,j,h/g,:],
/// with g = q_heads / kv_heads and, when causal, only keys j <= i (or, bottom-right aligned, j <= len - q_len + i);
/// with per-sequence lengths only keys j < kv_lens[b] (AttentionProblem::keys_seen). A row that sees no key has
/// O = 0 and LSE = -inf. K and V are always in the contiguous layout here: for a paged problem, the pages gathered
/// in each sequence's order. The softmax subtracts the row maximum before exponentiating, so no score overflows.
/// The row log-sum-exp LSE[b,h,i] = ln sum_j exp(scale * Q[b,i,h,:]·K[b,j,h/g,:]) over the same keys,
/// and the backward's dQ, dK and dV, are computed here too, also in double. The models' features
/// (problem.hpp): a window bounds each row's keys (AttentionProblem::keys_range); soft-capping turns each score
/// s into softcap tanh(s / softcap); sinks (values passed as `sinks`, one a query head) add exp(sink_h) to each
/// row's sum, and so to its LSE, with no value; their gradient is ReferenceGradients::dsinks.
#pragma once

#include "fa/problem.hpp"

#include <vector>

namespace fa {

/// One output row O[b, i, h, 0:head_dim] into out_row. q, k, v are whole
/// tensors in the problem's layout, as doubles. Returns the largest |score|
/// (|scale q.k|) of the keys the row sees. With lse, also the row's log-sum-exp
/// (natural log, computed as max + ln sum exp(score - max), so it never overflows).
double reference_attention_row(const AttentionProblem& p, const double* q, const double* k,
                               const double* v, int b, int i, int h, double* out_row,
                               double* lse = nullptr, const std::vector<double>* sinks = nullptr);

/// The whole output, rows spread over the machine's cores. Validates p.
/// With max_abs_score, also the largest |score| of the whole problem (the
/// tolerances grow with it: see tolerance_for). With lse, also the row
/// log-sum-exp, resized to [batch, q_heads, q_len] (p.lse_elements()), in the same pass.
/// Throws std::invalid_argument naming the tensor whose size does not match p.
/// With p.sinks, `sinks` holds the q_heads sink logits (std::invalid_argument without them, or with them and no
/// p.sinks).
std::vector<double> reference_attention(const AttentionProblem& p, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        double* max_abs_score = nullptr, std::vector<double>* lse = nullptr,
                                        const std::vector<double>* sinks = nullptr);

/// The row log-sum-exp alone (V is not needed): LSE[b,h,i] = ln sum_j exp(scale q_i·k_j) over the
/// keys row i sees, [batch, q_heads, q_len], computed stably (row maximum first). Validates p and the sizes.
std::vector<double> reference_lse(const AttentionProblem& p, const std::vector<double>& q,
                                  const std::vector<double>& k, const std::vector<double>* sinks = nullptr);

/// dQ, dK and dV in double.
struct ReferenceGradients {
  std::vector<double> dq;  ///< dQ, [batch, q_len, q_heads, head_dim]
  std::vector<double> dk;  ///< dK, [batch, kv_len, kv_heads, head_dim], summed over the KV head's group
  std::vector<double> dv;  ///< dV, [batch, kv_len, kv_heads, head_dim], summed over the KV head's group
  std::vector<double> dsinks;  ///< d/dsink_h, [q_heads], with sinks (empty without)
};

/// The gradients of L = sum(O * dO), O = softmax(scale Q Kᵀ, masked) V, in double at exact P and O:
/// dV_j = sum_i P_ij dO_i; dP_ij = dO_i·V_j; D_i = dO_i·O_i; dS_ij = P_ij (dP_ij - D_i);
/// dQ_i = scale sum_j dS_ij K_j; dK_j = scale sum_i dS_ij Q_i (i over every query row, of every
/// query head of the KV head's group, that sees key j). A key no row sees (causal, j >= q_len) gets 0.
/// Under soft-capping dS_ij also takes the cap's slope 1 - (s_ij / softcap)^2 (s_ij the capped score); with sinks
/// P_ij = exp(s_ij - LSE_i) with the sink in LSE_i, and dsink_h = -sum_i exp(sink_h - LSE_i) D_i.
///
/// Two passes, each spread over the machine's cores: one over query rows (b, i, h) computes P, O, LSE_i,
/// D_i and dQ_i (dQ_i needs D_i, which needs the whole row); one over keys (b, j, kv_head) recomputes
/// P_ij = exp(s_ij - LSE_i) for the rows that see key j and sums dK_j and dV_j, as FlashAttention's
/// backward does from the saved LSE. Each output row is written by one thread alone (no atomics, no
/// races); memory beyond the outputs is LSE and D (two doubles per query row) and one row of
/// probabilities per thread, never Nq x Nkv. Validates p; throws std::invalid_argument naming the
/// tensor whose size does not match p.
///
/// `stored_o`, where given: the O a backward reads (a forward's output, rounded to its dtype), shaped like q; D_i is
/// then dO_i·O_i of that O, as every backward computes it, instead of the exact O's. No backward can undo the
/// rounding of its input O, and where the cap saturates (slopes near 0 on most keys) that rounding alone, through D,
/// moves dQ by as much as the dtype's bound (notebook 54): the harness judges a backward at the O it is given.
ReferenceGradients reference_attention_backward(const AttentionProblem& p, const std::vector<double>& q,
                                                const std::vector<double>& k, const std::vector<double>& v,
                                                const std::vector<double>& d_o,
                                                const std::vector<double>* sinks = nullptr,
                                                const std::vector<double>* stored_o = nullptr);

/// The trace of a row-major rows x cols matrix: the sum of its min(rows, cols)
/// diagonal elements, added in double (exact for int sums below 2^53).
/// 0 for an empty matrix; throws std::invalid_argument for a negative size.
double reference_trace(const int* matrix, int rows, int cols);
/// The trace of a row-major rows x cols float matrix, added in double (see the int overload).
double reference_trace(const float* matrix, int rows, int cols);

}  // namespace fa
