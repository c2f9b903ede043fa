/// @file compare.hpp
/// @brief Comparing a step's output with the float64 reference, and the tolerances.
#pragma once

#include "fa/dtype.hpp"
#include "fa/host_tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

/// How far an output is from the reference.
struct ErrorStats {
  double rel_l2 = 0;            ///< ||out - ref||_2 / ||ref||_2
  double max_abs = 0;           ///< max |out - ref| over finite outputs
  std::int64_t non_finite = 0;  ///< NaN or Inf outputs (unwritten elements stay NaN), or not -inf where the reference is
  std::int64_t count = 0;       ///< elements compared
  /// "rel_l2 = ..., max_abs = ..., non-finite = ...", for failure messages.
  std::string describe() const;
};

/// Largest errors a step may make, per output type.
struct Tolerance {
  double rel_l2;   ///< largest relative L2 error allowed
  double max_abs;  ///< largest absolute error of one element allowed
  double row_rel;  ///< largest relative L2 error of any one output row (d elements)
};

/// The tolerances, written once.
///
/// Base (inputs of order 1, scores within a few units): f32: float accumulation of O(1000) terms
/// stays near 1e-6 relative; 1e-5 leaves room without hiding bugs (a wrong mask or scale gives
/// errors of order 1e-1). f16: the output alone is rounded to 11 bits (relative 2^-11 = 4.9e-4 per
/// element), so 2e-3 relative L2. bf16: 8 significant bits, output rounding 2^-8 = 3.9e-3 relative
/// per element (and tensor-core steps round P to bf16 too), so f16's bounds times 2^3 for the three
/// bits bf16 lacks: 1.6e-2 relative L2, 3.2e-2 max abs.
///
/// Per row: one row is d elements, so its relative error scatters around the whole output's; twice
/// the whole-output bound still sits far below what a wrong row gives (order 1e-1 to 1).
///
/// Large scores (max_abs_score, the largest |scale q.k| of the problem): every step forms S in float
/// and P = exp(S - m), so S and m each carry about one float rounding at their magnitude, 2^-24 |S|
/// relative to 1 in the exponent: P moves by up to 2 * 2^-24 * max|S| relatively, and the weighted
/// average O by up to twice that. Both bounds get 8 * 2^-24 * max|S| added: nothing at |S| ~ 3,
/// 5e-5 at logits of standard deviation 30, 5e-4 with an offset of +1000 on every score.
Tolerance tolerance_for(DType dtype, double max_abs_score = 0);

/// The tolerances of a gradient (dQ, dK or dV), written once.
///
/// A gradient is the end of a longer chain than O: P is recomputed from LSE, dP - D subtracts two dot
/// products of the same size, and dS = P (dP - D) feeds two more products. Each dtype's relative L2
/// bound is twice the forward's: f16 rounds O (in D), P and dS (on tensor cores) and the gradient
/// itself to 11 bits, bf16 to 8, f32 carries float rounding through twice as many sums. Gradients are
/// not of order 1 (dV of key 0 sums over every query row under a causal mask), so max_abs is relative
/// to the largest |reference| element of the tensor, at twice the relative L2 bound (the forward's f16
/// and bf16 ratio; the largest error of 10^5 elements sits several standard deviations out). A row's
/// error is relative to its own norm or to the RMS row norm, whichever is larger: a row whose gradient
/// cancels to near zero (a saturated softmax row, where dP_ij - D_i is the difference of two nearly
/// equal numbers) is judged against a typical row.
///
/// Large scores: S and LSE each carry a float rounding at their magnitude, so the exponent of every
/// recomputed P_ij is off by up to 2 * 2^-24 * max|S|, independently per score; and sum_j dS_ij = 0
/// cancels in dQ, so those errors are not shrunk by the sum the way O's are. The score term is twice
/// the forward's, 16 * 2^-24 * max|S|: 1e-3 relative with +1000 on every score (an H100 run of step
/// 26 in f32 measured 5.4e-4 of the largest |dQ| there, against the 5.0e-4 the forward's term allows).
Tolerance gradient_tolerance_for(DType dtype, double max_abs_score = 0);

/// The largest absolute error of one LSE element: 2e-5 (a float log of a float sum of exponentials
/// that each carry ex2.approx's 2^-22) plus the forward's score term doubled, 16 * 2^-24 * max|S| (LSE
/// holds the row max at its magnitude). A wrong LSE (a log2, a missing max, a wrong row) is off by
/// order 1.
double lse_tolerance(double max_abs_score = 0);

/// What the harness concluded about one output: the errors, the bounds, and the first check that
/// failed, in the order they are made: non-finite outputs, relative L2, worst row, max abs.
struct Verdict {
  ErrorStats global;                ///< errors over the whole output
  double worst_row_rel = 0;         ///< largest relative L2 error of one row
  std::int64_t worst_row = -1;      ///< that row's index (b, i, h flattened), -1 if none
  Tolerance tolerance{};            ///< the bounds applied
  std::string failed;               ///< "" when every check passed; else the first failing check
  std::string tensor = "O";         ///< what was judged: "O", "LSE", "dQ", "dK" or "dV"
  /// True when every check passed.
  bool passed() const { return failed.empty(); }
  /// "failed: <check> (<numbers>)" or "passed (<numbers>)", for messages and tables.
  std::string describe() const;
};

/// Compares out with ref row by row (rows of row_length elements) and against tolerance_for(dtype,
/// max_abs_score). Rows with a zero reference norm are judged by their absolute error.
Verdict judge(const HostTensor& out, const std::vector<double>& ref, int row_length, double max_abs_score = 0);

/// A gradient (dQ, dK or dV) against its float64 reference, with gradient_tolerance_for's bounds: max
/// abs relative to the larger of max |ref| and 2^-10 of `magnitude`, each row relative to the larger of
/// its norm and the RMS row norm. `magnitude` is the largest |element| of the call's three gradients:
/// where a gradient cancels to zero everywhere (one key: dS = P (dP - D) = 0 exactly, in exact
/// arithmetic), its rounding is relative to the terms that cancel, not to their difference, and an
/// H100 run gave |dQ| of 6e-8 there against a zero reference.
Verdict judge_gradient(const HostTensor& out, const std::vector<double>& ref, int row_length, double max_abs_score,
                       const std::string& tensor, double magnitude = 0);

/// dQ, dK and dV of one call, each judged with judge_gradient against its float64 reference (in that
/// order), with the call's largest reference element as `magnitude`.
std::vector<Verdict> judge_gradients(const Gradients& out, const std::vector<double>& dq, const std::vector<double>& dk,
                                     const std::vector<double>& dv, int head_dim, double max_abs_score);

/// The sinks' gradient (f32 [q_heads]) of a backward call on inputs of `dtype`, against its float64 reference,
/// as one row with gradient_tolerance_for(dtype)'s bounds, as dQ, dK and dV are: it is summed in float from
/// D_i = dO_i . O_i of the O the backward reads (rounded to `dtype`; the harness's reference takes D from that O too,
/// reference_attention_backward's stored_o).
Verdict judge_dsinks(const HostTensor& out, const std::vector<double>& ref, DType dtype, double max_abs_score);

/// LSE (f32, one value per query row) against its float64 reference, element by element with
/// lse_tolerance's bound.
Verdict judge_lse(const HostTensor& out, const std::vector<double>& ref, double max_abs_score = 0);

/// Compares out (any dtype) with ref element by element.
ErrorStats compare(const HostTensor& out, const std::vector<double>& ref);
/// Compares n values of out with n values of ref.
ErrorStats compare(const double* out, const double* ref, std::int64_t n);

/// No NaN/Inf and both errors within the tolerance.
bool within(const ErrorStats& stats, const Tolerance& tol);

}  // namespace fa
