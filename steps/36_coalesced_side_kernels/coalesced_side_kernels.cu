// Step 36: the backward's side kernels read and write memory in 16-byte pieces, each row whole by consecutive lanes.
//
// Before and after the K/V-tile kernel, every backward step since 27 runs two small kernels: D = rowsum(dO o O)
// (row_dot_kernel, one thread a query row) and dQ's rounding from float (convert_dq_kernel, one thread an
// element). Per element of Q they move 14 bytes (dO and O in; the float dQ in, rounded out and zeroed), and
// Nsight Compute timed them at d = 128 (B=4 N=4096 H=16 f16): 371 us for D and 127 us for the rounding, next to
// 5.54 ms for the main kernel. D's kernel moves the fewest bytes and takes the longest. Its 32 lanes read 2 bytes
// each from 32 rows that lie q_heads * head_dim * 2 bytes apart, so every load of a warp touches 32 sectors for 64
// useful bytes.
// Here head_dim / 8 lanes share a row, each reading 16 contiguous bytes of dO and of O, and shuffles sum their
// parts (side_kernels.cuh); the rounding reads four floats a thread. Measured the same way: 48 us and 110 us. The
// K/V-tile kernel is step 35's, unchanged.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "14_warp_tiling/load_rows.cuh"
#include "27_flash_backward/float_dq.cuh"
#include "32_lean_loop/red_add_if.cuh"
#include "33_reordered_k_copy/load_rows_paired.cuh"
#include "36_coalesced_side_kernels/side_kernels.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::step36 {
namespace {

using namespace tc;

/// What this step accepts: 16-bit inputs for mma.sync, head_dim 64 and 128 (a multiple of 64: the swizzle).
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 90;            ///< red.global.add.v4.f32: sm_90 (mma.sync and ldmatrix: sm_80)
  static constexpr int pointer_alignment = 16;   ///< 16-byte cp.async copies
  static constexpr Pass pass = Pass::backward;   ///< dQ, dK, dV from Q, K, V, O, LSE and dO
  static constexpr bool needs_workspace = true;  ///< D and dQ in float; the float dQ starts zero and is left zero
};

constexpr int kWarps = 8;                         ///< warps per block
constexpr int kThreads = kWarps * kWarpSize;      ///< 256 threads
constexpr int Bc = 128;                           ///< keys per block
template <int D> constexpr int kBr = D == 64 ? 128 : 64;  ///< query rows per Q tile: 128 at d = 64
constexpr int kWarpRows = 32;                     ///< rows (or keys) of a warp tile: two m16 tiles
constexpr int kPRowBytes = Bc * 2;                ///< one query row of P or dS in shared memory: 256 bytes

constexpr int kStages = 2;                        ///< Q_i and dO_i: the tile in use and the next one

/// Shared memory: K_j, V_j (Bc x D), kStages x (Q_i, dO_i) (Br x D), P and dS (Br x Bc), K'_j (Bc x D), all
/// swizzled 16-bit tiles.
template <int D>
constexpr int shared_bytes() { return 2 * (2 * Bc * D + kStages * 2 * kBr<D> * D + 2 * kBr<D> * Bc + Bc * D); }

/// Block (key tile, kv_h, b). With kWM = Br / 32 warps down a Q tile and kWN = 8 / kWM across it (2 x 4 at
/// d = 128, 4 x 2 at d = 64), warp w takes, of each Q tile: rows 32 (w % kWM) .. + 31 and keys
/// Bc / kWN (w / kWM) .. of S, P, dP and dS; rows 32 (w % kWM) .. + 31 and columns d / kWN (w / kWM) .. of dQ.
/// Of dV and dK (kept across Q tiles) it takes keys 32 (w / 2) .. + 31 and columns (w % 2) d / 2 .., as before.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
interleaved_reductions_kernel(kit::Grads<T, D> s, const float* __restrict__ D_rows, float* __restrict__ dQ_acc,
                              float scale_log2) {
  constexpr int Br = kBr<D>;
  constexpr int kWM = Br / kWarpRows, kWN = kWarps / kWM;  // warps down and across a Q tile's S and dQ
  constexpr int kWarpKeys = Bc / kWN;    // keys of a warp's S, P, dP and dS: 32, or 64 at d = 64
  constexpr int kDSteps = D / 16;        // k-steps of S and dP (over the head dimension)
  constexpr int kKeyTiles = kWarpKeys / 8; // n8 tiles of a warp's S and dP (keys)
  constexpr int kRowSteps = Br / 16;     // k-steps of dV and dK (over query rows)
  constexpr int kKeySteps = Bc / 16;     // k-steps of dQ (over keys)
  constexpr int kKVTiles = D / 2 / 8;    // n8 tiles of a warp's dV and dK (columns)
  constexpr int kQTiles = D / kWN / 8;   // n8 tiles of a warp's dQ (columns)
  constexpr int kRowBytes = D * 2;

  extern __shared__ __align__(1024) unsigned char shared[];  // every tile 256-byte aligned: see the XOR bases
  const std::uint32_t K_tile = shared_address(shared);     // [Bc][D] swizzled
  const std::uint32_t V_tile = K_tile + 2 * Bc * D;         // [Bc][D] swizzled
  constexpr int kStageBytes = 2 * 2 * Br * D;               // one stage: Q_i, then dO_i
  const std::uint32_t Q_tile = V_tile + 2 * Bc * D;         // [Br][D] swizzled, stage 0 (stage s at + s kStageBytes)
  const std::uint32_t dO_tile = Q_tile + 2 * Br * D;        // [Br][D] swizzled, stage 0
  const std::uint32_t P_tile = Q_tile + kStages * kStageBytes;  // [Br][Bc] swizzled: a query row per 256 bytes
  const std::uint32_t dS_tile = P_tile + 2 * Br * Bc;       // [Br][Bc] swizzled
  const std::uint32_t Kp_tile = dS_tile + 2 * Br * Bc;      // [Bc][D] swizzled: K_j, each 16 columns' pairs reordered

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  static_assert(kWM == 2 || kWM == 4, "the shift below is log2 kWM");
  const int wr = warp & (kWM - 1), wa = warp >> (kWM / 2);  // the warp's rows (of Br) and its part of the keys, or of dQ's columns
  const int kvr = warp & 1, kva = warp >> 1;  // dV's and dK's: the warp's column half and its 32 keys
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of each m16 tile
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  const int j0 = blockIdx.x * Bc, kv_h = blockIdx.y, b = blockIdx.z;
  const int group = s.q_heads / s.kv_heads;
  const int q_stride = s.q_stride(), kv_stride = s.kv_stride();

  load_rows_async<Bc, D, kThreads>(K_tile, s.k_head(b, kv_h), j0, s.kv_len, kv_stride, tid);
  load_rows_async<Bc, D, kThreads>(V_tile, s.v_head(b, kv_h), j0, s.kv_len, kv_stride, tid);
  load_rows_paired_async<Bc, D, kThreads>(Kp_tile, s.k_head(b, kv_h), j0, s.kv_len, kv_stride, tid);
  cp_async_commit();

  // ldmatrix addresses, split as in step 14 into a per-lane part and compile-time offsets.
  // A fragments from a [row][column] tile (Q_i, dO_i for S and dP; dS for dQ): lanes 0-15 rows 0-15 at chunk
  // 2k, lanes 16-31 the same rows at chunk 2k+1.
  const int a_lane_row = lane & 15;
  const int a_lane_xor = (lane >> 4) ^ (lane & 7);
  // B fragments of a transposed [row][d] tile (K_j and V_j for S and dP, as K was for S in the forward); read
  // .trans, the same lanes give A fragments of a transposed tile (P^T and dS^T from P and dS): lanes 0-7 rows 0-7
  // chunk 2k, lanes 8-15 the same rows chunk 2k+1, lanes 16-31 rows 8-15.
  const int bt_lane_row = (lane & 7) + ((lane >> 4) << 3);
  const int bt_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);
  // B fragments of a [row][d] tile read .trans (dO_i, Q_i for dV and dK; K_j for dQ; V was read so for P V).
  const int b_lane_row = lane & 15;
  const int b_lane_xor = (lane >> 4) ^ (lane & 7);
  const int row0 = wr * kWarpRows, key0 = wa * kWarpKeys;  // the warp's rows and keys in S, P, dP and dS
  const int kv_key0 = kva * kWarpRows;  // the warp's keys in dV and dK
  // Each operand's base: the address of chunk 0 of the lane's row with the lane's XOR already in bits 4-7. A tile
  // row is 256-byte aligned (128 at d = 64, whose rows have 8 chunks), so chunk c of that row is at base ^ (c << 4),
  // and rows 16 or 8 further down at + a multiple of 256, which ldmatrix takes as an immediate offset. Chunks that
  // depend on the warp (P's keys, dV's and dK's columns, dQ's) are XORed in here once. dO_i, V_j and dS sit a
  // constant past Q_i, K_j and P: the same bases plus kdO, kV, kdS. Q_i's and dO_i's are stage 0's.
  std::uint32_t xa_QdO = Q_tile + (row0 + a_lane_row) * kRowBytes + (a_lane_xor << 4);      // Q_i, dO_i as A
  std::uint32_t xbt_KV = K_tile + (key0 + bt_lane_row) * kRowBytes + (bt_lane_xor << 4);    // K_j, V_j as B
  std::uint32_t xat_PdS = (P_tile + bt_lane_row * kPRowBytes + (bt_lane_xor << 4)) ^ ((kv_key0 / 8) << 4);  // P^T, dS^T
  std::uint32_t xb_QdO = (Q_tile + b_lane_row * kRowBytes + (b_lane_xor << 4)) ^ ((kvr * kKVTiles) << 4);  // as B
  std::uint32_t xb_K = (Kp_tile + b_lane_row * kRowBytes + (b_lane_xor << 4)) ^ ((wa * kQTiles) << 4);    // K'_j for dQ
  std::uint32_t xa_dS = dS_tile + (row0 + a_lane_row) * kPRowBytes + (a_lane_xor << 4);     // dS as A, for dQ
  constexpr std::uint32_t kdO = 2 * Br * D, kV = 2 * Bc * D, kdS = 2 * Br * Bc;

  float dV[2][kKVTiles][4] = {}, dK[2][kKVTiles][4] = {};  // keys kv_key0 + 16m + g (+ 8), columns kvr d/2 + 8c + 2t

  // Top-left causal: a row i sees key j only if j <= i, so Q tiles before j0 see none of this block's keys.
  const int first_row = s.causal ? j0 / Br * Br : 0;
  // The Q tiles this block visits, head by head of the group: per_head tiles of rows first_row, first_row + Br, ..
  // in each head, walked below. The first one's copies join K_j's and V_j's.
  const int per_head = first_row < s.q_len ? (s.q_len - first_row + Br - 1) / Br : 0;
  const int tiles = group * per_head;
  if (tiles > 0) {
    load_rows_async<Br, D, kThreads>(Q_tile, s.q_head(b, kv_h * group), first_row, s.q_len, q_stride, tid);
    load_rows_async<Br, D, kThreads>(dO_tile, s.do_head(b, kv_h * group), first_row, s.q_len, q_stride, tid);
  }
  cp_async_commit();
  int h = kv_h * group, i0 = first_row;  // tile it's head and first row
  for (int it = 0; it < tiles; ++it) {
    const int stage = it % kStages;
    int h1 = h, i1 = i0 + Br;  // tile it + 1: the next rows of this head, or the next head's first rows
    if (i1 >= s.q_len) i1 = first_row, ++h1;
    const float* lse_rows = s.lse_head(b, h);
    const float* d_rows = D_rows + (s.lse_head(b, h) - s.LSE);  // D has LSE's layout
    {  // one Q tile (the block keeps step 30's indentation, so that step-diff shows what changed)
      // The next tile's copies go to the other stage, which the barrier closing tile it - 1 freed. The last tile
      // commits an empty group, so that "all but the newest group" is always this tile's copies.
      if (it + 1 < tiles) {
        const std::uint32_t next = (stage ^ 1) * kStageBytes;
        load_rows_async<Br, D, kThreads>(Q_tile + next, s.q_head(b, h1), i1, s.q_len, q_stride, tid);
        load_rows_async<Br, D, kThreads>(dO_tile + next, s.do_head(b, h1), i1, s.q_len, q_stride, tid);
      }
      cp_async_commit();
      // A lane's rows of S are row0 + 16m + g + 8h: their LSE (in log2 units, so P = 2^(S scale_log2 - LSE log2
      // e)) and D, from global memory while the copies fly. Rows past q_len get 0: their Q and dO rows are
      // zeros, so their P multiplies zeros.
      float lse[2][2], dd[2][2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = i0 + row0 + 16 * m + g + 8 * hh;
          lse[m][hh] = row < s.q_len ? lse_rows[row] * kLog2e : 0.f;
          dd[m][hh] = row < s.q_len ? d_rows[row] : 0.f;
        }
      }
      cp_async_wait<1>();  // this tile's copies (and, for the first, K_j's and V_j's) have landed
      __syncthreads();
      const std::uint32_t so = stage * kStageBytes;
      // Without this empty asm, ptxas hoists base ^ (c << 4) for every operand and c out of the loop, into more
      // registers than are left. Here the bases may have changed, so each XOR is redone where it is used.
      asm volatile("" : "+r"(xa_QdO), "+r"(xbt_KV), "+r"(xat_PdS), "+r"(xb_QdO), "+r"(xb_K), "+r"(xa_dS));
      const std::uint32_t xa_Q = xa_QdO + so, xb_Q = xb_QdO + so;  // this tile's stage

      // S = Q_i K_w^T: 32 rows x 32 keys. C element [m][n][e] is row i0 + row0 + 16m + g + 8 (e >= 2), key
      // j0 + key0 + 8n + 2t + (e & 1).
      float S[2][kKeyTiles][4] = {};
#pragma unroll
      for (int k = 0; k < kDSteps; ++k) {
        std::uint32_t qa[2][4], kb[kKeyTiles / 2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldmatrix_x4(qa[m], (xa_Q ^ ((2 * k) << 4)) + m * 16 * kRowBytes);
#pragma unroll
        for (int n = 0; n < kKeyTiles; n += 2) ldmatrix_x4(kb[n / 2], (xbt_KV ^ ((2 * k) << 4)) + n * 8 * kRowBytes);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) mma_m16n8k16<T>(S[m][n], qa[m], kb[n / 2][2 * (n & 1)], kb[n / 2][2 * (n & 1) + 1]);
        }
      }

      // P = 2^(S scale_log2 - LSE), 0 where the causal mask hides the key or past kv_len (a zero key there
      // would score 0, and exp(0 - LSE) can overflow); to shared memory for dV, and kept for dS.
      const bool needs_mask = j0 + Bc > s.kv_len || (s.causal && j0 + Bc - 1 > i0);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = fast_exp2(S[m][n][e] * scale_log2 - lse[m][e >> 1]);
            if (needs_mask) {
              const int row = i0 + row0 + 16 * m + g + (e >= 2 ? 8 : 0);
              const int key = j0 + key0 + 8 * n + 2 * t + (e & 1);
              if (key >= s.kv_len || (s.causal && key > row)) p = 0.f;
            }
            S[m][n][e] = p;
          }
        }
      }
      // Each lane's pair (key columns 2t, 2t+1 of n8 tile n, row g or g + 8) is 4 contiguous bytes of that
      // row, chunk key0 / 8 + n, swizzled like every tile.
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int row = row0 + 16 * m + g + 8 * hh, chunk = key0 / 8 + n;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(P_tile + row * kPRowBytes + ((chunk ^ (row & 7)) << 4) + 4 * t),
                         "r"(pack2<T>(S[m][n][2 * hh], S[m][n][2 * hh + 1])));
          }
        }
      }

      // dP = dO_i V_w^T, the same tile as S; then dS = P (dP - D), to shared memory for dK and dQ. At d = 64 in
      // two halves of 32 keys (n8 tiles kHalfTiles half ..): each half's dP is dS before the next is made. (The
      // halves' body keeps step 33's indentation, so that step-diff shows what changed.)
      constexpr int kHalves = kWarpKeys / 32, kHalfTiles = kKeyTiles / kHalves;
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
      float dP[2][kHalfTiles][4] = {};
#pragma unroll
      for (int k = 0; k < kDSteps; ++k) {
        std::uint32_t oa[2][4], vb[kHalfTiles / 2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldmatrix_x4(oa[m], (xa_Q ^ ((2 * k) << 4)) + kdO + m * 16 * kRowBytes);
#pragma unroll
        for (int n = 0; n < kHalfTiles; n += 2)
          ldmatrix_x4(vb[n / 2], (xbt_KV ^ ((2 * k) << 4)) + kV + (half * kHalfTiles + n) * 8 * kRowBytes);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int n = 0; n < kHalfTiles; ++n) mma_m16n8k16<T>(dP[m][n], oa[m], vb[n / 2][2 * (n & 1)], vb[n / 2][2 * (n & 1) + 1]);
        }
      }
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int n = 0; n < kHalfTiles; ++n) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int ns = half * kHalfTiles + n;  // the n8 tile of S
            const int row = row0 + 16 * m + g + 8 * hh, chunk = key0 / 8 + ns;
            const float ds0 = S[m][ns][2 * hh] * (dP[m][n][2 * hh] - dd[m][hh]);
            const float ds1 = S[m][ns][2 * hh + 1] * (dP[m][n][2 * hh + 1] - dd[m][hh]);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dS_tile + row * kPRowBytes + ((chunk ^ (row & 7)) << 4) + 4 * t),
                         "r"(pack2<T>(ds0, ds1)));
          }
        }
      }
      }
      __syncthreads();  // P and dS are complete: every warp's part

      // dQ_i += scale dS K_j: rows row0 .. row0 + 31, columns wa d/kWN .. + d/kWN - 1, added to the float dQ.
      // Every K/V tile's block adds to the same rows: atomics. The products read K'_j, so n8 tiles 2q and 2q + 1
      // hold, in lane t, columns 16q + 4t .. 16q + 4t + 3 of rows g and g + 8: elements 0, 1 of both tiles for
      // row g, elements 2, 3 for row g + 8. Each is one reduction of four adjacent floats.
      float acc[2][kQTiles][4] = {};
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) {
        std::uint32_t da[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldmatrix_x4(da[m], (xa_dS ^ ((2 * k) << 4)) + m * 16 * kPRowBytes);
#pragma unroll
        for (int c = 0; c < kQTiles; c += 2) {
          std::uint32_t kb[4];
          ldmatrix_x4_trans(kb, (xb_K ^ (c << 4)) + k * 16 * kRowBytes);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma_m16n8k16<T>(acc[m][c], da[m], kb[0], kb[1]);
            mma_m16n8k16<T>(acc[m][c + 1], da[m], kb[2], kb[3]);
          }
        }
      }
      // Reduction n (of 2 kQTiles) adds four columns of one row: m16 tile m, row g or g + 8 (hh), tile pair q.
      auto reduce_dq = [&](int n) {
        const int m = n / kQTiles, hh = n / (kQTiles / 2) % 2, q = n % (kQTiles / 2);
        const int row = i0 + row0 + 16 * m + g + 8 * hh;
        float* dq_row = dQ_acc + s.q_offset(b, h) + std::int64_t(row) * q_stride + wa * (D / kWN) + 4 * t;
        const float* lo = acc[m][2 * q] + 2 * hh;      // columns 16q + 4t, + 1
        const float* hi = acc[m][2 * q + 1] + 2 * hh;  // columns 16q + 4t + 2, + 3
        bwd::red_add_v4_if(row < s.q_len, dq_row + 16 * q,
                           float4{s.scale * lo[0], s.scale * lo[1], s.scale * hi[0], s.scale * hi[1]});
      };

      // dV_w += P^T dO_i and dK_w += dS^T Q_i: keys 32 kva.. (A: P^T and dS^T, read .trans from P and dS, whose
      // rows are query rows) times columns kvr d/2.. of dO_i and Q_i ([row][d], read .trans as V was for P V).
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        std::uint32_t pa[2][4], dsa[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          // chunk kv_key0 / 8 + 2m (in the base: kv_key0 / 8); lanes 8-15 and 24-31 read the next: (lane >> 3) & 1
          ldmatrix_x4_trans(pa[m], (xat_PdS ^ ((2 * m) << 4)) + k * 16 * kPRowBytes);
          ldmatrix_x4_trans(dsa[m], (xat_PdS ^ ((2 * m) << 4)) + kdS + k * 16 * kPRowBytes);
        }
#pragma unroll
        for (int c = 0; c < kKVTiles; c += 2) {
          std::uint32_t ob[4], qb[4];  // n8 tile kvr kKVTiles + c of the full width (in the base: kvr kKVTiles)
          ldmatrix_x4_trans(ob, (xb_Q ^ (c << 4)) + kdO + k * 16 * kRowBytes);
          ldmatrix_x4_trans(qb, (xb_Q ^ (c << 4)) + k * 16 * kRowBytes);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma_m16n8k16<T>(dV[m][c], pa[m], ob[0], ob[1]);
            mma_m16n8k16<T>(dV[m][c + 1], pa[m], ob[2], ob[3]);
            mma_m16n8k16<T>(dK[m][c], dsa[m], qb[0], qb[1]);
            mma_m16n8k16<T>(dK[m][c + 1], dsa[m], qb[2], qb[3]);
          }
          // after every kEvery of these steps (8 mmas each), one of dQ's reductions
          constexpr int kSteps = kRowSteps * kKVTiles / 2, kEvery = kSteps / (2 * kQTiles);
          static_assert(kSteps % (2 * kQTiles) == 0, "the reductions spread evenly over dV's and dK's steps");
          const int step = k * (kKVTiles / 2) + c / 2;
          if (step % kEvery == kEvery - 1) reduce_dq(step / kEvery);
        }
      }

      __syncthreads();  // every warp is done with this tile's stage, P and dS
    }
    h = h1, i0 = i1;
  }

  cp_async_wait<0>();  // a block no Q tile reaches (causal) still waits for its K_j and V_j copies

  // dK (times the scale) and dV of the warp's 32 keys and d / 2 columns, summed over every row of every head
  // of the group.
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = j0 + kv_key0 + 16 * m + g + 8 * r;
      if (key >= s.kv_len) continue;
      T* dk_row = s.dk_head(b, kv_h) + key * kv_stride + kvr * (D / 2);
      T* dv_row = s.dv_head(b, kv_h) + key * kv_stride + kvr * (D / 2);
#pragma unroll
      for (int c = 0; c < kKVTiles; ++c) {
        *reinterpret_cast<std::uint32_t*>(dk_row + c * 8 + 2 * t) = pack2<T>(s.scale * dK[m][c][2 * r], s.scale * dK[m][c][2 * r + 1]);
        *reinterpret_cast<std::uint32_t*>(dv_row + c * 8 + 2 * t) = pack2<T>(dV[m][c][2 * r], dV[m][c][2 * r + 1]);
      }
    }
  }
}

/// Validates the problem, then launches D, the K/V-tile kernel and dQ's rounding.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 36", [&]<class T, int D>() {
    float* dQ_acc = static_cast<float*>(t.workspace);
    float* D_rows = dQ_acc + p.q_elements();
    kit::launch(bwd::row_dot_wide_kernel<T, D>, bwd::row_dot_wide_blocks<D>(p.lse_elements()), bwd::kRowThreads, 0,
                stream, kit::grads<T, D>(p, t), D_rows, p.lse_elements());
    const dim3 grid(kit::ceil_div(p.kv_len, Bc), p.kv_heads, p.batch);
    kit::launch(interleaved_reductions_kernel<T, D>, grid, kThreads, shared_bytes<D>(), stream, kit::grads<T, D>(p, t),
                D_rows, dQ_acc, p.softmax_scale() * kLog2e);
    kit::launch(bwd::convert_dq_wide_kernel<T>, bwd::convert_dq_wide_blocks(p.q_elements()), bwd::kRowThreads, 0,
                stream, dQ_acc, static_cast<T*>(t.dq), p.q_elements());
  });
}

}  // namespace

/// Step 36 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &bwd::workspace_bytes); }

}  // namespace fa::step36
