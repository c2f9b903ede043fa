// Step 01: naive attention, one thread per output element.
//
// The most direct translation of O = softmax(scale * Q K^T) V: thread (b, i, h, c)
// computes O[b, i, h, c] on its own, walking all keys three times -- once for
// the row maximum, once for the softmax denominator, once for the weighted sum
// of V[:, c]. Nothing is shared, so every score q_i . k_j is recomputed 3 times
// by each of the head_dim threads of a row: 3*d recomputations of every score.
// That makes this the slowest step, on purpose; it is the baseline for "right".
#include "fa/kit.cuh"

namespace fa::step01 {
namespace {

/// What this step accepts. The kernel works for any head_dim; the step takes the sizes the course tests.
using Support = kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>>;

constexpr int kThreadsPerBlock = 256;  ///< one thread per output element, 256 to a block

/// Thread idx computes output element idx of O (of total_outputs), reading the whole
/// rows of K and V it needs straight from global memory.
template <class T>
__global__ void naive_attention_kernel(kit::Heads<T> s, std::int64_t total_outputs) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total_outputs) return;

  // O is [batch, q_len, q_heads, head_dim]: peel the coordinates off the flat index.
  const int c = int(idx % s.head_dim);
  const int h = int((idx / s.head_dim) % s.q_heads);
  const int i = int((idx / (s.head_dim * s.q_heads)) % s.q_len);
  const int b = int(idx / (std::int64_t(s.head_dim) * s.q_heads * s.q_len));
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  const T* __restrict__ q_row = s.q_head(b, h) + i * s.q_stride();
  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const T* __restrict__ V_head = s.v_head(b, kv_head);
  const int kv_stride = s.kv_stride();  // from key j to key j+1
  const int keys = s.causal ? min(i + 1, s.kv_len) : s.kv_len;  // top-left causal: j <= i

  auto score = [&](int j) {
    float dot = 0.f;
    for (int x = 0; x < s.head_dim; ++x) dot += kit::to_float(q_row[x]) * kit::to_float(K_head[j * kv_stride + x]);
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
  for (int j = 0; j < keys; ++j) acc += expf(score(j) - m) * kit::to_float(V_head[j * kv_stride + c]);

  s.O[idx] = kit::from_float<T>(acc / l);
  // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
  if (s.LSE && c == 0) s.lse_head(b, h)[i] = m + logf(l);
}

/// Validates the problem, then launches one thread per output element on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 01", [&]<class T, int D>() {
    const std::int64_t total = p.q_elements();
    const dim3 grid = kit::grid_1d((total + kThreadsPerBlock - 1) / kThreadsPerBlock);
    kit::launch(naive_attention_kernel<T>, grid, kThreadsPerBlock, 0, stream, kit::heads<T>(p, t), total);
  });
}

}  // namespace

/// Step 01 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step01
