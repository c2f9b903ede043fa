/// @file wgmma_mn.cuh
/// @brief Step 38's one new matrix multiply: a warpgroup MMA whose A, too, is read from shared memory
/// MN-major (imm-trans-a = 1), as B was for O = P V (step 20's wgmma_rs).
///
/// dQ_i = dS K_j takes dS [query rows][keys] as A. The backward holds dS^T in registers (a warpgroup's
/// accumulator rows are keys), so it stores dS^T as it is, [key][query row], query rows contiguous: for A
/// (M = query rows, K = keys) that is MN-major, the layout V had as B. The descriptor is built the same
/// way: 128-byte-swizzled chunks of 64 M-elements, 8 k-values (1024 bytes) per swizzle atom.
#pragma once

#include "20_wgmma/wgmma.cuh"

#include <cstdint>
#include <type_traits>

namespace fa::hopper {

/// d (+)= A B for an m64n64k16 tile, A and B both from shared memory and both MN-major (the last two
/// operands, imm-trans-a = imm-trans-b = 1): A stored [16 k][64 rows] (dS^T as [key][query row]), B stored
/// [16 k][64 columns] (K_j as [key][d]). `accumulate` = 0 overwrites d instead (the first k-step).
template <class T>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[8][4], std::uint64_t a, std::uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FA_WGMMA_D64 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA_WGMMA_D64 ", %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace fa::hopper
