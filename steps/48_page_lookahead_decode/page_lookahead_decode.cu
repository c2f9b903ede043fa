// Step 48: the page table read two tiles ahead, checked where it is used, walked without a division.
//
// Step 47 reads a paged cache the way step 46 does: lane l < 16 of a warp looks up key l of the warp's next slice a
// tile ahead, j / page_size and j % page_size, and the pool's row of the key from the table. Nsight Compute on the
// H200 (step 46, d = 64, 16/16 heads, B = 8, 8192 keys, f16; docs/results/profiles) timed pages of 16 at 148 us
// against 79 us for the contiguous cache, and put 12 % of the warps' stall samples on one instruction: the compare
// of the table entry with the pool's size (the value check every page entry gets since step 45), waiting on the
// entry's load. The check reads the entry the moment its load is issued, so each warp waits out a whole table read
// every tile, with no other warp of its SM to run (one block an SM, 4 warps); the division by page_size adds some
// twenty dependent integer instructions a lookup. Here a lane keeps its key's place in the pages as (page, row) and
// moves it a tile on with two adds and a compare (64 keys are q pages and r rows of a page, divided once a block);
// it reads the table entry two tiles ahead and keeps it as it came, and checks it and makes it a row of the pool
// only when its tile's copies start, two tiles of work later.
//
// And the split rule counts blocks for the pages. At d = 64 one block an SM keeps half the bytes in flight it keeps
// at d = 128 (its ring's rows are half as wide), too few to cover a paged read's longer wait: Nsight Compute on the
// H200 (B = 8, 16/16 heads, 8,192 keys, pages of 16) saw one warp a scheduler, eligible a third of the cycles, and
// 3.0 TB/s against 4.0 contiguous. On a paged cache the rule counts 128 / d blocks an SM, so d = 64 gets the splits
// that put two on each SM and the bytes in flight of d = 128. (At d = 128 the ring's 128 KiB leave an SM room for
// one block: counting two only queued more waves. A contiguous cache keeps one: two were slower there.)
//
// And a contiguous cache gets a kernel of its own, compiled without the page walk (kPaged, a template parameter): the
// walk's registers, table reads and `pages ?` tests were in the loop of every call, paged or not, and step 47, which
// has no walk, read a contiguous cache faster. On the H200 (session 23, f16, one new token) the loop of one row tile at
// d = 64 went from 415 to 299 instructions (cuobjdump, CUDA 13.0) and the read from 3.71 to 4.06 TB/s, 0.96x the read
// ceiling (B = 8, 16/16 heads, 8,192 keys, medians of two rounds; step 47: 4.07); at d = 128 with 32/8 heads, in one
// round, from 3.85 to 4.07 (B = 64, 2,048 keys) and 3.76 to 3.86 (B = 1, 131,072), the same at B = 8 (3.73, 3.72), and
// with 8 new tokens from 2.75 to 3.06 (B = 8). The paged kernel is the one before.
//
// And two more changes, timed as variants of this step (session 24, H200, f16, 32/8 heads, d = 128, medians of two
// rounds). A paged kernel of one row tile copies a warp's 16-key slice that lies in one page as a contiguous cache's:
// one row from the walk and the 15 after it (the splits' shares are multiples of 16 keys, so slices start where pages
// of 16 may). At d = 128 the loop less the path not taken is 536 instructions, where it was 673 (contiguous: 413;
// cuobjdump, CUDA 13.0, counts that include the cold branch recording a bad table entry), and with one new token pages
// of 16 went from 0.85-0.88x to 0.96-0.98x the contiguous speed (B = 1, 131,072 keys: 3.35 to 3.74 TB/s; B = 8, 8,192:
// 3.26 to 3.61; B = 64, 2,048: 3.37 to 3.86); at d = 64 it is 393 against 415, and pages did not move there. And the
// kernel of two row tiles at d = 128 (several new tokens), whose 255 registers a thread leave one warp a scheduler,
// gets a ring of 3 stages, so that two blocks share an SM: with 8 new tokens 3.21 to 3.52 TB/s contiguous and 2.56 to
// 3.40 on pages of 16 (B = 1), 3.14 to 3.47 and 2.41 to 3.33 (B = 64), 3.04 to 2.96 and 2.42 to 2.84 (B = 8).
//
// And at d = 64 a wide block: kWideWarps = 8 warps, tiles of 128 keys, a ring of 128 KiB. Nsight Compute on the H200
// (session 25, B = 8, 16/16 heads, 8,192 keys, one new token) timed the paged split kernel at 68.8 us against the
// contiguous one's 74.6 (base clocks): read two 4-warp blocks an SM at a time, pages cost no time per byte; the paged
// call's second split and its combine did. A wide block keeps the same bytes in flight with one block an SM and one
// split. Timed as a variant (f16, medians of two rounds): pages of 16 from 3.70 to 3.84 TB/s and of 64 from 3.60 to
// 3.87 at B = 8, against a contiguous read from 4.07 to 4.01; at B = 1 (131,072 keys) 3.35 to 3.58 contiguous and 3.15
// to 3.46 on pages of 16; at B = 64 (2,048 keys) 3.84 to 4.05 contiguous, but 3.99 to 3.77 on pages of 16. So the
// launcher takes it for every contiguous cache at d = 64 and for a paged one whose (sequence, KV head, chunk) units
// fit the SMs one each; many short paged sequences keep two 4-warp blocks an SM.
//
// The rest is step 47's: up to two row tiles a block sharing each K and V fragment, the warps' 16-key slices of each
// 64-key tile copied with cp.async into a 4-stage ring, swizzled, read back with ldmatrix; the merge of the warps;
// the split rule and the combine; step 45's cache forms.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "42_split_kv_decode/split_kv.cuh"
#include "fa/kit.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace fa::step48 {
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

/// Block (split, kv_h x chunks + chunk, b): the keys of split `split` of sequence b, for the kRows = kTiles x 16 rows
/// of chunk `chunk` of KV head kv_h's group: row r is pair x = chunk x kRows + r of the group's (query head, new
/// token) pairs, row tile r / 16 of the block, query
/// head kv_h x group + x / q_len and new token x % q_len; rows past the pairs are zeros. Warp w takes keys
/// first + 16 kW t + 16 w .. + 15 of tile t (kW warps: kWarps, or kWideWarps at d = 64). Writes, per row, the
/// slice's O (divided by its own sum) and its log-sum-exp in log2 units into the workspace; a row that sees none of
/// the slice's keys gets O = 0 and -inf. With one split (gridDim.x = 1) it writes O and LSE instead.
/// kPaged: a paged cache's kernel, with the page walk; without it, a contiguous cache's.
template <class T, int D, int kTiles, bool kPaged, int kW>
__global__ void __launch_bounds__(kW * kWarpSize)
split_kernel(kit::Heads<T, D> s, kit::Cache cache, float* __restrict__ partial_o, float* __restrict__ partial_lse,
             int splits, int chunks, float scale_log2) {
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
  // This split's keys: an equal share of the sequence's in multiples of 16 keys, [first, last) (so that a warp's
  // slices start where pages of 16, 32, ... may). The same for the whole block.
  const int share = kit::ceil_div(kit::ceil_div(len, splits), kWarpKeys) * kWarpKeys;
  const int first = min(split * share, len), last = min(first + share, len);

  // Each row tile's 16 rows of Q as A fragments, one per k-step, read once from global memory (a[0]: row g, columns
  // 16k + 2t, 2t + 1; a[1]: row g + 8; a[2], a[3]: the same rows, 8 columns on); zeros for the padding rows. And
  // where the keys of this lane's two rows end (the mask and the length; 0 for a padding row).
  std::uint32_t q_frag[kTiles][kDSteps][4];
  int seen[kTiles][2];
#pragma unroll
  for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kTileRows * mt + g + 8 * half;
      const T* q_row = holds(r) ? s.q_head(b, head_of(r)) + token_of(r) * s.q_stride() : nullptr;
      seen[mt][half] = holds(r) ? keys_seen_in(len, s.q_len, token_of(r), s.causal, cache.bottom_right) : 0;
#pragma unroll
      for (int k = 0; k < kDSteps; ++k)
#pragma unroll
        for (int x = 0; x < 2; ++x)
          q_frag[mt][k][half + 2 * x] =
              q_row ? *reinterpret_cast<const std::uint32_t*>(q_row + 16 * k + 8 * x + 2 * t) : 0u;
    }

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
    // Scaled to log2 units, and -inf for a key past the slice or masked for the row (a padding row sees none).
    // S[mt][n][e] is row 16 mt + g + 8 (e >= 2), key base + 8n + 2t + (e & 1).
    const int base = first + tile * kTileKeys + warp * kWarpKeys;
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = base + 8 * n + 2 * t + (e & 1);
          S[mt][n][e] = j < last && j < seen[mt][e >> 1] ? S[mt][n][e] * scale_log2 : -INFINITY;
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
    float M = -INFINITY;
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

/// The workspace: step 42's (decode::workspace_bytes), sized for the fewest blocks a split: one a (batch, KV head).
std::size_t workspace_bytes(const AttentionProblem& p) {
  return decode::workspace_bytes(p, std::int64_t(p.batch) * p.kv_heads, kThreads);
}

/// The split kernel of one or two row tiles: one where a KV head's pairs fit in 16 rows, so that a block of one new
/// token is step 46's, two where they do not; with the page walk for a paged cache, without it for a contiguous one;
/// of kWideWarps warps where `wide` (d = 64 only), else of kWarps.
template <class T, int D>
void launch_split(int tiles, bool wide, dim3 grid, cudaStream_t stream, const kit::Heads<T, D>& heads,
                  const kit::Cache& cache, float* partial_o, float* partial_lse, int splits, int chunks,
                  float scale_log2) {
  const bool paged = cache.page_table != nullptr;
  const auto with_warps = [&](auto warps) {
    constexpr int kW = decltype(warps)::value;
    const auto go = [&](auto kernel, int ring_bytes) {
      kit::launch(kernel, grid, kW * kWarpSize, ring_bytes, stream, heads, cache, partial_o, partial_lse, splits,
                  chunks, scale_log2);
    };
    constexpr int kOne = kRingBytes<D, kRingStages<D, 1>, kW>, kTwo = kRingBytes<D, kRingStages<D, kMaxTiles>, kW>;
    if (tiles == 1)
      paged ? go(split_kernel<T, D, 1, true, kW>, kOne) : go(split_kernel<T, D, 1, false, kW>, kOne);
    else
      paged ? go(split_kernel<T, D, kMaxTiles, true, kW>, kTwo) : go(split_kernel<T, D, kMaxTiles, false, kW>, kTwo);
  };
  if constexpr (D == 64)
    if (wide) return with_warps(std::integral_constant<int, kWideWarps>{});
  with_warps(std::integral_constant<int, kWarps>{});
}

/// Validates the problem (dispatch refuses more new tokens than kMaxQueries), then launches the split kernel over
/// chunks of 16 or 32 rows of each KV head's (query head, new token) pairs and, with more than one split, the
/// combine.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 48", [&]<class T, int D>() {
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
    const int splits = decode::splits_for(p.kv_len, units, slots);
    float* partial_o = static_cast<float*>(t.workspace);
    float* partial_lse = partial_o + std::int64_t(splits) * p.q_elements();
    const auto heads = kit::heads<T, D>(p, t);
    const float scale_log2 = p.softmax_scale() * 1.44269504f;  // exp(x) = 2^(x log2(e))
    launch_split<T, D>(tiles, wide, dim3(splits, p.kv_heads * chunks, p.batch), stream, heads, kit::cache(p, t),
                       partial_o, partial_lse, splits, chunks, scale_log2);
    if (splits > 1)
      kit::launch(decode::combine_kernel<T, D>, kit::grid_1d(std::int64_t(p.batch) * p.q_len * p.q_heads), D, 0,
                  stream, heads, partial_o, partial_lse, splits, p.batch);
  });
}

}  // namespace

/// Step 48 as the registry lists it: the launcher and its workspace (the splits' partials).
Launcher launcher() { return kit::launcher<Support>(&launch, &workspace_bytes); }

}  // namespace fa::step48
