/// @file npy.hpp
/// @brief Reading and writing NumPy .npy files of float32 or float16, and of int32 (for fa-run).
///
/// NumPy has no bfloat16 type, so there is no bf16 .npy file: bf16 tensors are
/// written as float32 (every bf16 value is exactly a float), and reading a file
/// whose element type is not '<f4' or '<f2' (e.g. the '<V2' or '<u2' of raw
/// 16-bit bfloat16 bits) is refused with a message that says so.
#pragma once

#include "fa/host_tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

/// Reads a C-ordered little-endian float32 ('<f4') or float16 ('<f2') .npy file.
/// Throws std::runtime_error naming the file and what is wrong otherwise.
HostTensor read_npy(const std::string& path);

/// Writes the tensor as a version 1.0 .npy file: f32 as '<f4', f16 as '<f2',
/// bf16 widened (exactly) to float32 '<f4'.
void write_npy(const std::string& path, const HostTensor& tensor);

/// An integer .npy file's shape and values (a KV cache's lengths or page table).
struct NpyInts {
  std::vector<std::int64_t> shape;  ///< the array's dimensions
  std::vector<int> values;          ///< its elements in C order, as int32
};
/// Reads a C-ordered int32 ('<i4') or int64 ('<i8', each value within int32) .npy file.
/// Throws std::runtime_error naming the file and what is wrong otherwise.
NpyInts read_npy_ints(const std::string& path);
/// Writes int32 values of the given shape as a version 1.0 '<i4' .npy file.
void write_npy_ints(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<int>& values);

}  // namespace fa
