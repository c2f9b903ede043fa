/// @file device.cpp
/// @brief Device buffers for a problem's inputs, output and workspace.
#include "fa/device.hpp"

namespace fa {

bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string gpu_name() {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp props{};
  FA_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  return props.name;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    FA_CUDA_CHECK(cudaMalloc(&data_, bytes));
    FA_CUDA_CHECK(cudaMemset(data_, 0, bytes));  // a workspace starts zero (step 25's tile counter)
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);  // destructors must not throw; a failure here is reported by the next call
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw std::length_error("DeviceBuffer::upload: more bytes than the buffer holds");
  if (bytes) FA_CUDA_CHECK(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw std::length_error("DeviceBuffer::download: more bytes than the buffer holds");
  if (bytes) FA_CUDA_CHECK(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::poison() {
  if (bytes_) FA_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes_));
}

CudaEventTimer::CudaEventTimer() {
  FA_CUDA_CHECK(cudaEventCreate(&start_));
  FA_CUDA_CHECK(cudaEventCreate(&stop_));
}

CudaEventTimer::~CudaEventTimer() {
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
}

void CudaEventTimer::start(cudaStream_t stream) { FA_CUDA_CHECK(cudaEventRecord(start_, stream)); }
void CudaEventTimer::stop(cudaStream_t stream) { FA_CUDA_CHECK(cudaEventRecord(stop_, stream)); }

float CudaEventTimer::elapsed_ms() {
  FA_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  FA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return ms;
}

}  // namespace fa
