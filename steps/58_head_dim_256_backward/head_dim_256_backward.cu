// Step 58: the backward at head_dim 256. A warpgroup's dV and dK over 64 keys and 256 columns are 2 x 128 floats a
// thread, more than the 240 registers it has: at d = 256 the two consumer warpgroups own the same 64 keys (Bc = 64)
// and split the work by role. Warpgroup 0 computes S^T, P^T and dV (P^T from its registers, as before), hands P^T to
// warpgroup 1 through shared memory, and warpgroup 1 computes dP^T, dS^T and dK: 128 accumulator floats each, the
// same wgmmas a tile on each side. dQ's buffers (64 KiB each at d = 256) give way to P^T's 16 KiB; the tile's dQ
// (64 x 256 floats, 64 KiB) goes instead into the stage whose Q_i and dO_i both warpgroups have finished with, and
// the dQ warp adds it to the float dQ with the copy engine's bulk reductions (step 39's), then frees the stage for
// the load warp. Adding dQ by atomics from the registers, as FlashAttention-3 does at d = 256, held each consumer's
// accumulators until its reductions had read them: 9.10 ms against 6.73 on the H200 (B = 4, N = 4096, H = 16,
// bf16). d = 64 and 128 compile to step 56's kernels; the rest is step 56's.
#include "09_tensor_cores/mma.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "20_wgmma/wgmma.cuh"
#include "21_tma_pipeline/tma.cuh"
#include "22_warp_specialization/roles.cuh"
#include "23_pingpong/named_barrier.cuh"
#include "27_flash_backward/float_dq.cuh"
#include "36_coalesced_side_kernels/side_kernels.cuh"
#include "38_wgmma_backward/wgmma_mn.cuh"
#include "39_dq_by_copy_engine/bulk_reduce.cuh"
#include "50_softcap/tanh_exp2.cuh"
#include "57_head_dim_256/wgmma_wide.cuh"
#include "fa/kit.cuh"
#include "fa/tma.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace fa::step58 {
namespace {

using namespace hopper;
using namespace tc;

/// What this step accepts: wgmma takes 16-bit inputs; it is an sm_90a instruction, so the step is built for
/// sm_90a and runs on sm_90 (H100, H200) only; the copy engine reads 16-byte-aligned tensors.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128, 256>> {
  static constexpr int min_arch = 90;            ///< wgmma.mma_async: sm_90a
  static constexpr bool arch_specific = true;    ///< sm_90a code runs on sm_90 alone
  static constexpr int pointer_alignment = 16;   ///< tensor maps need 16-byte-aligned base addresses
  static constexpr Pass pass = Pass::backward;   ///< dQ, dK, dV from Q, K, V, O, LSE and dO
  static constexpr bool needs_workspace = true;  ///< D and dQ in float; the float dQ starts zero and is left zero
  /// A sliding window (FlashAttention's window_size), soft-capping (its softcap), sinks (gpt-oss's) and packed
  /// variable lengths (its cu_seqlens).
  static constexpr Features features{.window = true, .softcap = true, .sinks = true, .varlen = true};
};

/// Consumer warpgroups per block: consumer w owns keys 64w .. 64w + 63 of the block's K/V tile. Warpgroup 0 of the
/// block is the producer; consumer w is warpgroup w + 1.
constexpr int kWarpGroups = 2;                                 ///< consumer warpgroups per block
constexpr int kGroupThreads = 4 * kWarpSize;                   ///< 128 threads, 4 warps, in a warpgroup
constexpr int kConsumerThreads = kWarpGroups * kGroupThreads;  ///< 256: the empty barriers count them
constexpr int kThreads = kConsumerThreads + kGroupThreads;     ///< 384 threads: + the producer warpgroup
constexpr int kGroupKeys = 64;                         ///< keys per warpgroup: the M of S^T, dP^T, dV and dK
/// Whether the warpgroups split a tile's work by role (d = 256): both own the block's 64 keys; warpgroup 0 computes
/// S^T, P^T and dV, warpgroup 1 dP^T, dS^T and dK, so each holds one 64 x 256 accumulator (128 floats a thread).
template <int D> constexpr bool kWide = D == 256;
/// Keys per block: 128, two warpgroups of 64; 64 at d = 256, where both warpgroups work on the same keys.
template <int D> constexpr int kBc = kWide<D> ? kGroupKeys : kWarpGroups * kGroupKeys;
template <int D> constexpr int kBr = D == 64 ? 128 : 64;  ///< query rows per Q tile: 128 at d = 64, as before
constexpr int kStages = 2;                             ///< Q_i and dO_i: the tile in use and the next one

/// The producer's warps: warp 0 loads, warp 1 hands dQ to the copy engine; warps 2 and 3 have nothing to do.
constexpr int kLoadWarp = 0;
constexpr int kDqWarp = 1;  ///< the producer's warp that issues dQ's reductions

/// Registers per thread after the split, as in step 22: 384 threads launched one block per SM start with 168 each
/// (65536 / 384, rounded down to 8), and 128 x 24 + 256 x 240 = 64512 uses every one of them.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;  ///< registers per consumer thread, after setmaxnreg.inc
static_assert(kGroupThreads * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                  kThreads * launch_registers<kThreads>(),
              "setmaxnreg moves registers within the block's pool, which must hold both roles' registers");

/// Columns per chunk: 64 16-bit elements are 128 bytes, one row of the 128-byte swizzle. A tile of width D is
/// stored as D / 64 chunks [rows][64], one after the other, each a copy-engine box (as in step 21).
constexpr int kChunk = 64;
constexpr int kChunkRowBytes = 128;  ///< bytes of one row of a chunk

/// dQ_i's buffers in shared memory: the tile in the copy engine's hands and the one being written.
constexpr int kDqBuffers = 2;
/// A dQ piece is copied in boxes of 32 floats (128 bytes, the 128-byte swizzle's row) by 64 rows: 8 KiB each.
constexpr int kDqBoxColumns = 32;
constexpr int kDqBoxBytes = 64 * kDqBoxColumns * 4;  ///< bytes of one box: 64 rows x 32 floats

/// dS^T's buffers: two where shared memory has room for them (d = 128; at d = 64 a second one would need 40 bytes
/// more than the SM's 227 KiB), so that tile i + 1 writes dS^T while the other warpgroup may still read tile i's.
/// With one, the consumers meet a second time a tile, before dS^T is written again.
template <int D> constexpr int kDsBuffers = D == 128 ? 2 : 1;

/// Whether dV_w += P^T dO_i is issued as soon as P^T is packed, to run while dS^T is computed: at d = 128. At d = 64
/// P^T's A registers would stay live beside S^T and dP^T (64 floats each there), more than 240 registers hold.
template <int D> constexpr bool kEarlyDv = D == 128;

/// Whether the LSE of the tile's rows is loaded before the wait for S^T: at d = 128 (16 registers). At d = 64 the
/// 128-row tile's LSE would take 32 registers beside S^T and dP^T, and the consumers would spill.
template <int D> constexpr bool kLseAhead = D == 128;

/// Named barriers (0 is __syncthreads'): the consumers' meeting at dS^T, the one before dS^T is written again (one
/// buffer), and per dQ buffer b "full" (the consumers have written it) and "empty" (the copy engine has read it),
/// both counting the consumers and the dQ warp. Each thread counts once a phase: by bar.sync where it waits, by
/// bar.arrive where it only signals.
constexpr int kDsReadyBarrier = 1;
constexpr int kDsFreeBarrier = 2;     ///< the consumers have read dS^T: it may be written again (one buffer)
constexpr int kDqFullBarrier = 3;     ///< + b: dQ buffer b holds the tile's pieces
constexpr int kDqEmptyBarrier = 5;    ///< + b: the copy engine has read dQ buffer b
constexpr int kDqHandOver = kConsumerThreads + kWarpSize;  ///< threads that meet at dQ's barriers: 288
/// At d = 256 (no dQ buffers, so no dQ barriers): warpgroup 0 has written P^T for warpgroup 1 ("ready"), and
/// warpgroup 1 has read it ("free"); warpgroup 0 arrives at the first and waits at the second, warpgroup 1 the reverse.
constexpr int kPReadyBarrier = 7;
constexpr int kPFreeBarrier = 8;  ///< warpgroup 1 has read P^T: warpgroup 0 may write the next
/// At d = 256: both warpgroups' wgmmas of a stage have finished, so Q_i and dO_i are dead and the stage may hold the
/// tile's dQ.
constexpr int kStageDeadBarrier = 9;

/// Bytes after dS^T: the dQ buffers, or at d = 256 P^T in floats, warpgroup 0's hand-over to warpgroup 1 (two dQ
/// buffers of 64 x 256 floats would be 128 KiB there; the tile's dQ goes into its dead stage instead).
template <int D>
constexpr int kAfterDsBytes = kWide<D> ? 4 * kBc<D> * kBr<D> : kDqBuffers * 4 * kBr<D> * D;

/// Shared memory: K_j, V_j (Bc x D), kStages x (Q_i, dO_i) (Br x D), kDsBuffers x dS^T (Bc x Br), all 16-bit and
/// swizzled; kDqBuffers x dQ_i (Br x D floats, swizzled), or at d = 256 P^T (Bc x Br floats); kStages x (LSE, D)
/// (Br floats each); 1 + 2 kStages mbarriers; 1024 bytes to align the start to a swizzle atom.
template <int D>
constexpr int shared_bytes() {
  constexpr int Bc = kBc<D>;
  return 2 * (2 * Bc * D + kStages * 2 * kBr<D> * D + kDsBuffers<D> * Bc * kBr<D>) + kAfterDsBytes<D> +
         kStages * 2 * kBr<D> * 4 + 8 * (1 + 2 * kStages) + 1024;
}
static_assert(shared_bytes<256>() <= 232448, "d = 256's block fits the SM's 227 KiB");

/// The two 16-bit values pack2<T> packed, as floats (lo in x).
template <class T>
__device__ __forceinline__ float2 unpack2(std::uint32_t packed) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
}

/// D_i = dO_i . O_i, as step 36's row_dot_wide_kernel computes it (kRowLanes<D> lanes a row), and the sinks'
/// gradient: row i's term -e^(sink_h - LSE_i) D_i (0 for a row with neither key nor sink, LSE = -inf), summed over
/// the warp's rows (2 at d = 128, 4 at d = 64) and added to dsinks[h] once a warp. Rows are in LSE's order (b, h, i),
/// so a warp's rows are of one head but where a head's rows end inside it: there each row adds its own term.
template <class T, int D>
__global__ void row_dot_sinks_kernel(kit::Grads<T, D> s, float* __restrict__ D_rows, std::int64_t rows,
                                     const float* __restrict__ sinks, float* __restrict__ dsinks) {
  constexpr int kLanes = bwd::kRowLanes<D>;
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t row = idx / kLanes;  // (b, h, i), LSE's layout
  const int chunk = int(idx % kLanes);     // elements 8 chunk .. 8 chunk + 7 of the row
  const float dot = bwd::row_dot_wide(s, row, chunk, rows);
  if (row < rows && chunk == 0) D_rows[row] = dot;

  // The row's term of dsinks, on its first lane; h = -1 past the last row.
  const int h = row < rows ? int((row / s.q_len) % s.q_heads) : -1;
  float term = 0.f;
  if (row < rows && chunk == 0) {
    const float lse = s.LSE[row];
    term = lse == -INFINITY ? 0.f : -expf(sinks[h] - lse) * dot;
  }
  // Every row of the warp of lane 0's head (or past the last): the warp's sum, added by lane 0.
  const int h0 = __shfl_sync(0xffffffffu, h, 0);
  if (__all_sync(0xffffffffu, h == h0 || h < 0)) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) term += __shfl_xor_sync(0xffffffffu, term, offset);
    if (threadIdx.x % kWarpSize == 0 && h0 >= 0) atomicAdd(dsinks + h0, term);
  } else if (row < rows && chunk == 0) {
    atomicAdd(dsinks + h, term);
  }
}

/// The K/V tile a block owns: its sequence's first row of Q and of K in the pack, its query rows and keys, and the
/// tile's first key j0 in the sequence.
struct KVTile {
  int b;        ///< sequence
  int j0;       ///< the tile's first key: keys j0 .. j0 + Bc - 1 of the sequence (none when j0 >= kv_len)
  int q_start;  ///< the sequence's first row of Q (dO, dQ; of LSE and D in each head) in the pack
  int k_start;  ///< its first row of K (V, dK, dV)
  int q_len;    ///< its query rows
  int kv_len;   ///< its keys
};

/// The pack's K/V tiles. Sequence b owns virtual tiles tile_start(b) .. tile_start(b + 1) - 1, tile_start(b) = b +
/// cu_k[b] / Bc: at least its ceil(kv_len_b / Bc) tiles and at most one more, empty, so the grid, batch + total_k /
/// Bc tiles, needs no pass over the lengths. Block x's sequence is the last b with tile_start(b) <= x.
template <int Bc>
struct Pack {
  int batch;        ///< sequences
  const int* cu_q;  ///< the pack's offsets of query rows, [batch + 1]
  const int* cu_k;  ///< the pack's offsets of keys, [batch + 1]

  /// Sequence b's first virtual tile: b + cu_k[b] / Bc.
  __device__ int tile_start(int b) const { return b + cu_k[b] / Bc; }
  /// Virtual tile x's sequence (a binary search over tile_start) and place in it.
  __device__ KVTile tile(int x) const {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_start(mid) <= x) lo = mid;
      else hi = mid - 1;
    }
    const int q_start = cu_q[lo], k_start = cu_k[lo];
    return {lo, (x - tile_start(lo)) * Bc, q_start, k_start, cu_q[lo + 1] - q_start, cu_k[lo + 1] - k_start};
  }
};

/// Block (key tile, kv_h, b): a producer warpgroup and two consumers; consumer w owns keys j0 + 64w .. + 63 of S^T,
/// dP^T, dV and dK, warp v of it keys 16v .. 16v + 15 of those. Of dQ_i (Br x D) consumer w computes one 64 x 64
/// piece: columns 64w .. at d = 128 (Br = 64), rows 64w .. at d = 64 (Br = 128). kSoftcap: each score capped to
/// softcap tanh(scale q.k / softcap), in log2 units, and its slope in dS^T. kVarlen: block (virtual tile, kv_h, 0)
/// of the pack, whose tensors the maps and s see as one sequence of all their rows (batch 1).
template <class T, int D, bool kSoftcap, bool kVarlen>
__global__ void __launch_bounds__(kThreads, 1)
warp_specialized_backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                      const __grid_constant__ CUtensorMap dq_map, kit::Grads<T, D> s, const float* __restrict__ D_rows,
                      float scale_log2, int window_left, int window_right, float cap_log2, float scale_over_cap,
                      Pack<kBc<D>> pack) {
  constexpr int Br = kBr<D>;
  constexpr int Bc = kBc<D>;
  constexpr int kDSteps = D / 16;     // k-steps of S^T and dP^T (over the head dimension)
  constexpr int kRowTiles = Br / 8;   // n8 tiles of S^T and dP^T (query rows)
  constexpr int kRowSteps = Br / 16;  // k-steps of dV and dK (over query rows)
  constexpr int kKVTiles = D / 8;     // n8 tiles of dV and dK (columns)
  constexpr int kKeySteps = Bc / 16;  // k-steps of dQ (over keys)
  constexpr int kChunks = D / kChunk;
  constexpr std::uint32_t kKVBytes = 2 * Bc * D;     // K_j or V_j
  constexpr std::uint32_t kQBytes = 2 * Br * D;      // Q_i or dO_i
  constexpr std::uint32_t kStageBytes = 2 * kQBytes;  // one stage: Q_i, then dO_i
  static_assert(kWide<D> || Br * D == 64 * 128, "one 64 x 64 piece of dQ_i per warpgroup");

  // Every tile starts on a 1024-byte boundary (a swizzle atom), so the descriptors' base offset is 0.
  extern __shared__ __align__(1024) unsigned char shared[];
  unsigned char* const smem = shared + ((1024 - (smem_address(shared) & 1023)) & 1023);
  const std::uint32_t K_tile = smem_address(smem);         // kChunks x [Bc][64] swizzled
  const std::uint32_t V_tile = K_tile + kKVBytes;          // kChunks x [Bc][64] swizzled
  const std::uint32_t Q_tile = V_tile + kKVBytes;          // kChunks x [Br][64], stage s at + s kStageBytes
  const std::uint32_t dO_tile = Q_tile + kQBytes;          // kChunks x [Br][64], stage 0
  const std::uint32_t dS_tile = Q_tile + kStages * kStageBytes;  // buffer b at + b 2 Bc Br: Br / 64 x [Bc][64]
  const std::uint32_t dQ_tile = dS_tile + kDsBuffers<D> * 2 * Bc * Br;  // buffer b at + b Br D 4: pieces, boxes
  float* const lse_s = reinterpret_cast<float*>(smem + (dQ_tile + kAfterDsBytes<D> - K_tile));  // [kStages][Br]
  float* const d_s = lse_s + kStages * Br;                                                   // [kStages][Br]
  const std::uint32_t KV_full = smem_address(d_s + kStages * Br);  // K_j and V_j have landed
  const std::uint32_t QdO_full = KV_full + 8;                      // stage s: + 8 s, Q_i, dO_i, LSE, D are in
  const std::uint32_t Empty = QdO_full + 8 * kStages;              // stage s: + 8 s, the consumers are done with it

  const int tid = threadIdx.x;
  // The warpgroup, read from lane 0 through a shuffle: the same value, but now the compiler knows it is the same in
  // every lane of the warp, so what is computed from it (the descriptors below) is kept in uniform registers, once
  // a warp, instead of in each thread's and moved (R2UR) to uniform ones at every wgmma. CUTLASS's
  // canonical_warp_group_idx() does the same.
  const int wg = __shfl_sync(0xffffffff, tid / kGroupThreads - 1, 0);  // consumer warpgroup 0 or 1; -1: producer
  const int warp = (tid % kGroupThreads) / kWarpSize;  // warp within the warpgroup
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's keys are g and g + 8 of its warp's 16
  const int t = lane & 3;   // threadID_in_group: its query rows are 2t, 2t+1 of every n8 tile
  // The block's keys: tile blockIdx.x of sequence blockIdx.z, or in a pack virtual tile blockIdx.x of the sequence
  // that holds it; b is then the tensors' one sequence, 0, and the sequence sits at q_start and k_start in it.
  const KVTile kv =
      kVarlen ? pack.tile(blockIdx.x) : KVTile{int(blockIdx.z), int(blockIdx.x) * Bc, 0, 0, s.q_len, s.kv_len};
  const int j0 = kv.j0, kv_h = blockIdx.y, b = kVarlen ? 0 : kv.b;
  const int q_start = kv.q_start, k_start = kv.k_start, q_len = kv.q_len, kv_len = kv.kv_len;
  if (kVarlen && j0 >= kv_len) return;  // a sequence's empty virtual tile: it owns no key, and writes nothing
  const int group = s.q_heads / s.kv_heads;

  // The query rows [first, last) that see key j: the mask, the window and kv_len, the inverse of the reference's
  // rule (rows_range_in: row i is among them exactly when keys_range_in of row i holds j).
  auto rows_of = [&](int j) {
    return rows_range_in(kv_len, q_len, j, s.causal, false, window_left, window_right);
  };
  // The keys [first, last) query row i sees: the reference's rule itself.
  auto keys_of = [&](int i) {
    return keys_range_in(kv_len, q_len, i, s.causal, false, window_left, window_right);
  };
  // The rows that see some key of this block: from the first that sees its first key to the last that sees its
  // last (both ends grow with the key), rows_begin .. rows_end - 1, in Q tiles from the one holding rows_begin.
  const int rows_begin = rows_of(j0).first, rows_end = rows_of(min(j0 + Bc, kv_len) - 1).last;
  const int first_row = rows_begin / Br * Br;
  // The Q tiles this block visits, head by head of the group: per_head tiles of rows first_row, first_row + Br, ..
  // in each head, walked below.
  const int per_head = rows_begin < rows_end ? (rows_end - first_row + Br - 1) / Br : 0;
  const int tiles = group * per_head;
  // Without the mask, the sequence's K/V tile x starts at tile x of that walk (mod tiles): its head and first row.
  const int start = s.causal || tiles == 0 ? 0 : (j0 / Bc) % tiles;
  int h = kv_h * group, i0 = first_row;  // tile it's head and first row
  if (start > 0) h += start / per_head, i0 += start % per_head * Br;  // (start > 0: per_head > 0)
  // The walk's next tile: the next rows of this head, or the next head's first rows.
  auto next_tile = [&] {
    i0 += Br;
    if (i0 >= rows_end) {
      i0 = first_row;
      if (++h == (kv_h + 1) * group) h = kv_h * group;  // past the group's last head: back to its first
    }
  };

  // One thread sets up the barriers: K/V's full barrier expects one arrival (its own expect_tx), a stage's full
  // barrier 33: lane 0's expect_tx, then each of the load warp's 32 lanes once its LSE and D rows are written; an
  // empty barrier one from every consumer thread. This is the block's last __syncthreads.
  if (tid == 0) {
    prefetch_tensor_map(&q_map);
    prefetch_tensor_map(&k_map);
    prefetch_tensor_map(&v_map);
    prefetch_tensor_map(&do_map);
    prefetch_tensor_map(&dq_map);
    mbarrier_init(KV_full, 1);
    for (int st = 0; st < kStages; ++st) mbarrier_init(QdO_full + 8 * st, 1 + kWarpSize);
    // (At d = 256 one arrival more: a stage is free once every consumer thread has read its LSE and D and the dQ
    // warp's lane 0 has seen the copy engine read the tile's dQ from it.)
    for (int st = 0; st < kStages; ++st) mbarrier_init(Empty + 8 * st, kConsumerThreads + (kWide<D> ? 1 : 0));
    fence_mbarrier_init();
  }
  __syncthreads();

  // The producer gives its registers back. Its load warp starts K_j and V_j on their way (keys past kv_len arrive
  // as zeros, or in a pack as the next sequence's, and are masked below), then fills the stages: tile it >= kStages
  // reuses the stage tile it - kStages left, and waits for that stage's empty phase number it / kStages - 1.
  if (wg < 0) {
    setmaxnreg_dec<kProducerRegisters>();
    if (warp == kLoadWarp) {
      if (lane == 0) {
        mbarrier_arrive_expect_tx(KV_full, 2 * kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          tma_load_4d(K_tile + c * Bc * kChunkRowBytes, &k_map, KV_full, c * kChunk, kv_h, k_start + j0, b);
          tma_load_4d(V_tile + c * Bc * kChunkRowBytes, &v_map, KV_full, c * kChunk, kv_h, k_start + j0, b);
        }
      }
      for (int it = 0; it < tiles; ++it, next_tile()) {
        const int stage = it % kStages;
        if (it >= kStages) mbarrier_wait(Empty + 8 * stage, (it / kStages - 1) & 1);
        // Q_i and dO_i first, their copies the longest: lane 0's arrival expects their bytes, then one copy per
        // chunk. Rows past q_len arrive as zeros, or in a pack as the next sequence's rows.
        if (lane == 0) {
          mbarrier_arrive_expect_tx(QdO_full + 8 * stage, kStageBytes);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            tma_load_4d(Q_tile + stage * kStageBytes + c * Br * kChunkRowBytes, &q_map, QdO_full + 8 * stage,
                        c * kChunk, h, q_start + i0, b);
            tma_load_4d(dO_tile + stage * kStageBytes + c * Br * kChunkRowBytes, &do_map, QdO_full + 8 * stage,
                        c * kChunk, h, q_start + i0, b);
          }
        }
        // The LSE (in log2 units, so P = 2^(S scale_log2 - LSE log2 e)) and D of the tile's rows, a row per lane
        // and step; then every lane arrives. Rows past q_len get LSE = +inf and D = 0: P = 2^(S - inf) = 0 whatever
        // their Q and dO rows hold (in a pack, the next sequence's), so they add nothing to dV, dK, and dQ's rows of
        // the tile past q_len are zeros.
        const float* lse_rows = s.lse_head(b, h) + q_start;  // the sequence's row 0 of head h
#pragma unroll
        for (int r = lane; r < Br; r += kWarpSize) {
          const int row = i0 + r;
          lse_s[stage * Br + r] = row < q_len ? lse_rows[row] * kLog2e : INFINITY;
          d_s[stage * Br + r] = row < q_len ? D_rows[lse_rows - s.LSE + row] : 0.f;  // D has LSE's layout
        }
        mbarrier_arrive(QdO_full + 8 * stage);
      }
    } else if (warp == kDqWarp && kWide<D>) {
      // At d = 256 the tile's dQ is in stage it % kStages, warpgroup w's 64 x 128 piece as four boxes of 32 columns
      // from box 4w on; once the copy engine has read them, the stage is free for tile it + kStages.
      for (int it = 0; it < tiles; ++it, next_tile()) {
        const int stage = it % kStages;
        if (stage == 0) named_barrier_sync<kDqFullBarrier, kDqHandOver>();
        else named_barrier_sync<kDqFullBarrier + 1, kDqHandOver>();
        if (lane == 0) {
          const std::uint32_t buffer = Q_tile + stage * kStageBytes;
#pragma unroll
          for (int box = 0; box < 2 * 4; ++box)
            bulk_reduce_add_4d(&dq_map, buffer + box * kDqBoxBytes, box * kDqBoxColumns, h, q_start + i0, b);
          bulk_commit();
          bulk_wait_read<0>();
          mbarrier_arrive(Empty + 8 * stage);
        }
        __syncwarp();
      }
      if (lane == 0) bulk_wait<0>();  // every reduction has landed before the block's shared memory goes away
    } else if (warp == kDqWarp && !kWide<D>) {
      // The dQ warp: when the consumers have filled buffer it % kDqBuffers, lane 0 gives it to the copy engine, per
      // consumer piece two boxes, each added to the float dQ at (column, head, row, batch); rows past q_len are
      // clipped, or in a pack add their zeros to the next sequence's rows. Once the copy engine has read it, the
      // consumers may write it again (tile it + kDqBuffers).
      for (int it = 0; it < tiles; ++it, next_tile()) {
        const int buf = it % kDqBuffers;
        if (buf == 0) named_barrier_sync<kDqFullBarrier, kDqHandOver>();
        else named_barrier_sync<kDqFullBarrier + 1, kDqHandOver>();
        if (lane == 0) {
          const std::uint32_t buffer = dQ_tile + buf * 4 * Br * D;
#pragma unroll
          for (int w = 0; w < kWarpGroups; ++w) {
            const int rc = D == 64 ? w : 0, dc = D == 64 ? 0 : w;
#pragma unroll
            for (int box = 0; box < 2; ++box) {
              bulk_reduce_add_4d(&dq_map, buffer + (2 * w + box) * kDqBoxBytes, dc * 64 + box * kDqBoxColumns, h,
                                 q_start + i0 + rc * 64, b);
            }
          }
          bulk_commit();
          bulk_wait_read<0>();
        }
        __syncwarp();
        if (it + kDqBuffers < tiles) {
          if (buf == 0) named_barrier_arrive<kDqEmptyBarrier, kDqHandOver>();
          else named_barrier_arrive<kDqEmptyBarrier + 1, kDqHandOver>();
        }
      }
      if (lane == 0) bulk_wait<0>();  // every reduction has landed before the block's shared memory goes away
    }
    return;
  }
  // The consumers take the registers the producer gave back.
  setmaxnreg_inc<kConsumerRegisters>();

  const int kw = kWide<D> ? 0 : wg;  // the warpgroup's 64 keys of the tile: 64 wg .., at d = 256 both the first 64
  const int key0 = j0 + kw * kGroupKeys + warp * 16 + g;  // this lane's keys: key0 and key0 + 8
  const RowRange key_rows[2] = {rows_of(key0), rows_of(key0 + 8)};  // the rows [first, last) that see each
  const int kv_stride = s.kv_stride();
  // This warpgroup's piece of dQ_i: rows 64 dq_rc .., columns 64 dq_dc ..
  const int dq_rc = D == 64 ? wg : 0, dq_dc = D == 64 ? 0 : D / 128 * wg;  // at d = 256 columns 128 wg .. + 127

  // Descriptors. K-major, for S^T and dP^T (A: this warpgroup's 64 keys of K_j or V_j; B: Q_i or dO_i, N = Br
  // rows): k-step k reads 16 columns, 32 bytes into chunk k / 4; 8-row groups are 1024 bytes apart.
  // Each is built once (a base) and advanced by a constant a k-step: the start address is the descriptor's low 14
  // bits in 16-byte units, and an address in shared memory never carries out of them.
  auto advance = [](std::uint64_t desc, std::uint32_t bytes) { return desc + (bytes >> 4); };
  const std::uint64_t K_desc = smem_descriptor(K_tile + kw * kGroupKeys * kChunkRowBytes, 0, 8 * kChunkRowBytes);
  const std::uint64_t V_desc = smem_descriptor(V_tile + kw * kGroupKeys * kChunkRowBytes, 0, 8 * kChunkRowBytes);
  auto kv_desc = [&](std::uint64_t base, int k) { return advance(base, (k / 4) * Bc * kChunkRowBytes + (k % 4) * 32); };
  auto q_desc = [&](std::uint32_t tile, int k) {
    return advance(smem_descriptor(tile, 0, 8 * kChunkRowBytes), (k / 4) * Br * kChunkRowBytes + (k % 4) * 32);
  };
  // MN-major, as V was for O = P V: B of dV and dK (dO_i, Q_i: [query row][d]), k-step k is rows 16k .., 2048
  // bytes in, the next 64 columns a chunk (Br rows) further; A and B of dQ (dS^T: [key][query row], K_j:
  // [key][d]), k-step k is keys 16k .., the piece's 64 rows or columns chunk dq_rc or dq_dc (Bc rows each).
  auto q_mn_desc = [&](std::uint32_t tile, int k) {
    return advance(smem_descriptor(tile, Br * kChunkRowBytes, 8 * kChunkRowBytes), k * 16 * kChunkRowBytes);
  };
  auto ds_desc = [&](std::uint32_t dS, int k) {
    return advance(smem_descriptor(dS + dq_rc * Bc * kChunkRowBytes, Bc * kChunkRowBytes, 8 * kChunkRowBytes),
                   k * 16 * kChunkRowBytes);
  };
  const std::uint64_t K_mn_desc =
      smem_descriptor(K_tile + dq_dc * Bc * kChunkRowBytes, Bc * kChunkRowBytes, 8 * kChunkRowBytes);
  auto k_mn_desc = [&](int k) { return advance(K_mn_desc, k * 16 * kChunkRowBytes); };

  // d = 256, the roles split: warpgroup 0 computes S^T = K_j Q_i^T and P^T (the mask, the cap), hands P^T (with the
  // cap, P^T times its slope) to warpgroup 1 through shared memory, and adds P^T dO_i to dV (A from its registers);
  // warpgroup 1 computes dP^T = V_j dO_i^T, dS^T = P^T (dP^T - D) into shared memory as before, and adds dS^T Q_i to
  // dK. Each then computes its 64 x 128 piece of dQ_i = dS K_j (columns 128 wg ..) and stores it, times the scale,
  // into the stage both have finished with, for the dQ warp's reductions. One accumulator a warpgroup, dKV.
  if constexpr (kWide<D>) {
    float4* const P_s = reinterpret_cast<float4*>(smem + (dQ_tile - K_tile));  // [kRowTiles][128 threads]
    const int place = tid % kGroupThreads;  // this thread's place in its warpgroup: its column of P_s
    float dKV[kKVTiles][4] = {};  // warpgroup 0: dV, 1: dK, of the lane's keys key0, key0 + 8, columns 8n + 2t, + 1
    mbarrier_wait(KV_full, 0);  // also where no Q tile reaches the block (causal): its copies land before it exits
    for (int it = 0; it < tiles; ++it, next_tile()) {
      const int stage = it % kStages;
      const std::uint32_t Q_i = Q_tile + stage * kStageBytes, dO_i = dO_tile + stage * kStageBytes;
      const float* lse = lse_s + stage * Br;
      const float* dd = d_s + stage * Br;
      mbarrier_wait(QdO_full + 8 * stage, (it / kStages) & 1);

      // S^T (warpgroup 0) or dP^T (warpgroup 1): kDSteps wgmmas over the 256 columns, element [n][e] of key key0 + 8
      // (e >= 2), query row i0 + 8n + 2t + (e & 1), as in step 56.
      float SdP[kRowTiles][4];
      std::uint32_t frag[kRowSteps][4];  // P^T (warpgroup 0) or dS^T (warpgroup 1) packed: the A registers of dV, dK
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kDSteps; ++k)
        wgmma_ss<T>(SdP, kv_desc(wg == 0 ? K_desc : V_desc, k), q_desc(wg == 0 ? Q_i : dO_i, k), k > 0);
      wgmma_commit();
      if (wg == 0) {
        float2 lse2[kRowTiles];
#pragma unroll
        for (int n = 0; n < kRowTiles; ++n) lse2[n] = *reinterpret_cast<const float2*>(lse + 8 * n + 2 * t);
        wgmma_wait<0>();
        fence_registers(SdP);
        // Warpgroup 1 has read the last tile's P^T (it arrives before the last tile's dS^T barrier, which this
        // warpgroup has passed, so this never waits).
        if (it > 0) named_barrier_sync<kPFreeBarrier, kConsumerThreads>();
        // P^T as step 56's exponents compute it, the masked copy only where a row misses a key; each n8 tile's
        // hand-over (P^T, or P^T times the cap's slope) goes to shared memory as soon as it is known.
        auto exponents = [&](auto masked) {
#pragma unroll
          for (int n = 0; n < kRowTiles; ++n) {
            float hand[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float slope = 1.f;
              if constexpr (kSoftcap) {
                const float tanh_s = tanh_exp2(SdP[n][e] * scale_over_cap);
                slope = 1.f - tanh_s * tanh_s;
                SdP[n][e] = cap_log2 * tanh_s;
              }
              float p = fast_exp2(SdP[n][e] * (kSoftcap ? 1.f : scale_log2) - ((e & 1) ? lse2[n].y : lse2[n].x));
              if constexpr (decltype(masked)::value) {
                const int row = i0 + 8 * n + 2 * t + (e & 1);
                const RowRange& seen = key_rows[e >= 2 ? 1 : 0];
                if (row < seen.first || row >= seen.last) p = 0.f;
              }
              SdP[n][e] = p;
              hand[e] = p * slope;
            }
            P_s[n * kGroupThreads + place] = make_float4(hand[0], hand[1], hand[2], hand[3]);
          }
        };
        if (keys_of(i0).last < j0 + Bc || keys_of(min(i0 + Br, q_len) - 1).first > j0) exponents(std::true_type{});
        else exponents(std::false_type{});
        named_barrier_arrive<kPReadyBarrier, kConsumerThreads>();  // P^T is in shared memory
#pragma unroll
        for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            frag[k][2 * half] = pack2<T>(SdP[2 * k + half][0], SdP[2 * k + half][1]);
            frag[k][2 * half + 1] = pack2<T>(SdP[2 * k + half][2], SdP[2 * k + half][3]);
          }
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kRowSteps; ++k) wgmma_rs<T>(dKV, frag[k], q_mn_desc(dO_i, k));  // dV += P^T dO_i
        wgmma_commit();
        // This warpgroup's dQ wgmmas of the last tile have finished (waited for below): dS^T may be written again.
        if (it > 0) named_barrier_arrive<kDsFreeBarrier, kConsumerThreads>();
      } else {
        wgmma_wait<0>();
        fence_registers(SdP);  // dP^T has landed
        // dS^T = P^T (dP^T - D), P^T (with the cap, times its slope) from warpgroup 0, which may then write the next.
        named_barrier_sync<kPReadyBarrier, kConsumerThreads>();
#pragma unroll
        for (int n = 0; n < kRowTiles; ++n) {
          const float4 p = P_s[n * kGroupThreads + place];
          const float2 d2 = *reinterpret_cast<const float2*>(dd + 8 * n + 2 * t);
          SdP[n][0] = p.x * (SdP[n][0] - d2.x);
          SdP[n][1] = p.y * (SdP[n][1] - d2.y);
          SdP[n][2] = p.z * (SdP[n][2] - d2.x);
          SdP[n][3] = p.w * (SdP[n][3] - d2.y);
        }
        if (it + 1 < tiles) named_barrier_arrive<kPFreeBarrier, kConsumerThreads>();
#pragma unroll
        for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            frag[k][2 * half] = pack2<T>(SdP[2 * k + half][0], SdP[2 * k + half][1]);
            frag[k][2 * half + 1] = pack2<T>(SdP[2 * k + half][2], SdP[2 * k + half][3]);
          }
        }
        // Both warpgroups' dQ wgmmas of the last tile have read dS^T (one buffer).
        if (it > 0) named_barrier_sync<kDsFreeBarrier, kConsumerThreads>();
        // dS^T to shared memory as step 56 stores it: key row warp 16 + g (+ 8), query rows 8n + 2t, + 1.
#pragma unroll
        for (int n = 0; n < kRowTiles; ++n) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int key = warp * 16 + g + 8 * r;
            const std::uint32_t address = dS_tile + key * kChunkRowBytes + ((n ^ (key & 7)) << 4) + 4 * t;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(frag[n / 2][2 * (n % 2) + r]) : "memory");
          }
        }
        fence_proxy_async();  // the dS^T stores, before wgmma (the async proxy) reads them
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kRowSteps; ++k) wgmma_rs<T>(dKV, frag[k], q_mn_desc(Q_i, k));  // dK += dS^T Q_i
        wgmma_commit();
      }
      named_barrier_sync<kDsReadyBarrier, kConsumerThreads>();
      // dV or dK has landed before dQ's accumulators are live: the packed P^T or dS^T (its A) is then free. Every
      // wgmma reading this stage has finished: this thread is done with Q_i, dO_i, LSE and D (its arrival says so to
      // the load warp, which still waits for the dQ warp's), and once both warpgroups are, the stage takes the
      // tile's dQ.
      wgmma_wait<0>();
      fence_registers(dKV);
      mbarrier_arrive(Empty + 8 * stage);
      named_barrier_sync<kStageDeadBarrier, kConsumerThreads>();

      // This warpgroup's piece of dQ_i = dS K_j, columns 128 wg .. + 127, in two halves of 64 columns one after the
      // other (64 accumulator floats beside dKV's 128 serialize ptxas's wgmmas); each half, times the scale, goes to
      // the stage as four boxes of 64 rows x 32 floats (the piece's from box 4 wg on), each row 128 bytes with its
      // 16-byte piece c at c ^ (row % 8), as the copy engine reads it (the layout of step 56's dQ buffers). Rows
      // past q_len hold zeros (their P^T is 0): the copy engine clips them, or in a pack adds the zeros to the next
      // sequence's rows.
      const std::uint32_t piece = Q_tile + stage * kStageBytes + wg * 4 * kDqBoxBytes;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float dQ[8][4];
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kKeySteps; ++k)
          wgmma_ss_mn<T>(dQ, ds_desc(dS_tile, k), advance(k_mn_desc(k), c * Bc * kChunkRowBytes), k > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(dQ);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = warp * 16 + g + 8 * r, col = 64 * c + 8 * n + 2 * t;  // of the piece
            const std::uint32_t address = piece + (col / kDqBoxColumns) * kDqBoxBytes + row * 128 +
                                          ((((col % kDqBoxColumns) / 4) ^ (row & 7)) << 4) + (col % 4) * 4;
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(s.scale * dQ[n][2 * r]),
                         "f"(s.scale * dQ[n][2 * r + 1]) : "memory");
          }
        }
      }
      fence_proxy_async();  // the dQ stores, before the copy engine (the async proxy) reads them
      if (stage == 0) named_barrier_arrive<kDqFullBarrier, kDqHandOver>();
      else named_barrier_arrive<kDqFullBarrier + 1, kDqHandOver>();
    }

    // dV (warpgroup 0) or dK times the scale (warpgroup 1) of the lane's two keys.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + 8 * r;
      if (key >= kv_len) continue;  // past the sequence's keys: the next sequence's, written by its own blocks
      T* row = (wg == 0 ? s.dv_head(b, kv_h) : s.dk_head(b, kv_h)) + std::int64_t(k_start + key) * kv_stride;
      const float factor = wg == 0 ? 1.f : s.scale;
#pragma unroll
      for (int n = 0; n < kKVTiles; ++n)
        *reinterpret_cast<std::uint32_t*>(row + 8 * n + 2 * t) = pack2<T>(factor * dKV[n][2 * r], factor * dKV[n][2 * r + 1]);
    }
    return;
  }

  // dV and dK of this lane's keys key0, key0 + 8 (elements 0-1, 2-3), columns 8n + 2t, + 1.
  float dV[kKVTiles][4] = {}, dK[kKVTiles][4] = {};

  mbarrier_wait(KV_full, 0);  // also where no Q tile reaches the block (causal): its copies land before it exits
  for (int it = 0; it < tiles; ++it, next_tile()) {
    const int stage = it % kStages;
    const std::uint32_t Q_i = Q_tile + stage * kStageBytes, dO_i = dO_tile + stage * kStageBytes;
    const float* lse = lse_s + stage * Br;
    const float* dd = d_s + stage * Br;
    const std::uint32_t dS = dS_tile + (it % kDsBuffers<D>) * 2 * Bc * Br;
    mbarrier_wait(QdO_full + 8 * stage, (it / kStages) & 1);

    // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: two groups of kDSteps wgmmas, issued back to back. Element [n][e] is
    // key key0 + 8 (e >= 2), query row i0 + 8n + 2t + (e & 1).
    float S[kRowTiles][4], dP[kRowTiles][4];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) wgmma_ss<T>(S, kv_desc(K_desc, k), q_desc(Q_i, k), k > 0);
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) wgmma_ss<T>(dP, kv_desc(V_desc, k), q_desc(dO_i, k), k > 0);
    wgmma_commit();
    // The rows' LSE into registers while the tensor cores work (d = 128), so that the exponents do not wait for the
    // loads.
    auto lse_pair = [&](int n) { return *reinterpret_cast<const float2*>(lse + 8 * n + 2 * t); };
    float2 lse2[kRowTiles];
    if constexpr (kLseAhead<D>) {
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) lse2[n] = lse_pair(n);
    }
    wgmma_wait<1>();  // S^T has landed; dP^T is still on its way
    fence_registers(S);

    // P^T = 2^(S^T scale_log2 - LSE), 0 for the rows outside the [first, last) of rows that see the key: the
    // window's, the causal mask's, and none past kv_len (a zero key there would score 0, and exp(0 - LSE) can
    // overflow; so can a row that sees no key, LSE = -inf). The query rows are columns now: their LSE is read per
    // pair.
    // With the cap, each score is capped first, as step 50 caps it, in log2 units: t = softcap log2(e) tanh(scale
    // S^T / softcap), and P^T = 2^(t - LSE). The cap's slope, 1 - tanh^2, belongs to dS^T: as soon as P^T's tile n
    // is known it is packed to 16 bits for dV (below, without the cap, all at once after the loop), and P^T times
    // the slope beside it, in the registers dS^T will take: the float S^T is then free, and no register more is
    // live than without the cap.
    // The mask's test is compiled into one copy of the loop and left out of the other: a tile that needs no mask
    // (most of them) branches once, not once a score.
    std::uint32_t p_frag[kRowSteps][4], ds_frag[kRowSteps][4];
    auto exponents = [&](auto masked) {
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        const float2 lse_n = kLseAhead<D> ? lse2[n] : lse_pair(n);
        [[maybe_unused]] float slope[4];  // with the cap: 1 - tanh^2 of each score
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kSoftcap) {
            const float tanh_s = tanh_exp2(S[n][e] * scale_over_cap);
            slope[e] = 1.f - tanh_s * tanh_s;
            S[n][e] = cap_log2 * tanh_s;
          }
          float p = fast_exp2(S[n][e] * (kSoftcap ? 1.f : scale_log2) - ((e & 1) ? lse_n.y : lse_n.x));
          if constexpr (decltype(masked)::value) {
            const int row = i0 + 8 * n + 2 * t + (e & 1);
            const RowRange& seen = key_rows[e >= 2 ? 1 : 0];
            if (row < seen.first || row >= seen.last) p = 0.f;
          }
          S[n][e] = p;
        }
        if constexpr (kSoftcap) {
          p_frag[n / 2][2 * (n % 2)] = pack2<T>(S[n][0], S[n][1]);      // key g,     rows 8n + 2t, + 1
          p_frag[n / 2][2 * (n % 2) + 1] = pack2<T>(S[n][2], S[n][3]);  // key g + 8, the same rows
          ds_frag[n / 2][2 * (n % 2)] = pack2<T>(S[n][0] * slope[0], S[n][1] * slope[1]);
          ds_frag[n / 2][2 * (n % 2) + 1] = pack2<T>(S[n][2] * slope[2], S[n][3] * slope[3]);
        }
      }
    };
    // The tile skips the mask when every row sees every key: the first row's keys reach past the tile's last (so the
    // tile ends before kv_len and the diagonal) and the last row's start at or before its first.
    // With the cap, every tile takes the masked copy: two copies of the capped loop, each leaving P^T and P^T times
    // the slope packed, meet with more registers live than the consumers have (ptxas spilled 112 bytes a thread at
    // d = 64 and 53 at d = 128), and the mask's test is a small part of a capped score's work.
    if (keys_of(i0).last < j0 + Bc || keys_of(min(i0 + Br, q_len) - 1).first > j0) exponents(std::true_type{});
    else exponents(std::bool_constant<kSoftcap>{});
    // P^T packed to 16 bits (without the cap; with it, the exponents did): the accumulator tiles of rows 2k and 2k + 1
    // are, element for element, the A registers of k-step k of dV (keys g / g + 8, rows 2t.. / 2t + 8..). At d = 128,
    // dV_w += P^T dO_i goes to the tensor cores at once (A from registers, B = dO_i MN-major), while dS^T is computed.
    if constexpr (!kSoftcap) {
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          p_frag[k][2 * half] = pack2<T>(S[2 * k + half][0], S[2 * k + half][1]);       // key g,     rows 16k + 8 half + 2t
          p_frag[k][2 * half + 1] = pack2<T>(S[2 * k + half][2], S[2 * k + half][3]);   // key g + 8, the same rows
        }
      }
    }
    if constexpr (kEarlyDv<D>) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) wgmma_rs<T>(dV, p_frag[k], q_mn_desc(dO_i, k));
      wgmma_commit();
      wgmma_wait<1>();  // dP^T has landed; dV is still on its way
    } else {
      wgmma_wait<0>();  // dP^T has landed
    }
    fence_registers(dP);

    // dS^T = P^T (dP^T - D) (with the cap, P^T times its slope, as the exponents packed it), packed to 16 bits as
    // P^T was: the A registers of dK.
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
      const float2 d2 = *reinterpret_cast<const float2*>(dd + 8 * n + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kSoftcap) {
          const float2 ps = unpack2<T>(ds_frag[n / 2][2 * (n % 2) + e / 2]);
          dP[n][e] = ((e & 1) ? ps.y : ps.x) * (dP[n][e] - ((e & 1) ? d2.y : d2.x));
        } else {
          dP[n][e] = S[n][e] * (dP[n][e] - ((e & 1) ? d2.y : d2.x));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        ds_frag[k][2 * half] = pack2<T>(dP[2 * k + half][0], dP[2 * k + half][1]);
        ds_frag[k][2 * half + 1] = pack2<T>(dP[2 * k + half][2], dP[2 * k + half][3]);
      }
    }
    // With one dS^T buffer, the other warpgroup may still be reading the last tile's: a warpgroup reaches this
    // barrier once its dQ wgmma has finished, so when both have, dS^T may be written again.
    if (kDsBuffers<D> == 1 && it > 0) named_barrier_sync<kDsFreeBarrier, kConsumerThreads>();
    // dS^T to shared memory as it is: key row wg 64 + warp 16 + g (+ 8), query rows 8n + 2t, + 1 are 4 bytes of
    // 16-byte chunk n % 8 of that key's row in row chunk n / 8, swizzled (chunk c of key row r at c ^ (r % 8)).
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = wg * kGroupKeys + warp * 16 + g + 8 * r;
        const std::uint32_t address =
            dS + ((n / 8) * Bc + key) * kChunkRowBytes + (((n % 8) ^ (key & 7)) << 4) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(ds_frag[n / 2][2 * (n % 2) + r]) : "memory");
      }
    }
    fence_proxy_async();  // the dS^T stores, before wgmma (the async proxy) reads them

    // Both consumers' dS^T are in shared memory, each writer's fence done. Of the block, only they meet here.
    named_barrier_sync<kDsReadyBarrier, kConsumerThreads>();

    // This warpgroup's piece of dQ_i = dS K_j (A = dS^T, B = K_j, both MN-major, over all Bc keys), then (dV_w at
    // d = 64 and) dK_w += dS^T Q_i (A from registers, B = Q_i MN-major): dQ first, so that its piece can be stored
    // while the others run.
    float dQ[8][4];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) wgmma_ss_mn<T>(dQ, ds_desc(dS, k), k_mn_desc(k), k > 0);
    wgmma_commit();
    if constexpr (!kEarlyDv<D>) {
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) wgmma_rs<T>(dV, p_frag[k], q_mn_desc(dO_i, k));
    }
#pragma unroll
    for (int k = 0; k < kRowSteps; ++k) wgmma_rs<T>(dK, ds_frag[k], q_mn_desc(Q_i, k));
    wgmma_commit();
    wgmma_wait<1>();  // dQ has landed (and dV, when it went first); dK is still on its way
    fence_registers(dQ);

    // The piece, times the scale, into dQ buffer it % kDqBuffers: this warpgroup's 64 x 64 floats as two boxes of 64
    // rows x 32 columns, each row 128 bytes with its 16-byte piece c at c ^ (row % 8), as the copy engine reads it.
    // From tile kDqBuffers on, the dQ warp must first have seen the copy engine read what the buffer held.
    const int buf = it % kDqBuffers;
    if (it >= kDqBuffers) {
      if (buf == 0) named_barrier_sync<kDqEmptyBarrier, kDqHandOver>();
      else named_barrier_sync<kDqEmptyBarrier + 1, kDqHandOver>();
    }
    const std::uint32_t dq_piece = dQ_tile + buf * 4 * Br * D + wg * 2 * kDqBoxBytes;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + g + 8 * r, col = 8 * n + 2 * t;  // of the piece
        const std::uint32_t address = dq_piece + (col / kDqBoxColumns) * kDqBoxBytes + row * 128 +
                                      ((((col % kDqBoxColumns) / 4) ^ (row & 7)) << 4) + (col % 4) * 4;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(s.scale * dQ[n][2 * r]),
                     "f"(s.scale * dQ[n][2 * r + 1]) : "memory");
      }
    }
    fence_proxy_async();  // the dQ stores, before the copy engine (the async proxy) reads them
    // The buffer is full once both consumers have arrived: the dQ warp hands it over; no one waits here.
    if (buf == 0) named_barrier_arrive<kDqFullBarrier, kDqHandOver>();
    else named_barrier_arrive<kDqFullBarrier + 1, kDqHandOver>();

    wgmma_wait<0>();
    fence_registers(dV);
    fence_registers(dK);
    // Every wgmma reading this stage has finished: this thread is done with it, and when all 256 consumer threads
    // have said so, the load warp refills it with tile it + kStages.
    mbarrier_arrive(Empty + 8 * stage);
  }

  // dK (times the scale) and dV of the lane's two keys, summed over every row of every head of the group.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= kv_len) continue;  // past the sequence's keys: the next sequence's, written by its own blocks
    T* dk_row = s.dk_head(b, kv_h) + std::int64_t(k_start + key) * kv_stride;
    T* dv_row = s.dv_head(b, kv_h) + std::int64_t(k_start + key) * kv_stride;
#pragma unroll
    for (int n = 0; n < kKVTiles; ++n) {
      *reinterpret_cast<std::uint32_t*>(dk_row + 8 * n + 2 * t) = pack2<T>(s.scale * dK[n][2 * r], s.scale * dK[n][2 * r + 1]);
      *reinterpret_cast<std::uint32_t*>(dv_row + 8 * n + 2 * t) = pack2<T>(dV[n][2 * r], dV[n][2 * r + 1]);
    }
  }
}

/// Validates the problem, builds the five tensor maps, then launches D (and with sinks their gradient), the K/V-tile
/// kernel and dQ's rounding. A pack is one sequence of all its rows to the maps and the side kernels (s.q_len =
/// total_q, s.kv_len = total_k, batch 1), as step 52's maps saw it: LSE and D [q_heads, total_q] are then (b, h, i)'s
/// order, and dsinks sums every packed row of a head.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 58", [&]<class T, int D>() {
    constexpr int Bc = kBc<D>;
    float* dQ_acc = static_cast<float*>(t.workspace);
    float* D_rows = dQ_acc + p.q_elements();
    if (p.total_q() > std::numeric_limits<int>::max() || p.total_k() > std::numeric_limits<int>::max())
      throw InvalidProblem("step 58: " + std::to_string(p.total_q()) + " rows of Q and " +
                           std::to_string(p.total_k()) + " of K; at most 2^31-1 of each are supported");
    kit::Grads<T, D> s = kit::grads<T, D>(p, t);
    const int batch = p.varlen() ? 1 : p.batch;
    if (p.varlen()) s.q_len = int(p.total_q()), s.kv_len = int(p.total_k());
    if (p.sinks) {  // dsinks is summed by atomics: zeroed first, on the same stream
      kit::zero_async(t.dsinks, std::size_t(p.q_heads) * sizeof(float), stream);
      kit::launch(row_dot_sinks_kernel<T, D>, bwd::row_dot_wide_blocks<D>(p.lse_elements()), bwd::kRowThreads, 0,
                  stream, s, D_rows, p.lse_elements(), t.sinks, t.dsinks);
    } else {
      kit::launch(bwd::row_dot_wide_kernel<T, D>, bwd::row_dot_wide_blocks<D>(p.lse_elements()), bwd::kRowThreads, 0,
                  stream, s, D_rows, p.lse_elements());
    }
    // What the copy engine reads: Q and dO in boxes of Br rows, K and V in boxes of Bc keys, 64 columns each.
    const CUtensorMap q_map = kit::heads_tensor_map(t.q, p.dtype, batch, s.q_len, p.q_heads, D, kBr<D>);
    const CUtensorMap do_map = kit::heads_tensor_map(t.d_o, p.dtype, batch, s.q_len, p.q_heads, D, kBr<D>);
    const CUtensorMap k_map = kit::heads_tensor_map(t.k, p.dtype, batch, s.kv_len, p.kv_heads, D, Bc);
    const CUtensorMap v_map = kit::heads_tensor_map(t.v, p.dtype, batch, s.kv_len, p.kv_heads, D, Bc);
    // dQ's float accumulator, as the copy engine adds to it: boxes of 64 rows by 32 columns.
    const CUtensorMap dq_map = kit::heads_tensor_map(dQ_acc, DType::f32, batch, s.q_len, p.q_heads, D, 64);
    // A pack's grid: the virtual K/V tiles, batch + total_k / Bc of them (Pack), a block each per KV head.
    const dim3 grid = p.varlen() ? dim3(unsigned(p.batch + p.total_k() / Bc), p.kv_heads, 1)
                                 : dim3(kit::ceil_div(p.kv_len, Bc), p.kv_heads, p.batch);
    const Pack<Bc> pack{p.batch, p.varlen() ? t.cu_seqlens_q : nullptr, p.varlen() ? t.cu_seqlens_k : nullptr};
    // The capped kernel where there is a cap: S in log2 units is softcap log2(e) tanh(scale S / softcap).
    const float cap = p.softcap;
    const auto kernel = p.varlen() ? (cap > 0.f ? warp_specialized_backward_kernel<T, D, true, true>
                                                : warp_specialized_backward_kernel<T, D, false, true>)
                                   : (cap > 0.f ? warp_specialized_backward_kernel<T, D, true, false>
                                                : warp_specialized_backward_kernel<T, D, false, false>);
    kit::launch(kernel, grid, kThreads, shared_bytes<D>(), stream, q_map, k_map, v_map, do_map, dq_map, s, D_rows,
                p.softmax_scale() * kLog2e, p.window_left, p.window_right, cap * kLog2e,
                cap > 0.f ? p.softmax_scale() / cap : 0.f, pack);
    kit::launch(bwd::convert_dq_wide_kernel<T>, bwd::convert_dq_wide_blocks(p.q_elements()), bwd::kRowThreads, 0,
                stream, dQ_acc, static_cast<T*>(t.dq), p.q_elements());
  });
}

}  // namespace

/// Step 58 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &bwd::workspace_bytes); }

}  // namespace fa::step58
