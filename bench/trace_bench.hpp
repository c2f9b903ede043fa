/// @file trace_bench.hpp
/// @brief fa-bench --suite trace: step 02's trace lesson, timed end to end.
#pragma once

#include <string>

namespace fa {

/// Times the two trace variants of step 02 (trace_in_place, trace_diagonal_copy)
/// end to end, host matrix in pageable memory to result on the host, and the
/// in-place kernel alone on a matrix already in device memory; int and float,
/// square matrices from 1024^2 to 16384^2 (the largest only if memory allows).
/// Prints a table and writes the rows to csv_path. Returns the exit status.
int run_trace_suite(const std::string& csv_path);

}  // namespace fa
