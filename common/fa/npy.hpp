/// @file npy.hpp
/// @brief Reading and writing NumPy .npy files of float32 or float16 (for fa-run).
#pragma once

#include "fa/host_tensor.hpp"

#include <string>

namespace fa {

/// Reads a C-ordered little-endian float32 ('<f4') or float16 ('<f2') .npy file.
/// Throws std::runtime_error naming the file and what is wrong otherwise.
HostTensor read_npy(const std::string& path);

/// Writes the tensor as a version 1.0 .npy file.
void write_npy(const std::string& path, const HostTensor& tensor);

}  // namespace fa
