/// @file trace.cu
/// @brief Step 02's second lesson: the trace of a matrix, and what moving data costs.
// Step 02, second lesson: the trace of a matrix, and what moving data costs.
//
// The kernel is the textbook reduction: a grid-stride loop lets a fixed grid
// cover a diagonal of any length, block_sum (reductions.cuh) combines the
// threads of a block, and one atomicAdd per block adds the block's total to the
// result. The lesson is in the two host functions around it: trace_in_place
// sends rows*cols elements over PCIe to use min(rows, cols) of them;
// trace_diagonal_copy gathers those on the host and sends only them.
#include "02_reductions/reductions.cuh"
#include "02_reductions/trace.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa::step02 {
namespace {

constexpr int kTraceThreads = 256;  ///< threads per block of trace_kernel
/// Enough blocks to fill every SM of current GPUs; beyond that the grid-stride
/// loop takes over, and fewer blocks means fewer atomicAdds on the one result.
constexpr int kMaxTraceBlocks = 256;

/// Sums values[k * stride] for k < count into *result (which starts at zero).
/// The in-place trace reads the matrix with stride cols + 1; the copied
/// diagonal is contiguous, stride 1.
template <class T>
__global__ void trace_kernel(const T* __restrict__ values, int count, long long stride, T* result) {
  __shared__ BlockReduceScratch<T> scratch;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long grid_threads = (long long)gridDim.x * blockDim.x;
  T thread_sum = T(0);
  for (long long k = first; k < count; k += grid_threads) thread_sum += values[k * stride];
  const T block_total = block_sum(thread_sum, scratch);
  if (threadIdx.x == 0) atomicAdd(result, block_total);
}

/// Throws std::invalid_argument naming `function` and `name` when value < 0.
void check_size(const char* function, const char* name, int value) {
  if (value < 0)
    throw std::invalid_argument(std::string(function) + ": " + name + " = " + std::to_string(value) +
                                " is negative");
}

/// Checks the sizes before any CUDA call; returns the diagonal's length.
int diagonal_length(const char* function, const void* matrix, int rows, int cols) {
  check_size(function, "rows", rows);
  check_size(function, "cols", cols);
  const int length = std::min(rows, cols);
  if (length > 0 && matrix == nullptr)
    throw std::invalid_argument(std::string(function) + ": matrix is null for a " + std::to_string(rows) +
                                " x " + std::to_string(cols) + " matrix");
  return length;
}

/// Runs trace_kernel on `count` device values and brings the sum back to the host.
template <class T>
T sum_on_device(const T* device_values, int count, long long stride, int grid_blocks) {
  const int blocks = grid_blocks > 0 ? grid_blocks
                                     : std::min((count + kTraceThreads - 1) / kTraceThreads, kMaxTraceBlocks);
  DeviceBuffer result(sizeof(T));
  FA_CUDA_CHECK(cudaMemset(result.get(), 0, sizeof(T)));
  trace_kernel<T><<<blocks, kTraceThreads>>>(device_values, count, stride, result.as<T>());
  FA_CHECK_LAUNCH();
  T sum{};
  result.download(&sum, sizeof(T));  // cudaMemcpy waits for the kernel
  return sum;
}

}  // namespace

template <class T>
T trace_in_place(const T* host_matrix, int rows, int cols) {
  const int length = diagonal_length("trace_in_place", host_matrix, rows, cols);
  if (length == 0) return T(0);
  // The whole matrix crosses PCIe, although only the diagonal is read.
  const std::size_t bytes = std::size_t(rows) * std::size_t(cols) * sizeof(T);
  DeviceBuffer matrix(bytes);
  matrix.upload(host_matrix, bytes);
  return sum_on_device(matrix.as<T>(), length, cols + 1LL, 0);
}

template <class T>
T trace_diagonal_copy(const T* host_matrix, int rows, int cols) {
  const int length = diagonal_length("trace_diagonal_copy", host_matrix, rows, cols);
  if (length == 0) return T(0);
  // Only the min(rows, cols) diagonal elements cross PCIe.
  std::vector<T> diagonal(length);
  for (int k = 0; k < length; ++k) diagonal[k] = host_matrix[k * (cols + 1LL)];
  DeviceBuffer device_diagonal(length * sizeof(T));
  device_diagonal.upload(diagonal.data(), length * sizeof(T));
  return sum_on_device(device_diagonal.as<T>(), length, 1, 0);
}

template <class T>
T trace_on_device(const T* device_matrix, int rows, int cols, int grid_blocks) {
  const int length = diagonal_length("trace_on_device", device_matrix, rows, cols);
  check_size("trace_on_device", "grid_blocks", grid_blocks);
  if (length == 0) return T(0);
  return sum_on_device(device_matrix, length, cols + 1LL, grid_blocks);
}

/// The instantiations the tests and fa-bench link against.
///@{
template int trace_in_place<int>(const int*, int, int);
template float trace_in_place<float>(const float*, int, int);
template int trace_diagonal_copy<int>(const int*, int, int);
template float trace_diagonal_copy<float>(const float*, int, int);
template int trace_on_device<int>(const int*, int, int, int);
template float trace_on_device<float>(const float*, int, int, int);
///@}

}  // namespace fa::step02
