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
#include "fa/kit.cuh"

#include <cstddef>

namespace fa::step03 {
namespace {

/// What this step accepts. The kernel is compiled for each head_dim, so its loops over d have fixed trip
/// counts. O, l and m live in a workspace in global memory (see workspace_bytes).
struct Support : kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>> {
  static constexpr bool needs_workspace = true;  ///< O, l and m in global memory
};

/// Algorithm 1, line 1: the tile sizes. One thread per query row, so Br is also the block size (one
/// warp). Br != Bc on purpose, so every test exercises the case the original gets wrong. Bc = 2 Br
/// halves the round trips of O through global memory that Bc = Br would make, for 88 KB of shared
/// memory at d = 128 (see shared_bytes).
constexpr int Br = 32;  ///< query rows per Q tile = threads per block
constexpr int Bc = 64;  ///< keys per K/V tile

/// Q_i (Br x d), K_j and V_j (Bc x d) and S (Br x Bc), all float: 28, 48 and 88 KB at d = 32, 64, 128.
constexpr int shared_bytes(int d) { return int(sizeof(float)) * (Br * d + 2 * Bc * d + Br * Bc); }

/// Block (h, b) computes O[b, :, h, :]. Thread tx owns query rows tx, tx + Br, tx + 2 Br, ... (its row
/// of every Q tile): it alone reads and writes their O, l and m, so those need no barrier.
template <class T, int d>
__global__ void __launch_bounds__(Br)
minimal_fa1_kernel(kit::Heads<T, d> s, float* __restrict__ O_acc, float* __restrict__ l, float* __restrict__ m) {
  const int tx = threadIdx.x;
  const int h = blockIdx.x, b = blockIdx.y;
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  // Lines 3-4: Tr Q tiles and Tc K/V tiles; the last of each may be partial. Row r of this head is
  // r * stride elements into Q, K, V, O ([batch, seq, heads, d]) and r * d into the float O_acc.
  const int Tr = (s.q_len + Br - 1) / Br, Tc = (s.kv_len + Bc - 1) / Bc;
  const int q_stride = s.q_stride(), kv_stride = s.kv_stride();
  const T* __restrict__ Q_bh = s.q_head(b, h);
  const T* __restrict__ K_bh = s.k_head(b, kv_head);
  const T* __restrict__ V_bh = s.v_head(b, kv_head);
  T* __restrict__ O_bh = s.o_head(b, h);
  const std::int64_t head_rows = (std::int64_t(b) * s.q_heads + h) * s.q_len;  // the workspace is [batch, q_heads, q_len(, d)]
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
        K_j[y][x] = kit::to_float(K_bh[(kv_start + y) * kv_stride + x]);
        V_j[y][x] = kit::to_float(V_bh[(kv_start + y) * kv_stride + x]);
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
      for (int x = 0; x < d; ++x) Q_i[tx][x] = kit::to_float(Q_bh[row * q_stride + x]);
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
    for (int x = 0; x < d; ++x) O_bh[row * q_stride + x] = kit::from_float<T>(O_acc_bh[row * d + x]);
  // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
  if (s.LSE)
    for (int row = tx; row < s.q_len; row += Br) s.lse_head(b, h)[row] = m_bh[row] + logf(l_bh[row]);
}

/// O accumulates in float even for half inputs, and l and m keep one float per query row, all in
/// global memory: B * Hq * Nq * (d + 2) floats.
std::size_t workspace_bytes(const AttentionProblem& p) {
  return sizeof(float) * std::size_t(p.batch) * p.q_heads * p.q_len * (std::size_t(p.head_dim) + 2);
}

/// Validates the problem, then launches one block per (head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 03", [&]<class T, int D>() {
    // The workspace (see workspace_bytes): the float O accumulator, then l, then m.
    float* O_acc = static_cast<float*>(t.workspace);
    float* l = O_acc + std::size_t(p.batch) * p.q_heads * p.q_len * D;
    float* m = l + std::size_t(p.batch) * p.q_heads * p.q_len;
    kit::launch(minimal_fa1_kernel<T, D>, dim3(p.q_heads, p.batch), Br, shared_bytes(D), stream,
                kit::heads<T, D>(p, t), O_acc, l, m);
  });
}

}  // namespace

/// Step 03 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step03
