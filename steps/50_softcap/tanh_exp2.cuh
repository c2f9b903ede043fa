/// @file tanh_exp2.cuh
/// @brief Step 50's tanh: tanh(x) to float rounding from the SM's exp2 and a reciprocal on the FMA units, written
/// once here and included by every later step that caps a score (the forward's and the backward's).
#pragma once

#include "11_exp2_softmax/exp2.cuh"

namespace fa::tc {

/// 1 / d for 1 <= d < 2^126, on the FMA units alone: the special-function unit is the capped loop's bottleneck
/// (the softmax's exp2 and the cap's need it already), and a reciprocal there would be a third instruction a score.
/// A seed from d's bits (the exponent negated, the mantissa roughly: at most 5 % off), then three Newton steps,
/// r <- r + r (1 - d r), each squaring the error: 2.6e-3, 6.6e-6, then float rounding (about 1e-7).
__device__ __forceinline__ float rcp_newton(float d) {
  float r = __int_as_float(0x7EF311C3 - __float_as_int(d));
#pragma unroll
  for (int i = 0; i < 3; ++i) r = fmaf(r, fmaf(-d, r, 1.f), r);
  return r;
}

/// tanh(x) to float rounding: 1 - 2 / (2^(2 x log2 e) + 1), one MUFU.EX2 and the reciprocal above. Past x = 10,
/// tanh(x) rounds to 1 in float, and x is held there so that the reciprocal's d stays finite; x = -inf gives 2^(..)
/// = 0 and exactly -1; a NaN stays NaN (the comparison is false for it).
__device__ __forceinline__ float tanh_exp2(float x) {
  const float d = fast_exp2((x > 10.f ? 10.f : x) * (2.f * kLog2e)) + 1.f;
  return fmaf(-2.f, rcp_newton(d), 1.f);
}

}  // namespace fa::tc
