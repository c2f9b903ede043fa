/// @file mma.cuh
/// @brief Step 09's tensor-core building blocks, written once here and included by every later
/// tensor-core step: mma.sync m16n8k16 and ldmatrix as inline PTX (with the fragment layouts they
/// use), packing P into 16-bit pairs, and the XOR swizzle that makes ldmatrix conflict-free.
///
/// mma.sync m16n8k16 and ldmatrix exist from sm_80 (Ampere) on: a step that includes this header
/// declares min_arch = 80 in its kit::Support and is built with add_step(... MIN_ARCH 80).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace fa::tc {

constexpr int kWarpSize = 32;                ///< lanes per warp
constexpr unsigned kFullMask = 0xffffffffu;  ///< all 32 lanes take part in every shuffle
constexpr int kRowsPerWarp = 16;   ///< the M of one mma: each warp owns 16 query rows
constexpr int kChunkElems = 8;     ///< 16-byte chunk = 8 half/bf16 elements = one ldmatrix row

// ---------------------------------------------------------------------------
// Inline PTX wrappers. Fragment layouts are those of the PTX ISA, section
// "Warp-level Matrix Fragment for mma.m16n8k16 with floating point type"
// (Matrix Fragments for mma.m16n8k16). For a lane of the warp:
//   g = lane >> 2  (groupID, 0..7)      t = lane & 3  (threadID_in_group, 0..3)
// A (16x16, row-major), four 32-bit registers of two 16-bit elements each:
//   a[0] = A[g    ][2t, 2t+1]    a[1] = A[g + 8][2t, 2t+1]
//   a[2] = A[g    ][2t+8, 2t+9]  a[3] = A[g + 8][2t+8, 2t+9]
// B (16x8, "col": element (k, n) with k varying fastest in a register):
//   b[0] = B[2t, 2t+1][g]        b[1] = B[2t+8, 2t+9][g]
// C/D (16x8, float):
//   c[0], c[1] = C[g][2t, 2t+1]  c[2], c[3] = C[g + 8][2t, 2t+1]
// In every 32-bit register the element with the lower column (or k) index is
// in the low 16 bits.
// ---------------------------------------------------------------------------

/// D = A B + C for one 16x8x16 block: A 16x16 (row), B 16x8 (col), C and D
/// 16x8 float, in the fragment layout above. One instruction per warp.
///@{
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                     std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4],
                                                            std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
///@}

/// Loads four 8x8 matrices of 16-bit elements from shared memory. Lanes 8i..8i+7
/// give the addresses of rows 0..7 of matrix i (each row 16 contiguous bytes,
/// 16-byte aligned); every lane receives in r[i] the pair at row lane >> 2,
/// columns 2 (lane & 3) + {0, 1} of matrix i — exactly one register of an A, B
/// or C-shaped fragment (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

/// As ldmatrix_x4, but each matrix is transposed on the way: r[i] receives the
/// pair at rows 2 (lane & 3) + {0, 1}, column lane >> 2 of matrix i. This turns
/// a row-major [key][column] tile of V into B fragments (k = key, n = column).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
}

/// Two floats rounded to T and packed in one register, the lower column in the
/// low half (the A-fragment convention).
///@{
template <class T> __device__ std::uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  std::uint32_t bits;
  std::memcpy(&bits, &h, 4);
  return bits;
}
template <> __device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  std::uint32_t bits;
  std::memcpy(&bits, &h, 4);
  return bits;
}
///@}

/// Shared-memory address (for PTX) of a generic pointer into shared memory.
__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of D-element rows.
/// Rows are D * 2 bytes, a multiple of 128, so without a swizzle chunk c of every
/// row sits in the same 4 banks and the 8 rows one ldmatrix phase reads would all
/// collide. XOR-ing the chunk index with row % 8 gives those 8 consecutive rows 8
/// different chunk positions: 8 x 16 bytes = 128 bytes = all 32 banks once.
template <int D>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(D % 64 == 0, "the swizzle permutes 8 chunks of 16 bytes: rows must be a multiple of 128 bytes");
  return (row * (D / kChunkElems) + (chunk ^ (row & 7))) * 16;
}

}  // namespace fa::tc
