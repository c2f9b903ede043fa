// Step 02: one block per query row; its threads split the keys and join their
// results with block reductions.
//
// In step 01 each of the head_dim threads of a row recomputed every score
// q_i . k_j three times: 3*d computations of every score. Here one block computes
// the whole row O[b, i, h, :]. Its threads split the keys; the row maximum m and
// the softmax sum l are combined with block_max and block_sum (reductions.cuh).
// Each score is computed twice: once for m, once for its weight P_ij. The weights
// go through shared memory, a chunk of keys at a time, so that thread c can add
// sum_j P_ij V[j, c] for its own output column c.
#include "02_reductions/reductions.cuh"
#include "fa/kit.cuh"

namespace fa::step02 {
namespace {

/// What this step accepts. The block has head_dim threads and q_shared holds kMaxHeadDim floats.
using Support = kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>>;

/// One thread per output column: the block has head_dim threads (32, 64 or 128).
/// q is kept in shared memory, so the largest head_dim sets its size.
constexpr int kMaxHeadDim = 128;
/// Keys whose weights P_ij are held in shared memory at once (2 KiB of floats).
/// A chunk loop, not one array of kv_len weights: kv_len can be 16384 or more,
/// and 64 KiB of shared memory per block would leave an SM room for 3 blocks.
constexpr int kKeysPerChunk = 512;

/// Launched with one block per row (b, i, h) and blockDim.x == head_dim.
template <class T>
__global__ void reductions_attention_kernel(kit::Heads<T> s) {
  __shared__ float q_shared[kMaxHeadDim];
  __shared__ float P_chunk[kKeysPerChunk];
  __shared__ BlockReduceScratch<float> scratch;

  // Blocks are numbered in O's own order [batch, q_len, q_heads]: O's row is blockIdx.x.
  const std::int64_t row = blockIdx.x;
  const int h = int(row % s.q_heads);
  const int i = int((row / s.q_heads) % s.q_len);
  const int b = int(row / (std::int64_t(s.q_heads) * s.q_len));
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head
  const int c = threadIdx.x;                          // this thread's output column
  const int threads = blockDim.x;

  const T* __restrict__ q_row = s.q_head(b, h) + i * s.q_stride();
  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const T* __restrict__ V_head = s.v_head(b, kv_head);
  const int kv_stride = s.kv_stride();  // from key j to key j+1
  const int keys = s.causal ? min(i + 1, s.kv_len) : s.kv_len;  // top-left causal: j <= i

  // Every score reads all of q: load it once, as float, for the whole block.
  q_shared[c] = kit::to_float(q_row[c]);
  __syncthreads();

  auto score = [&](int j) {
    const T* k_row = K_head + j * kv_stride;
    float dot = 0.f;
    for (int x = 0; x < s.head_dim; ++x) dot += q_shared[x] * kit::to_float(k_row[x]);
    return s.scale * dot;
  };

  // Pass 1: the row maximum m, so that every exponent below is <= 0. Thread c
  // takes keys c, c + threads, c + 2 * threads, ...; block_max joins them.
  float thread_max = -INFINITY;
  for (int j = c; j < keys; j += threads) thread_max = fmaxf(thread_max, score(j));
  const float m = block_max(thread_max, scratch);

  // Pass 2, a chunk of keys at a time: the threads compute the chunk's weights
  // P_ij = exp(S_ij - m) once, into shared memory; then every thread adds
  // sum_j P_ij V[j, c] for its own column. Each thread also sums its own weights
  // (its share of l); block_sum joins the shares at the end.
  float thread_sum = 0.f;
  float acc = 0.f;
  for (int chunk_start = 0; chunk_start < keys; chunk_start += kKeysPerChunk) {
    const int chunk_keys = min(kKeysPerChunk, keys - chunk_start);
    for (int jj = c; jj < chunk_keys; jj += threads) {
      const float P = expf(score(chunk_start + jj) - m);
      P_chunk[jj] = P;
      thread_sum += P;
    }
    __syncthreads();  // the chunk's weights are all written before anyone reads them
    for (int jj = 0; jj < chunk_keys; ++jj)
      acc += P_chunk[jj] * kit::to_float(V_head[(chunk_start + jj) * kv_stride + c]);
    __syncthreads();  // everyone is done with this chunk before the next one overwrites it
  }
  const float l = block_sum(thread_sum, scratch);

  s.o_head(b, h)[i * s.q_stride() + c] = kit::from_float<T>(acc / l);
  // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
  if (s.LSE && c == 0) s.lse_head(b, h)[i] = m + logf(l);
}

/// Validates the problem, then launches one block of head_dim threads per output row on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 02", [&]<class T, int D>() {
    const dim3 grid = kit::grid_1d(std::int64_t(p.batch) * p.q_len * p.q_heads);  // one block per row
    kit::launch(reductions_attention_kernel<T>, grid, D, 0, stream, kit::heads<T>(p, t));
  });
}

}  // namespace

/// Step 02 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step02
