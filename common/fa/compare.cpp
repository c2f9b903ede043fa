/// @file compare.cpp
/// @brief Comparing an output with the float64 reference: errors per element and per row, the tolerances, the verdict.
#include "fa/compare.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace fa {

Tolerance tolerance_for(DType dtype, double max_abs_score) {
  Tolerance base;
  switch (dtype) {
    case DType::f32: base = {1e-5, 1e-5, 0}; break;
    case DType::f16: base = {2e-3, 4e-3, 0}; break;
    case DType::bf16: base = {1.6e-2, 3.2e-2, 0}; break;
    default: throw std::logic_error("tolerance_for: unknown dtype");
  }
  const double scores = 8.0 * std::ldexp(std::abs(max_abs_score), -24);  // see compare.hpp
  base.rel_l2 += scores;
  base.max_abs += scores;
  base.row_rel = 2 * base.rel_l2;
  return base;
}

std::string Verdict::describe() const {
  std::ostringstream out;
  out << (passed() ? "passed" : "failed: " + tensor + ": " + failed) << " (" << global.describe() << " worst_row_rel="
      << worst_row_rel << "; bounds rel_l2 " << tolerance.rel_l2 << ", row " << tolerance.row_rel << ", max_abs "
      << tolerance.max_abs << ")";
  return out.str();
}

namespace {
/// judge()'s checks with given bounds: a row's relative error is measured against the larger of its
/// norm and `row_floor` times the RMS row norm, and max_abs against `abs_scale` times the bound.
Verdict judge_with(const HostTensor& out, const std::vector<double>& ref, int row_length, Tolerance tolerance,
                   double row_floor, double abs_scale) {
  Verdict v;
  v.tolerance = tolerance;
  v.tolerance.max_abs *= abs_scale;
  v.global = compare(out, ref);
  const std::vector<double> values = out.to_double();
  const std::int64_t rows = std::int64_t(values.size()) / row_length;
  double all_ref2 = 0;
  for (double r : ref) all_ref2 += std::isfinite(r) ? r * r : 0;
  const double floor2 = rows > 0 ? row_floor * row_floor * all_ref2 / double(rows) : 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double diff2 = 0, ref2 = 0;
    for (std::int64_t c = r * row_length; c < (r + 1) * row_length; ++c) {
      if (std::isinf(ref[c])) {  // the LSE of a row that sees no key, -inf: only -inf is right (as compare())
        diff2 += values[c] == ref[c] ? 0 : INFINITY;
        continue;
      }
      const double d = values[c] - ref[c];
      diff2 += std::isfinite(d) ? d * d : INFINITY;
      ref2 += ref[c] * ref[c];
    }
    ref2 = std::max(ref2, floor2);
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (!(rel <= v.worst_row_rel)) {  // also takes NaN and infinity
      v.worst_row_rel = rel;
      v.worst_row = r;
    }
  }
  if (v.global.non_finite > 0)
    v.failed = "non-finite outputs";
  else if (!(v.global.rel_l2 <= v.tolerance.rel_l2))
    v.failed = "relative L2 error";
  else if (!(v.worst_row_rel <= v.tolerance.row_rel))
    v.failed = "one row's relative error (row " + std::to_string(v.worst_row) + ")";
  else if (!(v.global.max_abs <= v.tolerance.max_abs))
    v.failed = "max abs error";
  return v;
}
}  // namespace

Verdict judge(const HostTensor& out, const std::vector<double>& ref, int row_length, double max_abs_score) {
  return judge_with(out, ref, row_length, tolerance_for(out.dtype, max_abs_score), 0.0, 1.0);
}

Tolerance gradient_tolerance_for(DType dtype, double max_abs_score) {
  const Tolerance forward = tolerance_for(dtype);  // the base bounds, without the score term
  Tolerance t;
  t.rel_l2 = 2 * forward.rel_l2 + 16.0 * std::ldexp(std::abs(max_abs_score), -24);  // see compare.hpp
  t.max_abs = 2 * t.rel_l2;  // times the tensor's largest |reference| element, in judge_gradient
  t.row_rel = 2 * t.rel_l2;
  return t;
}

double lse_tolerance(double max_abs_score) { return 2e-5 + 16.0 * std::ldexp(std::abs(max_abs_score), -24); }

Verdict judge_gradient(const HostTensor& out, const std::vector<double>& ref, int row_length, double max_abs_score,
                       const std::string& tensor, double magnitude) {
  double largest = std::ldexp(magnitude, -10);  // see compare.hpp
  for (double r : ref) largest = std::max(largest, std::abs(r));
  Verdict v = judge_with(out, ref, row_length, gradient_tolerance_for(out.dtype, max_abs_score), 1.0, largest);
  v.tensor = tensor;
  return v;
}

std::vector<Verdict> judge_gradients(const Gradients& out, const std::vector<double>& dq, const std::vector<double>& dk,
                                     const std::vector<double>& dv, int head_dim, double max_abs_score) {
  double magnitude = 0;  // the largest element of the three reference gradients
  for (const std::vector<double>* ref : {&dq, &dk, &dv})
    for (double r : *ref) magnitude = std::max(magnitude, std::abs(r));
  return {judge_gradient(out.dq, dq, head_dim, max_abs_score, "dQ", magnitude),
          judge_gradient(out.dk, dk, head_dim, max_abs_score, "dK", magnitude),
          judge_gradient(out.dv, dv, head_dim, max_abs_score, "dV", magnitude)};
}

Verdict judge_dsinks(const HostTensor& out, const std::vector<double>& ref, DType dtype, double max_abs_score) {
  double largest = 0;
  for (double r : ref) largest = std::max(largest, std::abs(r));
  Verdict v = judge_with(out, ref, int(std::max<std::size_t>(ref.size(), 1)), gradient_tolerance_for(dtype, max_abs_score),
                         1.0, largest);
  v.tensor = "dsinks";
  return v;
}

Verdict judge_lse(const HostTensor& out, const std::vector<double>& ref, double max_abs_score) {
  const double bound = lse_tolerance(max_abs_score);
  Verdict v = judge_with(out, ref, 1, {INFINITY, bound, INFINITY}, 0.0, 1.0);
  v.tensor = "LSE";
  return v;
}

std::string ErrorStats::describe() const {
  std::ostringstream out;
  out << "rel_l2=" << rel_l2 << " max_abs=" << max_abs << " non_finite=" << non_finite << "/"
      << count;
  return out.str();
}

ErrorStats compare(const double* out, const double* ref, std::int64_t n) {
  ErrorStats stats;
  stats.count = n;
  double diff2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isinf(ref[i])) {  // the LSE of a row that sees no key, -inf: only -inf is right
      if (out[i] != ref[i]) ++stats.non_finite;
      continue;
    }
    ref2 += ref[i] * ref[i];
    if (!std::isfinite(out[i])) {
      ++stats.non_finite;
      continue;
    }
    const double d = out[i] - ref[i];
    diff2 += d * d;
    stats.max_abs = std::max(stats.max_abs, std::abs(d));
  }
  stats.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return stats;
}

ErrorStats compare(const HostTensor& out, const std::vector<double>& ref) {
  if (out.numel() != static_cast<std::int64_t>(ref.size()))
    throw std::invalid_argument("compare: output has " + std::to_string(out.numel()) +
                                " elements, reference " + std::to_string(ref.size()));
  const std::vector<double> values = out.to_double();
  return compare(values.data(), ref.data(), out.numel());
}

bool within(const ErrorStats& stats, const Tolerance& tol) {
  return stats.non_finite == 0 && stats.rel_l2 <= tol.rel_l2 && stats.max_abs <= tol.max_abs;
}

}  // namespace fa
