// Step 02's matrix trace (steps/02_reductions/trace.hpp) against the CPU trace:
// both host variants and the in-place kernel alone, int and float, square and
// rectangular, empty to 8192 x 8192.
//
// Diagonal values are at least 1 in magnitude with random signs, and every
// other element is large, so a diagonal element that is missed, counted twice
// or replaced by a neighbour changes the result by far more than the tolerance.
#include "02_reductions/trace.hpp"
#include "fa/device.hpp"
#include "gpu.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

using namespace fa;
using Catch::Matchers::Contains;

namespace {

struct MatrixSize {
  int rows, cols;
};

// A quick generator: 8192 x 8192 matrices are filled in a fraction of a second.
struct XorShift {
  std::uint64_t state;
  std::uint32_t next() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return std::uint32_t(state >> 32);
  }
  double uniform() { return next() * (1.0 / 4294967296.0); }  // [0, 1)
};

// Diagonal: int +-[1, 1000], float +-[1, 2). Elsewhere: int around 10^5, float around 10^4.
template <class T>
std::vector<T> make_matrix(int rows, int cols, std::uint64_t seed) {
  XorShift rng{seed * 0x9E3779B97F4A7C15ull + 1};
  const bool is_int = std::is_integral<T>::value;
  std::vector<T> matrix(std::size_t(rows) * std::size_t(cols));
  for (auto& x : matrix) x = is_int ? T(100000 + rng.next() % 1000) : T(10000 + rng.uniform());
  for (std::int64_t k = 0; k < std::min(rows, cols); ++k) {
    const double sign = rng.next() % 2 ? 1.0 : -1.0;
    matrix[k * (std::int64_t(cols) + 1)] = is_int ? T(sign * (1 + rng.next() % 1000)) : T(sign * (1 + rng.uniform()));
  }
  return matrix;
}

// Adding n floats in any order errs by at most (longest chain of additions) *
// 2^-24 * sum|x|. Here the longest chain is a few grid-stride terms, 5 shuffle
// levels, at most 31 other warps' results and one atomicAdd per block (at most
// 256 blocks): 512 covers it. With |diagonal| >= 1 the tolerance stays below 1
// up to n = 16384 diagonal elements, so a lost or extra element is caught.
template <class T>
double tolerance_for(const std::vector<T>& matrix, int rows, int cols) {
  if (std::is_integral<T>::value) return 0;
  double sum_abs = 0;
  for (std::int64_t k = 0; k < std::min(rows, cols); ++k) sum_abs += std::fabs(double(matrix[k * (std::int64_t(cols) + 1)]));
  return 512 * std::ldexp(1.0, -24) * sum_abs;
}

}  // namespace

TEMPLATE_TEST_CASE("trace: both variants and the kernel alone match the CPU trace", "[gpu][step02][trace]", int,
                   float) {
  FA_REQUIRE_GPU();
  using T = TestType;
  const MatrixSize size = GENERATE(values<MatrixSize>(
      {{0, 0}, {0, 7}, {5, 0}, {1, 1}, {31, 31}, {1025, 1025}, {8192, 8192}, {1000, 3}, {3, 1000}}));
  const int rows = size.rows, cols = size.cols;
  const std::uint64_t seed = std::uint64_t(rows) * 100003u + cols;
  INFO(rows << " x " << cols << " seed " << seed);
  const std::vector<T> matrix = make_matrix<T>(rows, cols, seed);
  const double expected = reference_trace(matrix.data(), rows, cols);
  const double tolerance = tolerance_for(matrix, rows, cols);

  auto check = [&](const std::string& variant, T got) {
    INFO(variant << ": got " << got << ", expected " << expected << ", tolerance " << tolerance);
    CHECK(std::fabs(double(got) - expected) <= tolerance);  // int: exact
  };
  check("trace_in_place", step02::trace_in_place(matrix.data(), rows, cols));
  check("trace_diagonal_copy", step02::trace_diagonal_copy(matrix.data(), rows, cols));

  // The kernel alone, on the whole matrix in device memory; 1 and 3 blocks make
  // the grid-stride loop go around, 0 lets the function pick the grid.
  DeviceBuffer device_matrix(matrix.size() * sizeof(T));
  device_matrix.upload(matrix.data(), matrix.size() * sizeof(T));
  for (int grid_blocks : {0, 1, 3})
    check("trace_on_device with grid_blocks " + std::to_string(grid_blocks),
          step02::trace_on_device(device_matrix.as<T>(), rows, cols, grid_blocks));
}

TEST_CASE("trace: empty matrices give 0 and negative sizes are refused, before any CUDA call",
          "[cpu][step02][trace]") {
  // Runs without a GPU: none of these may reach the CUDA runtime.
  const std::vector<float> some(12, 1.0f);
  CHECK(step02::trace_in_place<float>(nullptr, 0, 0) == 0);
  CHECK(step02::trace_diagonal_copy<int>(nullptr, 0, 5) == 0);
  CHECK(step02::trace_on_device<float>(nullptr, 4, 0) == 0);
  CHECK_THROWS_WITH(step02::trace_in_place(some.data(), -1, 3), Contains("rows = -1"));
  CHECK_THROWS_WITH(step02::trace_diagonal_copy(some.data(), 3, -2), Contains("cols = -2"));
  CHECK_THROWS_WITH(step02::trace_on_device(some.data(), -7, 0), Contains("rows = -7"));
  CHECK_THROWS_WITH(step02::trace_on_device(some.data(), 3, 4, -1), Contains("grid_blocks = -1"));
  CHECK_THROWS_AS(step02::trace_in_place<int>(nullptr, 3, 3), std::invalid_argument);
  CHECK(reference_trace(some.data(), 3, 4) == 3.0);
  CHECK_THROWS_AS(reference_trace(some.data(), -1, 4), std::invalid_argument);
}
