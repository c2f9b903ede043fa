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
  out << (passed() ? "passed" : "failed: " + failed) << " (" << global.describe() << " worst_row_rel="
      << worst_row_rel << "; bounds rel_l2 " << tolerance.rel_l2 << ", row " << tolerance.row_rel << ", max_abs "
      << tolerance.max_abs << ")";
  return out.str();
}

Verdict judge(const HostTensor& out, const std::vector<double>& ref, int row_length, double max_abs_score) {
  Verdict v;
  v.tolerance = tolerance_for(out.dtype, max_abs_score);
  v.global = compare(out, ref);
  const std::vector<double> values = out.to_double();
  const std::int64_t rows = std::int64_t(values.size()) / row_length;
  for (std::int64_t r = 0; r < rows; ++r) {
    double diff2 = 0, ref2 = 0;
    for (std::int64_t c = r * row_length; c < (r + 1) * row_length; ++c) {
      const double d = values[c] - ref[c];
      diff2 += std::isfinite(d) ? d * d : INFINITY;
      ref2 += ref[c] * ref[c];
    }
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
