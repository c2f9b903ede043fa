/// @file device.hpp
/// @brief Device-side helpers for hosts: buffer, timer, device queries.
#pragma once

#include "fa/cuda_check.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

namespace fa {

/// True when the CUDA runtime finds at least one device (never throws).
bool gpu_available();

/// "NVIDIA H100 80GB HBM3" for the current device.
std::string gpu_name();

/// An owning, move-only block of device memory (cudaMalloc/cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// cudaMalloc of `bytes` (none for 0), set to zero.
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  /// Takes other's memory; other is left empty.
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  /// Frees this buffer's memory and takes other's.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The device pointer (nullptr when empty).
  void* get() const { return data_; }
  /// The device pointer as T*.
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  /// Size in bytes.
  std::size_t bytes() const { return bytes_; }

  /// Copies `bytes` from host memory to the start of the buffer.
  void upload(const void* host, std::size_t bytes);
  /// Copies the first `bytes` of the buffer to host memory.
  void download(void* host, std::size_t bytes) const;
  /// Fills every byte with 0xFF: NaN for float, half, bfloat16 and double alike, so an
  /// element a kernel forgets to write is caught by the comparison.
  void poison();

 private:
  void swap(DeviceBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Times a stretch of stream work with a pair of CUDA events.
class CudaEventTimer {
 public:
  CudaEventTimer();
  ~CudaEventTimer();
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  /// Records the start event on `stream`.
  void start(cudaStream_t stream = nullptr);
  /// Records the stop event on `stream`.
  void stop(cudaStream_t stream = nullptr);
  /// Waits for the stop event and returns milliseconds between start and stop.
  float elapsed_ms();

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

/// What the compiler and the occupancy calculator say about one kernel at one
/// launch configuration: the numbers behind "how many blocks fit on an SM"
/// (kit::resources probes them from a step's own launch).
struct KernelResources {
  int threads_per_block = 0;  ///< the launcher's block size
  int shared_bytes = 0;   ///< per block: dynamic + static shared memory
  int registers = 0;      ///< per thread, from the compiler (cudaFuncGetAttributes)
  int blocks_per_sm = 0;  ///< resident blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor)
};

}  // namespace fa
