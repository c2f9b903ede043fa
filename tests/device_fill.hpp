/// @file device_fill.hpp
/// @brief Test inputs made on the device, for problems too large to build on the host.
#pragma once

#include "fa/dtype.hpp"

#include <cstdint>

namespace fa::test {

/// Fills n elements of dtype at `data` (device memory) with values uniform in [lo, hi), each a hash
/// of (seed, index): fresh for every seed, the same for the same seed, no host memory involved.
void fill_uniform(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float lo, float hi);

/// How many of the n elements of dtype at `data` (device memory) are NaN or infinite.
std::int64_t count_non_finite(const void* data, DType dtype, std::int64_t n);

}  // namespace fa::test
