// Step 19 (FP32, d = 128): two warps per scheduler. Step 11's FP32 kernel (exp2_softmax_f32.cu, which
// this file starts from) runs one 128-thread block per SM at d = 128: Q, K, V and P take 162 KiB of
// shared memory, so each of the SM's four schedulers has a single warp to issue from, and every
// shared-memory or global load stalls it. Here one block of 256 threads shares the same Q, K and V
// tiles: the 16 threads of a row now split S's 64 keys (4 each) and O's 128 columns (8 each), half of
// what a thread held before. The registers that frees hold a prefetch: tile j + 1's K and V are loaded
// from global memory into registers at the top of tile j and stored to shared memory once its S and
// softmax are done (K over K_j, V into a second V buffer), so the loads overlap that work instead of
// stalling the block. At d = 64, where step
// 11's kernel already fits two blocks per SM, this layout measured slower; this step takes d = 128.
#include "11_exp2_softmax/exp2.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::step19 {
namespace {

using tc::fast_exp2;
using tc::kLog2e;

/// What this step accepts: every tensor row is read and written in 16-byte (f32) or 8-byte (f16)
/// vectors, so the tensors must be 16-byte aligned. d = 128 only: the layout is for the head dim
/// where step 11's FP32 kernel is left with one warp per scheduler (d = 32 and 64 run there). The
/// kernel uses nothing newer than FP32 FMAs, but its 195 KiB of shared memory per block fit sm_90
/// (227 KiB) and not sm_80 (163 KiB) or sm_86/89 (99 KiB), so it asks for sm_90.
struct Support : kit::Support<kit::DTypes<float, __half>, kit::HeadDims<128>> {
  static constexpr int min_arch = 90;           ///< 195 KiB of shared memory per block
  static constexpr int pointer_alignment = 16;  ///< 16-byte vector loads and stores
};

/// The block tile: Br query rows x Bc keys, 16 x 16 = 256 threads, each owning
/// TM = 8 rows x TN = 4 keys of S (and the same 8 rows of O, TD = 8 columns).
///@{
constexpr int Br = 128;
constexpr int Bc = 64;
constexpr int TM = 8;
constexpr int TN = 4;
constexpr int kRowGroups = Br / TM;                   ///< ty = 0..15
constexpr int kKeyGroups = Bc / TN;                   ///< tx = 0..15
constexpr int kThreads = kRowGroups * kKeyGroups;     ///< 256
constexpr int kRowGroupsPerWarp = 32 / kKeyGroups;    ///< 2: a warp is 2 row groups x 16 key groups
constexpr int kPStride = Br + 4;                      ///< words per row of the transposed P tile
///@}
constexpr unsigned kFullMask = 0xffffffffu;           ///< all 32 lanes take part in every shuffle
static_assert(TM == 8 && TN == 4, "a thread's rows are two float4 groups, its keys one");
static_assert(32 % kKeyGroups == 0, "the threads sharing a row must sit in one warp");

/// Row (0..Br-1) of register row i of thread row group ty: two groups of four
/// consecutive rows, half a tile apart, so each is one aligned float4.
__device__ int row_in_tile(int ty, int i) { return (i / 4) * (Br / 2) + 4 * ty + i % 4; }
/// Key (0..Bc-1) of register key n of thread key group tx: one float4 group, 4 tx .. 4 tx + 3.
__device__ int key_in_tile(int tx, int n) { return 4 * tx + n; }
/// Head dimension of register column c of thread key group tx: float4 groups 64 apart.
__device__ int column_of(int tx, int c) { return (c / 4) * (4 * kKeyGroups) + 4 * tx + c % 4; }

/// 16-byte global loads: four floats, or four halves (8 bytes) widened to float.
///@{
__device__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ float4 load4(const __half* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
///@}
/// Stores four floats of O in the tensor's type, as one 16- or 8-byte vector.
///@{
__device__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ void store4(__half* p, float4 v) {
  const __half2 lo = __floats2half2_rn(v.x, v.y);
  const __half2 hi = __floats2half2_rn(v.z, v.w);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&lo);
  raw.y = *reinterpret_cast<const unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}
///@}
/// An aligned float4 read from shared memory.
__device__ float4 shared4(const float* p) { return *reinterpret_cast<const float4*>(p); }

/// Max over the 16 lanes that share this lane's rows (lanes 2 apart); all get it.
__device__ float row_group_max(float value) {
  for (int offset = kRowGroupsPerWarp; offset < 32; offset *= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}
/// Sum over the 16 lanes that share this lane's rows; all get it.
__device__ float row_group_sum(float value) {
  for (int offset = kRowGroupsPerWarp; offset < 32; offset *= 2)
    value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

/// Words of each shared buffer for head dimension D.
template <int D>
struct SharedLayout {
  static constexpr int q_words = D * Br;               ///< Q_i transposed  [D][Br]
  static constexpr int k_words = D * Bc;               ///< K_j transposed  [D][Bc]
  static constexpr int v_stride = D + 4;               ///< V_j             [Bc][D + 4]
  static constexpr int v_words = Bc * v_stride;        ///< one V buffer's words (there are two)
  static constexpr int p_words = Bc * kPStride;        ///< P transposed    [Bc][Br + 4]
  /// Bytes of dynamic shared memory: Q_T, K_T, two V buffers and P_T (195 KiB at d = 128).
  static constexpr int bytes = int(sizeof(float)) * (q_words + k_words + 2 * v_words + p_words);
};

/// Grid (Tr, q_heads, batch), 256 threads: block (q_tile, h, b) computes rows
/// [q_tile*Br, q_tile*Br + Br) of head h in batch b.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
column_split_f32_kernel(kit::Heads<T, D> s, float scale_log2) {
  using Smem = SharedLayout<D>;
  constexpr int TD = D / kKeyGroups;  // head-dim columns of O per thread: 8
  static_assert(D % (4 * kKeyGroups) == 0, "each thread's O columns are whole float4 groups");
  static_assert((Bc * D / 4) % kThreads == 0, "every thread loads the same number of float4");
  // Every buffer starts at a multiple of 4 words, so float4 accesses are aligned.
  extern __shared__ __align__(16) float shared[];
  float* Q_T = shared;               // Q_T[k][r] = Q_i[r][k], loaded once
  float* K_T = Q_T + Smem::q_words;  // K_T[k][x] = K_j[x][k]
  float* V_j = K_T + Smem::k_words;  // V_j[x][c], rows padded by 4 words; tile j in buffer j % 2
  float* P_T = V_j + 2 * Smem::v_words;  // P_T[x][r] = P[r][x], rows padded by 4 words

  // Inside a warp the 2 row groups run fastest (lane = 2*tx + ty%2): the 16
  // threads of a row sit in one warp, so its max and sum stay shuffles. A
  // quarter-warp is then 2 row groups x 4 key groups, and its P_T stores meet
  // in pairs (2-way bank conflicts; see the README).
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int ty = (tid / 32) * kRowGroupsPerWarp + lane % kRowGroupsPerWarp;  // row group, 0..15
  const int tx = lane / kRowGroupsPerWarp;                                    // key group, 0..15

  const int i0 = blockIdx.x * Br;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = h / (s.q_heads / s.kv_heads);

  const int q_stride = s.q_stride();
  const int kv_stride = s.kv_stride();
  const T* __restrict__ Q_head = s.q_head(b, h);
  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const T* __restrict__ V_head = s.v_head(b, kv_head);
  T* __restrict__ O_head = s.o_head(b, h);

  // Q_i, transposed: each thread takes one float4 of a row, consecutive threads
  // take consecutive rows, so the four scalar stores of a warp hit 32 different
  // banks. Rows past q_len are zeros (masked below, never written).
#pragma unroll 4
  for (int step = 0; step < Br * D / 4 / kThreads; ++step) {
    const int f = step * kThreads + tid;
    const int r = f % Br, k = 4 * (f / Br);
    const float4 q = i0 + r < s.q_len ? load4(Q_head + (i0 + r) * q_stride + k)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    Q_T[(k + 0) * Br + r] = q.x;
    Q_T[(k + 1) * Br + r] = q.y;
    Q_T[(k + 2) * Br + r] = q.z;
    Q_T[(k + 3) * Br + r] = q.w;
  }

  // This thread's rows of O (unnormalised), and of m and l. m is in log2 units
  // (scale_log2 * q.k); l is the sum over this thread's keys only.
  float O_acc[TM][TD];
  float m[TM], l[TM];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < TD; ++c) O_acc[i][c] = 0.f;
  }

  const int rows_end = min(i0 + Br, s.q_len);
  const int kv_end = s.causal ? min(s.kv_len, rows_end) : s.kv_len;
  const int Tc = (kv_end + Bc - 1) / Bc;

  // The prefetch: tile j + 1's K and V, 8 float4 each per thread at d = 128,
  // wait in registers while tile j is computed. fetch issues the global loads
  // (nothing waits for them until the stores use the values); store_k and
  // store_v write them where the next tile reads them. Same pattern as Q:
  // consecutive threads on consecutive keys. Keys past kv_len are zeros (V
  // must be: P = 0 times uninitialised memory could be NaN).
  constexpr int kLoads = Bc * D / 4 / kThreads;
  float4 k_next[kLoads], v_next[kLoads];
  auto fetch = [&](int kv0) {
#pragma unroll
    for (int step = 0; step < kLoads; ++step) {
      const int f = step * kThreads + tid;
      const int x = f % Bc, k = 4 * (f / Bc);
      const bool in_range = kv0 + x < s.kv_len;
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      k_next[step] = in_range ? load4(K_head + (kv0 + x) * kv_stride + k) : zero;
      v_next[step] = in_range ? load4(V_head + (kv0 + x) * kv_stride + k) : zero;
    }
  };
  auto store_k = [&]() {
#pragma unroll
    for (int step = 0; step < kLoads; ++step) {
      const int f = step * kThreads + tid;
      const int x = f % Bc, k = 4 * (f / Bc);
      K_T[(k + 0) * Bc + x] = k_next[step].x;
      K_T[(k + 1) * Bc + x] = k_next[step].y;
      K_T[(k + 2) * Bc + x] = k_next[step].z;
      K_T[(k + 3) * Bc + x] = k_next[step].w;
    }
  };
  auto store_v = [&](float* V_j) {
#pragma unroll
    for (int step = 0; step < kLoads; ++step) {
      const int f = step * kThreads + tid;
      const int x = f % Bc, k = 4 * (f / Bc);
      *reinterpret_cast<float4*>(&V_j[x * Smem::v_stride + k]) = v_next[step];
    }
  };
  fetch(0);
  store_k();
  store_v(V_j);
  __syncthreads();

  for (int tile = 0; tile < Tc; ++tile) {
    const int kv0 = tile * Bc;
    const bool has_next = tile + 1 < Tc;
    if (has_next) fetch(kv0 + Bc);  // in flight during this tile's S and softmax

    // S = Q_i K_j^T as a sum of outer products over k: per k, two float4 of
    // Q_T[k][.] (this thread's 8 rows) and one of K_T[k][.] (its 4 keys), then
    // 32 FMAs. The 2 row groups of a warp read 2 pairs of float4 of Q_T and
    // its 16 key groups 16 consecutive float4 of K_T: conflict-free broadcasts.
    float S[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int n = 0; n < TN; ++n) S[i][n] = 0.f;
#pragma unroll 8
    for (int k = 0; k < D; ++k) {
      const float4 q_lo = shared4(&Q_T[k * Br + 4 * ty]);
      const float4 q_hi = shared4(&Q_T[k * Br + Br / 2 + 4 * ty]);
      const float4 k_lo = shared4(&K_T[k * Bc + 4 * tx]);
      const float q[TM] = {q_lo.x, q_lo.y, q_lo.z, q_lo.w, q_hi.x, q_hi.y, q_hi.z, q_hi.w};
      const float key[TN] = {k_lo.x, k_lo.y, k_lo.z, k_lo.w};
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int n = 0; n < TN; ++n) S[i][n] = fmaf(q[i], key[n], S[i][n]);
    }

    // Scale into log2 units, and mask as step 06 does: a key past kv_len, a key above the
    // diagonal, or a row past q_len gives -inf. A thread owns whole rows, so
    // each row's three conditions fold into one key limit: keys j < limit pass.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = i0 + row_in_tile(ty, i);
      const int limit = row >= s.q_len ? 0 : s.causal ? min(s.kv_len, row + 1) : s.kv_len;
#pragma unroll
      for (int n = 0; n < TN; ++n) {
        const int j = kv0 + key_in_tile(tx, n);
        S[i][n] = j < limit ? scale_log2 * S[i][n] : -INFINITY;
      }
    }

    // Online softmax per row, in registers. The row max is joined over the 16
    // threads sharing the row (they must agree on m: each forms O columns from
    // all of the row's P). m_safe = 0 for a row with no valid key yet keeps
    // 2^(-inf - m) at 0 instead of NaN. l is rescaled like O and summed later.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      float tile_max = S[i][0];
#pragma unroll
      for (int n = 1; n < TN; ++n) tile_max = fmaxf(tile_max, S[i][n]);
      const float m_new = fmaxf(m[i], row_group_max(tile_max));
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2(m[i] - m_safe);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int c = 0; c < TD; ++c) O_acc[i][c] *= alpha;
#pragma unroll
      for (int n = 0; n < TN; ++n) {
        S[i][n] = fast_exp2(S[i][n] - m_safe);  // P overwrites S in the same registers
        l[i] += S[i][n];
      }
    }

    // P to shared memory, transposed: P_T[x][r], four rows per float4. With the
    // lane order above and rows padded to Br + 4 words, a quarter-warp's eight
    // 16-byte stores fall on four groups of four banks, two stores each (key
    // groups tx and tx + 2 land 16 words apart modulo 32): a 2-way conflict, on
    // 8 stores per thread per tile.
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      float* column = &P_T[key_in_tile(tx, n) * kPStride + 4 * ty];
      *reinterpret_cast<float4*>(column) = make_float4(S[0][n], S[1][n], S[2][n], S[3][n]);
      *reinterpret_cast<float4*>(column + Br / 2) = make_float4(S[4][n], S[5][n], S[6][n], S[7][n]);
    }
    __syncthreads();
    // Every thread is past its S (the barrier above), so K_T is free for tile
    // j + 1; V goes to the other buffer, whose tile j - 1 was last read before
    // the barrier that closed tile j - 1. The barrier that closes this tile
    // makes both visible, so a tile costs two barriers, not three.
    if (has_next) {
      store_k();
      store_v(V_j + ((tile + 1) % 2) * Smem::v_words);
    }
    float* V_cur = V_j + (tile % 2) * Smem::v_words;

    // O_i += P V_j as a second outer product, over keys: per key, two float4 of
    // P_T[x][.] (this thread's 8 rows) and TD/4 float4 of V_j[x][.] (its
    // columns), then 8*TD FMAs. Same broadcast pattern as Q_T and K_T above.
#pragma unroll 4
    for (int x = 0; x < Bc; ++x) {
      const float4 p_lo = shared4(&P_T[x * kPStride + 4 * ty]);
      const float4 p_hi = shared4(&P_T[x * kPStride + Br / 2 + 4 * ty]);
      const float p[TM] = {p_lo.x, p_lo.y, p_lo.z, p_lo.w, p_hi.x, p_hi.y, p_hi.z, p_hi.w};
      float v[TD];
#pragma unroll
      for (int g = 0; g < TD / 4; ++g) {
        const float4 v4 = shared4(&V_cur[x * Smem::v_stride + column_of(tx, 4 * g)]);
        v[4 * g + 0] = v4.x;
        v[4 * g + 1] = v4.y;
        v[4 * g + 2] = v4.z;
        v[4 * g + 3] = v4.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int c = 0; c < TD; ++c) O_acc[i][c] = fmaf(p[i], v[c], O_acc[i][c]);
    }
    __syncthreads();  // K_T, V_j and P_T are read before the next tile overwrites them
  }

  // Join each row's l over its 16 threads, normalise once, store float4 groups.
  // Top-left causal masking leaves every row at least key 0, so l > 0.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const float l_row = row_group_sum(l[i]);
    const int row = i0 + row_in_tile(ty, i);
    if (row < s.q_len) {
      const float inv_l = 1.f / l_row;
#pragma unroll
      for (int g = 0; g < TD / 4; ++g) {
        const float4 out = make_float4(O_acc[i][4 * g] * inv_l, O_acc[i][4 * g + 1] * inv_l,
                                       O_acc[i][4 * g + 2] * inv_l, O_acc[i][4 * g + 3] * inv_l);
        store4(O_head + row * q_stride + column_of(tx, 4 * g), out);
      }
      // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
      if (s.LSE && tx == 0) s.lse_head(b, h)[row] = (m[i] + log2f(l_row)) / kLog2e;
    }
  }
}

/// Validates the problem, then launches one block of 256 threads per (Q tile, head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 19", [&]<class T, int D>() {
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch);
    kit::launch(column_split_f32_kernel<T, D>, grid, kThreads, SharedLayout<D>::bytes, stream, kit::heads<T, D>(p, t),
                p.softmax_scale() * kLog2e);  // exp(scale x) = 2^(scale log2(e) x)
  });
}

}  // namespace

/// Step 19 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step19
