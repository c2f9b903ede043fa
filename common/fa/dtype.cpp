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

unsigned short float_to_half_bits(float value) {
  const __half h = __float2half_rn(value);
  unsigned short bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

float half_bits_to_float(unsigned short bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

unsigned short float_to_bf16_bits(float value) {
  const __nv_bfloat16 b = __float2bfloat16_rn(value);
  unsigned short bits;
  std::memcpy(&bits, &b, sizeof bits);
  return bits;
}

float bf16_bits_to_float(unsigned short bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

}  // namespace fa
