/// @file harness.hpp
/// @brief The cases every implementation must pass, and how one is judged: the steps' GPU tests, the
/// mutation suite and the exercise grader all run through here.
#pragma once

#include "fa/compare.hpp"
#include "fa/registry.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fa::test {

/// How a case's inputs are drawn.
enum class InputKind {
  uniform,       ///< Q, K, V uniform in [-1, 1): scores within a few units
  wide_10,       ///< Q uniform in [-30, 30): scores of standard deviation about 10
  wide_30,       ///< Q uniform in [-90, 90): scores of standard deviation about 30 (exp(S) overflows float)
  offset_1000,   ///< every score of a row shifted by the same 8192 * scale (about +1000 at d = 64)
  offset_minus_1000,  ///< every score of a row shifted by -8192 * scale (about -1000): the LSE is about -1000
  zero_scale,    ///< scale = 0: every visible key weighs the same, O is the mean of V's visible rows
  dominant_key,  ///< key 0 outscores every other by about 40: O is V's row 0, exactly
  dominant_sink,  ///< with sinks: each head's sink logit 4 + ln(kv_len), so it weighs some 50 times a row's keys
};

/// One case of the harness: a problem and how its inputs are made.
struct Case {
  std::string name;          ///< what the case tests, e.g. "GQA 8/2, lengths no tile divides"
  AttentionProblem problem;  ///< shapes, dtype, mask, scale
  InputKind kind = InputKind::uniform;  ///< how the inputs are drawn
  /// Graded on the forward only: a decode case of inputs that stress the numerics (inference has no backward,
  /// and one query row's dK over wide logits is about 0 in most rows: no relative bound measures it).
  bool forward_only = false;
  /// "name: B=.. Nq=.. ... f16 causal", for messages and tables.
  std::string describe() const;
};

/// The shape table: lengths 1, 7, 100 and 1000, lengths no tile size divides, q_len != kv_len both
/// ways, GQA 8/2 and MQA 8/1, a custom scale, a negative scale, batch 3, a few query rows over many keys,
/// and the KV cache's forms (per-sequence lengths, pages, bottom-right causal: run by the steps that take
/// them; every count of new tokens 1 .. 8 with and without the mask, sequences of no keys beside long ones, pages
/// of 1, 4, 12 and 48 keys, every score about -1000; K and V rows past each sequence's length are NaN, prepare());
/// the models' features in decode (windows about a page, caps of 5, sinks over several splits; K and V rows before
/// a window's first key NaN too);
/// at head_dim 64 (or, when `head_dims` lacks 64, its first), and three shapes and two of the cache's
/// at every other head_dim in `head_dims`; each for every dtype in `dtypes`, causal off and on. Shapes longer
/// than max_len (> 0) are left out (sanitizer runs).
std::vector<Case> shape_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len = 0);

/// Inputs that stress the numerics, at one head_dim (64 where the step takes it): logits of standard
/// deviation 10 and 30, +1000 on every score, scale = 0, one dominant key, kv_len = 16411 and decode
/// (q_len = 1) over it, decode over 5000 keys with logits of standard deviation 30 and over 3000 keys with
/// one dominant key, -1000 on every score over a kv_len no tile divides and (decode) over 5000 keys, and a causal
/// 4099 x 4099; at every other head_dim in `head_dims`, logits of standard
/// deviation 10, kv_len = 4099 and decode over 16411 keys; each for every dtype in `dtypes`.
/// Top-left causal masking leaves every row at least key 0, so no row is fully masked.
std::vector<Case> stress_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len = 0);

/// The shape table, then the stress cases: every case a step of `pass` is graded on. The backward
/// leaves out the dominant key, whose gradients (dQ, dK) are zero to within e^-40 and so smaller than
/// any rounding of O in D_i = dO_i . O_i: a relative bound has nothing to measure there; and the cases
/// marked forward_only. The forward takes every case.
std::vector<Case> graded_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len,
                               Pass pass);

/// The cases `step` supports out of `cases`.
std::vector<Case> supported_by(const StepInfo& step, const std::vector<Case>& cases);

/// A case made ready to run: its inputs (fresh for every seed) and the output it must give.
struct Prepared {
  AttentionInputs inputs;         ///< Q, K, V
  std::vector<double> expected;   ///< O: the float64 reference, or the exact answer where one is known
  std::vector<double> expected_lse;  ///< LSE, [batch, q_heads, q_len], from the float64 reference
  double max_abs_score = 0;       ///< largest |scale q.k|: the tolerances grow with it
  std::uint64_t seed = 0;         ///< the seed the inputs came from
  /// Prepared for a backward step: O (the reference's, rounded to the dtype), LSE (rounded to f32)
  /// and a random dO, and the gradients they must give.
  bool backward = false;
  BackwardInputs backward_inputs;      ///< O, LSE and dO, when `backward`
  std::vector<double> expected_dq;     ///< dQ from the float64 reference, when `backward`
  std::vector<double> expected_dk;     ///< dK, summed over each KV head's group
  std::vector<double> expected_dv;     ///< dV, summed likewise
  std::vector<double> expected_dsinks;  ///< the sinks' gradient, [q_heads], with sinks (else empty)
};

/// Draws the case's inputs from `seed` and computes what the output must be; for Pass::backward also
/// dO and the gradients.
Prepared prepare(const Case& c, std::uint64_t seed, Pass pass = Pass::forward);

/// How run_case names a failure of the second call of a step that asks for a workspace: the first
/// call passed, so the step left its workspace in a state the next call cannot start from.
inline constexpr char kSecondCall[] = "second call on the same workspace: ";

/// Runs `step` on the prepared case (outputs poisoned with NaN first) and judges every element: a
/// forward step's O and LSE, a backward step's dQ, dK and dV, and with sinks dsinks (the verdict names the first
/// tensor that fails). A step that asks for a workspace runs twice on the same buffers and both outputs are judged
/// (the second call's failure starts with kSecondCall). A launcher that throws fails with check
/// "threw: <message>". A backward step needs a case prepared for Pass::backward.
Verdict run_case(const StepInfo& step, const Case& c, const Prepared& prepared);

}  // namespace fa::test
