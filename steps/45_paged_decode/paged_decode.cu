// Step 45: a paged KV cache: each sequence's keys in fixed-size pages, found through a page table.
//
// A server holds the KV caches of many sequences that grow one token at a time and end at unknown lengths. Kept
// contiguous, each would need its longest length reserved up front. A paged cache (vLLM's PagedAttention,
// FlashInfer) cuts K and V into pages of page_size tokens in one pool, [pages, page_size, kv_heads, head_dim], and
// gives each sequence a page table: its key j lives in page page_table[b][j / page_size], at row j % page_size.
// Pages are handed out as a sequence grows and returned when it ends, in any order. The kernel is step 44's; only
// where a key's row comes from changes: the row in the pool, looked up in the table, in place of b x kv_len + j.
// The lookup has a cost, measured (README): a division and a table load in front of each key's copy ran pages of 64
// at 0.66-0.94x the contiguous cache on the H100, since one split block an SM (4 warps) does not hide that wait. So
// each thread walks its keys through the pages (an add a key, the table read once a page): 0.84-0.97x.
//
// The step takes the KV cache's per-sequence lengths, pages of any size, and the bottom-right causal mask (q_len new
// tokens, up to kMaxQueries).
#include "10_async_pipeline/cp_async.cuh"
#include "42_split_kv_decode/split_kv.cuh"
#include "fa/kit.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace fa::step45 {
namespace {

constexpr int kMaxQueries = 8;  ///< new tokens per sequence a call may bring (q_len): decode's, speculative

/// What this step accepts: 16-bit inputs read 16 bytes at a time; per-sequence lengths, pages and the bottom-right
/// mask.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 80;           ///< as the course's other 16-bit steps
  static constexpr int pointer_alignment = 16;  ///< 16-byte loads of K, V and Q rows
  static constexpr bool needs_workspace = true; ///< the splits' partial O and LSE, in float
  /// Per-sequence lengths, pages, the bottom-right mask, and at most kMaxQueries new tokens per sequence.
  static constexpr CacheForms cache_forms{
      .kv_lens = true, .paged = true, .bottom_right = true, .max_q_len = kMaxQueries};
};

constexpr int kThreads = 128;       ///< threads of a split block: 4 warps
constexpr int kUnroll = 4;          ///< keys of a lane group in one tile: a tile is kGroups x kUnroll keys
constexpr int kStages = 4;          ///< tiles of the ring: kStages - 1 on the way while one is used
/// Split blocks the split rule counts on an SM: one. Its ring keeps 3 tiles, 48 KiB at d = 128, on the way, and
/// counting the 3 blocks that fit (more splits, each shorter) measured slower at three of the four decode shapes
/// (the README's table).
constexpr int kSplitBlocksPerSM = 1;
constexpr int kMaxRows = 8;            ///< the most (query head, new token) rows a block holds in registers

/// Lanes that share one key: each holds 8 of its D elements (16 bytes of K, 16 of V).
template <int D> constexpr int kKeyLanes = D / 8;
/// Lane groups of a block: they walk the block's keys side by side, group g keys g, g + kGroups, ...
template <int D> constexpr int kGroups = kThreads / kKeyLanes<D>;
/// The ring: per stage, per key u of a lane group's kUnroll, K's and V's 16-byte piece of every thread, thread
/// index fastest (so a warp's 32 pieces are 512 consecutive bytes: no bank conflicts).
constexpr int kRingBytes = kStages * kUnroll * 2 * kThreads * 16;

/// Block (split, kv_h x chunks + chunk, b): the keys of split `split` of sequence b, for up to kRows rows of KV
/// head kv_h's group: row r is pair x = chunk x kRows + r of the group's (query head, new token) pairs, query head
/// kv_h x group + x / q_len and new token x % q_len. Lane group g (kKeyLanes<D> consecutive lanes) takes keys
/// first + g, first + g + kGroups, ..; lane c of the group holds columns 8c .. 8c + 7 of Q's rows, of each key,
/// and of its partial O. Writes, per row, the slice's O (divided by its own sum) and its log-sum-exp in log2 units
/// into the workspace; a row that sees none of the slice's keys gets O = 0 and -inf. With one split
/// (gridDim.x = 1) it writes O and LSE instead. kRows is a compile-time bound, so that the rows' registers stay
/// registers.
template <class T, int D, int kRows>
__global__ void __launch_bounds__(kThreads)
split_kernel(kit::Heads<T, D> s, kit::Cache cache, float* __restrict__ partial_o, float* __restrict__ partial_lse,
             int splits, int chunks, float scale_log2) {
  constexpr int kLanes = kKeyLanes<D>, kG = kGroups<D>;
  const int split = blockIdx.x, kv_h = blockIdx.y / chunks, chunk = blockIdx.y % chunks, b = blockIdx.z;
  const int group = s.q_heads / s.kv_heads, rows = group * s.q_len;
  // Row r's query head and new token; rows past the group's pairs (in the last chunk) are padding.
  auto head_of = [&](int r) { return kv_h * group + (chunk * kRows + r) / s.q_len; };
  auto token_of = [&](int r) { return (chunk * kRows + r) % s.q_len; };
  auto holds = [&](int r) { return chunk * kRows + r < rows; };
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
    seen[r] = holds(r) ? keys_seen_in(len, s.q_len, token_of(r), s.causal, cache.bottom_right) : 0;
    if (holds(r))
      decode::unpack8<T>(
          *reinterpret_cast<const uint4*>(s.q_head(b, head_of(r)) + token_of(r) * s.q_stride() + 8 * lane), q[r]);
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

  // Key j's row of K and V: in a paged cache, row j % page_size of page page_table[b][j / page_size] of the pool;
  // else row j of sequence b. Columns: this lane's 8 of KV head kv_h.
  const T* k_rows = s.K + kv_h * D + 8 * lane;
  const T* v_rows = s.V + kv_h * D + 8 * lane;
  const int stride = s.kv_stride();
  const int* pages = cache.page_table ? cache.page_table + std::int64_t(b) * (cache.kv_len / cache.page_size) : nullptr;
  // This thread copies keys first + g + kG x n, n = 0, 1, .. in that order (start_tile below): a walk of kG keys a
  // step. In a paged cache it keeps where the walk is (the page's index in the table, the row in the page, the
  // page's entry, and the next page's entry read ahead), so that a key costs an add, and the table is read once a
  // page, a page before the walk needs it, instead of a division and a load in front of every key's copy.
  const int table_pages = pages ? cache.kv_len / cache.page_size : 0;
  auto entry_of = [&](int i) { return i < table_pages ? cache.page(pages, b, i, len) : 0; };  // checked: kit::Cache
  int walk_page = 0, walk_row = first + g, entry = 0, next_entry = 0;
  if (pages) {
    walk_page = walk_row / cache.page_size, walk_row %= cache.page_size;
    entry = entry_of(walk_page), next_entry = entry_of(walk_page + 1);
  }
  // The row of the walk's key j, then one step on.
  auto row_of = [&](int j) -> std::int64_t {
    if (!pages) return std::int64_t(b) * cache.kv_len + j;
    const std::int64_t row = std::int64_t(entry) * cache.page_size + walk_row;
    walk_row += kG;
    if (walk_row >= cache.page_size) {  // into the next page, or further on when pages are shorter than kG keys
      const int ahead = walk_row / cache.page_size;
      walk_page += ahead, walk_row -= ahead * cache.page_size;
      entry = ahead == 1 ? next_entry : entry_of(walk_page);
      next_entry = entry_of(walk_page + 1);
    }
    return row;
  };
  // This thread's piece (stage, u, K or V) of the ring, at ring + ((stage x kUnroll + u) x 2 + kv) x kThreads.
  extern __shared__ uint4 ring[];
  auto piece = [&](int stage, int u, int kv) {
    return ring + ((stage * kUnroll + u) * 2 + kv) * kThreads + threadIdx.x;
  };
  constexpr int kTileKeys = kG * kUnroll;
  const int tiles = kit::ceil_div(last - first, kTileKeys);
  // Starts the copies of tile t's pieces of this thread into stage t % kStages, as one commit group (empty past
  // the last tile, so that every iteration below counts the same number of groups). A key past the slice is
  // filled with zeros, read from nowhere, and skipped after its shuffle.
  auto start_tile = [&](int t) {
    if (t < tiles) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = first + t * kTileKeys + u * kG + g;
        const std::int64_t row = row_of(j);  // every key of the walk, so that it stays in step
        const std::int64_t at = j < last ? row * stride : 0;
        tc::cp_async_16(tc::shared_address(piece(t % kStages, u, 0)), k_rows + at, j < last ? 16 : 0);
        tc::cp_async_16(tc::shared_address(piece(t % kStages, u, 1)), v_rows + at, j < last ? 16 : 0);
      }
    }
    tc::cp_async_commit();
  };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) start_tile(t);
  // Every thread of the block runs the same iterations (base is the block's), so the shuffles below always
  // have the whole warp.
  for (int t = 0, base = first; t < tiles; ++t, base += kTileKeys) {
    // Tile t + kStages - 1 set going, into the stage this thread finished reading in the last iteration; then
    // wait until no more than kStages - 1 groups are in flight: tile t has arrived.
    start_tile(t + kStages - 1);
    tc::cp_async_wait<kStages - 1>();
    uint4 k_raw[kUnroll], v_raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) k_raw[u] = *piece(t % kStages, u, 0), v_raw[u] = *piece(t % kStages, u, 1);
    // The scores of the kUnroll keys for each row: this lane's 8 products, summed over the group's lanes;
    // -inf for a key past the slice or masked for the row (a padding row sees none).
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

  tc::cp_async_wait<0>();  // the empty groups past the last tile

  // The block's kG groups merge, row by row, in shared memory: M = max m_g, L = sum l_g 2^(m_g - M),
  // O = sum o_g 2^(m_g - M) / L. With one split that is the answer: O in the tensor's type and LSE (natural
  // log), and no combine runs. Else workspace row (split, b, token, head): [splits][batch][q_len][q_heads].
  __shared__ float sm_m[kG], sm_l[kG], sm_o[kG][D];
  const bool one_split = gridDim.x == 1;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!holds(r)) break;  // the same for the whole block
    const int h = head_of(r), i = token_of(r);
    if (lane == 0) sm_m[g] = m[r], sm_l[g] = l[r];
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_o[g][8 * lane + e] = o[r][e];
    __syncthreads();
    float M = -INFINITY;
    for (int x = 0; x < kG; ++x) M = fmaxf(M, sm_m[x]);
    const std::int64_t row = ((std::int64_t(split) * gridDim.z + b) * s.q_len + i) * s.q_heads + h;
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
        s.o_head(b, h)[i * s.q_stride() + c] = kit::from_float<T>(L > 0.f ? O / L : 0.f);
        if (s.LSE && c == 0) s.lse_head(b, h)[i] = L > 0.f ? (M + log2f(L)) * 0.69314718f : -INFINITY;  // ln 2
      } else {
        partial_o[row * D + c] = L > 0.f ? O / L : 0.f;
        if (c == 0) partial_lse[row] = L > 0.f ? M + log2f(L) : -INFINITY;
      }
    }
    __syncthreads();
  }
}

/// The workspace: step 42's (decode::workspace_bytes), sized for the fewest blocks a split: one a (batch, KV head).
std::size_t workspace_bytes(const AttentionProblem& p) {
  return decode::workspace_bytes(p, std::int64_t(p.batch) * p.kv_heads, kThreads);
}

/// Validates the problem (dispatch refuses more new tokens than kMaxQueries), then launches the split kernel
/// (compiled for 1, 2, 4 or 8 rows: the least that holds a group's rows, group x q_len, or chunks of 8) and, with
/// more than one split, the combine.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 45", [&]<class T, int D>() {
    const int rows = p.q_heads / p.kv_heads * p.q_len;  // a KV head's (query head, new token) pairs
    auto split = [&](auto kernel, int rows_per_block) {
      const int chunks = kit::ceil_div(rows, rows_per_block);
      const int slots = kSplitBlocksPerSM * kit::device_multiprocessors();
      const int splits = decode::splits_for(p.kv_len, std::int64_t(p.batch) * p.kv_heads * chunks, slots);
      float* partial_o = static_cast<float*>(t.workspace);
      float* partial_lse = partial_o + std::int64_t(splits) * p.q_elements();
      const auto heads = kit::heads<T, D>(p, t);
      const float scale_log2 = p.softmax_scale() * 1.44269504f;  // exp(x) = 2^(x log2(e))
      kit::launch(kernel, dim3(splits, p.kv_heads * chunks, p.batch), kThreads, kRingBytes, stream, heads,
                  kit::cache(p, t), partial_o, partial_lse, splits, chunks, scale_log2);
      if (splits > 1)
        kit::launch(decode::combine_kernel<T, D>, kit::grid_1d(std::int64_t(p.batch) * p.q_len * p.q_heads), D, 0,
                    stream, heads, partial_o, partial_lse, splits, p.batch);
    };
    if (rows == 1) split(split_kernel<T, D, 1>, 1);
    else if (rows <= 2) split(split_kernel<T, D, 2>, 2);
    else if (rows <= 4) split(split_kernel<T, D, 4>, 4);
    else split(split_kernel<T, D, kMaxRows>, kMaxRows);
  });
}

}  // namespace

/// Step 45 as the registry lists it: the launcher and its workspace (the splits' partials).
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step45
