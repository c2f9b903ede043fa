// Step 03: minimal FlashAttention-1, written in the shape of Algorithm 1 of the paper.
//
// Step 02 gave each query row a block of its own, so every K and V row was fetched once per query
// row. Here K and V are cut into tiles of Bc keys, each loaded once into shared memory and used by
// Br query rows, and the softmax becomes online: a running maximum m and sum l per row let O be
// corrected tile by tile, so no row of scores is ever held whole. The shape is
// tspeterkim/flash-attention-minimal's: one block per (batch, head), one thread per query row, K/V
// tiles outer and Q tiles inner, O, l and m in global memory between tiles. Unlike that original it
// is right on every shape (tails, Br != Bc, causal, GQA, half) -- and still slow: the README says
// why, and what step 04 changes.
#include "fa/cuda_check.hpp"
#include "fa/problem.hpp"

#include <cuda_fp16.h>

#include <cstddef>
#include <string>

namespace fa::step03 {
namespace {

/// Algorithm 1, line 1: the tile sizes. One thread per query row, so Br is also the block size (one
/// warp). Br != Bc on purpose, so every test exercises the case the original gets wrong. Bc = 2 Br
/// halves the round trips of O through global memory that Bc = Br would make, for 88 KB of shared
/// memory at d = 128 (see shared_bytes).
constexpr int Br = 32;  ///< query rows per Q tile = threads per block
constexpr int Bc = 64;  ///< keys per K/V tile

/// Q_i (Br x d), K_j and V_j (Bc x d) and S (Br x Bc), all float: 28, 48 and 88 KB at d = 32, 64, 128.
constexpr int shared_bytes(int d) { return int(sizeof(float)) * (Br * d + 2 * Bc * d + Br * Bc); }

/// Loads and stores in the tensor's type; all arithmetic is in float.
///@{
__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
template <class T> __device__ T from_float(float x);
template <> __device__ float from_float<float>(float x) { return x; }
template <> __device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
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

/// Block (h, b) computes O[b, :, h, :]. Thread tx owns query rows tx, tx + Br, tx + 2 Br, ... (its row
/// of every Q tile): it alone reads and writes their O, l and m, so those need no barrier.
template <class T, int d>
__global__ void __launch_bounds__(Br)
minimal_fa1_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                   T* __restrict__ O, float* __restrict__ O_acc, float* __restrict__ l,
                   float* __restrict__ m, Shape s) {
  const int tx = threadIdx.x;
  const int h = blockIdx.x, b = blockIdx.y;
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  // Lines 3-4: Tr Q tiles and Tc K/V tiles; the last of each may be partial. Row r of this head is
  // r * stride elements into Q, K, V, O ([batch, seq, heads, d]) and r * d into the float O_acc.
  const int Tr = (s.q_len + Br - 1) / Br, Tc = (s.kv_len + Bc - 1) / Bc;
  const int q_stride = s.q_heads * d, kv_stride = s.kv_heads * d;
  const T* Q_bh = Q + (b * s.q_len * s.q_heads + h) * d;
  const T* K_bh = K + (b * s.kv_len * s.kv_heads + kv_head) * d;
  const T* V_bh = V + (b * s.kv_len * s.kv_heads + kv_head) * d;
  T* O_bh = O + (b * s.q_len * s.q_heads + h) * d;
  const int head_rows = (b * s.q_heads + h) * s.q_len;  // the workspace is [batch, q_heads, q_len(, d)]
  float* O_acc_bh = O_acc + head_rows * d;
  float* l_bh = l + head_rows;
  float* m_bh = m + head_rows;

  extern __shared__ float sram[];
  float(*Q_i)[d] = reinterpret_cast<float(*)[d]>(sram);
  float(*K_j)[d] = reinterpret_cast<float(*)[d]>(sram + Br * d);
  float(*V_j)[d] = reinterpret_cast<float(*)[d]>(sram + (Br + Bc) * d);
  float(*S)[Bc] = reinterpret_cast<float(*)[Bc]>(sram + (Br + 2 * Bc) * d);

  // Line 2: O = 0, l = 0, m = -inf. Done here, on every launch: the workspace may hold anything.
  for (int row = tx; row < s.q_len; row += Br) {
    for (int x = 0; x < d; ++x) O_acc_bh[row * d + x] = 0.f;
    l_bh[row] = 0.f;
    m_bh[row] = -INFINITY;
  }

  for (int j = 0; j < Tc; ++j) {  // line 5
    // Line 6: the Br threads load the Bc rows of K_j and V_j together, consecutive threads reading
    // consecutive elements. Keys past kv_len are not loaded; the loops below never reach them.
    const int kv_start = j * Bc;
    __syncthreads();  // everyone is done with the previous K_j, V_j
    for (int idx = tx; idx < Bc * d; idx += Br) {
      const int y = idx / d, x = idx % d;
      if (kv_start + y < s.kv_len) {
        K_j[y][x] = to_float(K_bh[(kv_start + y) * kv_stride + x]);
        V_j[y][x] = to_float(V_bh[(kv_start + y) * kv_stride + x]);
      }
    }
    __syncthreads();  // K_j, V_j are complete

    // Line 7. Causal: a Q tile whose last row i * Br + Br - 1 is before kv_start sees none of K_j.
    for (int i = s.causal ? kv_start / Br : 0; i < Tr; ++i) {
      // The keys of K_j this row sees: none past kv_len and, when causal, none past the row itself.
      // A row past q_len, or one that sees no key here (its m~ would be -inf, and exp(-inf - -inf)
      // is NaN), has nothing to add. No barrier follows in this loop, so threads may skip freely.
      const int row = i * Br + tx;
      int keys = min(Bc, s.kv_len - kv_start);
      if (s.causal) keys = min(keys, row + 1 - kv_start);
      if (row >= s.q_len || keys <= 0) continue;

      // Line 8: this thread's row of Q_i into shared memory, and its m and l (its row of O is read
      // where line 12 updates it).
      for (int x = 0; x < d; ++x) Q_i[tx][x] = to_float(Q_bh[row * q_stride + x]);
      const float m_prev = m_bh[row], l_prev = l_bh[row];

      // Line 9: S = scale * Q_i K_j^T, one row of dot products per thread; line 10: m~ = rowmax(S),
      // P~ = exp(S - m~) written over S, l~ = rowsum(P~).
      float m_tilde = -INFINITY;
      for (int y = 0; y < keys; ++y) {
        float dot = 0.f;
        for (int x = 0; x < d; ++x) dot += Q_i[tx][x] * K_j[y][x];
        S[tx][y] = s.scale * dot;
        m_tilde = fmaxf(m_tilde, S[tx][y]);
      }
      float l_tilde = 0.f;
      for (int y = 0; y < keys; ++y) {
        S[tx][y] = expf(S[tx][y] - m_tilde);
        l_tilde += S[tx][y];
      }

      // Line 11: the new running maximum and sum. keys >= 1 makes m~ finite, so m_new is finite and
      // the first visit (m_prev = -inf, l_prev = 0, O = 0) gives alpha = 0, not NaN.
      const float m_new = fmaxf(m_prev, m_tilde);
      const float alpha = expf(m_prev - m_new), beta = expf(m_tilde - m_new);
      const float l_new = alpha * l_prev + beta * l_tilde;

      // Line 12: O_i = diag(l_new)^-1 (diag(l_prev) alpha O_i + beta P~ V_j), read and written in HBM.
      float* O_row = O_acc_bh + row * d;
      for (int x = 0; x < d; ++x) {
        float pv = 0.f;
        for (int y = 0; y < keys; ++y) pv += S[tx][y] * V_j[y][x];
        O_row[x] = (l_prev * alpha * O_row[x] + beta * pv) / l_new;
      }
      m_bh[row] = m_new;  // line 13
      l_bh[row] = l_new;
    }
  }

  // Line 16: O is final (every row saw key 0 in tile j = 0, so l > 0). Round it once to T, from the
  // float accumulator this thread wrote itself.
  for (int row = tx; row < s.q_len; row += Br)
    for (int x = 0; x < d; ++x) O_bh[row * q_stride + x] = from_float<T>(O_acc_bh[row * d + x]);
}

/// Launches minimal_fa1_kernel for element type T and head dimension d on `stream`.
template <class T, int d>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  // The workspace (see workspace_bytes): the float O accumulator, then l, then m.
  const int rows = p.batch * p.q_heads * p.q_len;
  float* O_acc = static_cast<float*>(t.workspace);
  float* l = O_acc + std::size_t(rows) * d;
  float* m = l + rows;

  // More than 48 KB of dynamic shared memory (d = 128) must be asked for; asking is harmless below.
  const auto kernel = minimal_fa1_kernel<T, d>;
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes(d)));
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale()};
  kernel<<<dim3(p.q_heads, p.batch), Br, shared_bytes(d), stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), O_acc, l, m, shape);
  FA_CHECK_LAUNCH();
}

/// Picks the head-dimension instantiation for element type T.
template <class T>
void launch_for_dtype(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return launch_typed<T, 32>(p, t, stream);
    case 64: return launch_typed<T, 64>(p, t, stream);
    case 128: return launch_typed<T, 128>(p, t, stream);
  }
}

}  // namespace

// O accumulates in float even for half inputs, and l and m keep one float per query row, all in
// global memory: B * Hq * Nq * (d + 2) floats.
std::size_t workspace_bytes(const AttentionProblem& p) {
  return sizeof(float) * std::size_t(p.batch) * p.q_heads * p.q_len * (std::size_t(p.head_dim) + 2);
}

void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  // The kernel is compiled for each head_dim, so its loops over d have fixed trip counts.
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 03", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  if (p.dtype != DType::f32 && p.dtype != DType::f16)
    throw_unsupported("step 03", "dtype", to_string(p.dtype), "f32, f16");
  if (!t.workspace) throw InvalidProblem("step 03: needs a workspace of workspace_bytes() bytes");
  if (p.dtype == DType::f32) return launch_for_dtype<float>(p, t, stream);
  return launch_for_dtype<__half>(p, t, stream);
}

}  // namespace fa::step03
