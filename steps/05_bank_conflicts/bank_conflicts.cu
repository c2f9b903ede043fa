// Step 05: shared-memory bank conflicts, fixed two ways and measured.
//
// Step 04's score loop has lane x of a warp read K_j[x][k]: 32 addresses
// head_dim floats apart. Shared memory has 32 banks of 4 bytes (word w lives in
// bank w % 32), and head_dim is a multiple of 32, so all 32 lanes hit one bank
// and the read is replayed 32 times. The P.V loop reads V_j[x][c] the same way.
// This step changes only where a K/V tile element lives in shared memory, with
// four layouts registered side by side as variants of the step:
//   pad1       row stride head_dim + 1: lane x starts at bank x, scalar reads are
//              conflict-free.
//   pad4       row stride head_dim + 4 with the same scalar reads: lanes x, x+8,
//              x+16, x+24 share a bank, a 4-way conflict ("+4 fixes it" is wrong here).
//   pad4_vec4  row stride head_dim + 4 read as float4: a 16-byte read is served a
//              quarter-warp (8 lanes) at a time, and those 8 lanes cover all 32
//              banks exactly once, so +4 is conflict-free for this access only.
//   transpose  K and V tiles stored transposed, [head_dim][Bc]: lane x reads word
//              k*Bc + x, consecutive across lanes. The price moves to the store:
//              the loader writes a row of the tile (consecutive k) into a column of
//              the transposed tile, Bc words apart, a 32-way conflict on the store.
// Everything else is step 04's kernel, line for line.
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"

#include <cuda_fp16.h>

#include <string>

namespace fa::step05 {

/// Where element (key, column) of a K/V tile lives in shared memory.
enum class Layout { pad1, pad4, pad4_vec4, transpose };

namespace {

/// Bc = 32 keys per K/V tile, one per lane; Br = 16 query rows (as step 04).
constexpr int Bc = 32;
constexpr int Br = 16;                       ///< query rows per Q tile, one warp each
constexpr int kThreadsPerBlock = Br * Bc;    ///< 512
constexpr unsigned kFullMask = 0xffffffffu;  ///< all 32 lanes take part in every shuffle
static_assert(Bc == 32, "one warp per row of S: Bc must be the warp size");

/// Index of element (key, c) of a K/V tile of head dimension D in layout L.
template <Layout L, int D>
struct TileLayout {
  static constexpr bool transposed = L == Layout::transpose;  ///< stored [D][Bc]
  static constexpr bool vec4 = L == Layout::pad4_vec4;       ///< read as float4
  /// Words between consecutive keys (row-major) or consecutive columns (transposed).
  static constexpr int stride = transposed ? Bc : D + (L == Layout::pad1 ? 1 : 4);
  /// Words one tile occupies.
  static constexpr int words = transposed ? D * Bc : Bc * stride;
  /// Shared-memory index of key `key`, column `c`.
  __device__ static int at(int key, int c) { return transposed ? c * stride + key : key * stride + c; }
};

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

/// Bytes of dynamic shared memory: Q_i and O_i (Br x D), K_j and V_j (one tile
/// each in layout L), m and l (Br).
template <Layout L, int D>
constexpr int shared_bytes() {
  return int(sizeof(float)) * (2 * Br * D + 2 * TileLayout<L, D>::words + 2 * Br);
}

/// Step 04's kernel with K_j and V_j in layout L. Grid (Tr, q_heads, batch),
/// block (Bc, Br): block (q_tile, h, b) computes rows [q_tile*Br, q_tile*Br + Br)
/// of head h in batch b.
template <class T, int D, Layout L>
__global__ void __launch_bounds__(kThreadsPerBlock)
bank_conflicts_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                      T* __restrict__ O, Shape s) {
  using Tile = TileLayout<L, D>;
  // float4 reads need 16-byte alignment: every buffer below starts at a
  // multiple of 4 words because D, Tile::words and Br are multiples of 4.
  extern __shared__ __align__(16) float shared[];
  float* Q_i = shared;              // [Br][D]  this block's query rows, loaded once
  float* K_j = Q_i + Br * D;        // one key tile in layout L
  float* V_j = K_j + Tile::words;   // one value tile in layout L
  float* O_i = V_j + Tile::words;   // [Br][D]  running, unnormalised output
  float* m = O_i + Br * D;          // [Br]     running row max
  float* l = m + Br;                // [Br]     running row sum of exp(S - m)

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

  for (int e = tid; e < Br * D; e += kThreadsPerBlock) {
    const int row = e / D, col = e % D;
    Q_i[e] = i0 + row < s.q_len ? to_float(Q_head[(i0 + row) * q_stride + col]) : 0.f;
  }
  for (int c = x; c < D; c += Bc) O_i[y * D + c] = 0.f;
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

    // Global reads stay coalesced along d (consecutive threads, consecutive
    // columns); the shared-memory store goes wherever layout L puts (row, col).
    for (int e = tid; e < Bc * D; e += kThreadsPerBlock) {
      const int row = e / D, col = e % D;
      const bool in_range = kv0 + row < s.kv_len;
      K_j[Tile::at(row, col)] = in_range ? to_float(K_head[(kv0 + row) * kv_stride + col]) : 0.f;
      V_j[Tile::at(row, col)] = in_range ? to_float(V_head[(kv0 + row) * kv_stride + col]) : 0.f;
    }
    __syncthreads();

    // S[y][x] = scale * Q_i[y] . K_j[x]. Q_i[y][k] is one address for the whole
    // warp (a broadcast, never a conflict); K_j[x][k] is the read this step fixes.
    const int j = kv0 + x;
    float dot = 0.f;
    if constexpr (Tile::vec4) {
#pragma unroll 4
      for (int k = 0; k < D; k += 4) {
        const float4 q = *reinterpret_cast<const float4*>(&Q_i[y * D + k]);
        const float4 key = *reinterpret_cast<const float4*>(&K_j[Tile::at(x, k)]);
        dot += q.x * key.x + q.y * key.y + q.z * key.z + q.w * key.w;
      }
    } else {
#pragma unroll 8
      for (int k = 0; k < D; ++k) dot += Q_i[y * D + k] * K_j[Tile::at(x, k)];
    }
    const bool valid = i < s.q_len && j < s.kv_len && (!s.causal || j <= i);
    const float S = valid ? s.scale * dot : -INFINITY;

    // Online softmax, exactly as step 04.
    const float m_old = m[y];
    const float l_old = l[y];
    const float m_new = fmaxf(m_old, warp_max(S));
    const float m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float P = expf(S - m_safe);
    const float alpha = expf(m_old - m_safe);
    const float row_sum = warp_sum(P);
    __syncwarp();
    if (x == 0) {
      m[y] = m_new;
      l[y] = alpha * l_old + row_sum;
    }

    // O_i[y][c] = alpha * O_i[y][c] + sum_x P[y][x] * V_j[x][c], one warp sum per
    // column as in step 04; lane x reads V_j[x][c], the same pattern as K_j.
    if constexpr (Tile::vec4) {
      for (int c = 0; c < D; c += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&V_j[Tile::at(x, c)]);
        const float pv[4] = {warp_sum(P * v.x), warp_sum(P * v.y), warp_sum(P * v.z), warp_sum(P * v.w)};
        for (int u = 0; u < 4; ++u)
          if ((c + u) % Bc == x) O_i[y * D + c + u] = alpha * O_i[y * D + c + u] + pv[u];
      }
    } else {
      for (int c = 0; c < D; ++c) {
        const float pv = warp_sum(P * V_j[Tile::at(x, c)]);
        if (c % Bc == x) O_i[y * D + c] = alpha * O_i[y * D + c] + pv;
      }
    }
    __syncthreads();
  }

  if (i < s.q_len) {
    const float l_row = l[y];
    for (int c = x; c < D; c += Bc) O_head[i * q_stride + c] = from_float<T>(O_i[y * D + c] / l_row);
  }
}

/// Launches bank_conflicts_kernel for layout L, element type T and head dimension D on `stream`.
template <Layout L, class T, int D>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.causal, p.softmax_scale()};
  const int Tr = (p.q_len + Br - 1) / Br;
  const dim3 grid(Tr, p.q_heads, p.batch);
  const dim3 block(Bc, Br);
  constexpr int bytes = shared_bytes<L, D>();
  // Above 48 KiB of dynamic shared memory (d = 128) a kernel must opt in.
  if (bytes > 48 * 1024)
    FA_CUDA_CHECK(cudaFuncSetAttribute(bank_conflicts_kernel<T, D, L>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  bank_conflicts_kernel<T, D, L><<<grid, block, bytes, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), shape);
  FA_CHECK_LAUNCH();
}

/// Picks the head-dimension instantiation for layout L and element type T.
template <Layout L, class T>
void launch_for_head_dim(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return launch_typed<L, T, 32>(p, t, stream);
    case 64: return launch_typed<L, T, 64>(p, t, stream);
    case 128: return launch_typed<L, T, 128>(p, t, stream);
  }
}

/// Validates the problem against what step 05 supports, then launches layout L.
template <Layout L>
void launch_layout(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 05", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  constexpr int kMaxGridYZ = 65535;
  if (p.q_heads > kMaxGridYZ)
    throw_unsupported("step 05", "q_heads", std::to_string(p.q_heads), "at most 65535 (grid y)");
  if (p.batch > kMaxGridYZ)
    throw_unsupported("step 05", "batch", std::to_string(p.batch), "at most 65535 (grid z)");
  switch (p.dtype) {
    case DType::f32: return launch_for_head_dim<L, float>(p, t, stream);
    case DType::f16: return launch_for_head_dim<L, __half>(p, t, stream);
    default: break;  // bf16 and anything else: refused below
  }
  throw_unsupported("step 05", "dtype", to_string(p.dtype), "f32, f16");
}

/// Block size, shared memory and occupancy of the kernel launch_typed<L, T, D> launches.
template <Layout L, class T, int D>
KernelResources resources_typed() {
  return kernel_resources(reinterpret_cast<const void*>(&bank_conflicts_kernel<T, D, L>), kThreadsPerBlock,
                          shared_bytes<L, D>());
}

/// Resources of the instantiation launch_layout<L> picks for p.
template <Layout L>
KernelResources resources_layout(const AttentionProblem& p) {
  const bool f16 = p.dtype == DType::f16;
  switch (p.head_dim) {
    case 32: return f16 ? resources_typed<L, __half, 32>() : resources_typed<L, float, 32>();
    case 64: return f16 ? resources_typed<L, __half, 64>() : resources_typed<L, float, 64>();
    case 128: return f16 ? resources_typed<L, __half, 128>() : resources_typed<L, float, 128>();
  }
  throw_unsupported("step 05", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
}

}  // namespace

/// Step 05 with K/V rows padded by one word (scalar reads).
void launch_pad1(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_layout<Layout::pad1>(p, t, stream);
}
/// Step 05 with K/V rows padded by four words, read one float at a time.
void launch_pad4(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_layout<Layout::pad4>(p, t, stream);
}
/// Step 05 with K/V rows padded by four words, read as float4.
void launch_pad4_vec4(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_layout<Layout::pad4_vec4>(p, t, stream);
}
/// Step 05 with K and V tiles stored transposed.
void launch_transpose(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  launch_layout<Layout::transpose>(p, t, stream);
}

/// Resources of the kernel launch_pad1 would launch for p (fa-bench --resources).
KernelResources resources_pad1(const AttentionProblem& p) { return resources_layout<Layout::pad1>(p); }
/// Resources of the kernel launch_pad4 would launch for p.
KernelResources resources_pad4(const AttentionProblem& p) { return resources_layout<Layout::pad4>(p); }
/// Resources of the kernel launch_pad4_vec4 would launch for p.
KernelResources resources_pad4_vec4(const AttentionProblem& p) { return resources_layout<Layout::pad4_vec4>(p); }
/// Resources of the kernel launch_transpose would launch for p.
KernelResources resources_transpose(const AttentionProblem& p) { return resources_layout<Layout::transpose>(p); }

}  // namespace fa::step05
