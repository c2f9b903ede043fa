// Step 29: dQ added 16 bytes at a time: one vector reduction where step 28 issued four atomics.
//
// Nsight Compute puts step 28 at 84 % of the L2's throughput and 26 % of the SMs' at d = 128: every
// (K/V tile, Q tile) pair adds a 64 x d share of dQ to global memory, one float atomicAdd per element,
// and the L2 serves each as its own request. Hopper's red.global.add.v4.f32 adds four adjacent floats in
// one request. A lane holds two adjacent columns of two rows of each C fragment, so lanes t and t ^ 1 swap
// a row's pair with one shuffle each way and each then holds four adjacent columns of one row: a quarter
// of the requests for the same bytes. Vector reductions need sm_90; the rest is step 28's kernel.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "14_warp_tiling/load_rows.cuh"
#include "26_naive_backward/row_dot.cuh"
#include "27_flash_backward/float_dq.cuh"
#include "29_vector_atomics/red_add.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::step29 {
namespace {

using namespace tc;

/// What this step accepts: 16-bit inputs for mma.sync, head_dim 64 and 128 (a multiple of 64: the swizzle).
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 90;            ///< red.global.add.v4.f32: sm_90 (mma.sync and ldmatrix: sm_80)
  static constexpr int pointer_alignment = 16;   ///< 16-byte cp.async copies
  static constexpr Pass pass = Pass::backward;   ///< dQ, dK, dV from Q, K, V, O, LSE and dO
  static constexpr bool needs_workspace = true;  ///< D and dQ in float; the float dQ starts zero and is left zero
};

constexpr int kWarps = 4;                         ///< warps per block
constexpr int kThreads = kWarps * kWarpSize;      ///< 128 threads
constexpr int Bc = kWarps * kRowsPerWarp;         ///< 64 keys per block: 16 per warp
constexpr int Br = 64;                            ///< query rows per Q tile
constexpr int kDsRowBytes = Br * 2;               ///< one key's row of dS^T in shared memory: 128 bytes

/// Shared memory: K_j, V_j (Bc x D), Q_i, dO_i (Br x D), all swizzled 16-bit tiles; dS^T (Bc x Br, 16-bit,
/// swizzled); the Q tile's LSE and D (Br floats each, LSE in log2 units).
constexpr int shared_bytes(int D) { return 2 * (2 * Bc * D + 2 * Br * D + Bc * Br) + 2 * Br * 4; }

/// Block (key tile, kv_h, b): warp w owns keys j0 + 16w .. j0 + 16w + 15 and their dK, dV; every warp
/// computes 16 rows of each Q tile's dQ share.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
vector_atomics_kernel(kit::Grads<T, D> s, const float* __restrict__ D_rows, float* __restrict__ dQ_acc,
                            float scale_log2) {
  constexpr int kDSteps = D / 16;    // k-steps of S^T and dP^T (over the head dimension)
  constexpr int kRowTiles = Br / 8;  // n8 tiles of S^T (query rows)
  constexpr int kRowSteps = Br / 16; // k-steps of dV and dK (over query rows)
  constexpr int kKeySteps = Bc / 16; // k-steps of dQ (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of dK, dV and dQ (columns)
  constexpr int kRowBytes = D * 2;

  extern __shared__ __align__(128) unsigned char shared[];
  const std::uint32_t K_tile = shared_address(shared);     // [Bc][D] swizzled
  const std::uint32_t V_tile = K_tile + 2 * Bc * D;         // [Bc][D] swizzled
  const std::uint32_t Q_tile = V_tile + 2 * Bc * D;         // [Br][D] swizzled
  const std::uint32_t dO_tile = Q_tile + 2 * Br * D;        // [Br][D] swizzled
  const std::uint32_t dS_tile = dO_tile + 2 * Br * D;       // [Bc][Br] swizzled: dS^T, a key's row per 128 bytes
  float* LSE_i = reinterpret_cast<float*>(shared + 2 * (2 * Bc * D + 2 * Br * D + Bc * Br));
  float* D_i = LSE_i + Br;

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of the warp's m16 tile
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  const int j0 = blockIdx.x * Bc, kv_h = blockIdx.y, b = blockIdx.z;
  const int group = s.q_heads / s.kv_heads;
  const int q_stride = s.q_stride(), kv_stride = s.kv_stride();

  load_rows_async<Bc, D, kThreads>(K_tile, s.k_head(b, kv_h), j0, s.kv_len, kv_stride, tid);
  load_rows_async<Bc, D, kThreads>(V_tile, s.v_head(b, kv_h), j0, s.kv_len, kv_stride, tid);
  cp_async_commit();

  // ldmatrix addresses, split as in step 14 into a per-lane part and compile-time offsets.
  // A fragments from a [row][d] tile (K_w and V_w here, as Q was in the forward): lanes 0-15 rows 0-15 at
  // chunk 2k, lanes 16-31 the same rows at chunk 2k+1.
  const int a_lane_row = warp * kRowsPerWarp + (lane & 15);
  const int a_lane_xor = (lane >> 4) ^ (lane & 7);
  // B fragments of a transposed [row][d] tile (Q_i and dO_i for S^T and dP^T, as K was for S): lanes 0-7
  // rows 0-7 chunk 2k, lanes 8-15 the same rows chunk 2k+1, lanes 16-31 rows 8-15.
  const int bt_lane_row = (lane & 7) + ((lane >> 4) << 3);
  const int bt_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);
  // B fragments of a [row][d] tile read .trans (dO_i, Q_i for dV and dK; K_j for dQ; V was read so for P V).
  const int b_lane_row = lane & 15;
  const int b_lane_xor = (lane >> 4) ^ (lane & 7);
  const std::uint32_t K_a = K_tile + a_lane_row * kRowBytes, V_a = V_tile + a_lane_row * kRowBytes;
  const std::uint32_t Q_bt = Q_tile + bt_lane_row * kRowBytes, dO_bt = dO_tile + bt_lane_row * kRowBytes;
  const std::uint32_t Q_b = Q_tile + b_lane_row * kRowBytes, dO_b = dO_tile + b_lane_row * kRowBytes;
  const std::uint32_t K_b = K_tile + b_lane_row * kRowBytes;
  // dS's A fragments from the dS^T tile, read .trans: the stored rows are keys (lanes' rows as bt_lane_row),
  // the chunk is the query-row block: warp w's rows 16w.. are chunks 2w (lanes 0-7, 16-23) and 2w+1.
  const std::uint32_t dS_a = dS_tile + bt_lane_row * kDsRowBytes;
  const int ds_lane_xor = (2 * warp + ((lane >> 3) & 1)) ^ (lane & 7);

  float dK[kOutTiles][4] = {}, dV[kOutTiles][4] = {};
  const int key0 = j0 + warp * kRowsPerWarp;  // this warp's first key; its lane's keys are key0 + g (+ 8)

  // Top-left causal: a row i sees key j only if j <= i, so Q tiles before j0 see none of this block's keys.
  const int first_row = s.causal ? j0 / Br * Br : 0;
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    const float* lse_rows = s.lse_head(b, h);
    const float* d_rows = D_rows + (s.lse_head(b, h) - s.LSE);  // D has LSE's layout
    for (int i0 = first_row; i0 < s.q_len; i0 += Br) {
      __syncthreads();  // every warp is done with the previous Q tile's Q_i, dO_i and dS^T
      load_rows_async<Br, D, kThreads>(Q_tile, s.q_head(b, h), i0, s.q_len, q_stride, tid);
      load_rows_async<Br, D, kThreads>(dO_tile, s.do_head(b, h), i0, s.q_len, q_stride, tid);
      cp_async_commit();
      if (tid < Br) {
        // LSE in log2 units, so P = 2^(S scale_log2 - LSE log2 e). Rows past q_len get 0: their Q and dO
        // rows are zeros, so their P multiplies zeros.
        LSE_i[tid] = i0 + tid < s.q_len ? lse_rows[i0 + tid] * kLog2e : 0.f;
        D_i[tid] = i0 + tid < s.q_len ? d_rows[i0 + tid] : 0.f;
      }
      cp_async_wait<0>();
      __syncthreads();

      // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: 16 keys x Br rows each. C element [n][e] is key
      // key0 + g + 8 (e >= 2), row i0 + 8n + 2t + (e & 1).
      float S[kRowTiles][4] = {}, dP[kRowTiles][4] = {};
#pragma unroll
      for (int k = 0; k < kDSteps; ++k) {
        std::uint32_t k_frag[4], v_frag[4];
        ldmatrix_x4(k_frag, K_a + (((2 * k) ^ a_lane_xor) << 4));
        ldmatrix_x4(v_frag, V_a + (((2 * k) ^ a_lane_xor) << 4));
#pragma unroll
        for (int n = 0; n < kRowTiles; n += 2) {
          std::uint32_t qb[4], dob[4];
          ldmatrix_x4(qb, Q_bt + n * 8 * kRowBytes + (((2 * k) ^ bt_lane_xor) << 4));
          ldmatrix_x4(dob, dO_bt + n * 8 * kRowBytes + (((2 * k) ^ bt_lane_xor) << 4));
          mma_m16n8k16<T>(S[n], k_frag, qb[0], qb[1]);
          mma_m16n8k16<T>(S[n + 1], k_frag, qb[2], qb[3]);
          mma_m16n8k16<T>(dP[n], v_frag, dob[0], dob[1]);
          mma_m16n8k16<T>(dP[n + 1], v_frag, dob[2], dob[3]);
        }
      }

      // P^T = 2^(S^T scale_log2 - LSE), 0 where the causal mask hides the key or past kv_len (a zero key
      // there would score 0, and exp(0 - LSE) can overflow); then dS^T = P^T (dP^T - D).
      const bool needs_mask = j0 + Bc > s.kv_len || (s.causal && j0 + Bc - 1 > i0);
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 8 * n + 2 * t + (e & 1);  // row within the Q tile
          float p = fast_exp2(S[n][e] * scale_log2 - LSE_i[r]);
          if (needs_mask) {
            const int key = key0 + g + (e >= 2 ? 8 : 0);
            if (key >= s.kv_len || (s.causal && key > i0 + r)) p = 0.f;
          }
          S[n][e] = p;
          dP[n][e] = p * (dP[n][e] - D_i[r]);
        }
      }

      // The C fragments of row tiles 2k and 2k+1 are the A fragment of k-step k (keys g / g+8, rows
      // 2t.. / 2t+8..), as P's were in the forward: P^T and dS^T stay in registers for dV and dK.
      std::uint32_t p_frag[kRowSteps][4], ds_frag[kRowSteps][4];
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
        p_frag[k][0] = pack2<T>(S[2 * k][0], S[2 * k][1]);
        p_frag[k][1] = pack2<T>(S[2 * k][2], S[2 * k][3]);
        p_frag[k][2] = pack2<T>(S[2 * k + 1][0], S[2 * k + 1][1]);
        p_frag[k][3] = pack2<T>(S[2 * k + 1][2], S[2 * k + 1][3]);
        ds_frag[k][0] = pack2<T>(dP[2 * k][0], dP[2 * k][1]);
        ds_frag[k][1] = pack2<T>(dP[2 * k][2], dP[2 * k][3]);
        ds_frag[k][2] = pack2<T>(dP[2 * k + 1][0], dP[2 * k + 1][1]);
        ds_frag[k][3] = pack2<T>(dP[2 * k + 1][2], dP[2 * k + 1][3]);
      }

      // dS^T to shared memory for dQ: each lane's pair (rows 2t, 2t+1 of row tile n, key g or g + 8) is
      // 4 contiguous bytes of that key's row, chunk n, swizzled like every tile.
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // row tiles 2k and 2k + 1
          const int n = 2 * k + half;
#pragma unroll
          for (int r = 0; r < 2; ++r) {  // keys g and g + 8
            const int key = warp * kRowsPerWarp + g + 8 * r;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dS_tile + key * kDsRowBytes + ((n ^ (key & 7)) << 4) + 4 * t),
                         "r"(ds_frag[k][2 * half + r]));
          }
        }
      }

      // dV_w += P^T dO_i and dK_w += dS^T Q_i: dO_i and Q_i are [row][d], B for a k-step over rows, read
      // with ldmatrix .trans as V was for P V.
#pragma unroll
      for (int k = 0; k < kRowSteps; ++k) {
#pragma unroll
        for (int c = 0; c < kOutTiles; c += 2) {
          std::uint32_t dob[4], qb[4];
          ldmatrix_x4_trans(dob, dO_b + k * 16 * kRowBytes + ((c ^ b_lane_xor) << 4));
          ldmatrix_x4_trans(qb, Q_b + k * 16 * kRowBytes + ((c ^ b_lane_xor) << 4));
          mma_m16n8k16<T>(dV[c], p_frag[k], dob[0], dob[1]);
          mma_m16n8k16<T>(dV[c + 1], p_frag[k], dob[2], dob[3]);
          mma_m16n8k16<T>(dK[c], ds_frag[k], qb[0], qb[1]);
          mma_m16n8k16<T>(dK[c + 1], ds_frag[k], qb[2], qb[3]);
        }
      }
      __syncthreads();  // dS^T is complete: every warp's 16 keys

      // dQ_i += scale dS K_j: warp w takes rows 16w .. 16w + 15 of the Q tile, 32 columns at a time, and adds
      // them to the float dQ. Every K/V tile's block adds to the same rows: atomics. Lanes t and t ^ 1 swap
      // halves: an even t keeps row g and takes its partner's columns 2t + 2, 2t + 3 of it, an odd t keeps
      // row g + 8 and takes 2t - 2, 2t - 1; each lane then adds columns 4 (t / 2) .. + 3 of its row at once.
      std::uint32_t dsa[kKeySteps][4];
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) ldmatrix_x4_trans(dsa[k], dS_a + k * 16 * kDsRowBytes + (ds_lane_xor << 4));
      const bool odd = t & 1;
      const int row = i0 + warp * kRowsPerWarp + g + (odd ? 8 : 0);
      float* dq_row = dQ_acc + s.q_offset(b, h) + std::int64_t(row) * q_stride + 4 * (t >> 1);
#pragma unroll
      for (int c0 = 0; c0 < kOutTiles; c0 += 4) {
        float acc[4][4] = {};
#pragma unroll
        for (int k = 0; k < kKeySteps; ++k) {
#pragma unroll
          for (int c = 0; c < 4; c += 2) {
            std::uint32_t kb[4];
            ldmatrix_x4_trans(kb, K_b + k * 16 * kRowBytes + (((c0 + c) ^ b_lane_xor) << 4));
            mma_m16n8k16<T>(acc[c], dsa[k], kb[0], kb[1]);
            mma_m16n8k16<T>(acc[c + 1], dsa[k], kb[2], kb[3]);
          }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // The pair this lane gives away is the row its partner keeps.
          const float give0 = odd ? acc[c][0] : acc[c][2], give1 = odd ? acc[c][1] : acc[c][3];
          const float got0 = __shfl_xor_sync(kFullMask, give0, 1), got1 = __shfl_xor_sync(kFullMask, give1, 1);
          const float4 v = odd ? float4{got0, got1, acc[c][2], acc[c][3]} : float4{acc[c][0], acc[c][1], got0, got1};
          if (row < s.q_len)
            bwd::red_add_v4(dq_row + (c0 + c) * 8, float4{s.scale * v.x, s.scale * v.y, s.scale * v.z, s.scale * v.w});
        }
      }
    }
  }

  cp_async_wait<0>();  // a block no Q tile reaches (causal) still waits for its K_j and V_j copies

  // dK (times the scale) and dV of the warp's 16 keys, summed over every row of every head of the group.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + g + 8 * r;
    if (key >= s.kv_len) continue;
    T* dk_row = s.dk_head(b, kv_h) + key * kv_stride;
    T* dv_row = s.dv_head(b, kv_h) + key * kv_stride;
#pragma unroll
    for (int c = 0; c < kOutTiles; ++c) {
      *reinterpret_cast<std::uint32_t*>(dk_row + c * 8 + 2 * t) = pack2<T>(s.scale * dK[c][2 * r], s.scale * dK[c][2 * r + 1]);
      *reinterpret_cast<std::uint32_t*>(dv_row + c * 8 + 2 * t) = pack2<T>(dV[c][2 * r], dV[c][2 * r + 1]);
    }
  }
}

/// Validates the problem, then launches D, the K/V-tile kernel and dQ's rounding.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 29", [&]<class T, int D>() {
    float* dQ_acc = static_cast<float*>(t.workspace);
    float* D_rows = dQ_acc + p.q_elements();
    kit::launch(bwd::row_dot_kernel<T>, bwd::row_blocks(p.lse_elements()), bwd::kRowThreads, 0, stream,
                kit::grads<T>(p, t), D_rows, p.lse_elements());
    const dim3 grid(kit::ceil_div(p.kv_len, Bc), p.kv_heads, p.batch);
    kit::launch(vector_atomics_kernel<T, D>, grid, kThreads, shared_bytes(D), stream, kit::grads<T, D>(p, t),
                D_rows, dQ_acc, p.softmax_scale() * kLog2e);
    kit::launch(bwd::convert_dq_kernel<T>, bwd::row_blocks(p.q_elements()), bwd::kRowThreads, 0, stream, dQ_acc,
                static_cast<T*>(t.dq), p.q_elements());
  });
}

}  // namespace

/// Step 29 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &bwd::workspace_bytes); }

}  // namespace fa::step29
