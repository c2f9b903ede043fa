// Step 04: FlashAttention-2's loop order, with a 2D thread block.
//
// Step 03 (FlashAttention-1) sent every row's running O, l and m to global memory and back once per
// K/V tile. Here the loops are swapped: a block owns one Q tile Q_i for its whole life, streams every
// K/V tile past it and keeps O, l and m of its Br rows in shared memory; O is normalised and written
// once. Thread (x, y) computes the score S[y][x]; row y is one warp, so row max and sum are shuffles.
#include "02_reductions/reductions.cuh"
#include "fa/kit.cuh"

namespace fa::step04 {
namespace {

/// What this step accepts: head_dim is a template parameter, so only the instantiated sizes exist.
using Support = kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>>;

/// Bc = 32 keys per K/V tile, one per lane: a row of S is one full warp, so its
/// max and sum are 5 xor-shuffles with every lane taking part (step 02's
/// warp_max and warp_sum). Br = 16 query rows per Q tile -> 16 warps, 512
/// threads (see README: why 16 and not 32).
constexpr int Bc = 32;
constexpr int Br = 16;                       ///< query rows per Q tile, one warp each
constexpr int kThreadsPerBlock = Br * Bc;    ///< 512
static_assert(Bc == step02::kWarpSize, "one warp per row of S: Bc must be the warp size");

/// Bytes of dynamic shared memory: Q_i and O_i (Br x d), K_j and V_j (Bc x d), m and l (Br).
constexpr int shared_bytes(int head_dim) {
  return int(sizeof(float)) * (2 * Br * head_dim + 2 * Bc * head_dim + 2 * Br);
}

/// Grid (Tr, q_heads, batch), block (Bc, Br): block (q_tile, h, b) computes rows
/// [q_tile*Br, q_tile*Br + Br) of head h in batch b.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
tiled_online_softmax_kernel(kit::Heads<T, D> s) {
  // Shared-memory rows have stride D, unpadded on purpose: the 32 lanes reading
  // K_j[x][k] (or V_j[x][c]) hit addresses D floats apart, all in the same
  // bank. Those bank conflicts are step 05's subject.
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
  const int q_stride = s.q_stride();
  const int kv_stride = s.kv_stride();
  const T* __restrict__ Q_head = s.q_head(b, h);
  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const T* __restrict__ V_head = s.v_head(b, kv_head);
  T* __restrict__ O_head = s.o_head(b, h);

  // Load Q_i once (rows past q_len read as 0, never from memory) and start
  // O = 0, l = 0, m = -inf. O_i[y][c] is only ever touched by lane c % Bc of
  // row y, here and below, so it needs no barrier of its own.
  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? kit::to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
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
      K_j[e] = in_range ? kit::to_float(K_head[(kv0 + row) * kv_stride + col]) : 0.f;
      V_j[e] = in_range ? kit::to_float(V_head[(kv0 + row) * kv_stride + col]) : 0.f;
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
    const float m_new = fmaxf(m_old, step02::warp_max(S));
    const float m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float P = expf(S - m_safe);  // 0 for a masked score
    const float alpha = expf(m_old - m_safe);
    const float row_sum = step02::warp_sum(P);
    __syncwarp();  // every lane has read m[y] and l[y] before lane 0 replaces them
    if (x == 0) {
      m[y] = m_new;
      l[y] = alpha * l_old + row_sum;
    }

    // O_i[y][c] = alpha * O_i[y][c] + sum_x P[y][x] * V_j[x][c]: the sum over the
    // Bc lanes is one warp reduction per column c (5 shuffles each; step 06
    // replaces this), and lane c % Bc, which owns column c, applies it.
    for (int c = 0; c < D; ++c) {
      const float pv = step02::warp_sum(P * V_j[x * D + c]);
      if (c % Bc == x) O_i[y * D + c] = alpha * O_i[y * D + c] + pv;
    }
    __syncthreads();  // every thread is done with K_j, V_j before the next tile overwrites them
  }

  // Normalise once and write once. A row past q_len is never written; the
  // whole warp of that row skips this, so no shuffle is left half-attended.
  // A valid row has l >= 1 (its max score contributes exp(0) = 1).
  if (i < s.q_len) {
    const float l_row = l[y];  // written by lane 0 before the loop's last barrier
    for (int c = x; c < D; c += Bc) O_head[i * q_stride + c] = kit::from_float<T>(O_i[y * D + c] / l_row);
    // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
    if (s.LSE && x == 0) s.lse_head(b, h)[i] = m[y] + logf(l_row);
  }
}

/// Validates the problem, then launches one block per (Q tile, head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 04", [&]<class T, int D>() {
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch), block(Bc, Br);
    kit::launch(tiled_online_softmax_kernel<T, D>, grid, block, shared_bytes(D), stream, kit::heads<T, D>(p, t));
  });
}

}  // namespace

/// Step 04 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step04
