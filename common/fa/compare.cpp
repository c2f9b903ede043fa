#include "fa/compare.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace fa {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f32: return {1e-5, 1e-5};
    case DType::f16: return {2e-3, 4e-3};
    case DType::bf16: return {1.6e-2, 3.2e-2};
  }
  throw std::logic_error("tolerance_for: unknown dtype");
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
