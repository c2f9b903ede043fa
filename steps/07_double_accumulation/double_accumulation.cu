// Step 07: double-precision accumulation. Step 06's kernel with every running
// sum in a wider accumulator type Acc, to measure what float accumulation cost
// in accuracy and what a wider one costs in time.
//
// Step 06 rounds to float at every add: the D-term dot products, the row sum
// l of N exponentials, the N-term sums of O and the Tc rescalings by alpha.
// Here the scores S, the S/P tile, m, l, the warp reductions and O are kept in
// Acc, and each product's float operands are widened before they are
// multiplied. The inputs stay float or half, and so do the Q/K/V tiles in
// shared memory: they are exact copies of the inputs, so widening them there
// would add nothing. Two accumulators, one kernel (a traits class picks the
// arithmetic): "07-double" (Acc = double, plain FP64, exp in double) and
// "07-ff" (float-float: a pair of floats and error-free transformations, from
// float_float.cuh, for GPUs whose FP64 runs at 1/64 speed). One Br, kBr.
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"

#include "07_double_accumulation/float_float.cuh"

#include <cuda_fp16.h>

#include <string>

namespace fa::step07 {
namespace {

/// Query rows per block, for both variants, set from step 06's measurements
/// (the kernel still takes Br as a template parameter).
constexpr int kBr = 16;

/// Bc = 32 keys per K/V tile, one per lane; Br query rows (a template parameter).
constexpr int Bc = 32;
constexpr unsigned kFullMask = 0xffffffffu;  ///< all 32 lanes take part in every shuffle
static_assert(Bc == 32, "one warp per row of S: Bc must be the warp size");

/// K/V rows padded by four words and read as float4 (step 05's pad4_vec4): a
/// quarter-warp of 16-byte reads covers all 32 banks once.
template <int D>
constexpr int kv_stride_words() {
  return D + 4;
}

/// Loads and stores in the tensor's type; the tiles hold floats.
///@{
__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
template <class T> __device__ T from_float(float x);
template <> __device__ float from_float<float>(float x) { return x; }
template <> __device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
///@}

// The accumulator: a traits class names the type Acc and every operation the
// kernel does on it, so the kernel body is written once for both variants.

/// Acc = double: plain FP64. A product of two floats is exact in double (24 +
/// 24 significand bits < 53), so fma rounds once, at 2^-53.
struct DoubleAccumulation {
  /// The accumulator type and the operations the kernel does on it, in FP64.
  ///@{
  using Acc = double;
  __device__ static Acc zero() { return 0.0; }
  __device__ static Acc negative_infinity() { return -INFINITY; }
  __device__ static bool is_negative_infinity(Acc x) { return x == -INFINITY; }
  __device__ static Acc add(Acc a, Acc b) { return a + b; }
  __device__ static Acc mul(Acc a, Acc b) { return a * b; }
  __device__ static Acc mul(Acc a, float b) { return a * double(b); }
  __device__ static Acc fma(float a, float b, Acc c) { return ::fma(double(a), double(b), c); }
  __device__ static Acc fma(Acc a, float b, Acc c) { return ::fma(a, double(b), c); }
  __device__ static Acc max(Acc a, Acc b) { return fmax(a, b); }
  /// exp(a - b) with b finite; exp(-inf - b) = 0 as it should.
  __device__ static Acc exp_of_difference(Acc a, Acc b) { return ::exp(a - b); }
  __device__ static Acc shfl_xor(Acc v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }
  /// a / b in double, then one rounding to float.
  __device__ static float div_to_float(Acc a, Acc b) { return float(a / b); }
  ///@}
};

/// Acc = float-float (hi, lo): FP32 instructions only (see float_float.cuh).
struct FloatFloatAccumulation {
  /// The accumulator type and the operations the kernel does on it, in float-float.
  ///@{
  using Acc = ff::FloatFloat;
  __device__ static Acc zero() { return {0.f, 0.f}; }
  __device__ static Acc negative_infinity() { return {-INFINITY, 0.f}; }
  __device__ static bool is_negative_infinity(Acc x) { return x.hi == -INFINITY; }
  __device__ static Acc add(Acc a, Acc b) { return ff::add(a, b); }
  __device__ static Acc mul(Acc a, Acc b) { return ff::mul(a, b); }
  __device__ static Acc mul(Acc a, float b) { return ff::mul(a, b); }
  __device__ static Acc fma(float a, float b, Acc c) { return ff::fma(a, b, c); }
  __device__ static Acc fma(Acc a, float b, Acc c) { return ff::fma(a, b, c); }
  __device__ static Acc max(Acc a, Acc b) { return ff::max(a, b); }
  /// exp(a - b): the difference in float-float, then expf(hi) * (1 + lo).
  __device__ static Acc exp_of_difference(Acc a, Acc b) { return ff::exp_of_difference(a, b); }
  __device__ static Acc shfl_xor(Acc v, int lane_mask) { return ff::shfl_xor(kFullMask, v, lane_mask); }
  __device__ static float div_to_float(Acc a, Acc b) { return ff::div_to_float(a, b); }
  ///@}
};

/// Butterfly max over the 32 lanes of a warp, in Acc; every lane gets the result.
template <class Accum>
__device__ typename Accum::Acc warp_max(typename Accum::Acc value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2)
    value = Accum::max(value, Accum::shfl_xor(value, offset));
  return value;
}
/// Butterfly sum over the 32 lanes of a warp, in Acc; every lane gets the result.
template <class Accum>
__device__ typename Accum::Acc warp_sum(typename Accum::Acc value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2) value = Accum::add(value, Accum::shfl_xor(value, offset));
  return value;
}

/// Shapes the kernel needs, passed by value.
struct Shape {
  /// Sizes of the call, as in fa::AttentionProblem.
  ///@{
  int q_len, kv_len, q_heads, kv_heads;
  ///@}
  bool causal;  ///< top-left causal mask: query i sees keys j <= i
  float scale;  ///< softmax scale applied to Q·Kᵀ
};

/// Bytes of dynamic shared memory: Q_i (Br x D), K_j and V_j (Bc padded rows
/// each) in float, the S/P tile (Br x Bc) and m and l (Br) in Acc: with an
/// 8-byte Acc the S/P tile is twice step 06's. No O_i: O is in registers.
template <class Acc, int Br, int D>
constexpr int shared_bytes() {
  return int(sizeof(float)) * (Br * D + 2 * Bc * kv_stride_words<D>()) + int(sizeof(Acc)) * (Br * Bc + 2 * Br);
}

/// Step 06's kernel with S, P, m, l and O accumulated in Accum::Acc.
/// Grid (Tr, q_heads, batch), block (Bc, Br): block (q_tile, h, b) computes
/// rows [q_tile*Br, q_tile*Br + Br) of head h in batch b.
template <class Accum, class T, int D, int Br>
__global__ void __launch_bounds__(Br * Bc)
double_accumulation_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                           T* __restrict__ O, Shape s) {
  using Acc = typename Accum::Acc;
  constexpr int kThreadsPerBlock = Br * Bc;
  constexpr int kStride = kv_stride_words<D>();
  constexpr int kColumnsPerLane = D / Bc;  // output columns x, x+Bc, ... of row y
  static_assert(D % Bc == 0, "every lane owns the same number of output columns");
  // float4 reads need 16-byte alignment and Acc 8-byte alignment: every buffer
  // below starts at a multiple of 16 bytes because D, kStride, Bc and Br are
  // multiples of 4 (and sizeof(Acc) is 8).
  extern __shared__ __align__(16) float shared[];
  float* Q_i = shared;             // [Br][D]       this block's query rows, loaded once
  float* K_j = Q_i + Br * D;       // [Bc][kStride] one key tile
  float* V_j = K_j + Bc * kStride; // [Bc][kStride] one value tile
  Acc* S = reinterpret_cast<Acc*>(V_j + Bc * kStride);  // [Br][Bc] scores, then P in place
  Acc* m = S + Br * Bc;            // [Br]          running row max
  Acc* l = m + Br;                 // [Br]          running row sum of exp(S - m)

  const int x = threadIdx.x;  // lane: key x of the tile, and columns x, x+Bc, ... of O
  const int y = threadIdx.y;  // row of the Q tile (= warp index)
  const int tid = y * Bc + x;
  const int i0 = blockIdx.x * Br;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = h / (s.q_heads / s.kv_heads);

  const int q_stride = s.q_heads * D;
  const int kv_stride = s.kv_heads * D;
  const T* Q_head = Q + (b * s.q_len * s.q_heads + h) * D;
  const T* K_head = K + (b * s.kv_len * s.kv_heads + kv_head) * D;
  const T* V_head = V + (b * s.kv_len * s.kv_heads + kv_head) * D;
  T* O_head = O + (b * s.q_len * s.q_heads + h) * D;

  // O[y][x + u*Bc] for u < D/Bc: this thread's share of the output row, in
  // registers (fully unrolled loops below keep the indices compile-time).
  Acc O_acc[kColumnsPerLane];
#pragma unroll
  for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = Accum::zero();

  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
  }
  if (x == 0) {
    m[y] = Accum::negative_infinity();
    l[y] = Accum::zero();
  }
  __syncthreads();

  const int i = i0 + y;
  const int rows_end = min(i0 + Br, s.q_len);
  const int kv_end = s.causal ? min(s.kv_len, rows_end) : s.kv_len;
  const int Tc = (kv_end + Bc - 1) / Bc;

  for (int tile = 0; tile < Tc; ++tile) {
    const int kv0 = tile * Bc;

    // Global reads stay coalesced along d; shared rows are padded by 4 words.
    for (int e = tid; e < Bc * D; e += kThreadsPerBlock) {
      const int row = e / D, col = e % D;
      const bool in_range = kv0 + row < s.kv_len;
      K_j[row * kStride + col] = in_range ? to_float(K_head[(kv0 + row) * kv_stride + col]) : 0.f;
      V_j[row * kStride + col] = in_range ? to_float(V_head[(kv0 + row) * kv_stride + col]) : 0.f;
    }
    __syncthreads();

    // S[y][x] = scale * Q_i[y] . K_j[x], read as float4 as in step 05, each
    // product formed and added in Acc, and written to the shared tile:
    // consecutive lanes, consecutive 8-byte words (two wavefronts per warp, no
    // conflict), so its rows need no padding.
    const int j = kv0 + x;
    Acc dot = Accum::zero();
#pragma unroll 4
    for (int k = 0; k < D; k += 4) {
      const float4 q = *reinterpret_cast<const float4*>(&Q_i[y * D + k]);
      const float4 key = *reinterpret_cast<const float4*>(&K_j[x * kStride + k]);
      dot = Accum::fma(q.x, key.x, dot);
      dot = Accum::fma(q.y, key.y, dot);
      dot = Accum::fma(q.z, key.z, dot);
      dot = Accum::fma(q.w, key.w, dot);
    }
    const bool valid = i < s.q_len && j < s.kv_len && (!s.causal || j <= i);
    S[y * Bc + x] = valid ? Accum::mul(dot, s.scale) : Accum::negative_infinity();

    // Online softmax as step 05; the row max and row sum are still warp
    // shuffles over the Bc lanes of row y (once per tile each). Each lane reads
    // back its own score and overwrites it with P: same thread, same word, so
    // no barrier is needed between the two.
    const Acc S_yx = S[y * Bc + x];
    const Acc m_old = m[y];
    const Acc l_old = l[y];
    const Acc m_new = Accum::max(m_old, warp_max<Accum>(S_yx));
    const Acc m_safe = Accum::is_negative_infinity(m_new) ? Accum::zero() : m_new;
    const Acc P_yx = Accum::exp_of_difference(S_yx, m_safe);
    const Acc alpha = Accum::exp_of_difference(m_old, m_safe);
    S[y * Bc + x] = P_yx;  // P overwrites S: S is dead from here on
    const Acc row_sum = warp_sum<Accum>(P_yx);
    __syncwarp();  // P[y][*] complete, and m[y], l[y] read by every lane of row y
    if (x == 0) {
      m[y] = m_new;
      l[y] = Accum::add(Accum::mul(alpha, l_old), row_sum);
    }

    // O[y][c] = alpha * O[y][c] + sum_key P[y][key] * V_j[key][c] for the
    // columns c = x + u*Bc this lane owns. P[y][key] is one 8-byte word that
    // the whole warp reads (a broadcast); V_j[key][c] is consecutive across
    // lanes (conflict-free). No shuffle: the sum over keys runs inside a thread.
    // Unrolled by 8 rather than fully: fully unrolled, the double kernel at
    // d = 64 spills a few registers.
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = Accum::mul(O_acc[u], alpha);
#pragma unroll 8
    for (int key = 0; key < Bc; ++key) {
      const Acc p = S[y * Bc + key];
#pragma unroll
      for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = Accum::fma(p, V_j[key * kStride + x + u * Bc], O_acc[u]);
    }
    __syncthreads();  // K_j, V_j and P[y][*] are read before the next tile overwrites them
  }

  if (i < s.q_len) {
    const Acc l_row = l[y];
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u)
      O_head[i * q_stride + x + u * Bc] = from_float<T>(Accum::div_to_float(O_acc[u], l_row));
  }
}

/// Launches double_accumulation_kernel for accumulator Accum, element type T and head dimension D on `stream`.
template <class Accum, class T, int D>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  constexpr int Br = kBr;
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale()};
  const int Tr = (p.q_len + Br - 1) / Br;
  const dim3 grid(Tr, p.q_heads, p.batch);
  const dim3 block(Bc, Br);
  constexpr int bytes = shared_bytes<typename Accum::Acc, Br, D>();
  // Above 48 KiB of dynamic shared memory a kernel must opt in. The 8-byte S/P
  // tile adds Br*Bc*4 bytes to step 06's: Br = 16 at d = 128 needs 45.25 KiB,
  // Br = 32 at d = 128 57.5 KiB.
  if (bytes > 48 * 1024)
    FA_CUDA_CHECK(cudaFuncSetAttribute(double_accumulation_kernel<Accum, T, D, Br>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  double_accumulation_kernel<Accum, T, D, Br><<<grid, block, bytes, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), shape);
  FA_CHECK_LAUNCH();
}

/// Picks the head-dimension instantiation for accumulator Accum and element type T.
template <class Accum, class T>
void launch_for_head_dim(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return launch_typed<Accum, T, 32>(p, t, stream);
    case 64: return launch_typed<Accum, T, 64>(p, t, stream);
    case 128: return launch_typed<Accum, T, 128>(p, t, stream);
  }
}

/// Validates the problem against what step 07 supports, then launches accumulator Accum.
template <class Accum>
void launch_accumulating(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 07", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  constexpr int kMaxGridYZ = 65535;
  if (p.q_heads > kMaxGridYZ)
    throw_unsupported("step 07", "q_heads", std::to_string(p.q_heads), "at most 65535 (grid y)");
  if (p.batch > kMaxGridYZ)
    throw_unsupported("step 07", "batch", std::to_string(p.batch), "at most 65535 (grid z)");
  switch (p.dtype) {
    case DType::f32: return launch_for_head_dim<Accum, float>(p, t, stream);
    case DType::f16: return launch_for_head_dim<Accum, __half>(p, t, stream);
    default: break;  // bf16 and anything else: refused below
  }
  throw_unsupported("step 07", "dtype", to_string(p.dtype), "f32, f16");
}

/// Block size, shared memory and occupancy of the kernel launch_typed<Accum, T, D> launches.
template <class Accum, class T, int D>
KernelResources resources_typed() {
  return kernel_resources(reinterpret_cast<const void*>(&double_accumulation_kernel<Accum, T, D, kBr>),
                          kBr * Bc, shared_bytes<typename Accum::Acc, kBr, D>());
}

/// Resources of the instantiation launch_accumulating<Accum> picks for p.
template <class Accum>
KernelResources resources_accumulating(const AttentionProblem& p) {
  const bool f16 = p.dtype == DType::f16;
  switch (p.head_dim) {
    case 32: return f16 ? resources_typed<Accum, __half, 32>() : resources_typed<Accum, float, 32>();
    case 64: return f16 ? resources_typed<Accum, __half, 64>() : resources_typed<Accum, float, 64>();
    case 128: return f16 ? resources_typed<Accum, __half, 128>() : resources_typed<Accum, float, 128>();
  }
  throw_unsupported("step 07", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
}

}  // namespace

/// Step 07 with Acc = double: FP64 sums, exp in double (kBr query rows per block).
void launch_double(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_accumulating<DoubleAccumulation>(p, t, stream);
}
/// Step 07 with Acc = float-float: FP32 error-free transformations (kBr query rows per block).
void launch_ff(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_accumulating<FloatFloatAccumulation>(p, t, stream);
}

/// Resources of the kernel launch_double would launch for p (fa-bench --resources).
KernelResources resources_double(const AttentionProblem& p) { return resources_accumulating<DoubleAccumulation>(p); }
/// Resources of the kernel launch_ff would launch for p.
KernelResources resources_ff(const AttentionProblem& p) { return resources_accumulating<FloatFloatAccumulation>(p); }

}  // namespace fa::step07
