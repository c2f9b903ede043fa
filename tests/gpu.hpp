/// @file gpu.hpp
/// @brief How GPU test cases skip on a machine without a CUDA device.
#pragma once

#include "fa/registry.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fa::test {

/// The implementations under test: the step named by --step (all its variants), or every step and the
/// cuBLAS baseline.
std::vector<const StepInfo*> steps_under_test();
/// Those of them that compute `pass`. Throws std::invalid_argument when --step names only steps of the
/// other pass (the test case would check nothing).
std::vector<const StepInfo*> steps_under_test(Pass pass);

/// A fresh seed from the machine's random device: every run tests new inputs (print it on failure).
std::uint64_t fresh_seed();

/// True when a CUDA device is present. When it is not, records that the
/// current test case was skipped (main() then exits with 77, which CTest
/// reports as skipped) and returns false.
bool gpu_or_skip();

/// How many test cases called gpu_or_skip() without a device, or skip() for another reason.
int skipped_cases();

/// Records that (part of) the current test case cannot run on this machine, with the reason
/// (a step that needs a newer GPU, a problem larger than the device's memory): main() then
/// reports the run as skipped rather than passed, when nothing failed.
void skip(const std::string& reason);

/// Whether this GPU meets the step's minimum architecture; if not, warns naming both and, when
/// `count_as_skip`, records a skip (a test case where that is the whole point reports skipped).
bool runs_here(const StepInfo& step, bool count_as_skip = true);

/// The --step filter given on the command line ("" for every step).
const char* step_filter();
void set_step_filter(const char* filter);

/// --max-len N: attention shapes with q_len or kv_len above N are left out
/// (0, the default, keeps every shape). For compute-sanitizer runs, which are
/// 10-100x slower; the full table always runs without it.
int max_len();
void set_max_len(int n);

/// --mutant NAME: the mutant the hidden "[mutant-run]" case runs.
const char* mutant_filter();
void set_mutant_filter(const char* name);

}  // namespace fa::test

/// First line of every [gpu] test case.
#define FA_REQUIRE_GPU()                       \
  do {                                         \
    if (!::fa::test::gpu_or_skip()) return;    \
  } while (0)
