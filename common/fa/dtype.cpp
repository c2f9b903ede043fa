/// @file dtype.cpp
/// @brief The element types (f32, f16, bf16): names, sizes and conversions to and from double.
#include "fa/dtype.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <stdexcept>

namespace fa {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
  }
  return 0;
}

DType parse_dtype(const std::string& text) {
  if (text == "f32" || text == "float32" || text == "float") return DType::f32;
  if (text == "f16" || text == "float16" || text == "half") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  throw std::invalid_argument("unknown dtype '" + text + "' (expected f32, f16 or bf16)");
}

namespace {
/// The 16 bits of a 16-bit float (__half or __nv_bfloat16), and back: the two
/// types differ only in how their bits are read, so one pair serves both.
///@{
template <class T>
unsigned short bits_of(T value) {
  unsigned short bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
template <class T>
T from_bits(unsigned short bits) {
  T value;
  std::memcpy(static_cast<void*>(&value), &bits, sizeof bits);  // T is trivially copyable
  return value;
}
///@}
}  // namespace

unsigned short float_to_half_bits(float value) { return bits_of(__float2half_rn(value)); }
float half_bits_to_float(unsigned short bits) { return __half2float(from_bits<__half>(bits)); }
unsigned short float_to_bf16_bits(float value) { return bits_of(__float2bfloat16_rn(value)); }
float bf16_bits_to_float(unsigned short bits) { return __bfloat162float(from_bits<__nv_bfloat16>(bits)); }

}  // namespace fa
