/// @file trace.hpp
/// @brief Step 02's second lesson: the trace of a matrix on the GPU, and what
/// the bytes sent over PCIe cost.
///
/// The trace of a rows x cols matrix is the sum of its min(rows, cols) diagonal
/// elements A[k][k]. Two ways to compute it from a matrix in host memory:
///  - trace_in_place uploads the whole matrix (rows*cols*sizeof(T) bytes) and
///    reads the diagonal on the GPU;
///  - trace_diagonal_copy gathers the diagonal on the host and uploads only
///    min(rows, cols)*sizeof(T) bytes.
/// Both run the same kernel: a grid-stride loop, a block reduction
/// (reductions.cuh) and one atomicAdd per block.
///
/// Matrices are row-major and contiguous. An empty matrix (rows or cols == 0)
/// has trace 0 and nothing is launched; a negative size throws
/// std::invalid_argument naming it. int sums wrap like int arithmetic does.
/// Instantiated for int and float.
#pragma once

namespace fa::step02 {

/// Uploads the whole host matrix, sums its diagonal on the GPU, returns the sum.
template <class T>
T trace_in_place(const T* host_matrix, int rows, int cols);

/// Gathers the diagonal on the host, uploads only it, sums it on the GPU.
template <class T>
T trace_diagonal_copy(const T* host_matrix, int rows, int cols);

/// The in-place kernel alone, on a matrix already in device memory.
/// @param device_matrix row-major rows x cols matrix in device memory
/// @param rows, cols its sizes (neither may be negative)
/// @param grid_blocks blocks to launch; 0 lets the function choose. A small
///        number makes every thread go around the grid-stride loop several times.
template <class T>
T trace_on_device(const T* device_matrix, int rows, int cols, int grid_blocks = 0);

extern template int trace_in_place<int>(const int*, int, int);
extern template float trace_in_place<float>(const float*, int, int);
extern template int trace_diagonal_copy<int>(const int*, int, int);
extern template float trace_diagonal_copy<float>(const float*, int, int);
extern template int trace_on_device<int>(const int*, int, int, int);
extern template float trace_on_device<float>(const float*, int, int, int);

}  // namespace fa::step02
