// Step 60: the causal mask's diagonal at the last key (bottom-right), in step 57's kernel, as FlashAttention aligns
// it when seqlen_q != seqlen_k: query row i of a sequence of q_len rows over kv_len keys sees the keys
// j <= kv_len - q_len + i, so the last row sees every key (a chunk of a prompt over the cached prefix before it). The
// one rule, keys_range_in, takes the alignment: the kernel passes it through, and each sequence of a pack gets its own
// offset kv_len - q_len. Every tile walk and unmasked range is read from that rule, so nothing else moves; where
// q_len > kv_len, the first q_len - kv_len rows see no key (O = 0, LSE = -inf, or the sink's logit), and a work tile
// of such rows alone takes no K/V tile.
// What it buys: chunked prefill and a prompt continued over a cache of any length on the fastest forward.
#include "09_tensor_cores/mma.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "21_tma_pipeline/tma.cuh"
#include "20_wgmma/wgmma.cuh"
#include "22_warp_specialization/roles.cuh"
#include "23_pingpong/named_barrier.cuh"
#include "50_softcap/tanh_exp2.cuh"
#include "57_head_dim_256/wgmma_wide.cuh"
#include "fa/kit.cuh"
#include "fa/tma.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace fa::step60 {
namespace {

using namespace hopper;
using namespace tc;

/// What this step accepts: wgmma takes 16-bit inputs in this form; it is an sm_90a instruction, so the
/// step is built for sm_90a and runs on sm_90 (H100, H200) only; the copy engine reads 16-byte-aligned
/// tensors.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128, 256>> {
  static constexpr int min_arch = 90;             ///< wgmma.mma_async: sm_90a
  static constexpr bool arch_specific = true;     ///< sm_90a code runs on sm_90 alone
  static constexpr int pointer_alignment = 16;    ///< tensor maps need 16-byte-aligned base addresses
  static constexpr bool needs_workspace = true;   ///< the tile scheduler's counters
  /// A sliding window (FlashAttention's window_size), soft-capping (its softcap), sinks (gpt-oss's) and packed
  /// variable lengths (its cu_seqlens).
  static constexpr Features features{.window = true, .softcap = true, .sinks = true, .varlen = true};
  /// The causal mask's (and the window's) diagonal at each sequence's last key, FlashAttention's alignment: any
  /// q_len (a prefill step; the decode steps take at most a few new tokens).
  static constexpr CacheForms cache_forms{.bottom_right = true};
};

/// Consumer warpgroups per block: consumer w owns query rows 64w .. 64w + 63 of the block's Br = 128, the
/// M of its wgmma. Warpgroup 0 of the block is the producer; consumer w is warpgroup w + 1.
constexpr int kWarpGroups = 2;                      ///< consumer warpgroups per block
constexpr int kGroupThreads = 4 * kWarpSize;        ///< 128 threads, 4 warps, in a warpgroup
constexpr int kConsumerThreads = kWarpGroups * kGroupThreads;  ///< 256: the empty barriers count them
constexpr int kThreads = kConsumerThreads + kGroupThreads;     ///< 384 threads: + the producer warpgroup

/// Named barrier kTurn + w is consumer w's turn (barrier 0 is __syncthreads'): w waits on it, the other
/// consumer arrives on it. A phase counts both consumers' threads.
constexpr int kTurn = 1;
constexpr int kGroupRows = 64;                      ///< query rows per warpgroup: wgmma's M
constexpr int Br = kWarpGroups * kGroupRows;        ///< 128 query rows per block

/// Keys per K/V tile: 128, the N of S = Q K^T's wgmma. S (Bc / 8 accumulator tiles) and O (D / 8) hold
/// 64 + 64 floats per thread at d = 128: a warpgroup spreads its 64 rows over 128 threads.
/// At d = 256, 80: two stages of K and V tiles of Bc keys take 4 x Bc x 512 B beside Q_i's 64 KiB, and 80 is
/// the widest Bc of whole 16-key steps (P V's k-steps) under the 227 KiB a block has (96 would take 256 KiB).
/// Per consumer thread, O (D / 8 = 32 tiles) holds 128 floats, S 40 and P (Bc / 16 k-steps of 4) 20: 188 of 240.
template <int D>
constexpr int kv_tile() {
  return D == 256 ? 80 : 128;
}

/// Whether a warp skips O's rescale when none of its rows' maxima grew (step 18's vote): at d = 128.
/// At d = 256 too: the rescale is 128 multiplies a thread a tile there, more than three for each of S's 40 exponents.
template <int D>
constexpr bool kSkipRescale = D >= 128;

/// Registers per thread after the split: the producer drops to 24, the fewest setmaxnreg allows, and
/// each consumer rises to 240. setmaxnreg moves registers inside the block's pool: 384 threads launched
/// one block per SM start with 168 each (65536 / 384, rounded down to 8), 64512 in all, and 128 x 24 +
/// 256 x 240 = 64512 uses every one of them. One block per SM, at d = 64 too.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;  ///< registers per consumer thread, after setmaxnreg.inc
static_assert(kGroupThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                  kThreads * launch_registers<kThreads>(),
              "setmaxnreg moves registers within the block's pool, which must hold both roles' registers");

/// K/V stages: tile j lives in stage j % kStages. P V_j now finishes during tile j + 1, a tile later
/// than in step 23, so V_j holds its stage a tile longer; K_j's is released as soon as S_j is done.
/// In each of two calls on the H100 three stages (one with this split release, one with a single
/// release) ran faster than two stages with the split release in 13 of 16 configurations, by up to
/// 4-5.5 % (docs/results/ablations/README.md): with two, the copy of K_{j+2} waits for both
/// consumers' S_j, the second of them half a turn behind.
/// At d = 256 two: three stages of 64 keys (64 + 3 x 2 x 32 KiB = 256 KiB) do not fit beside Q_i, and three of
/// 48 (208 KiB) would spread each tile's fixed costs over three key steps of P V.
template <int D>
constexpr int kv_stages() {
  return D == 256 ? 2 : 3;
}

/// Columns per chunk: 64 16-bit elements are 128 bytes, one row of the 128-byte swizzle. A tile of
/// width D is stored as D / 64 chunks [rows][64], one after the other, each a copy-engine box.
constexpr int kChunk = 64;
constexpr int kChunkRowBytes = 128;  ///< bytes of one row of a chunk

/// Dynamic shared memory: Q_i (Br x D), kStages K tiles and kStages V tiles (Bc x D), all 16-bit, then
/// 2 + 4 kStages mbarriers; plus 1024 bytes to align the start to a swizzle atom.
template <int D>
constexpr int shared_bytes() {
  return 2 * (Br * D + kv_stages<D>() * 2 * kv_tile<D>() * D) + 8 * (2 + 4 * kv_stages<D>()) + 1024;
}
/// What a block of an H100 or H200 may take (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KiB), less the static
/// shared memory (next_tile, next_work: 32 bytes, which ptxas reports as 1024, the dynamic part's alignment):
/// d = 256's 230,480 bytes leave 944 to spare.
static_assert(shared_bytes<256>() + 1024 <= 227 * 1024, "d = 256's Q_i, K and V stages must fit in a block");

/// One work tile: what one block of step 24 computed, in the sequence that holds it.
struct WorkTile {
  int q_tile;   ///< query tile: rows q_tile * Br .. q_tile * Br + Br - 1 of the sequence; -1: an empty tile
  int h;        ///< query head
  int b;        ///< sequence
  int q_start;  ///< the sequence's first row of Q (and O) in the pack
  int k_start;  ///< its first row of K (and V)
  int q_len;    ///< its query rows (0 for an empty tile)
  int kv_len;   ///< its keys
};

/// The tile scheduler over the pack. Sequence b owns virtual tiles tile_start(b) .. tile_start(b + 1) - 1 of every
/// head: b + cu_seqlens_q[b] / Br, at least its ceil(len_b / Br) query tiles, and b Nq / Br tiles exactly for a
/// batch of one length. Work tile w is, for the (sequence, head) pair whose span holds it, step 24's order: the pairs
/// one after the other, b * q_heads + h, so the blocks running at once share a few heads' K and V in L2; within
/// a pair the query tiles, and, when causal, a sequence's last query tiles (which see the most keys) first; the
/// virtual tiles past the sequence's own are empty. Block c takes work tile c first, then tile G + next[0]++ (G
/// blocks) until that is past the last. The two counters live in the launch's workspace, zero when the kernel
/// starts; next[1] counts the blocks that have finished, and the last of them sets both back to zero for the next
/// launch.
struct Scheduler {
  int tiles;         ///< work tiles: q_heads x tile_start(batch)
  int batch;         ///< sequences
  int q_heads;       ///< query heads
  int q_len;         ///< every sequence's query rows, without cu_q
  int kv_len;        ///< every sequence's keys, without cu_k
  int total_q;       ///< rows of Q in the pack: LSE is [q_heads, total_q] with cu_q
  const int* cu_q;   ///< the pack's offsets of query rows, [batch + 1], or nullptr: sequence b starts at b q_len
  const int* cu_k;   ///< the pack's offsets of keys, [batch + 1], or nullptr: b kv_len
  int* next;         ///< next[0]: work tiles handed out past the first G; next[1]: blocks finished

  /// The first virtual tile of sequence b (b = batch: the tiles of one head).
  __device__ int tile_start(int b) const {
    return cu_q != nullptr ? b + cu_q[b] / Br : b * ((q_len + Br - 1) / Br);
  }
  /// The sequence of work tile w (below `tiles`): found in the pack by a binary search over tile_start, the last b
  /// with q_heads x tile_start(b) <= w.
  __device__ int sequence_of(int w) const {
    if (cu_q == nullptr) return w / (q_heads * tile_start(1));
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (q_heads * tile_start(mid) <= w) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
  /// Work tile w of sequence b: step 24's order inside the (sequence, head) pair.
  __device__ WorkTile work_tile(int w, int b, bool causal) const {
    const int first = tile_start(b), span = tile_start(b + 1) - first;
    const int r = w - q_heads * first;
    WorkTile work;
    work.b = b;
    work.h = r / span;
    work.q_start = cu_q != nullptr ? cu_q[b] : b * q_len;
    work.k_start = cu_k != nullptr ? cu_k[b] : b * kv_len;
    work.q_len = cu_q != nullptr ? cu_q[b + 1] - work.q_start : q_len;
    work.kv_len = cu_k != nullptr ? cu_k[b + 1] - work.k_start : kv_len;
    const int level = r % span, own = (work.q_len + Br - 1) / Br;
    work.q_tile = level >= own ? -1 : causal ? own - 1 - level : level;
    if (work.q_tile < 0) work.q_len = 0;  // an empty tile: no row to write
    return work;
  }
  /// Where row i of sequence b (first row q_start of the pack), head h, sits in LSE: [batch, q_heads, q_len], or
  /// [q_heads, total_q] with cu_q.
  __device__ std::int64_t lse_index(int b, int h, int q_start, int i) const {
    return cu_q != nullptr ? std::int64_t(h) * total_q + q_start + i : (std::int64_t(b) * q_heads + h) * q_len + i;
  }
};
constexpr int kSchedulerBytes = 2 * sizeof(int);  ///< the workspace step 25 asks for

/// FlashAttention-2 forward on Hopper, warp-specialized, consumers in ping-pong, each overlapping its
/// softmax with its own P V, persistent. A one-dimensional grid of at most one block per SM, block of a
/// producer warpgroup and kWarpGroups consumer warpgroups; a block takes work tiles from `sched`, and
/// for each computes rows [q_tile * Br, q_tile * Br + Br) of head h, consumer w rows w*64 .. w*64 + 63
/// of the tile; warp v of it rows 16v .. 16v + 15 of those. Thread 0, in the producer, issues every
/// copy. kRawMax: the scale is positive, so the row max is taken over raw scores and each exponent is
/// one FMA. kSoftcap: each score becomes softcap tanh(scale q.k / softcap), in log2 units (never with kRawMax).
/// bottom_right: the diagonal of row i is key kv_len - q_len + i of its sequence (its own lengths in a pack), not i.
template <class T, int D, bool kRawMax, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, 1)
persistent_grid_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map, kit::Heads<T, D> s, float scale_log2,
                       Scheduler sched, int window_left, int window_right, float cap_log2, float scale_over_cap,
                       const float* __restrict__ sinks, bool bottom_right) {
  static_assert(!(kRawMax && kSoftcap), "a capped score is bounded, not scaled: its max is the capped scores'");
  constexpr int Bc = kv_tile<D>();
  constexpr int kStages = kv_stages<D>();
  constexpr int kDSteps = D / 16;    // k-steps of S = Q K^T (over the head dimension)
  constexpr int kKeyTiles = Bc / 8;  // n8 tiles of S (keys)
  constexpr int kKeySteps = Bc / 16; // k-steps of O = P V (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of O (columns)
  constexpr int kChunks = D / kChunk;
  constexpr std::uint32_t kTileBytes = 2 * Bc * D;  // one K or V tile; the copies of one stage count these
  static_assert(D % kChunk == 0 && Bc % 16 == 0, "tiles are whole 64-column chunks and 16-key steps");

  // Every tile starts on a 1024-byte boundary (a swizzle atom), so the descriptors' base offset is 0.
  extern __shared__ __align__(1024) unsigned char shared[];
  const std::uint32_t Q_tile = (smem_address(shared) + 1023) & ~1023u;  // kChunks x [Br][64] swizzled
  const std::uint32_t K_tile = Q_tile + 2 * Br * D;                     // stage s: + s * kTileBytes
  const std::uint32_t V_tile = K_tile + kStages * kTileBytes;           // stage s: + s * kTileBytes
  const std::uint32_t barriers = V_tile + kStages * kTileBytes;
  const std::uint32_t Q_full = barriers;                    // Q_i has landed
  const std::uint32_t K_full = barriers + 8;                // stage s: + 8 s, K_j has landed
  const std::uint32_t V_full = barriers + 8 * (1 + kStages);  // stage s: + 8 s, V_j has landed
  const std::uint32_t K_empty = barriers + 8 * (1 + 2 * kStages);  // stage s: + 8 s, the consumers are done with K
  const std::uint32_t V_empty = barriers + 8 * (1 + 3 * kStages);  // stage s: + 8 s, the consumers are done with V
  const std::uint32_t Q_empty = barriers + 8 * (1 + 4 * kStages);  // the consumers are done with Q_i
  __shared__ int next_tile;  // the work tile whose Q lands next on Q_full, as the producer says
  __shared__ WorkTile next_work;  // its sequence and place, as the producer found them

  const int tid = threadIdx.x;
  const int group = tid / kGroupThreads - 1;       // consumer warpgroup 0 or 1; -1 is the producer
  const int warp = (tid % kGroupThreads) / kWarpSize;  // warp within the warpgroup
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of its warp's 16
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  const int q_stride = s.q_stride();

  // The work tile in hand's sequence: its first rows of Q and of K in the pack, its query rows and its keys.
  int q_start = 0, k_start = 0, q_len = 0, kv_len = 0;
  // The keys [first, last) query row i sees: the mask, the window and kv_len, as the reference's rule, the diagonal
  // where bottom_right puts it, from this sequence's own q_len and kv_len. A row whose diagonal is before key 0 sees
  // none (first == last == 0): it only widens a tile span below, never narrows one.
  auto keys_of = [&](int i) {
    return keys_range_in(kv_len, q_len, i, s.causal, bottom_right, window_left, window_right);
  };
  // The K/V tiles of query tile q_tile: from the tile of its first row's first key to the tile of its last row's
  // last key (a row's first and last keys never decrease as the row grows), t0 .. t0 + count - 1.
  struct TileSpan {
    int t0, count;
  };
  auto kv_tiles = [&](int q_tile) -> TileSpan {
    const int row0 = q_tile * Br, row_last = min(q_tile * Br + Br, q_len) - 1;
    const int first = keys_of(row0).first, last = keys_of(row_last).last;
    if (last <= first) return {0, 0};
    return {first / Bc, (last + Bc - 1) / Bc - first / Bc};
  };

  // The work tile in hand, set by take(work): its first row i0, head h, sequence b, KV head, its first K/V tile t0
  // and K/V tile count Tc (0 for an empty tile). `it` counts the K/V tiles of the work tiles this block finished
  // before it, so that tile j of this one is the block's tile it + j: the stages and their barrier phases run on
  // from work tile to work tile.
  int i0 = 0, h = 0, b = 0, kv_head = 0, Tc = 0, t0 = 0, it = 0;
  auto take = [&](const WorkTile& work) {
    i0 = max(work.q_tile, 0) * Br;
    h = work.h;
    b = work.b;
    kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head
    q_start = work.q_start, k_start = work.k_start, q_len = work.q_len, kv_len = work.kv_len;
    const TileSpan span = work.q_tile < 0 ? TileSpan{0, 0} : kv_tiles(work.q_tile);
    t0 = span.t0;
    Tc = span.count;
  };

  // j counts the block's K/V tiles over all its work tiles: tile j - it of the work tile in hand.
  // Tile j's K or V goes to stage j % kStages: one expect_tx, then one copy per chunk. Tile j >=
  // kStages reuses the stage tile j - kStages left: it waits for that stage's empty phase number
  // j / kStages - 1 first. Keys past kv_len (of this sequence) are the next sequence's, or zeros past the pack's
  // end, and are masked below.
  auto load_k = [&](int j) {
    const int stage = j % kStages;
    if (j >= kStages) mbarrier_wait(K_empty + 8 * stage, (j / kStages - 1) & 1);
    mbarrier_arrive_expect_tx(K_full + 8 * stage, kTileBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load_4d(K_tile + stage * kTileBytes + c * Bc * kChunkRowBytes, &k_map, K_full + 8 * stage, c * kChunk,
                  kv_head, k_start + (t0 + j - it) * Bc, 0);
  };
  auto load_v = [&](int j) {
    const int stage = j % kStages;
    if (j >= kStages) mbarrier_wait(V_empty + 8 * stage, (j / kStages - 1) & 1);
    mbarrier_arrive_expect_tx(V_full + 8 * stage, kTileBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load_4d(V_tile + stage * kTileBytes + c * Bc * kChunkRowBytes, &v_map, V_full + 8 * stage, c * kChunk,
                  kv_head, k_start + (t0 + j - it) * Bc, 0);
  };

  // One thread sets up the barriers: a full barrier expects one arrival (its own expect_tx), an empty
  // barrier one from every consumer thread. This is the block's last __syncthreads.
  if (tid == 0) {
    prefetch_tensor_map(&q_map);
    prefetch_tensor_map(&k_map);
    prefetch_tensor_map(&v_map);
    for (int i = 0; i < 1 + 2 * kStages; ++i) mbarrier_init(barriers + 8 * i, 1);
    for (int s = 0; s < 2 * kStages + 1; ++s) mbarrier_init(K_empty + 8 * s, kConsumerThreads);  // K's, V's, Q's
    fence_mbarrier_init();
  }
  __syncthreads();

  // The producer: gives its registers back, and one thread, work tile after work tile, says which tile
  // comes next and starts its Q_i and then every K and V tile on its way, each as soon as its buffer is
  // empty, in the order the consumers need them: K_j, which tile j multiplies first, ahead of V_{j-1},
  // which it multiplies second. The n-th work tile is said on Q_full's phase number n: next_tile is
  // written, then Q_full arrived on (with Q_i's bytes to come, when the tile has K/V tiles to take).
  // Both wait for Q_empty's phase n - 1: the consumers have read the tile before and finished its S.
  // A tile past the last one tells the consumers to stop. Rows of Q past q_len are the next sequence's (or zeros
  // past the pack's end), and nothing writes them. The next work tile's sequence is looked up in the pack (a
  // binary search over its offsets: dependent loads) before the wait, while the consumers still work; its place
  // in the sequence (independent loads) after it, written to next_work with next_tile: the consumers read it there.
  if (group < 0) {
    setmaxnreg_dec<kProducerRegisters>();
    if (tid == 0) {
      int w = blockIdx.x;
      int sequence = w < sched.tiles ? sched.sequence_of(w) : 0;
      for (int n = 0;; ++n) {
        if (n > 0) mbarrier_wait(Q_empty, (n - 1) & 1);
        next_tile = w;
        if (w >= sched.tiles) {
          mbarrier_arrive(Q_full);
          break;
        }
        const WorkTile work = sched.work_tile(w, sequence, s.causal);
        next_work = work;
        take(work);
        if (Tc == 0) {
          mbarrier_arrive(Q_full);
        } else {
          mbarrier_arrive_expect_tx(Q_full, 2 * Br * D);
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
            tma_load_4d(Q_tile + c * Br * kChunkRowBytes, &q_map, Q_full, c * kChunk, h, q_start + i0, 0);
        }
        for (int j = it; j < it + Tc; ++j) {
          load_k(j);
          if (j > it) load_v(j - 1);
        }
        if (Tc > 0) load_v(it + Tc - 1);
        it += Tc;
        w = gridDim.x + atomicAdd(&sched.next[0], 1);
        if (w < sched.tiles) sequence = sched.sequence_of(w);
      }
      // The last block to finish has seen every other block take a tile past the last: none will add
      // to the counters again, and it sets them back to zero for the next launch.
      if (atomicAdd(&sched.next[1], 1) == int(gridDim.x) - 1) {
        atomicExch(&sched.next[0], 0);
        atomicExch(&sched.next[1], 0);
      }
    }
    return;
  }
  // The consumers take the registers the producer gave back. Consumer 0 takes the first turn: consumer
  // 1 arrives on consumer 0's barrier as if it had just finished a turn.
  setmaxnreg_inc<kConsumerRegisters>();
  if (group == 1) named_barrier_arrive<kTurn + 0, kConsumerThreads>();
  // Consumer w waits for its turn on barrier kTurn + w and passes the turn on the other's. Barrier ids
  // are immediates in the instruction, so each consumer's choice is a branch, the same for all of its
  // 128 threads.
  auto wait_turn = [&] {
    if (group == 0) named_barrier_sync<kTurn + 0, kConsumerThreads>();
    else named_barrier_sync<kTurn + 1, kConsumerThreads>();
  };
  auto pass_turn = [&] {
    if (group == 0) named_barrier_arrive<kTurn + 1, kConsumerThreads>();
    else named_barrier_arrive<kTurn + 0, kConsumerThreads>();
  };

  // Per thread: O for rows g, g+8 of its warp as kOutTiles accumulator tiles; m and l for the same
  // rows. m is the full row max (the 4 lanes of a quad agree on it), of the raw scores when kRawMax,
  // else in log2 units (scores times scale_log2); l is this lane's partial sum over its own columns,
  // joined across the quad at the end.
  float O_acc[kOutTiles][4];
  float m[2], l[2];
  int warp_row0 = 0;  // this warp's first row in the work tile in hand
  KeyRange row_keys[2];  // the keys [first, last) of this lane's rows g and g + 8 in the work tile in hand

  // Descriptors. Q and K are K-major (a row's d values contiguous): k-step k reads 16 columns, 32 bytes
  // into chunk k / 4; 8-row groups are 1024 bytes apart. This warpgroup's A is rows 64 group .. of Q_i.
  // V is MN-major for O = P V (B is [key][column], columns contiguous): k-step k is keys 16k .., 2048
  // bytes in; 8-key groups 1024 bytes apart, and the next 64 columns a chunk (Bc rows) further.
  auto q_desc = [&](int k) {
    return smem_descriptor(Q_tile + (k / 4) * Br * kChunkRowBytes + group * kGroupRows * kChunkRowBytes + (k % 4) * 32,
                           0, 8 * kChunkRowBytes);
  };
  auto k_desc = [&](std::uint32_t stage, int k) {
    return smem_descriptor(K_tile + stage * kTileBytes + (k / 4) * Bc * kChunkRowBytes + (k % 4) * 32, 0,
                           8 * kChunkRowBytes);
  };
  auto v_desc = [&](std::uint32_t stage, int k) {
    return smem_descriptor(V_tile + stage * kTileBytes + k * 16 * kChunkRowBytes, Bc * kChunkRowBytes,
                           8 * kChunkRowBytes);
  };

  // P_{j-1} as the A registers of P V_{j-1}: packed at the end of tile j - 1, multiplied during tile j.
  std::uint32_t p_frag[kKeySteps][4];

  // One K/V tile: S = Q_i K_j^T and O_i += P V_{j-1}, then the online softmax of
  // S_j while P V_{j-1} runs. `masked` is
  // std::true_type or std::false_type, so kMasked is known at compile time and
  // the unmasked copy of this body holds no mask code at all. So is `first`
  // (tile 0, with no P V before it): every wgmma group the compiler sees issued
  // is one it can see waited for.
  auto process_tile = [&](const int j, auto masked, auto first) {
    constexpr bool kMasked = decltype(masked)::value;
    constexpr bool kFirst = decltype(first)::value;
    const int kv0 = (t0 + j) * Bc;
    const int n = it + j;  // the block's K/V tile number
    const int stage = n % kStages;
    const std::uint32_t phase = (n / kStages) & 1;  // the parity of the stage's phase that brings tile n

    // This warpgroup's turn: S = Q_i K_j^T (kDSteps wgmmas, one group), then
    // O_i += P V_{j-1} (kKeySteps wgmmas with P from registers, a second group);
    // the tensor cores run them in that order. As soon as they are queued, the
    // other warpgroup's turn begins. Then wait for S alone: at most one group,
    // P V_{j-1}, still in flight.
    float S[kKeyTiles][4];
    const int prev = (n + kStages - 1) % kStages;  // the stage of tile n - 1
    mbarrier_wait(K_full + 8 * stage, phase);
    if constexpr (!kFirst) mbarrier_wait(V_full + 8 * prev, ((n - 1) / kStages) & 1);
    wait_turn();
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) wgmma_ss<T>(S, q_desc(k), k_desc(stage, k), k > 0);
    wgmma_commit();
    if constexpr (!kFirst) {
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) wgmma_rs<T>(O_acc, p_frag[k], v_desc(prev, k));
      wgmma_commit();
    }
    pass_turn();
    wgmma_wait<kFirst ? 0 : 1>();
    fence_registers(S);
    // S_j is done with K_j: this thread says so, and when all 256 consumer
    // threads have, the producer refills K's stage while P V_{j-1} still runs.
    mbarrier_arrive(K_empty + 8 * stage);

    // With the cap, S = softcap log2(e) tanh(scale S / softcap); else, without
    // kRawMax, scale into log2 units; then, in the masked copy only,
    // set to -inf the scores of keys outside their row's [first, last): the
    // window's, the causal mask's and kv_len's.
    // Rows past q_len are no longer masked: their
    // Q rows are the next sequence's (or zeros past the pack's end), so their scores are finite, and they are never
    // written.
    // S[n][e] is row g + 8 (e >= 2) of the warp's 16, key n*8 + 2t + (e & 1).
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kSoftcap) S[n][e] = cap_log2 * tanh_exp2(S[n][e] * scale_over_cap);
        else if constexpr (!kRawMax) S[n][e] *= scale_log2;
        if constexpr (kMasked) {
          const KeyRange& seen = row_keys[e >= 2 ? 1 : 0];
          const int key = kv0 + n * 8 + 2 * t + (e & 1);
          if (key < seen.first || key >= seen.last) S[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax on the fragments, for this lane's two rows (r = 0: row g,
    // elements 0-1 of each tile; r = 1: row g+8, elements 2-3). A
    // row's Bc values are spread over the 4 lanes of a quad, so its max is joined
    // with two butterfly shuffles (lane ^ 1, lane ^ 2). alpha is kept per row and
    // applied to O after the loop, where the warp can skip it.
    float alpha[2];
    bool grew = false;  // did any of this lane's rows get a new max?
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) row_max = fmaxf(row_max, fmaxf(S[n][2 * r], S[n][2 * r + 1]));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
      const float m_new = fmaxf(m[r], row_max);
      grew |= m_new != m[r];
      // A row with every key so far masked keeps m = -inf; subtracting 0 instead
      // gives P = 2^-inf = 0 and alpha = 0 rather than NaN from -inf - (-inf).
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;
      // 2^((x - m) c) = 2^(x c - m c): with kRawMax, c = scale_log2 and every
      // exponent is one FFMA; otherwise the scores are already scaled, c = 1.
      const float c = kRawMax ? scale_log2 : 1.f;
      const float m_scaled = m_safe * c;
      alpha[r] = fast_exp2((m[r] - m_safe) * c);
      m[r] = m_new;
      float row_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        S[n][2 * r] = fast_exp2(fmaf(S[n][2 * r], c, -m_scaled));
        S[n][2 * r + 1] = fast_exp2(fmaf(S[n][2 * r + 1], c, -m_scaled));
        row_sum += S[n][2 * r] + S[n][2 * r + 1];
      }
      l[r] = alpha[r] * l[r] + row_sum;
    }

    // Now wait for P V_{j-1}: O is rescaled next and P_j packed into the
    // registers it read. It is done with V_{j-1}: this thread says so, and
    // when all 256 consumer threads have, the producer refills V's stage.
    wgmma_wait<0>();
    fence_registers(O_acc);
    if constexpr (!kFirst) mbarrier_arrive(V_empty + 8 * prev);
    // O *= alpha, row by row. A row whose max did not grow has alpha = 2^0 = 1
    // exactly, so when no row of the warp grew (one vote for all 32 lanes; a
    // warp-uniform branch) the multiplies change nothing and are skipped. A row
    // with every key so far masked has alpha = 0 and O = 0: skipping is exact too.
    if (!kSkipRescale<D> || __any_sync(kFullMask, grew)) {
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        O_acc[c][0] *= alpha[0];
        O_acc[c][1] *= alpha[0];
        O_acc[c][2] *= alpha[1];
        O_acc[c][3] *= alpha[1];
      }
    }

    // P stays in registers: the accumulator tiles of keys 2k and 2k+1 are, element
    // for element, the A registers of k-step k (rows g / g+8, keys 2t.. / 2t+8..).
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
      p_frag[k][0] = pack2<T>(S[2 * k][0], S[2 * k][1]);          // row g,   keys 16k + 2t
      p_frag[k][1] = pack2<T>(S[2 * k][2], S[2 * k][3]);          // row g+8, keys 16k + 2t
      p_frag[k][2] = pack2<T>(S[2 * k + 1][0], S[2 * k + 1][1]);  // row g,   keys 16k + 8 + 2t
      p_frag[k][3] = pack2<T>(S[2 * k + 1][2], S[2 * k + 1][3]);  // row g+8, keys 16k + 8 + 2t
    }
  };

  // The work tiles of this block, one after another, as the producer names them: the n-th on Q_full's
  // phase number n, until one past the last; its sequence and place from next_work.
  for (int n = 0;; ++n) {
    mbarrier_wait(Q_full, n & 1);
    const int w = next_tile;
    if (w >= sched.tiles) break;
    take(next_work);
    warp_row0 = i0 + group * kGroupRows + warp * 16;
    T* __restrict__ O_head = s.O + std::int64_t(q_start) * q_stride + h * D;  // the sequence's row 0 of head h
#pragma unroll
    for (int c = 0; c < kOutTiles; ++c) O_acc[c][0] = O_acc[c][1] = O_acc[c][2] = O_acc[c][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;

    row_keys[0] = keys_of(warp_row0 + g);
    row_keys[1] = keys_of(warp_row0 + g + 8);
    // The tiles every row of the block sees whole take the unmasked copy: keys from the last row's first (the
    // latest window start) to the first row's last (the earliest end), tiles lo .. hi - 1 of the work tile's. The
    // tiles before lo (the window's left edge) and from hi on (its right edge, the diagonal, kv_len) take the
    // masked copy.
    const int row_last = min(i0 + Br, q_len) - 1;
    const int lo = min(Tc, max(1, (keys_of(row_last).first + Bc - 1) / Bc - t0));
    const int hi = max(lo, min(Tc, keys_of(i0).last / Bc - t0));
    // With no K/V tile at all (Tc = 0: a work tile whose key range is empty) the
    // consumers take no turn and write O = 0 below; otherwise tile 0 takes the
    // masked copy whichever it needs (masking a tile that needs none changes
    // nothing).
    if (Tc > 0) {
      process_tile(0, std::true_type{}, std::true_type{});
      int j = 1;
      for (; j < lo; ++j) process_tile(j, std::true_type{}, std::false_type{});
      for (; j < hi; ++j) process_tile(j, std::false_type{}, std::false_type{});
      for (; j < Tc; ++j) process_tile(j, std::true_type{}, std::false_type{});
      // Every S of the work tile is done (the last tile waited for all of its
      // wgmmas): this thread is done with Q_i, and when all 256 consumer threads
      // are, the producer names the next work tile and copies its Q over it.
      mbarrier_arrive(Q_empty);

      // The last turn holds P V_{Tc-1} alone, and ends like every turn: consumer
      // 1's passes the turn to consumer 0's first turn of the next work tile, or,
      // when there is none, to its wait below the loop.
      const int last = (it + Tc - 1) % kStages;
      mbarrier_wait(V_full + 8 * last, ((it + Tc - 1) / kStages) & 1);
      wait_turn();
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) wgmma_rs<T>(O_acc, p_frag[k], v_desc(last, k));
      wgmma_commit();
      pass_turn();
      wgmma_wait<0>();
      fence_registers(O_acc);
      // The next work tile's V copies reuse this stage too.
      mbarrier_arrive(V_empty + 8 * last);
      it += Tc;
    } else {
      mbarrier_arrive(Q_empty);  // a tile with no K/V tile reads no Q: the producer may go on
    }

    // l: join the quad's partial sums; the head's sink joins the row's max and sum (log2 units; none: -inf, and
    // M = m, L = l); then O = O_acc 2^(m - M) / L rounded to T. Each lane writes two adjacent columns of rows g and
    // g+8 of every n8 tile; rows past q_len (the sequence's last block's tail) are not written.
    const float sink_log2 = sinks != nullptr ? sinks[h] * kLog2e : -INFINITY;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_l = l[r];
      row_l += __shfl_xor_sync(kFullMask, row_l, 1);
      row_l += __shfl_xor_sync(kFullMask, row_l, 2);
      const float m_log2 = m[r] * (kRawMax ? scale_log2 : 1.f);  // -inf for a row that saw no key
      const float M = fmaxf(m_log2, sink_log2);
      const float keys_weight = M == -INFINITY ? 0.f : fast_exp2(m_log2 - M);  // 2^(m - M): 0 with no key
      const float L = row_l * keys_weight + (sink_log2 == -INFINITY ? 0.f : fast_exp2(sink_log2 - M));
      const float inv_l = L > 0.f ? keys_weight / L : 0.f;
      const int i = warp_row0 + g + 8 * r;
      if (i < q_len) {
#pragma unroll
        for (int c = 0; c < kOutTiles; ++c) {
          const std::uint32_t bits = pack2<T>(O_acc[c][2 * r] * inv_l, O_acc[c][2 * r + 1] * inv_l);
          *reinterpret_cast<std::uint32_t*>(O_head + i * q_stride + c * 8 + 2 * t) = bits;
        }
        // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P, the sink's term
        // included. A row with neither key nor sink has the empty sum's, -inf, as the reference.
        if (s.LSE != nullptr && t == 0)
          s.LSE[sched.lse_index(b, h, q_start, i)] = L > 0.f ? (M + log2f(L)) * (1.f / kLog2e) : -INFINITY;
      }
    }
  }
  // Consumer 1's last turn passed the turn on: consumer 0 takes it, with nothing left to do.
  if (group == 0) named_barrier_sync<kTurn + 0, kConsumerThreads>();
}

/// Validates the problem, builds the three tensor maps and the tile order, then launches one block of a
/// producer and kWarpGroups consumer warpgroups per SM (or per work tile, when there are fewer) on
/// `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 60", [&]<class T, int D>() {
    // What the copy engine reads: Q in boxes of Br rows, K and V in boxes of Bc keys, 64 columns each, each tensor
    // one sequence of all its rows (the pack's, or the batch's one after the other).
    const int total_q = int(p.total_q()), total_k = int(p.total_k());
    const CUtensorMap q_map = kit::heads_tensor_map(t.q, p.dtype, 1, total_q, p.q_heads, D, Br);
    const CUtensorMap k_map = kit::heads_tensor_map(t.k, p.dtype, 1, std::max(total_k, 1), p.kv_heads, D, kv_tile<D>());
    const CUtensorMap v_map = kit::heads_tensor_map(t.v, p.dtype, 1, std::max(total_k, 1), p.kv_heads, D, kv_tile<D>());
    // The work tiles are counted in an int, as step 24's grid counted its blocks in three dimensions: q_heads x
    // tile_start(batch), from the host's copy of the offsets' last entry.
    const std::int64_t tile_rows = p.varlen() ? p.batch + p.total_q() / Br : std::int64_t(p.batch) * kit::ceil_div(p.q_len, Br);
    const std::int64_t tiles = tile_rows * p.q_heads;
    if (tiles > std::numeric_limits<int>::max() || p.total_q() > std::numeric_limits<int>::max() ||
        p.total_k() > std::numeric_limits<int>::max())
      throw InvalidProblem("step 60: " + std::to_string(tiles) + " work tiles, " + std::to_string(p.total_q()) +
                           " rows of Q and " + std::to_string(p.total_k()) + " of K; at most 2^31-1 of each are "
                           "supported");
    const Scheduler sched{int(tiles), p.batch, p.q_heads, p.q_len, p.kv_len, total_q, p.varlen() ? t.cu_seqlens_q : nullptr,
                          p.varlen() ? t.cu_seqlens_k : nullptr, static_cast<int*>(t.workspace)};
    const dim3 grid(unsigned(std::min<std::int64_t>(tiles, kit::device_multiprocessors())));
    const float scale_log2 = p.softmax_scale() * kLog2e;  // exp(scale x) = 2^(scale log2(e) x)
    // max(c x) = c max(x) only for c > 0: a zero or negative scale scales first; a capped score is scaled and
    // capped before its max.
    const float cap = p.softcap;
    const auto kernel = cap > 0.f ? persistent_grid_kernel<T, D, false, true>
                        : scale_log2 > 0.f ? persistent_grid_kernel<T, D, true, false>
                                           : persistent_grid_kernel<T, D, false, false>;
    kit::launch(kernel, grid, kThreads, shared_bytes<D>(), stream, q_map, k_map, v_map, kit::heads<T, D>(p, t),
                scale_log2, sched, p.window_left, p.window_right, cap * kLog2e,
                cap > 0.f ? p.softmax_scale() / cap : 0.f, p.sinks ? t.sinks : nullptr,
                p.causal_align == CausalAlign::bottom_right);
  });
}

}  // namespace

/// Step 60 as the registry lists it, with the workspace its tile scheduler counts in.
Launcher launcher() {
  return kit::launcher<Support>(&launch, [](const AttentionProblem&) { return std::size_t(kSchedulerBytes); });
}

}  // namespace fa::step60
