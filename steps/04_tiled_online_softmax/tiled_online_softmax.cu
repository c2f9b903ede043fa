// Step 04: FlashAttention-2's loop order, with a 2D thread block.
//
// Step 03 (FlashAttention-1) ran K/V tiles in the outer loop and Q tiles in the
// inner one, so every row's running O, l and m went to global memory and back
// once per K/V tile. Here the loops are swapped: one block owns one Q tile Q_i
// for its whole life, streams every K/V tile past it, and keeps O, l and m of
// its Br rows in shared memory. O is normalised once at the end and written to
// global memory once. Thread (x, y) computes the score S[y][x]; the Bc = 32
// lanes of row y form one warp, so row max and row sum are warp shuffles.
//
// Shared-memory rows have stride head_dim, unpadded on purpose: the 32 lanes
// reading K_j[x][k] (or V_j[x][c]) hit addresses head_dim floats apart, all in
// the same bank. Those bank conflicts are step 05's subject.
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"

#include <cuda_fp16.h>

#include <string>

namespace fa::step04 {
namespace {

/// Bc = 32 keys per K/V tile, one per lane: a row of S is one full warp, so its
/// max and sum are 5 xor-shuffles with every lane taking part. Br = 16 query rows
/// per Q tile -> 16 warps, 512 threads (see README: why 16 and not 32).
constexpr int Bc = 32;
constexpr int Br = 16;                       ///< query rows per Q tile, one warp each
constexpr int kThreadsPerBlock = Br * Bc;    ///< 512
constexpr unsigned kFullMask = 0xffffffffu;  ///< all 32 lanes always take part in a shuffle
static_assert(Bc == 32, "one warp per row of S: Bc must be the warp size");

/// Loads and stores in the tensor's type; all arithmetic is in float.
///@{
__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
template <class T> __device__ T from_float(float x);
template <> __device__ float from_float<float>(float x) { return x; }
template <> __device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
///@}

/// Butterfly (xor) reductions over the 32 lanes of a warp: every lane ends with
/// the result, so no broadcast is needed afterwards. Every lane must call them.
///@{
__device__ float warp_max(float value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}
__device__ float warp_sum(float value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}
///@}

/// Shapes the kernel needs, passed by value.
struct Shape {
  /// Sizes of the call, as in fa::AttentionProblem.
  ///@{
  int q_len, kv_len, q_heads, kv_heads;
  ///@}
  bool causal;  ///< top-left causal mask: query i sees keys j <= i
  float scale;  ///< softmax scale applied to Q·Kᵀ
};

/// Bytes of dynamic shared memory: Q_i and O_i (Br x d), K_j and V_j (Bc x d), m and l (Br).
constexpr int shared_bytes(int head_dim) {
  return int(sizeof(float)) * (2 * Br * head_dim + 2 * Bc * head_dim + 2 * Br);
}

/// Grid (Tr, q_heads, batch), block (Bc, Br): block (q_tile, h, b) computes rows
/// [q_tile*Br, q_tile*Br + Br) of head h in batch b.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
tiled_online_softmax_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                            T* __restrict__ O, Shape s) {
  extern __shared__ float shared[];
  float* Q_i = shared;        // [Br][D]  this block's query rows, loaded once
  float* K_j = Q_i + Br * D;  // [Bc][D]  current key tile
  float* V_j = K_j + Bc * D;  // [Bc][D]  current value tile
  float* O_i = V_j + Bc * D;  // [Br][D]  running, unnormalised output
  float* m = O_i + Br * D;    // [Br]     running row max
  float* l = m + Br;          // [Br]     running row sum of exp(S - m)

  const int x = threadIdx.x;  // lane: key x of the tile, and columns x, x+Bc, ... of O
  const int y = threadIdx.y;  // row of the Q tile (= warp index)
  const int tid = y * Bc + x;
  const int i0 = blockIdx.x * Br;  // first query row of the tile
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  // Tensors are [batch, seq, heads, D]: from one sequence position to the next is heads*D.
  const int q_stride = s.q_heads * D;
  const int kv_stride = s.kv_heads * D;
  const T* Q_head = Q + (b * s.q_len * s.q_heads + h) * D;
  const T* K_head = K + (b * s.kv_len * s.kv_heads + kv_head) * D;
  const T* V_head = V + (b * s.kv_len * s.kv_heads + kv_head) * D;
  T* O_head = O + (b * s.q_len * s.q_heads + h) * D;

  // Load Q_i once (rows past q_len read as 0, never from memory) and start
  // O = 0, l = 0, m = -inf. O_i[y][c] is only ever touched by lane c % Bc of
  // row y, here and below, so it needs no barrier of its own.
  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
  }
  for (int c = x; c < D; c += Bc) O_i[y * D + c] = 0.f;
  if (x == 0) {
    m[y] = -INFINITY;
    l[y] = 0.f;
  }
  __syncthreads();  // Q_i, m and l are read by other threads below

  // Top-left causal: the tile's last valid row i_last sees keys j <= i_last, so
  // K/V tiles wholly above the diagonal are never loaded. Every block has at
  // least one key (i0 < q_len and kv_len >= 1), so Tc >= 1.
  const int i = i0 + y;  // this thread's query row
  const int rows_end = min(i0 + Br, s.q_len);
  const int kv_end = s.causal ? min(s.kv_len, rows_end) : s.kv_len;
  const int Tc = (kv_end + Bc - 1) / Bc;

  for (int tile = 0; tile < Tc; ++tile) {
    const int kv0 = tile * Bc;

    // Load K_j and V_j cooperatively, coalesced along d. Keys past kv_len are 0
    // so that P = 0 times V stays 0 (never 0 * garbage = NaN).
    for (int e = tid; e < Bc * D; e += kThreadsPerBlock) {
      const int row = e / D, col = e % D;
      const bool in_range = kv0 + row < s.kv_len;
      K_j[e] = in_range ? to_float(K_head[(kv0 + row) * kv_stride + col]) : 0.f;
      V_j[e] = in_range ? to_float(V_head[(kv0 + row) * kv_stride + col]) : 0.f;
    }
    __syncthreads();  // K_j, V_j complete before any thread reads them

    // S[y][x] = scale * Q_i[y] . K_j[x]. A key past kv_len, a key above the
    // diagonal, or a row past q_len gives -inf: those threads still run every
    // shuffle below, carrying the neutral -inf (max) and 0 (sum).
    const int j = kv0 + x;
    float dot = 0.f;
#pragma unroll 8
    for (int k = 0; k < D; ++k) dot += Q_i[y * D + k] * K_j[x * D + k];
    const bool valid = i < s.q_len && j < s.kv_len && (!s.causal || j <= i);
    const float S = valid ? s.scale * dot : -INFINITY;

    // Online softmax. m_new = max(m_old, rowmax(S)); the old O and l were
    // scaled by exp(-m_old), so they are rescaled by alpha = exp(m_old - m_new).
    // m_new = -inf only for a row with no valid key yet (rows past q_len): then
    // m_safe = 0 makes P = exp(-inf) = 0 and alpha = 0 instead of exp(NaN).
    const float m_old = m[y];
    const float l_old = l[y];
    const float m_new = fmaxf(m_old, warp_max(S));
    const float m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float P = expf(S - m_safe);  // 0 for a masked score
    const float alpha = expf(m_old - m_safe);
    const float row_sum = warp_sum(P);
    __syncwarp();  // every lane has read m[y] and l[y] before lane 0 replaces them
    if (x == 0) {
      m[y] = m_new;
      l[y] = alpha * l_old + row_sum;
    }

    // O_i[y][c] = alpha * O_i[y][c] + sum_x P[y][x] * V_j[x][c]: the sum over the
    // Bc lanes is one warp reduction per column c (5 shuffles each; step 06
    // replaces this), and lane c % Bc, which owns column c, applies it.
    for (int c = 0; c < D; ++c) {
      const float pv = warp_sum(P * V_j[x * D + c]);
      if (c % Bc == x) O_i[y * D + c] = alpha * O_i[y * D + c] + pv;
    }
    __syncthreads();  // every thread is done with K_j, V_j before the next tile overwrites them
  }

  // Normalise once and write once. A row past q_len is never written; the
  // whole warp of that row skips this, so no shuffle is left half-attended.
  // A valid row has l >= 1 (its max score contributes exp(0) = 1).
  if (i < s.q_len) {
    const float l_row = l[y];  // written by lane 0 before the loop's last barrier
    for (int c = x; c < D; c += Bc) O_head[i * q_stride + c] = from_float<T>(O_i[y * D + c] / l_row);
  }
}

/// Launches tiled_online_softmax_kernel for element type T and head dimension D on `stream`.
template <class T, int D>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale()};
  const int Tr = (p.q_len + Br - 1) / Br;
  const dim3 grid(Tr, p.q_heads, p.batch);
  const dim3 block(Bc, Br);
  constexpr int bytes = shared_bytes(D);
  // Above 48 KiB of dynamic shared memory (d = 128: 49,280 bytes) a kernel must opt in.
  if (bytes > 48 * 1024)
    FA_CUDA_CHECK(cudaFuncSetAttribute(tiled_online_softmax_kernel<T, D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  tiled_online_softmax_kernel<T, D><<<grid, block, bytes, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), shape);
  FA_CHECK_LAUNCH();
}

/// Picks the head-dimension instantiation for element type T.
template <class T>
void launch_for_head_dim(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return launch_typed<T, 32>(p, t, stream);
    case 64: return launch_typed<T, 64>(p, t, stream);
    case 128: return launch_typed<T, 128>(p, t, stream);
  }
}

/// Block size, shared memory and occupancy of the kernel launch_typed<T, D> launches.
template <class T, int D>
KernelResources resources_typed() {
  return kernel_resources(reinterpret_cast<const void*>(&tiled_online_softmax_kernel<T, D>), kThreadsPerBlock,
                          shared_bytes(D));
}

}  // namespace

void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  // head_dim is a template parameter: only the instantiated sizes exist.
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 04", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  // Heads and batch are grid dimensions y and z, which CUDA caps at 65535.
  constexpr int kMaxGridYZ = 65535;
  if (p.q_heads > kMaxGridYZ)
    throw_unsupported("step 04", "q_heads", std::to_string(p.q_heads), "at most 65535 (grid y)");
  if (p.batch > kMaxGridYZ)
    throw_unsupported("step 04", "batch", std::to_string(p.batch), "at most 65535 (grid z)");
  switch (p.dtype) {
    case DType::f32: return launch_for_head_dim<float>(p, t, stream);
    case DType::f16: return launch_for_head_dim<__half>(p, t, stream);
    default: break;  // bf16 and anything else: refused below
  }
  throw_unsupported("step 04", "dtype", to_string(p.dtype), "f32, f16");
}

/// Resources of the kernel launch() would launch for p (fa-bench --resources).
KernelResources resources(const AttentionProblem& p) {
  const bool f16 = p.dtype == DType::f16;
  switch (p.head_dim) {
    case 32: return f16 ? resources_typed<__half, 32>() : resources_typed<float, 32>();
    case 64: return f16 ? resources_typed<__half, 64>() : resources_typed<float, 64>();
    case 128: return f16 ? resources_typed<__half, 128>() : resources_typed<float, 128>();
  }
  throw_unsupported("step 04", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
}

}  // namespace fa::step04
