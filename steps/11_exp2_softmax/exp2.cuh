/// @file exp2.cuh
/// @brief Step 11's exponential: 2^x in one special-function-unit instruction, written once here and
/// included by every later step.
#pragma once

namespace fa::tc {

/// log2(e): exp(x) = 2^(x * log2(e)).
constexpr float kLog2e = 1.4426950408889634f;

/// 2^x on the special-function unit (ex2.approx.ftz.f32: one MUFU instruction, about 2 ulp; results
/// below 2^-126 flush to zero). ex2.approx(-inf) = +0, so masked scores vanish.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fa::tc
