/// @file dtype.hpp
/// @brief Element types of the attention tensors, and host conversions.
#pragma once

#include <cstddef>
#include <string>

namespace fa {

/// Element type of Q, K, V and O (all four share one type).
/// bf16 is bfloat16 (__nv_bfloat16): float's 8-bit exponent with an 8-bit
/// significand (7 stored bits), so it never overflows where f32 does not but
/// rounds 8 times more coarsely than f16.
enum class DType { f32, f16, bf16 };

/// Every dtype, in the order tests and tables list them.
inline constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

/// "f32", "f16" or "bf16".
const char* to_string(DType dtype);

/// Bytes per element.
std::size_t size_of(DType dtype);

/// Parses "f32"/"float32"/"float", "f16"/"float16"/"half" or "bf16"/"bfloat16";
/// throws std::invalid_argument otherwise.
DType parse_dtype(const std::string& text);

/// Rounds a float to the nearest half and returns the half's bit pattern.
unsigned short float_to_half_bits(float value);

/// Converts a half bit pattern to float (exact).
float half_bits_to_float(unsigned short bits);

/// Rounds a float to the nearest bfloat16 and returns its bit pattern.
unsigned short float_to_bf16_bits(float value);

/// Converts a bfloat16 bit pattern to float (exact: the top 16 bits of a float).
float bf16_bits_to_float(unsigned short bits);

}  // namespace fa
