// The standard-attention baseline: what attention costs without FlashAttention.
//
//   S = scale * Q K^T   one batched cuBLAS GEMM into an Nq x Nkv float matrix per head
//   P = softmax(S)      one kernel, a block per row (causal: masked entries become 0)
//   O = P V             one batched cuBLAS GEMM
//
// The scores are materialised in device memory (the workspace), which is what
// FlashAttention avoids. f32 runs in true FP32 (cuBLAS's default math mode, no
// TF32); f16 and bf16 multiply 16-bit inputs with float accumulation, store S
// in float and P in the input type (like PyTorch's math path). GQA is handled
// with pointer arrays: query head h multiplies KV head h / group.
#include "fa/kit.cuh"

#include <cublas_v2.h>

#include <stdexcept>
#include <string>

namespace fa::cublas {
namespace {

/// What the baseline accepts (its GEMMs take any d: 256 is listed for step 57). S (and P) live in the workspace.
struct Support : kit::Support<kit::DTypes<float, __half, __nv_bfloat16>, kit::HeadDims<32, 64, 128, 256>> {
  static constexpr bool needs_workspace = true;  ///< S and P in global memory
};

/// Throws std::runtime_error naming `what` unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS ") + what + " failed: " + cublasGetStatusString(status));
}

/// One handle per process, created on first use (the runner's warm-up absorbs that cost).
cublasHandle_t handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() { check_cublas(cublasCreate(&h), "cublasCreate"); }
    ~Handle() { cublasDestroy(h); }
  };
  static Handle instance;
  return instance.h;
}

/// bytes rounded up to a multiple of 256 (cuBLAS likes aligned matrices).
std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Workspace layout: S (float), P (16-bit; f16 and bf16 only), six pointer arrays.
struct Layout {
  /// Byte offsets of S, P and the pointer arrays in the workspace, and its total size.
  ///@{
  std::size_t s_offset, p_offset, pointers_offset, total;
  ///@}
};
/// Where S, P and the pointer arrays go in the workspace of problem p.
Layout layout(const AttentionProblem& p) {
  const std::size_t heads = std::size_t(p.batch) * p.q_heads;
  const std::size_t scores = heads * p.q_len * p.kv_len;
  Layout l{};
  l.s_offset = 0;
  l.p_offset = align256(scores * sizeof(float));
  l.pointers_offset = l.p_offset + (p.dtype != DType::f32 ? align256(scores * sizeof(__half)) : 0);
  l.total = l.pointers_offset + align256(6 * heads * sizeof(void*));
  return l;
}

/// The sizes make_pointers needs, passed by value.
struct Dims {
  /// As in fa::AttentionProblem.
  ///@{
  int batch, q_len, kv_len, q_heads, kv_heads, head_dim;
  ///@}
};

/// Pointer arrays for the batched GEMMs: one entry per (batch, query head).
__global__ void make_pointers(const char* Q, const char* K, const char* V, char* O, float* S, void* P,
                              const void** q_ptr, const void** k_ptr, const void** v_ptr, void** o_ptr,
                              float** s_ptr, void** p_ptr, Dims p, int elem_bytes, int p_bytes) {
  const int bh = blockIdx.x * blockDim.x + threadIdx.x;
  if (bh >= p.batch * p.q_heads) return;
  const int b = bh / p.q_heads, h = bh % p.q_heads, kv_head = h / (p.q_heads / p.kv_heads);
  const long long q_off = ((long long)b * p.q_len * p.q_heads + h) * p.head_dim * elem_bytes;
  const long long kv_off = ((long long)b * p.kv_len * p.kv_heads + kv_head) * p.head_dim * elem_bytes;
  const long long s_elems = (long long)bh * p.q_len * p.kv_len;
  q_ptr[bh] = Q + q_off;
  o_ptr[bh] = O + q_off;
  k_ptr[bh] = K + kv_off;
  v_ptr[bh] = V + kv_off;
  s_ptr[bh] = S + s_elems;
  p_ptr[bh] = static_cast<char*>(P) + s_elems * p_bytes;
}

/// Row-wise safe softmax of S into P (P may alias S when both are float).
/// Row r's log-sum-exp goes to lse[r] when lse is set (S's rows are LSE's: [batch, q_heads, q_len]).
template <int kThreads, class TP>
__global__ void softmax_rows(const float* S, TP* P, float* lse, int q_len, int kv_len, bool causal) {
  __shared__ float partial[kThreads];
  const long long row = blockIdx.x;
  const int i = int(row % q_len);
  const int keys = causal ? min(i + 1, kv_len) : kv_len;
  const float* s = S + row * kv_len;
  TP* out = P + row * kv_len;

  float m = -INFINITY;
  for (int j = threadIdx.x; j < keys; j += kThreads) m = fmaxf(m, s[j]);
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  m = partial[0];
  __syncthreads();

  float l = 0.f;
  for (int j = threadIdx.x; j < keys; j += kThreads) l += expf(s[j] - m);
  partial[threadIdx.x] = l;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv_l = 1.f / partial[0];
  // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
  if (lse && threadIdx.x == 0) lse[row] = m + logf(partial[0]);

  for (int j = threadIdx.x; j < kv_len; j += kThreads)
    out[j] = kit::from_float<TP>(j < keys ? expf(s[j] - m) * inv_l : 0.f);
}

/// Bytes of S, P and the pointer arrays for problem p.
std::size_t workspace_bytes(const AttentionProblem& p) { return layout(p).total; }

/// The three stages on `stream` for element type T.
template <class T>
void run(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  if (std::size_t(p.q_len) * p.kv_len > std::size_t(1) << 31)
    throw InvalidProblem("cublas baseline: q_len * kv_len = " + std::to_string(std::size_t(p.q_len) * p.kv_len) +
                         " scores per head exceed 2^31");

  const bool narrow = p.dtype != DType::f32;  // f16 or bf16: P gets its own 16-bit buffer
  const Layout l = layout(p);
  char* ws = static_cast<char*>(t.workspace);
  float* S = reinterpret_cast<float*>(ws + l.s_offset);
  void* P = narrow ? static_cast<void*>(ws + l.p_offset) : static_cast<void*>(S);
  const int heads = p.batch * p.q_heads;
  void** arrays = reinterpret_cast<void**>(ws + l.pointers_offset);
  const void** q_ptr = const_cast<const void**>(arrays);
  const void** k_ptr = const_cast<const void**>(arrays + heads);
  const void** v_ptr = const_cast<const void**>(arrays + 2 * heads);
  void** o_ptr = arrays + 3 * heads;
  float** s_ptr = reinterpret_cast<float**>(arrays + 4 * heads);
  void** p_ptr = arrays + 5 * heads;

  kit::launch(make_pointers, kit::ceil_div(heads, 128), 128, 0, stream, static_cast<const char*>(t.q),
              static_cast<const char*>(t.k), static_cast<const char*>(t.v), static_cast<char*>(t.o), S, P, q_ptr,
              k_ptr, v_ptr, o_ptr, s_ptr, p_ptr, Dims{p.batch, p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.head_dim},
              int(size_of(p.dtype)), narrow ? 2 : 4);

  cublasHandle_t h = handle();
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  const cudaDataType io_type =
      p.dtype == DType::f16 ? CUDA_R_16F : p.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const float scale = p.softmax_scale(), one = 1.f, zero = 0.f;
  const int d = p.head_dim;

  // Column-major view: S^T (Nkv x Nq, ld Nkv) = K_h^T-as-(Nkv x d) * Q_h-as-(d x Nq).
  check_cublas(cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, p.kv_len, p.q_len, d, &scale,
                                   k_ptr, io_type, p.kv_heads * d, q_ptr, io_type, p.q_heads * d, &zero,
                                   reinterpret_cast<void* const*>(s_ptr), CUDA_R_32F, p.kv_len, heads,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "GEMM S = QK^T");

  constexpr int kThreads = 256;
  const dim3 rows = kit::grid_1d(std::int64_t(heads) * p.q_len);  // one block per row of S
  kit::launch(softmax_rows<kThreads, T>, rows, kThreads, 0, stream, S, static_cast<T*>(P), t.lse, p.q_len,
              p.kv_len, p.causal);

  // Column-major view: O_h^T (d x Nq, ld Hq*d) = V_h-as-(d x Nkv) * P^T-as-(Nkv x Nq).
  check_cublas(cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, d, p.q_len, p.kv_len, &one,
                                   v_ptr, io_type, p.kv_heads * d, p_ptr, io_type, p.kv_len, &zero,
                                   o_ptr, io_type, p.q_heads * d, heads, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
               "GEMM O = PV");
}

/// Validates the problem, then runs the three stages on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "cublas baseline", [&]<class T, int D>() { run<T>(p, t, stream); });
}

}  // namespace

/// The baseline as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::cublas
