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
  std::int64_t non_finite = 0;  ///< NaN or Inf outputs (unwritten elements stay NaN)
  std::int64_t count = 0;       ///< elements compared
  /// "rel_l2 = ..., max_abs = ..., non-finite = ...", for failure messages.
  std::string describe() const;
};

/// Largest errors a step may make, per output type.
struct Tolerance {
  double rel_l2;   ///< largest relative L2 error allowed
  double max_abs;  ///< largest absolute error of one element allowed
};

/// The tolerances, written once. f32: float accumulation of O(1000) terms
/// stays near 1e-6 relative; 1e-5 leaves room without hiding bugs (a wrong
/// mask or scale gives errors of order 1e-1). f16: the output alone is rounded
/// to 11 bits (relative 2^-11 = 4.9e-4 per element), so 2e-3 relative L2.
/// bf16: 8 significant bits, output rounding 2^-8 = 3.9e-3 relative per element
/// (and tensor-core steps round P to bf16 too), so f16's bounds times 2^3 for
/// the three bits bf16 lacks: 1.6e-2 relative L2, 3.2e-2 max abs.
Tolerance tolerance_for(DType dtype);

/// Compares out (any dtype) with ref element by element.
ErrorStats compare(const HostTensor& out, const std::vector<double>& ref);
/// Compares n values of out with n values of ref.
ErrorStats compare(const double* out, const double* ref, std::int64_t n);

/// No NaN/Inf and both errors within the tolerance.
bool within(const ErrorStats& stats, const Tolerance& tol);

}  // namespace fa
