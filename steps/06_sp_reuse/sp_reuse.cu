// Step 06: S/P reuse. The score tile lives in shared memory, P overwrites S,
// and each thread owns output columns, so O moves to registers.
//
// Step 05 (pad4_vec4 layout, kept here) held one score per thread in a register
// and formed O += P.V with one 5-shuffle warp_sum per head_dim column: 5*D
// shuffles per row per K/V tile for D useful products per lane. Here thread
// (x, y) writes its score to S[y][x] in one Br x Bc shared tile, turns it into
// P = exp(S - m_new) in place (S is dead once P exists, so one buffer holds
// both), and then every lane of row y reads the whole row P[y][*] (a
// broadcast) to accumulate the columns it owns, c = x, x+Bc, ...: no shuffle in
// P.V at all. Those D/Bc accumulators per thread are registers, so step 05's
// Br x D O_i buffer is gone: Br*D*4 bytes freed for an S/P tile of Br*Bc*4.
// The freed shared memory pays for taller Q tiles, so Br is a template
// parameter (8, 16, 32 are registered). m and l stay where step 05 had them.
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"

#include <cuda_fp16.h>

#include <string>

namespace fa::step06 {
namespace {

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

/// Loads and stores in the tensor's type; all arithmetic is in float.
///@{
__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
template <class T> __device__ T from_float(float x);
template <> __device__ float from_float<float>(float x) { return x; }
template <> __device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
///@}

/// Butterfly max over the 32 lanes of a warp; every lane gets the result.
__device__ float warp_max(float value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}
/// Butterfly sum over the 32 lanes of a warp; every lane gets the result.
__device__ float warp_sum(float value) {
  for (int offset = Bc / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
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
/// each), the S/P tile (Br x Bc), m and l (Br). No O_i: O is in registers.
template <int Br, int D>
constexpr int shared_bytes() {
  return int(sizeof(float)) * (Br * D + 2 * Bc * kv_stride_words<D>() + Br * Bc + 2 * Br);
}

/// Step 05's kernel with S and P in one shared tile and O in registers.
/// Grid (Tr, q_heads, batch), block (Bc, Br): block (q_tile, h, b) computes
/// rows [q_tile*Br, q_tile*Br + Br) of head h in batch b.
template <class T, int D, int Br>
__global__ void __launch_bounds__(Br * Bc)
sp_reuse_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                T* __restrict__ O, Shape s) {
  constexpr int kThreadsPerBlock = Br * Bc;
  constexpr int kStride = kv_stride_words<D>();
  constexpr int kColumnsPerLane = D / Bc;  // output columns x, x+Bc, ... of row y
  static_assert(D % Bc == 0, "every lane owns the same number of output columns");
  // float4 reads need 16-byte alignment: every buffer below starts at a
  // multiple of 4 words because D, kStride, Bc and Br are multiples of 4.
  extern __shared__ __align__(16) float shared[];
  float* Q_i = shared;             // [Br][D]       this block's query rows, loaded once
  float* K_j = Q_i + Br * D;       // [Bc][kStride] one key tile
  float* V_j = K_j + Bc * kStride; // [Bc][kStride] one value tile
  float* S = V_j + Bc * kStride;   // [Br][Bc]      scores, then P in place
  float* m = S + Br * Bc;          // [Br]          running row max
  float* l = m + Br;               // [Br]          running row sum of exp(S - m)

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
  float O_acc[kColumnsPerLane];
#pragma unroll
  for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] = 0.f;

  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
  }
  if (x == 0) {
    m[y] = -INFINITY;
    l[y] = 0.f;
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

    // S[y][x] = scale * Q_i[y] . K_j[x], read as float4 as in step 05, and
    // written to the shared tile: consecutive lanes, consecutive words, no
    // conflict, so its rows need no padding.
    const int j = kv0 + x;
    float dot = 0.f;
#pragma unroll 4
    for (int k = 0; k < D; k += 4) {
      const float4 q = *reinterpret_cast<const float4*>(&Q_i[y * D + k]);
      const float4 key = *reinterpret_cast<const float4*>(&K_j[x * kStride + k]);
      dot += q.x * key.x + q.y * key.y + q.z * key.z + q.w * key.w;
    }
    const bool valid = i < s.q_len && j < s.kv_len && (!s.causal || j <= i);
    S[y * Bc + x] = valid ? s.scale * dot : -INFINITY;

    // Online softmax as step 05; the row max and row sum are still warp
    // shuffles over the Bc lanes of row y (once per tile each). Each lane reads
    // back its own score and overwrites it with P: same thread, same word, so
    // no barrier is needed between the two.
    const float S_yx = S[y * Bc + x];
    const float m_old = m[y];
    const float l_old = l[y];
    const float m_new = fmaxf(m_old, warp_max(S_yx));
    const float m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float P_yx = expf(S_yx - m_safe);
    const float alpha = expf(m_old - m_safe);
    S[y * Bc + x] = P_yx;  // P overwrites S: S is dead from here on
    const float row_sum = warp_sum(P_yx);
    __syncwarp();  // P[y][*] complete, and m[y], l[y] read by every lane of row y
    if (x == 0) {
      m[y] = m_new;
      l[y] = alpha * l_old + row_sum;
    }

    // O[y][c] = alpha * O[y][c] + sum_key P[y][key] * V_j[key][c] for the
    // columns c = x + u*Bc this lane owns. P[y][key..key+3] is one float4 that
    // the whole warp reads (a broadcast); V_j[key][c] is consecutive across
    // lanes (conflict-free). No shuffle: the sum over keys runs inside a thread.
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u) O_acc[u] *= alpha;
#pragma unroll
    for (int key = 0; key < Bc; key += 4) {
      const float4 p = *reinterpret_cast<const float4*>(&S[y * Bc + key]);
#pragma unroll
      for (int u = 0; u < kColumnsPerLane; ++u) {
        const int c = x + u * Bc;
        O_acc[u] += p.x * V_j[(key + 0) * kStride + c] + p.y * V_j[(key + 1) * kStride + c] +
                    p.z * V_j[(key + 2) * kStride + c] + p.w * V_j[(key + 3) * kStride + c];
      }
    }
    __syncthreads();  // K_j, V_j and P[y][*] are read before the next tile overwrites them
  }

  if (i < s.q_len) {
    const float l_row = l[y];
#pragma unroll
    for (int u = 0; u < kColumnsPerLane; ++u) O_head[i * q_stride + x + u * Bc] = from_float<T>(O_acc[u] / l_row);
  }
}

/// Launches sp_reuse_kernel for Br query rows, element type T and head dimension D on `stream`.
template <int Br, class T, int D>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale()};
  const int Tr = (p.q_len + Br - 1) / Br;
  const dim3 grid(Tr, p.q_heads, p.batch);
  const dim3 block(Bc, Br);
  constexpr int bytes = shared_bytes<Br, D>();
  // Above 48 KiB of dynamic shared memory (Br = 32 at d = 128) a kernel must opt in.
  if (bytes > 48 * 1024)
    FA_CUDA_CHECK(cudaFuncSetAttribute(sp_reuse_kernel<T, D, Br>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       bytes));
  sp_reuse_kernel<T, D, Br><<<grid, block, bytes, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), shape);
  FA_CHECK_LAUNCH();
}

/// Picks the head-dimension instantiation for Br query rows and element type T.
template <int Br, class T>
void launch_for_head_dim(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return launch_typed<Br, T, 32>(p, t, stream);
    case 64: return launch_typed<Br, T, 64>(p, t, stream);
    case 128: return launch_typed<Br, T, 128>(p, t, stream);
  }
}

/// Validates the problem against what step 06 supports, then launches Br query rows per block.
template <int Br>
void launch_rows(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 06", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  constexpr int kMaxGridYZ = 65535;
  if (p.q_heads > kMaxGridYZ)
    throw_unsupported("step 06", "q_heads", std::to_string(p.q_heads), "at most 65535 (grid y)");
  if (p.batch > kMaxGridYZ)
    throw_unsupported("step 06", "batch", std::to_string(p.batch), "at most 65535 (grid z)");
  switch (p.dtype) {
    case DType::f32: return launch_for_head_dim<Br, float>(p, t, stream);
    case DType::f16: return launch_for_head_dim<Br, __half>(p, t, stream);
    default: break;  // bf16 and anything else: refused below
  }
  throw_unsupported("step 06", "dtype", to_string(p.dtype), "f32, f16");
}

/// Block size, shared memory and occupancy of the kernel launch_typed<Br, T, D> launches.
template <int Br, class T, int D>
KernelResources resources_typed() {
  return kernel_resources(reinterpret_cast<const void*>(&sp_reuse_kernel<T, D, Br>), Br * Bc,
                          shared_bytes<Br, D>());
}

/// Resources of the instantiation launch_rows<Br> picks for p.
template <int Br>
KernelResources resources_rows(const AttentionProblem& p) {
  const bool f16 = p.dtype == DType::f16;
  switch (p.head_dim) {
    case 32: return f16 ? resources_typed<Br, __half, 32>() : resources_typed<Br, float, 32>();
    case 64: return f16 ? resources_typed<Br, __half, 64>() : resources_typed<Br, float, 64>();
    case 128: return f16 ? resources_typed<Br, __half, 128>() : resources_typed<Br, float, 128>();
  }
  throw_unsupported("step 06", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
}

}  // namespace

/// Step 06 with Br = 8 query rows per block (256 threads).
void launch_br8(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_rows<8>(p, t, stream);
}
/// Step 06 with Br = 16 query rows per block (512 threads).
void launch_br16(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_rows<16>(p, t, stream);
}
/// Step 06 with Br = 32 query rows per block (1024 threads).
void launch_br32(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_rows<32>(p, t, stream);
}

/// Resources of the kernel launch_br8 would launch for p (fa-bench --resources).
KernelResources resources_br8(const AttentionProblem& p) { return resources_rows<8>(p); }
/// Resources of the kernel launch_br16 would launch for p.
KernelResources resources_br16(const AttentionProblem& p) { return resources_rows<16>(p); }
/// Resources of the kernel launch_br32 would launch for p.
KernelResources resources_br32(const AttentionProblem& p) { return resources_rows<32>(p); }

}  // namespace fa::step06
