// Step 18: rescale O only when a row's max grew. Each tile multiplies every O accumulator by its row's
// alpha = 2^(m_old - m_new), although alpha is exactly 1 whenever the tile holds no new maximum for the
// row: for i.i.d. scores a row's max moves in tile j with chance 1/(j + 1). Here a warp votes
// (__any_sync) and skips the multiplies when none of its 32 rows' maxima grew (notebook 18 counts how
// often that is: about a third of the tiles at 4096 keys, more on longer rows). At d = 128 that is
// what lets K/V tiles of Bc = 64 keys fit: step 17 took 32, because 64 spilled about 200 bytes, and
// with the rescale as a separate, skippable loop ptxas spills 28-32. Twice the keys per tile means half the Q re-reads, row-max shuffles and barriers per key.
// At d = 64 (Bc = 64 already) the vote measured slower, so there O is rescaled every tile, as before.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "14_warp_tiling/load_rows.cuh"
#include "fa/kit.cuh"

#include <cstdint>
#include <type_traits>

namespace fa::step18 {
namespace {

using namespace tc;

/// What this step accepts: tensor cores take 16-bit inputs in this form (f32 runs in steps 01-08);
/// mma.sync m16n8k16, ldmatrix and cp.async need sm_80; rows move as 16-byte vectors.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 80;           ///< mma.sync m16n8k16, ldmatrix, cp.async: sm_80
  static constexpr int pointer_alignment = 16;  ///< rows move as 16-byte vectors
};

/// Warps per block and m16 tiles per warp: warp w owns rows 32w .. 32w + 31 of Br = 128.
constexpr int kWarps = 4;   ///< warps per block
constexpr int kMTiles = 2;  ///< m16 tiles per warp: each K/V fragment feeds kMTiles mmas
constexpr int kWarpRows = kMTiles * kRowsPerWarp;  ///< 32 query rows per warp
constexpr int Br = kWarps * kWarpRows;             ///< 128 query rows per block

/// Keys per K/V tile: 64 at both head dims. S (kMTiles x Bc / 8 fragments) and O (kMTiles x D / 8)
/// hold 128 floats per lane at d = 64 (no spill) and 192 at d = 128, FlashAttention-2's tile there:
/// 28-32 bytes spilled with the rescale skippable (ptxas, sm_90), about 200 with it inline (step 17).
template <int D>
constexpr int kv_tile() {
  return 64;
}

/// Whether a warp skips O's rescale when none of its rows' maxima grew: at d = 128, where it is what
/// lets Bc = 64 fit; at d = 64 the vote and branch measured slower than the 64 multiplies they save.
template <int D>
constexpr bool kSkipRescale = D == 128;

/// K/V stages: tile j lives in stage j % kStages.
constexpr int kStages = 2;

/// Dynamic shared memory: Q_i (Br x D), then kStages x (K_j tile, V_j tile) (Bc x D), 16-bit.
template <int D>
constexpr int shared_bytes() {
  return 2 * (Br * D + kStages * 2 * kv_tile<D>() * D);
}

/// FlashAttention-2 forward on tensor cores. Grid (Tr, q_heads, batch), block of
/// kWarps warps; block x computes rows [q_tile * Br, q_tile * Br + Br) of head h,
/// and warp w owns rows w*32 .. w*32 + 31 of the tile: m16 tile mt is rows
/// w*32 + mt*16 .. + 15. kRawMax: the scale is positive, so the row max is
/// taken over raw scores and each exponent is one FMA.
template <class T, int D, bool kRawMax>
__global__ void __launch_bounds__(kWarps * kWarpSize)
conditional_rescale_kernel(kit::Heads<T, D> s, float scale_log2) {
  constexpr int Bc = kv_tile<D>();
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kDSteps = D / 16;    // k-steps of S = Q K^T (over the head dimension)
  constexpr int kKeyTiles = Bc / 8;  // n8 tiles of S (keys)
  constexpr int kKeySteps = Bc / 16; // k-steps of O = P V (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of O (columns)
  static_assert(Bc % 16 == 0 && D % 16 == 0, "mma tiles are 16 wide");

  extern __shared__ __align__(128) unsigned char shared[];
  const std::uint32_t Q_tile = shared_address(shared);   // [Br][D] swizzled
  const std::uint32_t K_tile = Q_tile + 2 * Br * D;       // [Bc][D] swizzled, stage 0
  const std::uint32_t V_tile = K_tile + 2 * Bc * D;       // [Bc][D] swizzled, stage 0
  constexpr int kStageBytes = 2 * 2 * Bc * D;             // stage s: K_tile / V_tile + s * kStageBytes

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of each of the warp's m16 tiles
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  // Causal blocks further down the sequence do more work: start them first.
  const int q_tile = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = q_tile * Br;              // first row of the block
  const int warp_row0 = i0 + warp * kWarpRows;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_head = h / (s.q_heads / s.kv_heads);  // GQA: a group of query heads shares one KV head

  const int q_stride = s.q_stride();
  const int kv_stride = s.kv_stride();
  const T* __restrict__ Q_head = s.q_head(b, h);
  const T* __restrict__ K_head = s.k_head(b, kv_head);
  const T* __restrict__ V_head = s.v_head(b, kv_head);
  T* __restrict__ O_head = s.o_head(b, h);

  // Causal: the block's last row sees keys up to itself, so later tiles are skipped.
  const int rows_end = min(i0 + Br, s.q_len);
  const int kv_end = s.causal ? min(s.kv_len, rows_end) : s.kv_len;
  const int Tc = (kv_end + Bc - 1) / Bc;

  // Q_i, K_0 and V_0 start on their way together, into stage 0.
  load_rows_async<Br, D, kThreads>(Q_tile, Q_head, i0, s.q_len, q_stride, tid);
  load_rows_async<Bc, D, kThreads>(K_tile, K_head, 0, s.kv_len, kv_stride, tid);
  load_rows_async<Bc, D, kThreads>(V_tile, V_head, 0, s.kv_len, kv_stride, tid);
  cp_async_commit();

  // Per lane: O for rows g, g+8 of each m16 tile as kOutTiles C fragments; m and
  // l for the same rows. m is the full row max (the 4 lanes of a quad agree on
  // it), of the raw scores when kRawMax, else in log2 units (scores times
  // scale_log2); l is this lane's partial sum over its own columns, joined
  // across the quad at the end.
  float O_acc[kMTiles][kOutTiles][4] = {};
  float m[kMTiles][2], l[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }

  // ldmatrix addresses into Q_i, K_j and V_j, split into what depends on the
  // lane (fixed for the whole kernel) and compile-time offsets, so the unrolled
  // loops below need no per-load index arithmetic. The rows a lane addresses are
  // lane_row + a multiple of 8, so their row % 8 is lane_row % 8; and for an
  // even chunk c, (c + x) ^ r = c ^ (x ^ r): the swizzle is one XOR with a
  // per-lane constant. (Same offsets as swizzled_offset, computed cheaply.)
  // Q's A fragments: lanes 0-15 address rows 0-15 of an m16 tile at chunk 2k,
  // lanes 16-31 the same rows at chunk 2k+1 (matrices a[0], a[1], a[2], a[3]).
  constexpr int kRowBytes = D * 2;
  const int q_lane_row = warp * kWarpRows + (lane & 15);   // row of m16 tile 0 (tile mt: + 16 mt)
  const int q_lane_xor = (lane >> 4) ^ (lane & 7);         // chunk 2k (lanes 0-15) or 2k+1 (16-31), swizzled
  const int k_lane_row = (lane & 7) + ((lane >> 4) << 3);  // key within 16: tile n (lanes 0-15), n+1 (16-31)
  const int k_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);   // chunk 2k (lanes 0-7) or 2k+1 (8-15), swizzled
  const int v_lane_row = lane & 15;                        // key within a 16-key step
  const int v_lane_xor = (lane >> 4) ^ (lane & 7);         // chunk c (lanes 0-15) or c+1 (16-31), swizzled
  const std::uint32_t Q_lane = Q_tile + q_lane_row * kRowBytes;
  const std::uint32_t K_lane = K_tile + k_lane_row * kRowBytes;
  const std::uint32_t V_lane = V_tile + v_lane_row * kRowBytes;

  // One K/V tile: S = Q_i K_j^T, the online softmax, O_i += P V_j. `masked` is
  // std::true_type or std::false_type, so kMasked is known at compile time and
  // the unmasked copy of this body holds no mask code at all.
  auto process_tile = [&](const int j, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int kv0 = j * Bc;
    // Tile j has landed (this thread's copies, then everyone's: the barrier), and
    // every warp is done with tile j - 1, whose stage tile j + 1 now fills while
    // tile j is computed.
    cp_async_wait<0>();
    __syncthreads();
    const std::uint32_t stage = (j % kStages) * kStageBytes;
    if (j + 1 < Tc) {
      const std::uint32_t next = ((j + 1) % kStages) * kStageBytes;
      load_rows_async<Bc, D, kThreads>(K_tile + next, K_head, kv0 + Bc, s.kv_len, kv_stride, tid);
      load_rows_async<Bc, D, kThreads>(V_tile + next, V_head, kv0 + Bc, s.kv_len, kv_stride, tid);
    }
    cp_async_commit();

    // S = Q_i K_j^T. K_j is [key][d] row-major, i.e. B = K_j^T stored "col": a
    // plain ldmatrix of 8 keys x 8 dims is a B register. One x4 load serves two
    // n8 tiles: lanes 0-7 keys 0-7 chunk 2k (b0 of tile n), lanes 8-15 keys 0-7
    // chunk 2k+1 (b1 of tile n), lanes 16-31 the same for keys 8-15 (tile n+1).
    // Each K load now feeds both m16 tiles of the warp.
    float S[kMTiles][kKeyTiles][4] = {};
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) {
      std::uint32_t q_frag[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(q_frag[mt], Q_lane + mt * kRowsPerWarp * kRowBytes + (((2 * k) ^ q_lane_xor) << 4));
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, K_lane + stage + n * 8 * kRowBytes + (((2 * k) ^ k_lane_xor) << 4));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16<T>(S[mt][n], q_frag[mt], kb[0], kb[1]);
          mma_m16n8k16<T>(S[mt][n + 1], q_frag[mt], kb[2], kb[3]);
        }
      }
    }

    // Without kRawMax, scale into log2 units; then, in the masked copy only,
    // set to -inf the scores of keys past kv_len and, when causal, of keys
    // after their row.
    // Rows past q_len are no longer masked: their
    // Q rows are zeros, so their scores are finite, and they are never written.
    // S[mt][n][e] is row mt*16 + g + 8 (e >= 2), key n*8 + 2t + (e & 1).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (!kRawMax) S[mt][n][e] *= scale_log2;
          if constexpr (kMasked) {
            const int row = warp_row0 + mt * kRowsPerWarp + g + (e >= 2 ? 8 : 0);
            const int key = kv0 + n * 8 + 2 * t + (e & 1);
            if (key >= s.kv_len || (s.causal && key > row)) S[mt][n][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax on the fragments, for this lane's two rows of each m16 tile
    // (r = 0: row g, elements 0-1 of each tile; r = 1: row g+8, elements 2-3). A
    // row's Bc values are spread over the 4 lanes of a quad, so its max is joined
    // with two butterfly shuffles (lane ^ 1, lane ^ 2). alpha is kept per row and
    // applied to O after the loop, where the warp can skip it.
    float alpha[kMTiles][2];
    bool grew = false;  // did any of this lane's rows get a new max?
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float row_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) row_max = fmaxf(row_max, fmaxf(S[mt][n][2 * r], S[mt][n][2 * r + 1]));
        row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
        const float m_new = fmaxf(m[mt][r], row_max);
        grew |= m_new != m[mt][r];
        // A row with every key so far masked keeps m = -inf; subtracting 0 instead
        // gives P = 2^-inf = 0 and alpha = 0 rather than NaN from -inf - (-inf).
        const float m_safe = m_new == -INFINITY ? 0.f : m_new;
        // 2^((x - m) c) = 2^(x c - m c): with kRawMax, c = scale_log2 and every
        // exponent is one FFMA; otherwise the scores are already scaled, c = 1.
        const float c = kRawMax ? scale_log2 : 1.f;
        const float m_scaled = m_safe * c;
        alpha[mt][r] = fast_exp2((m[mt][r] - m_safe) * c);
        m[mt][r] = m_new;
        float row_sum = 0.f;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          S[mt][n][2 * r] = fast_exp2(fmaf(S[mt][n][2 * r], c, -m_scaled));
          S[mt][n][2 * r + 1] = fast_exp2(fmaf(S[mt][n][2 * r + 1], c, -m_scaled));
          row_sum += S[mt][n][2 * r] + S[mt][n][2 * r + 1];
        }
        l[mt][r] = alpha[mt][r] * l[mt][r] + row_sum;
      }
    }
    // O *= alpha, row by row. A row whose max did not grow has alpha = 2^0 = 1
    // exactly, so when no row of the warp grew (one vote for all 32 lanes; a
    // warp-uniform branch) the multiplies change nothing and are skipped. A row
    // with every key so far masked has alpha = 0 and O = 0: skipping is exact too.
    if (!kSkipRescale<D> || __any_sync(kFullMask, grew)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int c = 0; c < kOutTiles; ++c) {
          O_acc[mt][c][0] *= alpha[mt][0];
          O_acc[mt][c][1] *= alpha[mt][0];
          O_acc[mt][c][2] *= alpha[mt][1];
          O_acc[mt][c][3] *= alpha[mt][1];
        }
      }
    }

    // P stays in registers: the C fragments of key tiles 2k and 2k+1 are, element
    // for element, the A fragment of k-step k (rows g / g+8, keys 2t.. / 2t+8..).
    std::uint32_t p_frag[kMTiles][kKeySteps][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) {
        p_frag[mt][k][0] = pack2<T>(S[mt][2 * k][0], S[mt][2 * k][1]);          // row g,   keys 16k + 2t
        p_frag[mt][k][1] = pack2<T>(S[mt][2 * k][2], S[mt][2 * k][3]);          // row g+8, keys 16k + 2t
        p_frag[mt][k][2] = pack2<T>(S[mt][2 * k + 1][0], S[mt][2 * k + 1][1]);  // row g,   keys 16k + 8 + 2t
        p_frag[mt][k][3] = pack2<T>(S[mt][2 * k + 1][2], S[mt][2 * k + 1][3]);  // row g+8, keys 16k + 8 + 2t
      }
    }

    // O_i += P V_j. V_j is [key][d] row-major = B stored row-major, so ldmatrix
    // .trans hands each lane the (key 2t, 2t+1; column g) pairs B needs. Lanes
    // 0-15 address keys 0-15 at chunk 2c, lanes 16-31 keys 0-15 at chunk 2c+1:
    // matrices = b0, b1 of column tile 2c, then b0, b1 of column tile 2c+1.
    // Each V load now feeds both m16 tiles of the warp.
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
#pragma unroll
      for (int c = 0; c < kOutTiles; c += 2) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, V_lane + stage + k * 16 * kRowBytes + ((c ^ v_lane_xor) << 4));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16<T>(O_acc[mt][c], p_frag[mt][k], vb[0], vb[1]);
          mma_m16n8k16<T>(O_acc[mt][c + 1], p_frag[mt][k], vb[2], vb[3]);
        }
      }
    }
  };

  // The tiles no row of the block needs masked come first: every key below
  // kv_len and, when causal, at or before the block's first row i0. Only the
  // last tile (when kv_len is not a multiple of Bc) and, when causal, the Br/Bc
  // tiles (2 or 4) crossing the block's diagonal are left for the masked copy.
  int unmasked_tiles = min(Tc, s.kv_len / Bc);
  if (s.causal) unmasked_tiles = min(unmasked_tiles, (i0 + 1) / Bc);
  int j = 0;
  for (; j < unmasked_tiles; ++j) process_tile(j, std::false_type{});
  for (; j < Tc; ++j) process_tile(j, std::true_type{});

  // l: join the quad's partial sums, then O = O_acc / l rounded to T. Each lane
  // writes two adjacent columns of rows g and g+8 of every n8 tile; rows past
  // q_len (the last block's tail) are not written.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_l = l[mt][r];
      row_l += __shfl_xor_sync(kFullMask, row_l, 1);
      row_l += __shfl_xor_sync(kFullMask, row_l, 2);
      const float inv_l = row_l > 0.f ? 1.f / row_l : 0.f;
      const int i = warp_row0 + mt * kRowsPerWarp + g + 8 * r;
      if (i < s.q_len) {
#pragma unroll
        for (int c = 0; c < kOutTiles; ++c) {
          const std::uint32_t bits = pack2<T>(O_acc[mt][c][2 * r] * inv_l, O_acc[mt][c][2 * r + 1] * inv_l);
          *reinterpret_cast<std::uint32_t*>(O_head + i * q_stride + c * 8 + 2 * t) = bits;
        }
        // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
        if (s.LSE != nullptr && t == 0)
          s.lse_head(b, h)[i] = (m[mt][r] * (kRawMax ? scale_log2 : 1.f) + log2f(row_l)) / kLog2e;
      }
    }
  }
}

/// Validates the problem, then launches kWarps warps per (Q tile, head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 18", [&]<class T, int D>() {
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch);
    const float scale_log2 = p.softmax_scale() * kLog2e;  // exp(scale x) = 2^(scale log2(e) x)
    // max(c x) = c max(x) only for c > 0: a zero or negative scale scales first.
    const auto kernel = scale_log2 > 0.f ? conditional_rescale_kernel<T, D, true> : conditional_rescale_kernel<T, D, false>;
    kit::launch(kernel, grid, kWarps * kWarpSize, shared_bytes<D>(), stream, kit::heads<T, D>(p, t), scale_log2);
  });
}

}  // namespace

/// Step 18 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step18
