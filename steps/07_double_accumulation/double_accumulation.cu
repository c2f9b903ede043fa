// Step 07: double-precision accumulation. Step 06's kernel with every running sum (the scores, P,
// m, l and O) in a wider type Acc, to measure what float accumulation cost in accuracy and what a
// wider one costs in time. Two accumulators, one kernel: "07-double" (Acc = double, FP64) and
// "07-ff" (float-float, a pair of floats from float_float.cuh, for GPUs whose FP64 runs at 1/64
// speed). The inputs, and the Q/K/V tiles in shared memory, stay float or half: they are exact
// copies of the inputs, so widening them would add nothing.
#include "02_reductions/reductions.cuh"
#include "07_double_accumulation/float_float.cuh"
#include "fa/kit.cuh"

namespace fa::step07 {
namespace {

/// What this step accepts: head_dim is a template parameter, so only the instantiated sizes exist.
using Support = kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>>;

/// Bc = 32 keys per K/V tile, one per lane: a row of S is one full warp, so its
/// max and sum are 5 xor-shuffles with every lane taking part (step 02's
/// warp_max and warp_sum). Br query rows per Q tile, one warp each: a template
/// parameter here, kBr for both variants (set from step 06's measurements).
constexpr int Bc = 32;
constexpr int kBr = 16;  ///< query rows per block, for both accumulators
static_assert(Bc == step02::kWarpSize, "one warp per row of S: Bc must be the warp size");

/// What the kernel does on Acc that has no C++ operator, for Acc = double (FP64). For Acc =
/// ff::FloatFloat the same names are in float_float.cuh, found by argument-dependent lookup.
///@{
/// a * b + c for floats a, b: their product is exact in double (24 + 24 significand bits < 53), so
/// fma rounds once, at 2^-53.
__device__ double fma(float a, float b, double c) { return ::fma(double(a), double(b), c); }
/// a * b + c for a double a and a float b.
__device__ double fma(double a, float b, double c) { return ::fma(a, double(b), c); }
/// exp(a - b) with b finite; exp(-inf - b) = 0 as it should.
__device__ double exp_of_difference(double a, double b) { return exp(a - b); }
/// a / b in double, then one rounding to float.
__device__ float div_to_float(double a, double b) { return float(a / b); }
/// m + ln(l) in double (a row's log-sum-exp), then one rounding to float.
__device__ float log_sum_exp_to_float(double m, double l) { return float(m + log(l)); }
///@}
/// m + ln(l) rounded to float for Acc = ff::FloatFloat (float_float.cuh has no log): ln(l) =
/// ln(l.hi) + ln(1 + l.lo / l.hi), and |l.lo / l.hi| <= u makes the second term l.lo / l.hi to within
/// u^2. What remains is logf's own error (1 ulp of ln(l)), as float-accurate as ff::exp.
__device__ float log_sum_exp_to_float(ff::FloatFloat m, ff::FloatFloat l) {
  return m.hi + (m.lo + (logf(l.hi) + l.lo / l.hi));
}

/// Bytes of dynamic shared memory: Q_i (Br x D), K_j and V_j (Bc rows of D + 4
/// words each) in float, the S/P tile (Br x Bc) and m and l (Br) in Acc: with
/// an 8-byte Acc the S/P tile is twice step 06's. No O_i: O is in registers.
template <class Acc, int Br, int D>
constexpr int shared_bytes() {
  return int(sizeof(float)) * (Br * D + 2 * Bc * (D + 4)) + int(sizeof(Acc)) * (Br * Bc + 2 * Br);
}

/// Step 06's kernel with S, P, m, l and O accumulated in Acc.
/// Grid (Tr, q_heads, batch), block (Bc, Br): block (q_tile, h, b) computes
/// rows [q_tile*Br, q_tile*Br + Br) of head h in batch b. Wider sums take more
/// registers: two 512-thread blocks fit on an SM only at 64 registers or fewer,
/// which the double kernel at d <= 64 reaches only when asked to (it is asked).
template <class Acc, class T, int D, int Br>
__global__ void __launch_bounds__(Br * Bc, D <= 64 ? 2 : 1)
double_accumulation_kernel(kit::Heads<T, D> s) {
  constexpr int kThreadsPerBlock = Br * Bc;
  constexpr int kStride = D + 4;  // K/V rows padded by 4 words, read as float4 (step 05's pad4_vec4)
  constexpr int kColumnsPerLane = D / Bc;  // output columns x, x+Bc, ... of row y
  static_assert(D % Bc == 0, "every lane owns the same number of output columns");
  // float4 reads need 16-byte alignment and Acc 8-byte alignment: every buffer
  // below starts at a multiple of 16 bytes because D, kStride, Bc and Br are
  // multiples of 4 (and sizeof(Acc) is 8).
  extern __shared__ __align__(16) float shared[];
  float* Q_i = shared;              // [Br][D]  this block's query rows, loaded once
  float* K_j = Q_i + Br * D;        // [Bc][kStride] one key tile
  float* V_j = K_j + Bc * kStride;  // [Bc][kStride] one value tile
  Acc* SP = reinterpret_cast<Acc*>(V_j + Bc * kStride);  // [Br][Bc] scores S, then P in place
  Acc* m = SP + Br * Bc;      // [Br]     running row max
  Acc* l = m + Br;            // [Br]     running row sum of exp(S - m)

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

  // O[y][x + u*Bc] for u < D/Bc: this thread's share of the output row, in
  // registers (fully unrolled loops below keep the indices compile-time).
  Acc O_acc[kColumnsPerLane];
#pragma unroll
  for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = Acc(0.f);

  // Load Q_i once (rows past q_len read as 0, never from memory) and start
  // O = 0, l = 0, m = -inf.
  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? kit::to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
  }
  if (x == 0) {
    m[y] = Acc(-INFINITY);
    l[y] = Acc(0.f);
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
    // so that P = 0 times V stays 0 (never 0 * garbage = NaN). Shared rows are
    // padded by 4 words (step 05's pad4_vec4).
    for (int e = tid; e < Bc * D; e += kThreadsPerBlock) {
      const int row = e / D, col = e % D;
      const bool in_range = kv0 + row < s.kv_len;
      K_j[row * kStride + col] = in_range ? kit::to_float(K_head[(kv0 + row) * kv_stride + col]) : 0.f;
      V_j[row * kStride + col] = in_range ? kit::to_float(V_head[(kv0 + row) * kv_stride + col]) : 0.f;
    }
    __syncthreads();  // K_j, V_j complete before any thread reads them

    // S[y][x] = scale * Q_i[y] . K_j[x]. A key past kv_len, a key above the
    // diagonal, or a row past q_len gives -inf: those threads still run every
    // shuffle below, carrying the neutral -inf (max) and 0 (sum).
    // Read as float4 as in step 05; the score goes to the shared tile SP[y][x]:
    // consecutive lanes, consecutive words, no conflict, so its rows need no
    // padding.
    // Each product's float operands are widened before they are multiplied.
    const int j = kv0 + x;
    Acc dot = Acc(0.f);
#pragma unroll 4
    for (int k = 0; k < D; k += 4) {
      const float4 q = *reinterpret_cast<const float4*>(&Q_i[y * D + k]);
      const float4 key = *reinterpret_cast<const float4*>(&K_j[x * kStride + k]);
      dot = fma(q.w, key.w, fma(q.z, key.z, fma(q.y, key.y, fma(q.x, key.x, dot))));
    }
    const bool valid = i < s.q_len && j < s.kv_len && (!s.causal || j <= i);
    SP[y * Bc + x] = valid ? s.scale * dot : Acc(-INFINITY);

    // Online softmax. m_new = max(m_old, rowmax(S)); the old O and l were
    // scaled by exp(-m_old), so they are rescaled by alpha = exp(m_old - m_new).
    // m_new = -inf only for a row with no valid key yet (rows past q_len): then
    // m_safe = 0 makes P = exp(-inf) = 0 and alpha = 0 instead of exp(NaN).
    // Each lane reads back its own score and overwrites it with P: same
    // thread, same word, so no barrier is needed between the two.
    const Acc S = SP[y * Bc + x];
    const Acc m_old = m[y];
    const Acc l_old = l[y];
    const Acc m_new = max(m_old, step02::warp_max(S));
    const Acc m_safe = m_new == Acc(-INFINITY) ? Acc(0.f) : m_new;
    const Acc P = exp_of_difference(S, m_safe);  // 0 for a masked score
    const Acc alpha = exp_of_difference(m_old, m_safe);
    SP[y * Bc + x] = P;  // P overwrites S: S is dead from here on
    const Acc row_sum = step02::warp_sum(P);
    __syncwarp();  // P[y][*] complete, and every lane has read m[y] and l[y] before lane 0 replaces them
    if (x == 0) {
      m[y] = m_new;
      l[y] = alpha * l_old + row_sum;
    }

    // O[y][c] = alpha * O[y][c] + sum_key P[y][key] * V_j[key][c] for the
    // columns c = x + u*Bc this lane owns. P[y][key] is one 8-byte word that
    // the whole warp reads (a broadcast); V_j[key][c] is consecutive across
    // lanes (conflict-free). No shuffle: the sum over keys runs inside a thread.
    // Unrolled by 8 rather than fully: fully unrolled, the double kernel at
    // d = 64 spills a few registers.
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] *= alpha;
#pragma unroll 8
    for (int key = 0; key < Bc; ++key) {
      const Acc p = SP[y * Bc + key];
#pragma unroll
      for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = fma(p, V_j[key * kStride + x + u * Bc], O_acc[u]);
    }
    __syncthreads();  // every thread is done with K_j, V_j before the next tile overwrites them
  }

  // Normalise once and write once. A row past q_len is never written; the
  // whole warp of that row skips this, so no shuffle is left half-attended.
  // A valid row has l >= 1 (its max score contributes exp(0) = 1).
  if (i < s.q_len) {
    const Acc l_row = l[y];  // written by lane 0 before the loop's last barrier
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u)
      O_head[i * q_stride + x + u * Bc] = kit::from_float<T>(div_to_float(O_acc[u], l_row));
    // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
    if (s.LSE && x == 0) s.lse_head(b, h)[i] = log_sum_exp_to_float(m[y], l_row);
  }
}

/// Validates the problem, then launches accumulator Acc, one block per (Q tile, head, batch), on `stream`.
template <class Acc>
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  constexpr int Br = kBr;
  kit::dispatch<Support>(p, t, "step 07", [&]<class T, int D>() {
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch), block(Bc, Br);
    kit::launch(double_accumulation_kernel<Acc, T, D, Br>, grid, block, shared_bytes<Acc, Br, D>(), stream,
                kit::heads<T, D>(p, t));
  });
}

}  // namespace

/// Step 07 with Acc = double (FP64) and Acc = float-float (FP32 pairs), as the registry lists them.
///@{
Launcher launcher_double() { return kit::launcher<Support>(&launch<double>); }
Launcher launcher_ff() { return kit::launcher<Support>(&launch<ff::FloatFloat>); }
///@}

}  // namespace fa::step07
