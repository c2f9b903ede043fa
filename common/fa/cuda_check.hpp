/// @file cuda_check.hpp
/// @brief The one error-check macro used on every CUDA call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fa {

/// A failed CUDA call: the message holds the call, file, line and CUDA's error string.
class CudaError : public std::runtime_error {
 public:
  /// The error `code` returned by `call` at line `line` of `file` (the message starts with both).
  CudaError(cudaError_t code, const char* call, const char* file, int line)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + cudaGetErrorName(code) + ": " + cudaGetErrorString(code)),
        code_(code) {}
  /// The CUDA error code.
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

}  // namespace fa

/// Wraps a CUDA runtime call; throws fa::CudaError on failure.
#define FA_CUDA_CHECK(call)                                              \
  do {                                                                   \
    const cudaError_t fa_status_ = (call);                               \
    if (fa_status_ != cudaSuccess)                                       \
      throw ::fa::CudaError(fa_status_, #call, __FILE__, __LINE__);      \
  } while (0)

/// Checks the launch that just happened (bad configuration, too much shared memory...).
#define FA_CHECK_LAUNCH() FA_CUDA_CHECK(cudaGetLastError())
