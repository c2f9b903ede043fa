// Step 42: split-KV decoding (flash-decoding).
//
// A model that generates text asks, per sequence, for one new query (or a few) against a long KV cache. The
// forward steps give each (query tile, head, batch) one block: at B = 1 with 32 heads that is 32 blocks for 132
// SMs, each walking 131,072 keys alone, and the work is reading K and V once, so the time is set by how many SMs
// read. Here the keys of each (head, batch) are split among `splits` blocks. Block s reads its slice of the keys
// and writes what the online softmax gives for it: a partial O (normalized over its slice) and the slice's
// log-sum-exp. A second kernel merges the slices exactly: with LSE = log sum_s exp(LSE_s),
// O = sum_s exp(LSE_s - LSE) O_s, the same identity the online softmax applies tile by tile. The number of
// splits is chosen from the work (batch x query heads), the SM count and how many split blocks an SM holds, so
// that the split kernel's blocks fill whole waves of the GPU; where the work does that without splitting, one
// split writes O itself and no merge runs.
//
// The step takes the KV cache's per-sequence lengths and the bottom-right causal mask (q_len new tokens, up to
// kMaxQueries), and refuses a paged cache (a later step takes it). Each query head reads its KV head's keys on its
// own; under GQA the group's heads read the same K and V again (step 43 packs them).
#include "42_split_kv_decode/split_kv.cuh"
#include "fa/kit.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace fa::step42 {
namespace {

constexpr int kMaxQueries = 8;  ///< new tokens per sequence a call may bring (q_len): decode's, speculative

/// What this step accepts: 16-bit inputs read 16 bytes at a time; per-sequence lengths and the bottom-right mask.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 80;           ///< as the course's other 16-bit steps
  static constexpr int pointer_alignment = 16;  ///< 16-byte loads of K, V and Q rows
  static constexpr bool needs_workspace = true; ///< the splits' partial O and LSE, in float
  /// Per-sequence lengths, the bottom-right mask, and at most kMaxQueries new tokens per sequence.
  static constexpr CacheForms cache_forms{.kv_lens = true, .bottom_right = true, .max_q_len = kMaxQueries};
};

constexpr int kThreads = 128;       ///< threads of a split block: 4 warps
constexpr int kUnroll = 4;          ///< keys a lane group loads before it uses the first: bytes in flight

/// Lanes that share one key: each holds 8 of its D elements (16 bytes of K, 16 of V).
template <int D> constexpr int kKeyLanes = D / 8;
/// Lane groups of a block: they walk the block's keys side by side, group g keys g, g + kGroups, ...
template <int D> constexpr int kGroups = kThreads / kKeyLanes<D>;

/// Block (split, h, b): the keys of split `split` of sequence b, for each of the q_len <= kRows query rows of
/// head h. Lane group g (kKeyLanes<D> consecutive lanes) takes keys first + g, first + g + kGroups, ..; lane c of
/// the group holds columns 8c .. 8c + 7 of Q's rows, of each key, and of its partial O. Writes, per row, the
/// slice's O (divided by its own sum) and its log-sum-exp in log2 units into the workspace; a row that sees none
/// of the slice's keys gets O = 0 and -inf. With one split (gridDim.x = 1) it writes O and LSE instead. kRows is
/// a compile-time bound, so that the rows' registers stay registers (decode's q_len = 1 keeps one row's).
template <class T, int D, int kRows>
__global__ void __launch_bounds__(kThreads)
split_kernel(kit::Heads<T, D> s, kit::Cache cache, float* __restrict__ partial_o, float* __restrict__ partial_lse,
             int splits, float scale_log2) {
  constexpr int kLanes = kKeyLanes<D>, kG = kGroups<D>;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kv_h = h / (s.q_heads / s.kv_heads);
  const int lane = threadIdx.x % kLanes, g = threadIdx.x / kLanes;
  const int len = cache.len(b);
  // This split's keys: an equal share of the sequence's, [first, last). The same for the whole block.
  const int share = kit::ceil_div(len, splits);
  const int first = min(split * share, len), last = min(first + share, len);

  // This lane's 8 columns of every query row, as floats, times the scale in log2 units; and where the keys
  // each row sees end (the mask and the length).
  float q[kRows][8];
  int seen[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    seen[r] = r < s.q_len ? keys_seen_in(len, s.q_len, r, s.causal, cache.bottom_right) : 0;
    if (r < s.q_len)
      decode::unpack8<T>(*reinterpret_cast<const uint4*>(s.q_head(b, h) + r * s.q_stride() + 8 * lane), q[r]);
    else
      for (int e = 0; e < 8; ++e) q[r][e] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) q[r][e] *= scale_log2;
  }

  // The group's running maximum m, sum l and O (its 8 columns) per row, in log2 units.
  float m[kRows], l[kRows], o[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
  }

  const T* k_rows = s.k_head(b, kv_h) + 8 * lane;
  const T* v_rows = s.v_head(b, kv_h) + 8 * lane;
  const int stride = s.kv_stride();
  // Every thread of the block runs the same iterations (base is the block's), so the shuffles below always
  // have the whole warp; a key past the slice is loaded as zeros and skipped after its shuffle.
  for (int base = first; base < last; base += kG * kUnroll) {
    // kUnroll keys' K and V first, all in flight at once.
    uint4 k_raw[kUnroll], v_raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kG + g;
      k_raw[u] = v_raw[u] = make_uint4(0, 0, 0, 0);
      if (j < last) {
        k_raw[u] = *reinterpret_cast<const uint4*>(k_rows + std::int64_t(j) * stride);
        v_raw[u] = *reinterpret_cast<const uint4*>(v_rows + std::int64_t(j) * stride);
      }
    }
    // The scores of the kUnroll keys for each row: this lane's 8 products, summed over the group's lanes;
    // -inf for a key past the slice or masked for the row (a row past q_len sees none).
    float score[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kG + g;
      float k[8];
      decode::unpack8<T>(k_raw[u], k);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) x += q[r][e] * k[e];
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
        score[u][r] = j < last && j < seen[r] ? x : -INFINITY;
      }
    }
    // Online softmax over the kUnroll keys at once: one rescale of what is summed when the maximum grows.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m_new = m[r];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, score[u][r]);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: every weight below is 0, not NaN
      const float rescale = exp2f(m[r] - m_use);              // 0 while m is -inf
      l[r] *= rescale;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] *= rescale;
      m[r] = m_new;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float v[8];
      decode::unpack8<T>(v_raw[u], v);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float p = exp2f(score[u][r] - (m[r] == -INFINITY ? 0.f : m[r]));  // 0 for a -inf score
        l[r] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] += p * v[e];
      }
    }
  }

  // The block's kG groups merge, row by row, in shared memory: M = max m_g, L = sum l_g 2^(m_g - M),
  // O = sum o_g 2^(m_g - M) / L. With one split that is the answer: O in the tensor's type and LSE (natural
  // log), and no combine runs. Else workspace row (split, b, r): [splits][batch][q_len][q_heads].
  __shared__ float sm_m[kG], sm_l[kG], sm_o[kG][D];
  const bool one_split = gridDim.x == 1;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= s.q_len) break;  // the same for the whole block
    if (lane == 0) sm_m[g] = m[r], sm_l[g] = l[r];
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_o[g][8 * lane + e] = o[r][e];
    __syncthreads();
    float M = -INFINITY;
    for (int x = 0; x < kG; ++x) M = fmaxf(M, sm_m[x]);
    const std::int64_t row = ((std::int64_t(split) * gridDim.z + b) * s.q_len + r) * s.q_heads + h;
    for (int c = threadIdx.x; c < D; c += kThreads) {
      float L = 0.f, O = 0.f;
      if (M != -INFINITY) {
        for (int x = 0; x < kG; ++x) {
          const float w = exp2f(sm_m[x] - M);  // 0 for a group that saw no key
          L += sm_l[x] * w;
          O += sm_o[x][c] * w;
        }
      }
      if (one_split) {
        s.o_head(b, h)[r * s.q_stride() + c] = kit::from_float<T>(L > 0.f ? O / L : 0.f);
        if (s.LSE && c == 0) s.lse_head(b, h)[r] = L > 0.f ? (M + log2f(L)) * 0.69314718f : -INFINITY;  // ln 2
      } else {
        partial_o[row * D + c] = L > 0.f ? O / L : 0.f;
        if (c == 0) partial_lse[row] = L > 0.f ? M + log2f(L) : -INFINITY;
      }
    }
    __syncthreads();
  }
}

/// The workspace: step 42's (decode::workspace_bytes), with one block a (batch, query head) in each split.
std::size_t workspace_bytes(const AttentionProblem& p) {
  return decode::workspace_bytes(p, std::int64_t(p.batch) * p.q_heads, kThreads);
}

/// Validates the problem (dispatch refuses more new tokens than kMaxQueries), then launches the split kernel
/// (compiled for 1, 2, 4 or 8 rows: the least that holds q_len) and, with more than one split, the combine.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 42", [&]<class T, int D>() {
    auto split = [&](auto kernel) {
      const int slots = kit::resident_blocks(kernel, kThreads, 0) * kit::device_multiprocessors();
      const int splits = decode::splits_for(p.kv_len, std::int64_t(p.batch) * p.q_heads, slots);
      float* partial_o = static_cast<float*>(t.workspace);
      float* partial_lse = partial_o + std::int64_t(splits) * p.q_elements();
      const auto heads = kit::heads<T, D>(p, t);
      const float scale_log2 = p.softmax_scale() * 1.44269504f;  // exp(x) = 2^(x log2(e))
      kit::launch(kernel, dim3(splits, p.q_heads, p.batch), kThreads, 0, stream, heads, kit::cache(p, t), partial_o,
                  partial_lse, splits, scale_log2);
      if (splits > 1)
        kit::launch(decode::combine_kernel<T, D>, kit::grid_1d(std::int64_t(p.batch) * p.q_len * p.q_heads), D, 0,
                    stream, heads, partial_o, partial_lse, splits, p.batch);
    };
    if (p.q_len == 1) split(split_kernel<T, D, 1>);
    else if (p.q_len <= 2) split(split_kernel<T, D, 2>);
    else if (p.q_len <= 4) split(split_kernel<T, D, 4>);
    else split(split_kernel<T, D, 8>);
  });
}

}  // namespace

/// Step 42 as the registry lists it: the launcher and its workspace (the splits' partials).
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step42
