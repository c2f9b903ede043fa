// Step 59: the models' features in decode: a sliding window, soft-capping and sinks on step 48's kernel.
//
// A model with local layers (Gemma 2 and 3, gpt-oss, Mistral) decodes each new token against the last `left` + 1
// keys of its sequence, however long the cache. Step 48's splits share the whole sequence: over a window of 1024 keys
// in a cache of 8192, seven eighths of its blocks would read keys no row sees and mask them. Here the splits share
// the keys the sequence's new tokens see together, the span from the first token's window start to the last token's
// last key (keys_range_in, the reference's rule), and the launcher counts its splits from the window's keys, not the
// cache's: the keys read, the pages looked up and the splits all grow with the window. A row's mask is its own range
// (the window's left edge, the causal diagonal, the length). The cap goes where the scores are scaled, c tanh(s / c)
// in log2 units (step 50's tanh from exp2), in a kernel of its own so the uncapped one is step 48's. The sink is one
// term of the row's whole softmax: it joins once, where the row is whole, in the combine (or, with one split, in the
// block's merge), never in a split's partial, whose LSE the combine weighs: there it would count once per split.
//
// The rest is step 48's: the page table read two tiles ahead, the walk without a division, the split rule's blocks an
// SM on a paged cache, a kernel without the walk for a contiguous cache, a slice in one page copied as a contiguous
// cache's, up to two row tiles a block sharing each K and V fragment, the cp.async ring (of 3 stages and two blocks an
// SM for two row tiles at d = 128), d = 64's wide block of 8 warps, the warps' merge, the combine; step 45's cache
// forms.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "42_split_kv_decode/split_kv.cuh"
#include "50_softcap/tanh_exp2.cuh"
#include "fa/kit.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace fa::step59 {
namespace {

using namespace tc;

constexpr int kMaxQueries = 8;  ///< new tokens per sequence a call may bring (q_len): decode's, speculative

/// What this step accepts: 16-bit inputs (mma.sync), 16-byte copies of K and V; step 45's cache forms.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 80;           ///< mma.sync m16n8k16, ldmatrix, cp.async: sm_80
  static constexpr int pointer_alignment = 16;  ///< 16-byte copies of K and V rows, 4-byte loads of Q
  static constexpr bool needs_workspace = true; ///< the splits' partial O and LSE, in float
  /// Per-sequence lengths, pages, the bottom-right mask, and at most kMaxQueries new tokens per sequence.
  static constexpr CacheForms cache_forms{
      .kv_lens = true, .paged = true, .bottom_right = true, .max_q_len = kMaxQueries};
  /// A sliding window (FlashAttention's window_size), soft-capping (its softcap) and sinks (gpt-oss's).
  static constexpr Features features{.window = true, .softcap = true, .sinks = true};
};

constexpr int kWarps = 4;                       ///< warps of a split block
constexpr int kThreads = kWarps * kWarpSize;    ///< 128 threads
constexpr int kWideWarps = 8;                   ///< warps of d = 64's wide block: 128-key tiles, one an SM
constexpr int kTileRows = kRowsPerWarp;         ///< rows of a row tile: the M of one mma, 16 (query head, new token) pairs
constexpr int kMaxTiles = 2;                    ///< row tiles a block may hold: its rows, up to 32
constexpr int kWarpKeys = 16;                   ///< a warp's keys in a tile: one k-step of P V
constexpr int kStages = 4;                      ///< tiles of the ring: kStages - 1 on the way while one is used
constexpr int kLookahead = 2;                   ///< tiles between a page-table read and the copies that use it
constexpr int kSplitBlocksPerSM = 1;            ///< split blocks the split rule counts on an SM (step 44's choice)
/// Split blocks the rule counts on an SM for a paged cache: as many as keep the bytes in flight of one at d = 128.
template <int D> constexpr int kPagedSplitBlocksPerSM = std::max(1, 128 / D);

/// Bytes of a warp's slice of K (or V) in one stage: kWarpKeys rows of D 16-bit elements, swizzled.
template <int D> constexpr int kSliceBytes = kWarpKeys * D * 2;
/// The ring: per stage, per warp (kW of them), its slice of K then its slice of V.
template <int D, int kRing, int kW> constexpr int kRingBytes = kRing * kW * 2 * kSliceBytes<D>;
/// Stages of a kernel's ring: kStages, but 3 for two row tiles at d = 128, whose 255 registers a thread leave its
/// SM one warp a scheduler: 3 x 32 KiB lets two blocks share the SM (the split rule counts two), and each warp's
/// waits are covered by the other block's.
template <int D, int kTiles> constexpr int kRingStages = D == 128 && kTiles == 2 ? 3 : kStages;
/// Split blocks the rule counts on an SM for a kernel of two row tiles at d = 128: the two its ring lets in.
constexpr int kTwoTileBlocksPerSM = 2;

/// The models' features as the kernel reads them: the window's sides (-1: open), the cap in log2 units and the scale
/// over it (the capped kernel's S = cap_log2 tanh(scale_over_cap q.k)), and each query head's sink logit (nullptr: no
/// sinks).
struct Model {
  int window_left;       ///< keys before the row's diagonal it sees (-1: open)
  int window_right;      ///< keys after it (-1: open; the causal mask's 0 where causal)
  float cap_log2;        ///< the cap in log2 units (0: no cap)
  float scale_over_cap;  ///< the softmax scale over the cap
  const float* sinks;    ///< each query head's sink logit, or nullptr
};

/// Block (split, kv_h x chunks + chunk, b): the keys of split `split` of sequence b's span (the keys its new tokens
/// see), for the kRows = kTiles x 16 rows
/// of chunk `chunk` of KV head kv_h's group: row r is pair x = chunk x kRows + r of the group's (query head, new
/// token) pairs, row tile r / 16 of the block, query
/// head kv_h x group + x / q_len and new token x % q_len; rows past the pairs are zeros. Warp w takes keys
/// first + 16 kW t + 16 w .. + 15 of tile t (kW warps: kWarps, or kWideWarps at d = 64). Writes, per row, the
/// slice's O (divided by its own sum) and its log-sum-exp in log2 units into the workspace; a row that sees none of
/// the slice's keys gets O = 0 and -inf. With one split (gridDim.x = 1) it writes O and LSE instead, the head's sink in them. kSoftcap: each score becomes
/// softcap tanh(scale q.k / softcap), in log2 units.
/// kPaged: a paged cache's kernel, with the page walk; without it, a contiguous cache's.
template <class T, int D, int kTiles, bool kSoftcap, bool kPaged, int kW>
__global__ void __launch_bounds__(kW * kWarpSize)
split_kernel(kit::Heads<T, D> s, kit::Cache cache, float* __restrict__ partial_o, float* __restrict__ partial_lse,
             int splits, int chunks, float scale_log2, Model model) {
  constexpr int kRows = kTiles * kTileRows;         // a block's rows
  constexpr int kDSteps = D / 16;                   // k-steps of S = Q K^T (over the head dimension)
  constexpr int kOutTiles = D / 8;                  // n8 tiles of O (columns)
  constexpr int kChunksPerRow = D / kChunkElems;    // 16-byte chunks of a key's row
  constexpr int kCopies = kWarpKeys * kChunksPerRow / kWarpSize;  // chunks of K (and of V) a lane copies a tile
  constexpr int kRowBytes = D * 2;
  constexpr int kRing = kRingStages<D, kTiles>;     // stages of this kernel's ring
  constexpr int kTileKeys = kW * kWarpKeys;         // keys of a tile: 64, or 128 in a wide block
  constexpr int kBlockThreads = kW * kWarpSize;     // the block's threads
  // A paged kernel of one row tile copies a slice that lies in one page as a contiguous cache's (see start_tile).
  // (With two row tiles its registers would spill.)
  constexpr bool kSlicesInPages = kPaged && kTiles == 1;
  const int split = blockIdx.x, kv_h = blockIdx.y / chunks, chunk = blockIdx.y % chunks, b = blockIdx.z;
  const int group = s.q_heads / s.kv_heads, rows = group * s.q_len;
  // Row r's query head and new token; rows past the group's pairs (in the last chunk) are padding.
  auto head_of = [&](int r) { return kv_h * group + (chunk * kRows + r) / s.q_len; };
  auto token_of = [&](int r) { return (chunk * kRows + r) % s.q_len; };
  auto holds = [&](int r) { return chunk * kRows + r < rows; };
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t + 1 of every n8 tile
  const int len = cache.len(b);
  // The keys the new tokens see together: from the first token's first key to the last token's last (both ends grow
  // with the token). No key outside it is read, no page of it looked up.
  const int left = model.window_left, right = model.window_right;
  auto keys_of = [&](int i) { return keys_range_in(len, s.q_len, i, s.causal, cache.bottom_right, left, right); };
  const KeyRange span{keys_of(0).first, keys_of(s.q_len - 1).last};
  // This split's keys: an equal share of the span's in multiples of 16 keys, [first, last) (where the span starts at a
  // multiple of 16, as it does without a window, a warp's slices then start where pages of 16, 32, ... may). The same
  // for the whole block.
  const int share = kit::ceil_div(kit::ceil_div(span.count(), splits), kWarpKeys) * kWarpKeys;
  const int first = min(span.first + split * share, span.last), last = min(first + share, span.last);

  // Each row tile's 16 rows of Q as A fragments, one per k-step, read once from global memory (a[0]: row g, columns
  // 16k + 2t, 2t + 1; a[1]: row g + 8; a[2], a[3]: the same rows, 8 columns on); zeros for the padding rows.
  std::uint32_t q_frag[kTiles][kDSteps][4];
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kTileRows * mt + g + 8 * half;
      const T* q_row = holds(r) ? s.q_head(b, head_of(r)) + token_of(r) * s.q_stride() : nullptr;
#pragma unroll
      for (int k = 0; k < kDSteps; ++k)
#pragma unroll
        for (int x = 0; x < 2; ++x)
          q_frag[mt][k][half + 2 * x] =
              q_row ? *reinterpret_cast<const std::uint32_t*>(q_row + 16 * k + 8 * x + 2 * t) : 0u;
    }

  // The keys of this split each row of the block sees, [first, last) (the window, the mask, the length and the
  // split's end; none for a padding row), in shared memory: a lane's registers hold Q, O and the page walk, and its
  // rows' window starts beside their ends would spill at d = 128 with two row tiles.
  __shared__ int sm_first[kRows], sm_last[kRows];
  for (int r = threadIdx.x; r < kRows; r += kBlockThreads) {
    const KeyRange keys = holds(r) ? keys_of(token_of(r)) : KeyRange{};
    sm_first[r] = keys.first, sm_last[r] = min(keys.last, last);
  }
  __syncthreads();

  // Per lane and row tile: O for rows g, g + 8 as kOutTiles C fragments; m (the row's maximum, the quad agrees on
  // it) and l (this lane's part of the row's sum, joined across the quad at the end), in log2 units.
  float O_acc[kTiles][kOutTiles][4] = {};
  float m[kTiles][2], l[kTiles][2];
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  // Key j's row of K and V: in a paged cache, row j % page_size of page page_table[b][j / page_size] of the pool;
  // else row j of sequence b (step 45). Columns: KV head kv_h's.
  const T* k_rows = s.K + kv_h * D;
  const T* v_rows = s.V + kv_h * D;
  const int stride = s.kv_stride();
  // Without kPaged, pages is nullptr at compile time: the contiguous cache's kernel has no walk, every `pages ?`
  // below folded away. The paged kernel still tests the table at run time, as before: told at compile time that it is
  // there, its loop grew (420 to 433 instructions in session 23's ablation) and read pages of 16 slower.
  const int* pages = kPaged && cache.page_table
                         ? cache.page_table + std::int64_t(b) * (cache.kv_len / cache.page_size)
                         : nullptr;
  auto row_of = [&](int j) -> std::int64_t {
    if (!pages) return std::int64_t(b) * cache.kv_len + j;
    return std::int64_t(cache.page(pages, b, j / cache.page_size, len)) * cache.page_size + j % cache.page_size;
  };
  // Lane l < 16 follows key l of the warp's slice through the pages, kLookahead tiles ahead of the copies: `walk` is
  // the key, (`page`, `offset`) its page of the sequence and its row in it. A tile on is kTileKeys keys on, step_pages
  // pages and step_rows rows (one division for the block); lanes 16-31 repeat lanes 0-15's keys. `held[x]` is the
  // table entry, as read, of the tile x after the next copies' own (held[0]: theirs), and its key's row in the page.
  struct Held {
    int entry, offset;
  };
  const int page_size = pages ? cache.page_size : 1;
  const int step_pages = kTileKeys / page_size, step_rows = kTileKeys % page_size;
  int walk = first + warp * kWarpKeys + (lane & (kWarpKeys - 1));
  int page = walk / page_size, offset = walk % page_size;
  // The entry of the tile the walk is at, its load issued now and not waited for; then the walk a tile on.
  auto read_ahead = [&]() -> Held {
    const Held read{pages && walk < last ? pages[page] : 0, offset};
    walk += kTileKeys, page += step_pages, offset += step_rows;
    if (offset >= page_size) offset -= page_size, ++page;
    return read;
  };
  Held held[kLookahead];
#pragma unroll
  for (int x = 0; x < kLookahead; ++x) held[x] = read_ahead();
  // The row in the pool of the entry read kLookahead tiles ago, checked now: an entry outside the pool is recorded
  // (as cache.page does) and read as page 0. A key past the slice was never read (entry 0) and is masked below.
  auto row_held = [&](const Held& h, int j) -> std::int64_t {
    int entry = h.entry;
    if (unsigned(entry) >= unsigned(cache.pages)) {
      if (j < last) cache.refuse(CacheFault::page, b, j / page_size, entry, cache.pages);
      entry = 0;
    }
    return std::int64_t(entry) * page_size + h.offset;
  };
  // This warp's slice of K (kv = 0) or V (kv = 1) in stage `stage` of the ring.
  extern __shared__ __align__(128) unsigned char ring[];
  auto slice = [&](int stage, int kv) {
    return shared_address(ring + ((stage * kW + warp) * 2 + kv) * kSliceBytes<D>);
  };
  const int tiles = kit::ceil_div(last - first, kTileKeys);
  // Starts the copies of this warp's 16 keys of tile `tile` into stage tile % kRing, as one commit group of each
  // lane (empty past the last tile, so that every iteration below counts the same number of groups). Consecutive
  // lanes take consecutive 16-byte chunks of a key's row (coalesced), stored swizzled (conflict-free, as step 09's
  // tiles). A key past the slice is filled with zeros, read from nowhere, and masked below.
  auto start_tile = [&](int tile) {
    if (tile < tiles) {
      const int base = first + tile * kTileKeys + warp * kWarpKeys;
      // A slice (16 keys from a multiple of 16) lies in one page where the page size is a multiple of 16, and
      // sometimes where it is not: then its rows in the pool are lane 0's and the 15 after it, and its copies are
      // addressed as a contiguous cache's, without a shuffle and a 64-bit multiply each (a uniform branch: lane 0's
      // row in its page decides for the warp).
      const bool one_page =
          kSlicesInPages && pages && __shfl_sync(kFullMask, held[0].offset, 0) + kWarpKeys <= page_size;
      const std::int64_t rows_here = pages ? row_held(held[0], base + (lane & (kWarpKeys - 1))) : 0;
#pragma unroll
      for (int x = 0; x + 1 < kLookahead; ++x) held[x] = held[x + 1];
      held[kLookahead - 1] = read_ahead();
      if (one_page) {
        const std::int64_t slice_at = __shfl_sync(kFullMask, rows_here, 0) * stride;
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
          const int e = i * kWarpSize + lane, key = e / kChunksPerRow, c = e % kChunksPerRow;
          const int j = base + key;
          const std::int64_t at = j < last ? slice_at + (key * stride + c * kChunkElems) : 0;
          const int to = swizzled_offset<D>(key, c);
          cp_async_16(slice(tile % kRing, 0) + to, k_rows + at, j < last ? 16 : 0);
          cp_async_16(slice(tile % kRing, 1) + to, v_rows + at, j < last ? 16 : 0);
        }
      } else
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int e = i * kWarpSize + lane, key = e / kChunksPerRow, c = e % kChunksPerRow;
        const int j = base + key;
        const std::int64_t row = pages ? __shfl_sync(kFullMask, rows_here, key) : row_of(j);
        const std::int64_t at = j < last ? row * stride + c * kChunkElems : 0;
        const int to = swizzled_offset<D>(key, c);
        cp_async_16(slice(tile % kRing, 0) + to, k_rows + at, j < last ? 16 : 0);
        cp_async_16(slice(tile % kRing, 1) + to, v_rows + at, j < last ? 16 : 0);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int x = 0; x < kRing - 1; ++x) start_tile(x);

  // ldmatrix addresses as step 09's, within a 16-key slice: for K (B of S = Q K^T) lanes 0-7 address keys 0-7 at
  // chunk 2k, lanes 8-15 keys 0-7 at chunk 2k + 1, lanes 16-31 the same for keys 8-15; for V (B of P V, through
  // .trans) lanes 0-15 address keys 0-15 at chunk c, lanes 16-31 at chunk c + 1. The swizzle is one XOR with a
  // per-lane constant.
  const int k_lane_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);
  const int v_lane_row = lane & 15;
  const int v_lane_xor = (lane >> 4) ^ (lane & 7);
  // Every warp runs the same iterations (tiles is the block's), so the merge below has every warp.
  for (int tile = 0; tile < tiles; ++tile) {
    // Tile tile + kRing - 1 set going, into the stage this warp finished reading in the last iteration; then wait
    // until no more than kRing - 1 groups of this lane are in flight (tile `tile` of this lane has landed), and
    // for the warp's other lanes to have waited too: then every chunk of the warp's slice is there.
    start_tile(tile + kRing - 1);
    cp_async_wait<kRing - 1>();
    __syncwarp();
    const std::uint32_t K_lane = slice(tile % kRing, 0) + k_lane_row * kRowBytes;
    const std::uint32_t V_lane = slice(tile % kRing, 1) + v_lane_row * kRowBytes;

    // S = Q K^T for the warp's 16 keys: two n8 tiles, one ldmatrix x4 a k-step, whose fragments feed every row
    // tile's mma: the keys are read from shared memory once for all the block's rows.
    float S[kTiles][2][4] = {};
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) {
      std::uint32_t kb[4];
      ldmatrix_x4(kb, K_lane + (((2 * k) ^ k_lane_xor) << 4));
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
        mma_m16n8k16<T>(S[mt][0], q_frag[mt][k], kb[0], kb[1]);
        mma_m16n8k16<T>(S[mt][1], q_frag[mt][k], kb[2], kb[3]);
      }
    }
    // Scaled to log2 units (capped: softcap log2(e) tanh(scale S / softcap)), and -inf for a key outside the row's
    // keys of the slice (a padding row sees none). Each row's two ends are read once a tile, both loads issued before
    // either is compared: a compare that waited on one load before issuing the next (as `a && sm[r] ...` compiles)
    // put a shared-memory round trip after another on every score, and halved the kernel's speed at d = 64.
    // S[mt][n][e] is row 16 mt + g + 8 (e >= 2), key base + 8n + 2t + (e & 1).
    const int base = first + tile * kTileKeys + warp * kWarpKeys;
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = kTileRows * mt + g + 8 * half;
        const int row_first = sm_first[r], row_last = sm_last[r];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            float& s_ = S[mt][n][2 * half + x];
            const int j = base + 8 * n + 2 * t + x;
            const float score = kSoftcap ? model.cap_log2 * tanh_exp2(s_ * model.scale_over_cap) : s_ * scale_log2;
            s_ = j >= row_first && j < row_last ? score : -INFINITY;
          }
      }
    // Online softmax on the fragments, row by row (half 0: row g, elements 0-1 of each tile; half 1: row g + 8,
    // elements 2-3). A row's 16 scores are spread over the 4 lanes of a quad: two butterfly shuffles join its max.
    // P stays in registers: the C fragments of the two key tiles are, element for element, the A fragment of the
    // k-step over the warp's 16 keys (rows g / g + 8; keys 2t.. / 8 + 2t..).
    std::uint32_t p_frag[kTiles][4];
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      float (&Sm)[2][4] = S[mt];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float row_max = fmaxf(fmaxf(Sm[0][2 * half], Sm[0][2 * half + 1]), fmaxf(Sm[1][2 * half], Sm[1][2 * half + 1]));
        row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
        const float m_new = fmaxf(m[mt][half], row_max);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: every weight below is 0, not NaN
        const float rescale = exp2f(m[mt][half] - m_use);       // 0 while m is -inf
        m[mt][half] = m_new;
        float row_sum = 0.f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          Sm[n][2 * half] = exp2f(Sm[n][2 * half] - m_use);
          Sm[n][2 * half + 1] = exp2f(Sm[n][2 * half + 1] - m_use);
          row_sum += Sm[n][2 * half] + Sm[n][2 * half + 1];
        }
        l[mt][half] = l[mt][half] * rescale + row_sum;
#pragma unroll
        for (int c = 0; c < kOutTiles; ++c) O_acc[mt][c][2 * half] *= rescale, O_acc[mt][c][2 * half + 1] *= rescale;
      }
      p_frag[mt][0] = pack2<T>(Sm[0][0], Sm[0][1]);  // row g,     keys 2t, 2t + 1
      p_frag[mt][1] = pack2<T>(Sm[0][2], Sm[0][3]);  // row g + 8, keys 2t, 2t + 1
      p_frag[mt][2] = pack2<T>(Sm[1][0], Sm[1][1]);  // row g,     keys 8 + 2t, 8 + 2t + 1
      p_frag[mt][3] = pack2<T>(Sm[1][2], Sm[1][3]);  // row g + 8, keys 8 + 2t, 8 + 2t + 1
    }
    // O += P V: ldmatrix .trans hands each lane V's (key, column) pairs as B fragments, two column tiles a load;
    // like K's, each load feeds every row tile.
#pragma unroll
    for (int c = 0; c < kOutTiles; c += 2) {
      std::uint32_t vb[4];
      ldmatrix_x4_trans(vb, V_lane + ((c ^ v_lane_xor) << 4));
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
        mma_m16n8k16<T>(O_acc[mt][c], p_frag[mt], vb[0], vb[1]);
        mma_m16n8k16<T>(O_acc[mt][c + 1], p_frag[mt], vb[2], vb[3]);
      }
    }
    __syncwarp();  // every lane has read this stage before the next iteration's copies refill it
  }
  cp_async_wait<0>();  // the empty groups past the last tile

  // The kW warps merge, row by row, through shared memory (the ring, now idle): M = max m_w, L = sum l_w 2^(m_w - M),
  // O = sum O_w 2^(m_w - M) / L. With one split that is the answer: O in the tensor's type and LSE (natural log),
  // and no combine runs. Else workspace row (split, b, token, head): [splits][batch][q_len][q_heads].
  // The sink is the whole row's: with one split it joins M and L here, as one more term with no value; with several
  // the combine adds it, once, and no split's partial holds it.
  __shared__ float sm_m[kW][kRows], sm_l[kW][kRows];
  float* sm_o = reinterpret_cast<float*>(ring);  // [kW][kRows][D]
  __syncthreads();  // every warp is done with the ring
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kTileRows * mt + g + 8 * half;
      float row_l = l[mt][half];
      row_l += __shfl_xor_sync(kFullMask, row_l, 1);
      row_l += __shfl_xor_sync(kFullMask, row_l, 2);
      if (t == 0) sm_m[warp][r] = m[mt][half], sm_l[warp][r] = row_l;
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        sm_o[(warp * kRows + r) * D + 8 * c + 2 * t] = O_acc[mt][c][2 * half];
        sm_o[(warp * kRows + r) * D + 8 * c + 2 * t + 1] = O_acc[mt][c][2 * half + 1];
      }
    }
  __syncthreads();
  const bool one_split = gridDim.x == 1;
  for (int x = threadIdx.x; x < kRows * D; x += kBlockThreads) {
    const int r = x / D, c = x % D;
    if (!holds(r)) break;  // rows grow with x: no later one is held either
    const int h = head_of(r), i = token_of(r);
    const float sink_log2 = one_split && model.sinks != nullptr ? model.sinks[h] * kLog2e : -INFINITY;
    float M = sink_log2;
#pragma unroll
    for (int w = 0; w < kW; ++w) M = fmaxf(M, sm_m[w][r]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const float weight = exp2f(sm_m[w][r] - M);  // 0 for a warp that saw no key of the row
        L += sm_l[w][r] * weight;
        O += sm_o[(w * kRows + r) * D + c] * weight;
      }
      L += exp2f(sink_log2 - M);  // the sink's term: 0 without one
    }
    const std::int64_t row = ((std::int64_t(split) * gridDim.z + b) * s.q_len + i) * s.q_heads + h;
    if (one_split) {
      s.o_head(b, h)[i * s.q_stride() + c] = kit::from_float<T>(L > 0.f ? O / L : 0.f);
      if (s.LSE && c == 0) s.lse_head(b, h)[i] = L > 0.f ? (M + log2f(L)) * 0.69314718f : -INFINITY;  // ln 2
    } else {
      partial_o[row * D + c] = L > 0.f ? O / L : 0.f;
      if (c == 0) partial_lse[row] = L > 0.f ? M + log2f(L) : -INFINITY;
    }
  }
}

/// Step 42's combine with the head's sink: the splits' partials merged with their log-sum-exp weights, and the sink
/// as one more term of the merge with no value, added once for the row. A row no split saw a key of gets O = 0 and
/// the sink's logit as its LSE.
template <class T, int D>
__global__ void __launch_bounds__(D)
sink_combine_kernel(kit::Heads<T, D> s, const float* __restrict__ partial_o, const float* __restrict__ partial_lse,
                    int splits, int batch, const float* __restrict__ sinks) {
  const int h = blockIdx.x % s.q_heads, i = (blockIdx.x / s.q_heads) % s.q_len, b = blockIdx.x / (s.q_heads * s.q_len);
  const int c = threadIdx.x;
  auto at = [&](int split) { return ((std::int64_t(split) * batch + b) * s.q_len + i) * s.q_heads + h; };
  float M = -INFINITY;
  for (int x = 0; x < splits; ++x) M = fmaxf(M, partial_lse[at(x)]);
  // The sink joins the row's max and sum once, as a term with no value: M is finite from here on, L at least 2^0.
  const float sink_log2 = sinks[h] * kLog2e;
  M = fmaxf(M, sink_log2);
  float L = exp2f(sink_log2 - M), O = 0.f;
  for (int x = 0; x < splits; ++x) {
    const float w = exp2f(partial_lse[at(x)] - M);  // 0 for a split that saw no key of this row
    L += w;
    O += w * partial_o[at(x) * D + c];
  }
  s.o_head(b, h)[i * s.q_stride() + c] = kit::from_float<T>(O / L);
  if (s.LSE && c == 0) s.lse_head(b, h)[i] = (M + log2f(L)) * 0.69314718f;  // ln 2
}

/// The most keys one sequence's new tokens see together, which the split rule shares out: the cache's kv_len, or,
/// where a window's left side and the right side (causal's, or the window's) both bound the rows, left + right +
/// q_len when that is fewer.
int window_keys(const AttentionProblem& p) {
  const int right = p.causal ? 0 : p.window_right;
  if (p.window_left < 0 || right < 0) return p.kv_len;
  return int(std::min<std::int64_t>(p.kv_len, std::int64_t(p.window_left) + right + p.q_len));
}

/// The workspace: step 42's (decode::workspace_bytes), sized for the fewest blocks a split: one a (batch, KV head).
std::size_t workspace_bytes(const AttentionProblem& p) {
  return decode::workspace_bytes(p, std::int64_t(p.batch) * p.kv_heads, kThreads);
}

/// The split kernel of one or two row tiles: one where a KV head's pairs fit in 16 rows, so that a block of one new
/// token is step 46's, two where they do not; with the page walk for a paged cache, without it for a contiguous one;
/// of kWideWarps warps where `wide` (d = 64 only), else of kWarps.
template <class T, int D, bool kSoftcap>
void launch_split(int tiles, bool wide, dim3 grid, cudaStream_t stream, const kit::Heads<T, D>& heads,
                  const kit::Cache& cache, float* partial_o, float* partial_lse, int splits, int chunks,
                  float scale_log2, const Model& model) {
  const bool paged = cache.page_table != nullptr;
  const auto with_warps = [&](auto warps) {
    constexpr int kW = decltype(warps)::value;
    const auto go = [&](auto kernel, int ring_bytes) {
      kit::launch(kernel, grid, kW * kWarpSize, ring_bytes, stream, heads, cache, partial_o, partial_lse, splits,
                  chunks, scale_log2, model);
    };
    constexpr int kOne = kRingBytes<D, kRingStages<D, 1>, kW>, kTwo = kRingBytes<D, kRingStages<D, kMaxTiles>, kW>;
    if (tiles == 1)
      paged ? go(split_kernel<T, D, 1, kSoftcap, true, kW>, kOne)
            : go(split_kernel<T, D, 1, kSoftcap, false, kW>, kOne);
    else
      paged ? go(split_kernel<T, D, kMaxTiles, kSoftcap, true, kW>, kTwo)
            : go(split_kernel<T, D, kMaxTiles, kSoftcap, false, kW>, kTwo);
  };
  if constexpr (D == 64)
    if (wide) return with_warps(std::integral_constant<int, kWideWarps>{});
  with_warps(std::integral_constant<int, kWarps>{});
}

/// Validates the problem (dispatch refuses more new tokens than kMaxQueries), then launches the split kernel over
/// chunks of 16 or 32 rows of each KV head's (query head, new token) pairs and, with more than one split, the
/// combine (with sinks, step 59's). The splits are counted from the keys a window lets the new tokens see.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 59", [&]<class T, int D>() {
    const int rows = p.q_heads / p.kv_heads * p.q_len;  // a KV head's (query head, new token) pairs
    const int tiles = rows > kTileRows ? kMaxTiles : 1;  // row tiles a block
    const int chunks = kit::ceil_div(rows, tiles * kTileRows);
    // At d = 64 the wide block (kWideWarps warps, one an SM) for a contiguous cache, and for a paged one whose
    // (sequence, KV head, chunk) units fit the SMs one each; many short paged sequences keep two 4-warp blocks an SM.
    const std::int64_t units = std::int64_t(p.batch) * p.kv_heads * chunks;
    const bool wide = D == 64 && (p.page_size == 0 || units <= kit::device_multiprocessors());
    const int per_sm = D == 128 && tiles == kMaxTiles ? kTwoTileBlocksPerSM
                       : p.page_size > 0 && !wide     ? kPagedSplitBlocksPerSM<D>
                                                      : kSplitBlocksPerSM;
    const int slots = per_sm * kit::device_multiprocessors();
    const int splits = decode::splits_for(window_keys(p), units, slots);
    float* partial_o = static_cast<float*>(t.workspace);
    float* partial_lse = partial_o + std::int64_t(splits) * p.q_elements();
    const auto heads = kit::heads<T, D>(p, t);
    const float scale_log2 = p.softmax_scale() * 1.44269504f;  // exp(x) = 2^(x log2(e))
    const float cap = p.softcap;
    const Model model{p.window_left, p.window_right, cap * kLog2e, cap > 0.f ? p.softmax_scale() / cap : 0.f,
                      p.sinks ? t.sinks : nullptr};
    const dim3 grid(splits, p.kv_heads * chunks, p.batch);
    if (cap > 0.f)
      launch_split<T, D, true>(tiles, wide, grid, stream, heads, kit::cache(p, t), partial_o, partial_lse, splits,
                               chunks, scale_log2, model);
    else
      launch_split<T, D, false>(tiles, wide, grid, stream, heads, kit::cache(p, t), partial_o, partial_lse, splits,
                                chunks, scale_log2, model);
    const dim3 one_a_row = kit::grid_1d(std::int64_t(p.batch) * p.q_len * p.q_heads);
    if (splits > 1 && model.sinks)
      kit::launch(sink_combine_kernel<T, D>, one_a_row, D, 0, stream, heads, partial_o, partial_lse, splits, p.batch,
                  model.sinks);
    else if (splits > 1)
      kit::launch(decode::combine_kernel<T, D>, one_a_row, D, 0, stream, heads, partial_o, partial_lse, splits, p.batch);
  });
}

}  // namespace

/// Step 59 as the registry lists it: the launcher and its workspace (the splits' partials).
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step59
