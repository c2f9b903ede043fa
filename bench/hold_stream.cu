/// @file hold_stream.cu
/// @brief A one-thread kernel that keeps the GPU busy for a given time, so that the host has queued a timed call
/// before the call's start event is reached (see hold_stream.hpp).
#include "hold_stream.hpp"

#include "fa/cuda_check.hpp"

#include <cstdint>

namespace fa::bench {
namespace {

/// Spins until `ns` nanoseconds have passed on the GPU's global timer.
__global__ void hold_kernel(std::uint64_t ns) {
  std::uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void hold_stream(double microseconds, cudaStream_t stream) {
  if (microseconds <= 0) return;
  hold_kernel<<<1, 1, 0, stream>>>(std::uint64_t(microseconds * 1000.0));
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fa::bench
