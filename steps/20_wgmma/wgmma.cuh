/// @file wgmma.cuh
/// @brief Step 20's matrix multiplies: Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a), written
/// out as the PTX it is, plus the shared-memory descriptors it reads its operands through.
///
/// A warpgroup is 4 consecutive warps (128 threads) starting at a warp index divisible by 4. One
/// `wgmma.mma_async.m64nNk16` multiplies a 64 x 16 tile of A by a 16 x N tile of B into a 64 x N tile
/// of f32 accumulators spread over the warpgroup's registers. B always comes from shared memory; A
/// from shared memory or from registers. The instruction is asynchronous: it is issued, the warpgroup
/// goes on, and commit_group / wait_group say when the results have landed in the registers.
///
/// Register layouts (the same as mma.sync m16n8k16's, step 09, stacked): warp w of the warpgroup holds
/// rows 16w .. 16w + 15. Thread lane = 4g + t of it holds, of accumulator n8 tile i, d[i][0..1] = row
/// 16w + g, columns 8i + 2t, +1 and d[i][2..3] = row 16w + g + 8, the same columns. An A tile in
/// registers is four 32-bit registers of two 16-bit values: a[0] = (row g, k 2t, 2t+1),
/// a[1] = (row g + 8, k 2t, 2t+1), a[2] = (row g, k 2t+8, 2t+9), a[3] = (row g + 8, k 2t+8, 2t+9).
///
/// Shared-memory layouts: the canonical 128-byte-swizzled layout, which step 20's threads write with
/// cp.async and step 21's copy engine writes itself (fa/tma.hpp): a tile is stored in column chunks of
/// 64 elements, each chunk [rows][64] with 128-byte rows, and the 16-byte piece c of row r sits at piece
/// c ^ (r % 8) of that row. Eight rows (1024 bytes) are one swizzle atom.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fa::hopper {

/// The shared-memory (state space) address of a generic pointer into shared memory.
__device__ __forceinline__ std::uint32_t smem_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

/// Makes this thread's earlier writes to shared memory (plain stores, cp.async once waited for) visible
/// to the async proxy, through which wgmma (and the copy engine) read shared memory. Every writing
/// thread runs it, then a barrier (__syncthreads) collects all of them before the wgmma is issued.
/// Without it wgmma may read what was in shared memory before the writes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/// A wgmma shared-memory matrix descriptor (64 bits) for a 128-byte-swizzled operand at shared
/// address `address` (1024-byte aligned, or a k offset inside an aligned atom):
///  - bits  0-13: address >> 4;
///  - bits 16-29: leading byte offset >> 4 ("LBO"): for an MN-major operand (V here), the step from one
///    64-element column chunk to the next; unused for a K-major one (Q, K);
///  - bits 32-45: stride byte offset >> 4 ("SBO"): the step from one group of 8 rows (K-major) or of
///    8 k-values (MN-major) to the next: 1024 bytes, one swizzle atom, in both;
///  - bits 62-63: the swizzle, 1 = 128 bytes.
__device__ __forceinline__ std::uint64_t smem_descriptor(std::uint32_t address, std::uint32_t leading_bytes,
                                                         std::uint32_t stride_bytes) {
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t(leading_bytes >> 4) << 16) |
         (std::uint64_t(stride_bytes >> 4) << 32) | (std::uint64_t(1) << 62);
}

/// Orders this warpgroup's earlier register writes (accumulators rescaled, A fragments packed) before
/// the wgmma instructions that follow read them. Needed before the first wgmma of a batch.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

/// Closes the wgmma instructions issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

/// Waits until at most `kPending` committed groups are still in flight (0: all have landed).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

/// Tells the compiler that the registers of `d` may have changed here (they are written by the tensor
/// cores between issue and wait), so it neither reads them earlier nor moves their writes later.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

/// The 32 accumulator registers of an m64n64 tile, as PTX operands %0..%31 and as C++ operands d[8][4].
#define FA_WGMMA_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
/// The same 32 registers as the C++ operands of the asm statement: "+f", read and written.
#define FA_WGMMA_D64_OPERANDS \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
    "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
    "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
/// The 64 accumulator registers of an m64n128 tile, as PTX operands %0..%63 and as C++ operands d[16][4].
#define FA_WGMMA_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
/// The same 64 registers as the C++ operands of the asm statement: "+f", read and written.
#define FA_WGMMA_D128_OPERANDS \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
    "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
    "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
    "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
    "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
    "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
    "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])


/// d (+)= A B for an m64n64k16 tile, A and B both from shared memory, both K-major (A [64 rows][16 k],
/// B [64 rows][16 k]: Q and K as stored). `accumulate` = 0 overwrites d instead (the first k-step).
template <class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], std::uint64_t a, std::uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FA_WGMMA_D64 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA_WGMMA_D64 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
}

/// d += A B for an m64n64k16 tile, A from registers (four 32-bit registers, see above), B from shared
/// memory MN-major (the last operand, imm-trans-b = 1: B [16 k][64 columns] stored with its columns
/// contiguous, as V is: [key][d]).
template <class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FA_WGMMA_D64 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA_WGMMA_D64 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D64_OPERANDS
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

/// d (+)= A B for an m64n128k16 tile, A and B both from shared memory, both K-major (A [64 rows][16 k],
/// B [128 rows][16 k]: Q and K as stored). `accumulate` = 0 overwrites d instead (the first k-step).
template <class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], std::uint64_t a, std::uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FA_WGMMA_D128 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FA_WGMMA_D128_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FA_WGMMA_D128 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FA_WGMMA_D128_OPERANDS
                 : "l"(a), "l"(b), "r"(accumulate));
}

/// d += A B for an m64n128k16 tile, A from registers (four 32-bit registers, see above), B from shared
/// memory MN-major (the last operand, imm-trans-b = 1: B [16 k][128 columns] stored with its columns
/// contiguous, as V is: [key][d]).
template <class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FA_WGMMA_D128 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D128_OPERANDS
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FA_WGMMA_D128 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : FA_WGMMA_D128_OPERANDS
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace fa::hopper
