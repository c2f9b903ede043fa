/// @file tanh_exp2.cuh
/// @brief Step 50's tanh: tanh(x) to float rounding from the SM's exp2 and a fast division, written once here and
/// included by every later step that caps a score (the forward's and the backward's).
#pragma once

#include "11_exp2_softmax/exp2.cuh"

namespace fa::tc {

/// tanh(x) to float rounding from the SM's exp2 and a fast division: 1 - 2 / (2^(2 x log2 e) + 1). Large |x| give
/// 2^(..) = inf or 0, and so exactly +1 or -1.
__device__ __forceinline__ float tanh_exp2(float x) {
  return 1.f - __fdividef(2.f, fast_exp2(x * (2.f * kLog2e)) + 1.f);
}

}  // namespace fa::tc
