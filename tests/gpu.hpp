/// @file gpu.hpp
/// @brief How GPU test cases skip on a machine without a CUDA device.
#pragma once

namespace fa::test {

/// True when a CUDA device is present. When it is not, records that the
/// current test case was skipped (main() then exits with 77, which CTest
/// reports as skipped) and returns false.
bool gpu_or_skip();

/// How many test cases called gpu_or_skip() without a device.
int skipped_cases();

/// The --step filter given on the command line ("" for every step).
const char* step_filter();
void set_step_filter(const char* filter);

}  // namespace fa::test

/// First line of every [gpu] test case.
#define FA_REQUIRE_GPU()                       \
  do {                                         \
    if (!::fa::test::gpu_or_skip()) return;    \
  } while (0)
