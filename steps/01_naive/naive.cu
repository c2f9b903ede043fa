// Step 01: naive attention, one thread per output element.
//
// The most direct translation of O = softmax(scale * Q K^T) V: thread (b, i, h, c)
// computes O[b, i, h, c] on its own, walking all keys three times -- once for
// the row maximum, once for the softmax denominator, once for the weighted sum
// of V[:, c]. Nothing is shared, so every score q_i . k_j is recomputed 3 times
// by each of the head_dim threads of a row: 3*d recomputations of every score.
// That makes this the slowest step, on purpose; it is the baseline for "right".
#include "fa/cuda_check.hpp"
#include "fa/problem.hpp"

#include <cuda_fp16.h>

#include <string>

namespace fa::step01 {
namespace {

constexpr int kThreadsPerBlock = 256;  ///< one thread per output element, 256 to a block

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
  int q_len, kv_len, q_heads, kv_heads, head_dim;
  ///@}
  bool causal;  ///< top-left causal mask: query i sees keys j <= i
  float scale;  ///< softmax scale applied to Q·Kᵀ
};

/// Thread idx computes output element idx of O (of total_outputs), reading the whole
/// rows of K and V it needs straight from global memory.
template <class T>
__global__ void naive_attention_kernel(const T* __restrict__ Q, const T* __restrict__ K,
                                       const T* __restrict__ V, T* __restrict__ O,
                                       int total_outputs, Shape s) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total_outputs) return;

  // O is [batch, q_len, q_heads, head_dim]: peel the coordinates off the flat index.
  const int c = idx % s.head_dim;
  const int h = (idx / s.head_dim) % s.q_heads;
  const int i = (idx / (s.head_dim * s.q_heads)) % s.q_len;
  const int b = idx / (s.head_dim * s.q_heads * s.q_len);
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  const T* q_row = Q + ((b * s.q_len + i) * s.q_heads + h) * s.head_dim;
  const T* K_head = K + (b * s.kv_len * s.kv_heads + kv_head) * s.head_dim;
  const T* V_head = V + (b * s.kv_len * s.kv_heads + kv_head) * s.head_dim;
  const int kv_stride = s.kv_heads * s.head_dim;  // from key j to key j+1
  const int keys = s.causal ? min(i + 1, s.kv_len) : s.kv_len;  // top-left causal: j <= i

  auto score = [&](int j) {
    float dot = 0.f;
    for (int x = 0; x < s.head_dim; ++x) dot += to_float(q_row[x]) * to_float(K_head[j * kv_stride + x]);
    return s.scale * dot;
  };

  // Pass 1: the row maximum m, so that every exponent below is <= 0.
  float m = -INFINITY;
  for (int j = 0; j < keys; ++j) m = fmaxf(m, score(j));
  // Pass 2: the softmax denominator l.
  float l = 0.f;
  for (int j = 0; j < keys; ++j) l += expf(score(j) - m);
  // Pass 3: this thread's output column, sum_j P_ij V[j, c].
  float acc = 0.f;
  for (int j = 0; j < keys; ++j) acc += expf(score(j) - m) * to_float(V_head[j * kv_stride + c]);

  O[idx] = from_float<T>(acc / l);
}

/// Launches naive_attention_kernel for element type T on `stream`.
template <class T>
void launch_typed(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  const int total = int(p.q_elements());  // validate() guarantees this fits in int
  const Shape shape{p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.head_dim, p.causal, p.softmax_scale()};
  const int blocks = (total + kThreadsPerBlock - 1) / kThreadsPerBlock;
  naive_attention_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v),
      static_cast<T*>(t.o), total, shape);
  FA_CHECK_LAUNCH();
}

}  // namespace

void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  validate(p);
  // The kernel works for any head_dim; the step accepts the sizes the course tests.
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw_unsupported("step 01", "head_dim", std::to_string(p.head_dim), "32, 64, 128");
  switch (p.dtype) {
    case DType::f32: return launch_typed<float>(p, t, stream);
    case DType::f16: return launch_typed<__half>(p, t, stream);
    default: break;  // bf16 and anything else: refused below
  }
  throw_unsupported("step 01", "dtype", to_string(p.dtype), "f32, f16");
}

}  // namespace fa::step01
