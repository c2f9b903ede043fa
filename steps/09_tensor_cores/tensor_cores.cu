// Step 09: the two matrix products of attention on tensor cores (FlashAttention-2 forward).
//
// Until step 08 every multiply-add of S = Q_i K_j^T and O_i += P V_j was a
// scalar FFMA on the CUDA cores. The H100's tensor cores do a 16x8x16 block
// product per warp in one instruction (mma.sync.m16n8k16), with 16-bit inputs
// and float accumulation, at several times the FFMA rate. Using them changes
// where the data lives: each warp owns 16 query rows and holds Q_i, S, P and O
// as mma fragments in registers; K_j and V_j come from shared memory through
// ldmatrix, stored with an XOR swizzle so those reads are conflict-free; the
// online softmax runs on the accumulator fragments (a row lives in a quad of 4
// lanes); P never leaves registers: the accumulator of S_ij is re-packed as the
// A operand of P V_j. K/V tiles arrive by cp.async while the other product runs.
// Inputs are f16 or bf16 only: tensor cores take no f32 operands in this form.
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace fa::step09 {
namespace {

// mma.sync m16n8k16, ldmatrix and cp.async exist from sm_80 (Ampere) on. Built
// for an older GPU, the device code below compiles to a trap and the launcher
// refuses to run (see check_architecture).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STEP09_TENSOR_CORES 1
#else
#define FA_STEP09_TENSOR_CORES 0
#endif

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
#if FA_STEP09_TENSOR_CORES
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4],
                                                            std::uint32_t b0, std::uint32_t b1) {
#if FA_STEP09_TENSOR_CORES
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
///@}

/// Loads four 8x8 matrices of 16-bit elements from shared memory. Lanes 8i..8i+7
/// give the addresses of rows 0..7 of matrix i (each row 16 contiguous bytes,
/// 16-byte aligned); every lane receives in r[i] the pair at row lane >> 2,
/// columns 2 (lane & 3) + {0, 1} of matrix i — exactly one register of an A, B
/// or C-shaped fragment (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t shared_address) {
#if FA_STEP09_TENSOR_CORES
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
#endif
}

/// As ldmatrix_x4, but each matrix is transposed on the way: r[i] receives the
/// pair at rows 2 (lane & 3) + {0, 1}, column lane >> 2 of matrix i. This turns
/// a row-major [key][column] tile of V into B fragments (k = key, n = column).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t shared_address) {
#if FA_STEP09_TENSOR_CORES
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address));
#endif
}

/// Starts a 16-byte copy global -> shared that does not hold up the thread
/// (cp.async.cg: through L2 only). src_bytes = 0 copies nothing and fills the
/// 16 bytes with zeros, which is how rows past the end of Q, K or V are padded.
__device__ __forceinline__ void cp_async_16(std::uint32_t shared_address, const void* global, int src_bytes) {
#if FA_STEP09_TENSOR_CORES
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global),
               "r"(src_bytes)
               : "memory");
#endif
}
/// Closes the group of cp.async issued so far by this thread.
__device__ __forceinline__ void cp_async_commit() {
#if FA_STEP09_TENSOR_CORES
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most `Pending` of this thread's committed groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#if FA_STEP09_TENSOR_CORES
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

/// 2^x on the special-function unit; ex2.approx(-inf) = +0, so masked scores vanish.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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

/// Starts copying rows [row0, row0 + Rows) of one head of Q, K or V (row r at
/// head + r * stride) into a swizzled Rows x D shared tile; rows at or past
/// `len` are zero-filled. Consecutive threads take consecutive 16-byte chunks
/// of a row, so the global reads are coalesced and each 8-thread store phase
/// covers one row's 8 chunks, permuted: conflict-free.
template <int Rows, int D, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(std::uint32_t tile, const T* head, int row0, int len, int stride,
                                                int tid) {
  constexpr int kChunksPerRow = D / kChunkElems;
  static_assert(Rows * kChunksPerRow % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < Rows * kChunksPerRow / kThreads; ++it) {
    const int e = it * kThreads + tid;
    const int row = e / kChunksPerRow, chunk = e % kChunksPerRow;
    const bool in_range = row0 + row < len;
    // Out-of-range rows read nothing, but still name a valid address.
    const T* src = head + (in_range ? (row0 + row) * stride + chunk * kChunkElems : 0);
    cp_async_16(tile + swizzled_offset<D>(row, chunk), src, in_range ? 16 : 0);
  }
}

/// Shapes the kernel needs, passed by value.
struct Shape {
  /// Sizes of the call, as in fa::AttentionProblem.
  ///@{
  int q_len, kv_len, q_heads, kv_heads;
  ///@}
  bool causal;  ///< top-left causal mask: query i sees keys j <= i
  float scale_log2;  ///< softmax scale * log2(e): exp(scale * s) = 2^(s * scale_log2)
};

/// Dynamic shared memory: Q_i (Br x D), one K_j tile and one V_j tile (Bc x D), 16-bit.
template <int D, int Br, int Bc>
constexpr int shared_bytes() {
  return 2 * (Br * D + 2 * Bc * D);
}

/// FlashAttention-2 forward on tensor cores. Grid (Tr, q_heads, batch), block of
/// kWarps warps; block x computes rows [q_tile * Br, q_tile * Br + Br) of head h,
/// where Br = 16 * kWarps and warp w owns rows w*16 .. w*16 + 15 of the tile.
template <class T, int D, int kWarps, int Bc>
__global__ void __launch_bounds__(kWarps * kWarpSize)
tensor_cores_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                    T* __restrict__ O, Shape s) {
#if FA_STEP09_TENSOR_CORES
  constexpr int Br = kWarps * kRowsPerWarp;
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kDSteps = D / 16;    // k-steps of S = Q K^T (over the head dimension)
  constexpr int kKeyTiles = Bc / 8;  // n8 tiles of S (keys)
  constexpr int kKeySteps = Bc / 16; // k-steps of O = P V (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of O (columns)
  static_assert(Bc % 16 == 0 && D % 16 == 0, "mma tiles are 16 wide");

  extern __shared__ __align__(128) unsigned char shared[];
  const std::uint32_t Q_tile = shared_address(shared);   // [Br][D] swizzled
  const std::uint32_t K_tile = Q_tile + 2 * Br * D;       // [Bc][D] swizzled
  const std::uint32_t V_tile = K_tile + 2 * Bc * D;       // [Bc][D] swizzled

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of the warp's 16
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  // Causal blocks further down the sequence do more work: start them first.
  const int q_tile = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = q_tile * Br;              // first row of the block
  const int warp_row0 = i0 + warp * kRowsPerWarp;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = h / (s.q_heads / s.kv_heads);

  const int q_stride = s.q_heads * D;
  const int kv_stride = s.kv_heads * D;
  const T* Q_head = Q + (b * s.q_len * s.q_heads + h) * D;
  const T* K_head = K + (b * s.kv_len * s.kv_heads + kv_head) * D;
  const T* V_head = V + (b * s.kv_len * s.kv_heads + kv_head) * D;
  T* O_head = O + (b * s.q_len * s.q_heads + h) * D;

  // Causal: the block's last row sees keys up to itself, so later tiles are skipped.
  const int rows_end = min(i0 + Br, s.q_len);
  const int kv_end = s.causal ? min(s.kv_len, rows_end) : s.kv_len;
  const int Tc = (kv_end + Bc - 1) / Bc;

  // Q_i and K_0 start on their way together; Q_i is needed first.
  load_tile_async<Br, D, kThreads>(Q_tile, Q_head, i0, s.q_len, q_stride, tid);
  cp_async_commit();
  load_tile_async<Bc, D, kThreads>(K_tile, K_head, 0, s.kv_len, kv_stride, tid);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // The warp's 16 rows of Q_i as A fragments, one per 16-wide k-step, loaded once.
  // ldmatrix lanes 0-15 address rows 0-15 at chunk 2k, lanes 16-31 rows 0-15 at
  // chunk 2k+1: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) = a[0], a[1], a[2], a[3].
  std::uint32_t q_frag[kDSteps][4];
#pragma unroll
  for (int k = 0; k < kDSteps; ++k)
    ldmatrix_x4(q_frag[k], Q_tile + swizzled_offset<D>(warp * kRowsPerWarp + (lane & 15), 2 * k + (lane >> 4)));

  // Per lane: O for rows g, g+8 as kOutTiles C fragments; m and l for the same two
  // rows. m is the full row max (the 4 lanes of a quad agree on it); l is this
  // lane's partial sum over its own columns, joined across the quad at the end.
  float O_acc[kOutTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  // ldmatrix addresses into K_j and V_j, split into what depends on the lane
  // (fixed for the whole kernel) and compile-time offsets, so the unrolled loops
  // below need no per-load index arithmetic. The rows a lane addresses are
  // lane_row + a multiple of 8, so their row % 8 is lane_row % 8; and for an
  // even chunk c, (c + x) ^ r = c ^ (x ^ r): the swizzle is one XOR with a
  // per-lane constant. (Same offsets as swizzled_offset, computed cheaply.)
  constexpr int kRowBytes = D * 2;
  const int k_lane_row = (lane & 7) + ((lane >> 4) << 3);  // key within 16: tile n (lanes 0-15), n+1 (16-31)
  const int k_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);   // chunk 2k (lanes 0-7) or 2k+1 (8-15), swizzled
  const int v_lane_row = lane & 15;                        // key within a 16-key step
  const int v_lane_xor = (lane >> 4) ^ (lane & 7);         // chunk c (lanes 0-15) or c+1 (16-31), swizzled
  const std::uint32_t K_lane = K_tile + k_lane_row * kRowBytes;
  const std::uint32_t V_lane = V_tile + v_lane_row * kRowBytes;

  for (int j = 0; j < Tc; ++j) {
    const int kv0 = j * Bc;
    // K_j has landed, and every warp is done reading V_{j-1}: V_j may overwrite it.
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async<Bc, D, kThreads>(V_tile, V_head, kv0, s.kv_len, kv_stride, tid);
    cp_async_commit();

    // S = Q_i K_j^T. K_j is [key][d] row-major, i.e. B = K_j^T stored "col": a
    // plain ldmatrix of 8 keys x 8 dims is a B register. One x4 load serves two
    // n8 tiles: lanes 0-7 keys 0-7 chunk 2k (b0 of tile n), lanes 8-15 keys 0-7
    // chunk 2k+1 (b1 of tile n), lanes 16-31 the same for keys 8-15 (tile n+1).
    float S[kKeyTiles][4] = {};
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, K_lane + n * 8 * kRowBytes + (((2 * k) ^ k_lane_xor) << 4));
        mma_m16n8k16<T>(S[n], q_frag[k], kb[0], kb[1]);
        mma_m16n8k16<T>(S[n + 1], q_frag[k], kb[2], kb[3]);
      }
    }

    // V_j has landed, and every warp is done reading K_j: K_{j+1} may overwrite it
    // while this tile's softmax and P V_j run.
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < Tc) load_tile_async<Bc, D, kThreads>(K_tile, K_head, kv0 + Bc, s.kv_len, kv_stride, tid);
    cp_async_commit();

    // Scale into the log2 domain, then mask with -inf only on tiles that need it:
    // the last tile (keys past kv_len) and, when causal, tiles crossing the
    // diagonal of this warp's rows. S[n][e] is row g + 8 (e >= 2), key n*8 + 2t + (e & 1).
    const bool needs_mask = kv0 + Bc > s.kv_len || (s.causal && kv0 + Bc - 1 > warp_row0);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[n][e] *= s.scale_log2;
        if (needs_mask) {
          const int row = warp_row0 + g + (e >= 2 ? 8 : 0);
          const int key = kv0 + n * 8 + 2 * t + (e & 1);
          if (key >= s.kv_len || (s.causal && key > row)) S[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax on the fragments, for this lane's two rows (r = 0: row g,
    // elements 0-1 of each tile; r = 1: row g+8, elements 2-3). A row's Bc values
    // are spread over the 4 lanes of a quad, so its max is joined with two
    // butterfly shuffles (lane ^ 1, lane ^ 2).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) row_max = fmaxf(row_max, fmaxf(S[n][2 * r], S[n][2 * r + 1]));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
      const float m_new = fmaxf(m[r], row_max);
      // A row with every key so far masked keeps m = -inf; subtracting 0 instead
      // gives P = 2^-inf = 0 and alpha = 0 rather than NaN from -inf - (-inf).
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2(m[r] - m_safe);
      m[r] = m_new;
      float row_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        S[n][2 * r] = fast_exp2(S[n][2 * r] - m_safe);
        S[n][2 * r + 1] = fast_exp2(S[n][2 * r + 1] - m_safe);
        row_sum += S[n][2 * r] + S[n][2 * r + 1];
      }
      l[r] = alpha * l[r] + row_sum;
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        O_acc[c][2 * r] *= alpha;
        O_acc[c][2 * r + 1] *= alpha;
      }
    }

    // P stays in registers: the C fragments of key tiles 2k and 2k+1 are, element
    // for element, the A fragment of k-step k (rows g / g+8, keys 2t.. / 2t+8..).
    std::uint32_t p_frag[kKeySteps][4];
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
      p_frag[k][0] = pack2<T>(S[2 * k][0], S[2 * k][1]);          // row g,   keys 16k + 2t
      p_frag[k][1] = pack2<T>(S[2 * k][2], S[2 * k][3]);          // row g+8, keys 16k + 2t
      p_frag[k][2] = pack2<T>(S[2 * k + 1][0], S[2 * k + 1][1]);  // row g,   keys 16k + 8 + 2t
      p_frag[k][3] = pack2<T>(S[2 * k + 1][2], S[2 * k + 1][3]);  // row g+8, keys 16k + 8 + 2t
    }

    // O_i += P V_j. V_j is [key][d] row-major = B stored row-major, so ldmatrix
    // .trans hands each lane the (key 2t, 2t+1; column g) pairs B needs. Lanes
    // 0-15 address keys 0-15 at chunk 2c, lanes 16-31 keys 0-15 at chunk 2c+1:
    // matrices = b0, b1 of column tile 2c, then b0, b1 of column tile 2c+1.
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
#pragma unroll
      for (int c = 0; c < kOutTiles; c += 2) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, V_lane + k * 16 * kRowBytes + ((c ^ v_lane_xor) << 4));
        mma_m16n8k16<T>(O_acc[c], p_frag[k], vb[0], vb[1]);
        mma_m16n8k16<T>(O_acc[c + 1], p_frag[k], vb[2], vb[3]);
      }
    }
  }

  // l: join the quad's partial sums, then O = O_acc / l rounded to T. Each lane
  // writes two adjacent columns of rows g and g+8 of every n8 tile; rows past
  // q_len (the last block's tail) are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float row_l = l[r];
    row_l += __shfl_xor_sync(kFullMask, row_l, 1);
    row_l += __shfl_xor_sync(kFullMask, row_l, 2);
    const float inv_l = row_l > 0.f ? 1.f / row_l : 0.f;
    const int i = warp_row0 + g + 8 * r;
    if (i < s.q_len) {
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        const std::uint32_t bits = pack2<T>(O_acc[c][2 * r] * inv_l, O_acc[c][2 * r + 1] * inv_l);
        *reinterpret_cast<std::uint32_t*>(O_head + i * q_stride + c * 8 + 2 * t) = bits;
      }
    }
  }
#else
  __trap();  // built for a GPU without mma.sync m16n8k16; the launcher refuses first
#endif
}

/// Throws InvalidProblem unless the current GPU and the code built for `kernel`
/// are sm_80 or newer (checked once per kernel; needs a device).
template <class Kernel>
void check_architecture(Kernel kernel) {
  int device = 0, major = 0, minor = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major < 8)
    throw_unsupported("step 09", "GPU", "sm_" + std::to_string(major * 10 + minor),
                      "sm_80 or newer (step 09 needs mma.sync m16n8k16, ldmatrix and cp.async)");
  cudaFuncAttributes attributes{};
  FA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int built_for = attributes.ptxVersion != 0 ? attributes.ptxVersion : attributes.binaryVersion;
  if (built_for < 80)
    throw InvalidProblem("step 09 needs sm_80+: its kernel was built for compute_" + std::to_string(built_for) +
                         "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=80 or newer (default 90)");
}

/// Launches tensor_cores_kernel for element type T, head dimension D, kWarps warps and Bc keys on `stream`.
template <class T, int D, int kWarps, int Bc>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  constexpr int Br = kWarps * kRowsPerWarp;
  constexpr int bytes = shared_bytes<D, Br, Bc>();
  auto* kernel = tensor_cores_kernel<T, D, kWarps, Bc>;
  // Once per kernel: the architecture check, and the opt-in above 48 KiB of
  // dynamic shared memory (Br = 128, d = 128 uses 64 KiB).
  static const bool ready = [&] {
    check_architecture(kernel);
    if (bytes > 48 * 1024)
      FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)ready;
  const float log2e = 1.4426950408889634f;
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale() * log2e};
  const int Tr = (p.q_len + Br - 1) / Br;
  kernel<<<dim3(Tr, p.q_heads, p.batch), kWarps * kWarpSize, bytes, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o),
      shape);
  FA_CHECK_LAUNCH();
}

/// Tile sizes. Bc = 64 keys per K/V tile. Every warp owns 16 query rows and reads
/// all of K_j and V_j from shared memory, so Br only sets how many warps share one
/// K/V tile: Br = 128 (8 warps) halves the K/V traffic from L2 per flop compared
/// with Br = 64 (4 warps) — at N = 4096, d = 128 that is 4 GB instead of 8 GB per
/// call — at the price of fewer, bigger blocks (worse balance on short sequences).
/// Both are registered: "09-br128" and "09-br64".
/// This launcher validates the problem, then launches kWarps warps per block.
template <int kWarps>
void launch_config(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  if (p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 09", "head_dim", std::to_string(p.head_dim), "64, 128");
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    throw_unsupported("step 09", "dtype", to_string(p.dtype),
                      "f16, bf16 (tensor-core mma.sync takes 16-bit inputs; f32 runs in steps 01-08)");
  constexpr int kMaxGridYZ = 65535;
  if (p.q_heads > kMaxGridYZ)
    throw_unsupported("step 09", "q_heads", std::to_string(p.q_heads), "at most 65535 (grid y)");
  if (p.batch > kMaxGridYZ)
    throw_unsupported("step 09", "batch", std::to_string(p.batch), "at most 65535 (grid z)");
  // cp.async copies 16 bytes at a time and the output is written in 4-byte pairs.
  for (const void* ptr : {t.q, t.k, t.v, static_cast<const void*>(t.o)})
    if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0)
      throw_unsupported("step 09", "tensor address", std::to_string(reinterpret_cast<std::uintptr_t>(ptr)),
                        "16-byte aligned pointers");
  constexpr int Bc = 64;
  const bool half = p.dtype == DType::f16;
  if (p.head_dim == 64)
    return half ? launch_typed<__half, 64, kWarps, Bc>(p, t, stream)
                : launch_typed<__nv_bfloat16, 64, kWarps, Bc>(p, t, stream);
  return half ? launch_typed<__half, 128, kWarps, Bc>(p, t, stream)
              : launch_typed<__nv_bfloat16, 128, kWarps, Bc>(p, t, stream);
}

/// Block size, shared memory and occupancy of the kernel launch_config<kWarps> launches for p.
template <int kWarps>
KernelResources resources_config(const AttentionProblem& p) {
  constexpr int Bc = 64;
  constexpr int Br = kWarps * kRowsPerWarp;
  const bool half = p.dtype == DType::f16;
  auto of = [](const void* kernel, int bytes) { return kernel_resources(kernel, kWarps * kWarpSize, bytes); };
  if (p.head_dim == 64)
    return half ? of(reinterpret_cast<const void*>(&tensor_cores_kernel<__half, 64, kWarps, Bc>),
                     shared_bytes<64, Br, Bc>())
                : of(reinterpret_cast<const void*>(&tensor_cores_kernel<__nv_bfloat16, 64, kWarps, Bc>),
                     shared_bytes<64, Br, Bc>());
  return half ? of(reinterpret_cast<const void*>(&tensor_cores_kernel<__half, 128, kWarps, Bc>),
                   shared_bytes<128, Br, Bc>())
              : of(reinterpret_cast<const void*>(&tensor_cores_kernel<__nv_bfloat16, 128, kWarps, Bc>),
                   shared_bytes<128, Br, Bc>());
}

}  // namespace

/// Step 09 with Br = 128 query rows per block (8 warps of 16 rows): "09-br128".
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_config<8>(p, t, stream);
}
/// Step 09 with Br = 64 query rows per block (4 warps of 16 rows): "09-br64".
void launch_br64(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_config<4>(p, t, stream);
}
/// Resources of the kernel launch would launch for p (fa-bench --resources).
KernelResources resources(const AttentionProblem& p) { return resources_config<8>(p); }
/// Resources of the kernel launch_br64 would launch for p.
KernelResources resources_br64(const AttentionProblem& p) { return resources_config<4>(p); }

}  // namespace fa::step09
