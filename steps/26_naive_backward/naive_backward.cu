// Step 26: the backward pass, naively: every formula its own kernel, P and dS in memory.
//
// Training needs dQ, dK and dV, the gradients of a loss through O = softmax(scale Q K^T) V, given
// dO = dLoss/dO. With P the softmax, the chain rule gives five products and one row sum:
//   dV = P^T dO        dP = dO V^T        D_i = sum_c dO_ic O_ic  (= sum_j P_ij dP_ij)
//   dS = P o (dP - D)  dQ = scale dS K    dK = scale dS^T Q
// P is not kept by the forward: it is recomputed from the row log-sum-exp the forward wrote,
// P_ij = exp(scale q_i . k_j - LSE_i), with no running max or sum. This step writes P and dS to
// memory, Nq x Nkv floats each per head, and runs one thread per element of each: obviously right,
// and the baseline the FlashAttention backward (step 27) removes the N x N memory from.
#include "26_naive_backward/row_dot.cuh"
#include "fa/kit.cuh"

namespace fa::step26 {
namespace {

/// What this step accepts. CUDA cores in float, like step 01; it needs the workspace for P, dS and D.
struct Support : kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>> {
  static constexpr Pass pass = Pass::backward;     ///< dQ, dK, dV from Q, K, V, O, LSE and dO
  static constexpr bool needs_workspace = true;    ///< P and dS (Nq x Nkv per head) and D in global memory
};


/// The workspace: P and dS, each [batch, q_heads, q_len, kv_len] floats, then D, [batch, q_heads, q_len].
struct Workspace {
  float* P;   ///< P_ij, recomputed from LSE (0 where masked)
  float* dS;  ///< dS_ij = P_ij (dP_ij - D_i)
  float* D;   ///< D_i = dO_i . O_i
};

/// Element (b, h, i, j) of a [batch, q_heads, q_len, kv_len] score matrix.
template <class T>
__device__ std::int64_t score_index(const kit::Grads<T>& s, int b, int h, int i, int j) {
  return ((std::int64_t(b) * s.q_heads + h) * s.q_len + i) * s.kv_len + j;
}

/// The coordinates of one element of a score matrix.
struct Score {
  int b;  ///< batch
  int h;  ///< query head
  int i;  ///< query row
  int j;  ///< key
};
/// The coordinates of score element idx: the inverse of score_index.
template <class T>
__device__ Score score_of(const kit::Grads<T>& s, std::int64_t idx) {
  return {int(idx / (std::int64_t(s.kv_len) * s.q_len * s.q_heads)),
          int((idx / (std::int64_t(s.kv_len) * s.q_len)) % s.q_heads), int((idx / s.kv_len) % s.q_len),
          int(idx % s.kv_len)};
}

/// Thread (b, h, i, j) recomputes P_ij from the forward's LSE: exp(scale q_i . k_j - LSE_i), 0 where
/// the causal mask hides key j from row i.
template <class T>
__global__ void probabilities_kernel(kit::Grads<T> s, Workspace w, std::int64_t total) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const auto [b, h, i, j] = score_of(s, idx);
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  float p = 0.f;
  if (!s.causal || j <= i) {  // top-left causal: j <= i
    const T* __restrict__ q_row = s.q_head(b, h) + i * s.q_stride();
    const T* __restrict__ k_row = s.k_head(b, kv_head) + j * s.kv_stride();
    float dot = 0.f;
    for (int x = 0; x < s.head_dim; ++x) dot += kit::to_float(q_row[x]) * kit::to_float(k_row[x]);
    p = expf(s.scale * dot - s.lse_head(b, h)[i]);  // the forward's softmax, without its max and sum
  }
  w.P[idx] = p;
}

/// Thread (b, h, i, j) computes dP_ij = dO_i . V_j and dS_ij = P_ij (dP_ij - D_i): the softmax's
/// Jacobian applied to dP. A masked score has P_ij = 0, so its dS_ij is 0 too.
template <class T>
__global__ void score_gradient_kernel(kit::Grads<T> s, Workspace w, std::int64_t total) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const auto [b, h, i, j] = score_of(s, idx);
  const int kv_head = h / (s.q_heads / s.kv_heads);

  const T* __restrict__ do_row = s.do_head(b, h) + i * s.q_stride();
  const T* __restrict__ v_row = s.v_head(b, kv_head) + j * s.kv_stride();
  float dP = 0.f;
  for (int c = 0; c < s.head_dim; ++c) dP += kit::to_float(do_row[c]) * kit::to_float(v_row[c]);
  const std::int64_t row = (std::int64_t(b) * s.q_heads + h) * s.q_len + i;
  w.dS[idx] = w.P[idx] * (dP - w.D[row]);
}

/// Thread (b, i, h, c) computes dQ[b, i, h, c] = scale sum_j dS_ij K[j, c].
template <class T>
__global__ void dq_kernel(kit::Grads<T> s, Workspace w, std::int64_t total) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int c = int(idx % s.head_dim);
  const int h = int((idx / s.head_dim) % s.q_heads);
  const int i = int((idx / (s.head_dim * s.q_heads)) % s.q_len);
  const int b = int(idx / (std::int64_t(s.head_dim) * s.q_heads * s.q_len));
  const int kv_head = h / (s.q_heads / s.kv_heads);

  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const float* dS_row = w.dS + score_index(s, b, h, i, 0);
  float acc = 0.f;
  for (int j = 0; j < s.kv_len; ++j) acc += dS_row[j] * kit::to_float(K_head[j * s.kv_stride() + c]);
  s.dQ[idx] = kit::from_float<T>(s.scale * acc);  // dQ is shaped like Q: idx is (b, i, h, c)
}

/// Thread (b, j, kv_h, c) computes dK and dV of key j, column c: sums over every query row i of every
/// query head h that reads KV head kv_h (its GQA group), dV[j, c] = sum P_ij dO[i, c] and
/// dK[j, c] = scale sum dS_ij Q[i, c].
template <class T>
__global__ void dkv_kernel(kit::Grads<T> s, Workspace w, std::int64_t total) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int c = int(idx % s.head_dim);
  const int kv_h = int((idx / s.head_dim) % s.kv_heads);
  const int j = int((idx / (s.head_dim * s.kv_heads)) % s.kv_len);
  const int b = int(idx / (std::int64_t(s.head_dim) * s.kv_heads * s.kv_len));
  const int group = s.q_heads / s.kv_heads;

  float dV = 0.f, dK = 0.f;
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    const T* __restrict__ Q_head = s.q_head(b, h);
    const T* __restrict__ dO_head = s.do_head(b, h);
    for (int i = 0; i < s.q_len; ++i) {
      const std::int64_t ij = score_index(s, b, h, i, j);
      dV += w.P[ij] * kit::to_float(dO_head[i * s.q_stride() + c]);
      dK += w.dS[ij] * kit::to_float(Q_head[i * s.q_stride() + c]);
    }
  }
  s.dV[idx] = kit::from_float<T>(dV);  // dK and dV are shaped like K: idx is (b, j, kv_h, c)
  s.dK[idx] = kit::from_float<T>(s.scale * dK);
}

/// Bytes of P and dS (q_len x kv_len floats each, per batch and query head) and of D.
std::size_t workspace_bytes(const AttentionProblem& p) {
  const std::size_t scores = std::size_t(p.batch) * p.q_heads * p.q_len * p.kv_len;
  return (2 * scores + std::size_t(p.lse_elements())) * sizeof(float);
}

/// Validates the problem, then launches the five kernels in order on `stream` (D's comes from row_dot.cuh).
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 26", [&]<class T, int D>() {
    const std::int64_t scores = std::int64_t(p.batch) * p.q_heads * p.q_len * p.kv_len;
    float* workspace = static_cast<float*>(t.workspace);
    const Workspace w{workspace, workspace + scores, workspace + 2 * scores};
    const kit::Grads<T> s = kit::grads<T>(p, t);
    kit::launch(probabilities_kernel<T>, bwd::row_blocks(scores), bwd::kRowThreads, 0, stream, s, w, scores);
    kit::launch(bwd::row_dot_kernel<T>, bwd::row_blocks(p.lse_elements()), bwd::kRowThreads, 0, stream, s, w.D,
                p.lse_elements());
    kit::launch(score_gradient_kernel<T>, bwd::row_blocks(scores), bwd::kRowThreads, 0, stream, s, w, scores);
    kit::launch(dq_kernel<T>, bwd::row_blocks(p.q_elements()), bwd::kRowThreads, 0, stream, s, w, p.q_elements());
    kit::launch(dkv_kernel<T>, bwd::row_blocks(p.kv_elements()), bwd::kRowThreads, 0, stream, s, w, p.kv_elements());
  });
}

}  // namespace

/// Step 26 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step26
