/// @file dtype.hpp
/// @brief Element types of the attention tensors, and host conversions.
#pragma once

#include <cstddef>
#include <string>

namespace fa {

/// Element type of Q, K, V and O (all four share one type).
enum class DType { f32, f16 };

/// "f32" or "f16".
const char* to_string(DType dtype);

/// Bytes per element.
std::size_t size_of(DType dtype);

/// Parses "f32"/"float32"/"float" or "f16"/"float16"/"half"; throws std::invalid_argument otherwise.
DType parse_dtype(const std::string& text);

/// Rounds a float to the nearest half and returns the half's bit pattern.
unsigned short float_to_half_bits(float value);

/// Converts a half bit pattern to float (exact).
float half_bits_to_float(unsigned short bits);

}  // namespace fa
