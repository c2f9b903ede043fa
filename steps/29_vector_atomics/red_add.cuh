/// @file red_add.cuh
/// @brief Step 29's vector reduction, written once here and included by every later backward step that adds
/// dQ four floats at a time.
///
/// `red.global.add.v4.f32` exists from sm_90 (Hopper) on: a step that includes this header declares
/// min_arch = 90 in its kit::Support and is built with add_step(... MIN_ARCH 90).
#pragma once

namespace fa::bwd {

/// Adds four floats to four adjacent floats of global memory (16-byte aligned) in one reduction request.
__device__ __forceinline__ void red_add_v4(float* address, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

}  // namespace fa::bwd
