/// @file hold_stream.hpp
/// @brief Timing a call without the host's time in it. A CUDA event on an idle stream is reached at once, so
/// `start; call(); stop` also measures however long the host takes to queue the call (argument checks, tensor
/// maps, a framework's dispatch) before its first kernel. Queued first, hold_stream keeps the stream busy for
/// that long, the host queues start, the call and stop meanwhile, and the events then bracket only the GPU's
/// work: nvbench's "blocking kernel", made of a timer loop.
#pragma once

#include <cuda_runtime.h>

namespace fa::bench {

/// Queues on `stream` a one-thread kernel that spins for `microseconds` of GPU time (nothing when <= 0).
void hold_stream(double microseconds, cudaStream_t stream = nullptr);

}  // namespace fa::bench
