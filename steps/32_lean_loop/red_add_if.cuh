/// @file red_add_if.cuh
/// @brief Step 32's guarded vector reduction: step 29's `red.global.add.v4.f32` with its guard as the
/// instruction's predicate (`@p red...`) inside the asm, instead of a C++ `if` around the asm.
///
/// ptxas may still branch around the reduction and the arithmetic that feeds it; in step 32 it does. What the
/// predicated form changed there is register allocation: with `if (row < q_len) red_add_v4(...)` the kernel
/// spilled 12 bytes at d = 128 and its loop had 69 more SASS instructions (nvcc 13.0, cuobjdump -sass).
/// Like red_add_v4 it needs sm_90.
#pragma once

namespace fa::bwd {

/// Adds four floats to four adjacent floats of global memory (16-byte aligned) in one reduction request, only
/// where `pred` holds; where it does not, the address is not touched.
__device__ __forceinline__ void red_add_v4_if(bool pred, float* address, float4 v) {
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  @p red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n"
      "}\n" ::"l"(address),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(int(pred))
      : "memory");
}

}  // namespace fa::bwd
