// Step 10: an asynchronous load pipeline. Step 09 loaded K_j and V_j, waited, then computed: every
// warp of the block stood idle while the tiles crossed from global memory. Here they arrive by
// cp.async, which copies global -> shared without holding up the thread: V_j is loaded while
// S = Q_i K_j^T runs, and K_{j+1} while the softmax and P V_j run, so loads hide behind compute.
#include "09_tensor_cores/mma.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "fa/kit.cuh"

#include <cstdint>

namespace fa::step10 {
namespace {

using namespace tc;

/// What this step accepts: tensor cores take 16-bit inputs in this form (f32 runs in steps 01-08);
/// mma.sync m16n8k16, ldmatrix and cp.async need sm_80; rows move as 16-byte vectors.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 80;           ///< mma.sync m16n8k16, ldmatrix, cp.async: sm_80
  static constexpr int pointer_alignment = 16;  ///< rows move as 16-byte vectors
};

/// Keys per K/V tile, and warps per block (Br = 16 * kWarps = 64 query rows): step 09's br64, its
/// faster variant at the headline shape, d = 64 (step 09's README: where br128 wins).
constexpr int Bc = 64;     ///< keys per K/V tile
constexpr int kWarps = 4;  ///< warps per block: Br = 64 query rows

/// Dynamic shared memory: Q_i (Br x D), one K_j tile and one V_j tile (Bc x D), 16-bit.
template <int D, int Br>
constexpr int shared_bytes() {
  return 2 * (Br * D + 2 * Bc * D);
}

/// FlashAttention-2 forward on tensor cores. Grid (Tr, q_heads, batch), block of
/// kWarps warps; block x computes rows [q_tile * Br, q_tile * Br + Br) of head h,
/// where Br = 16 * kWarps and warp w owns rows w*16 .. w*16 + 15 of the tile.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * kWarpSize)
async_pipeline_kernel(kit::Heads<T, D> s) {
  constexpr int Br = kWarps * kRowsPerWarp;
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kDSteps = D / 16;    // k-steps of S = Q K^T (over the head dimension)
  constexpr int kKeyTiles = Bc / 8;  // n8 tiles of S (keys)
  constexpr int kKeySteps = Bc / 16; // k-steps of O = P V (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of O (columns)
  static_assert(Bc % 16 == 0 && D % 16 == 0, "mma tiles are 16 wide");

  extern __shared__ __align__(128) unsigned char shared[];
  const std::uint32_t Q_tile = shared_address(shared);   // [Br][D] swizzled
  const std::uint32_t K_tile = Q_tile + 2 * Br * D;       // [Bc][D] swizzled
  const std::uint32_t V_tile = K_tile + 2 * Bc * D;       // [Bc][D] swizzled

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of the warp's 16
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  const int q_tile = blockIdx.x;
  const int i0 = q_tile * Br;              // first row of the block
  const int warp_row0 = i0 + warp * kRowsPerWarp;
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

  // Q_i and K_0 start on their way together; Q_i is needed first.
  load_tile_async<Br, D, kThreads>(Q_tile, Q_head, i0, s.q_len, q_stride, tid);
  cp_async_commit();
  load_tile_async<Bc, D, kThreads>(K_tile, K_head, 0, s.kv_len, kv_stride, tid);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // The warp's 16 rows of Q_i as A fragments, one per 16-wide k-step, loaded once.
  // ldmatrix lanes 0-15 address rows 0-15 at chunk 2k, lanes 16-31 rows 0-15 at
  // chunk 2k+1: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) = a[0], a[1], a[2], a[3].
  std::uint32_t q_frag[kDSteps][4];
#pragma unroll
  for (int k = 0; k < kDSteps; ++k)
    ldmatrix_x4(q_frag[k], Q_tile + swizzled_offset<D>(warp * kRowsPerWarp + (lane & 15), 2 * k + (lane >> 4)));

  // Per lane: O for rows g, g+8 as kOutTiles C fragments; m and l for the same two
  // rows. m is the full row max (the 4 lanes of a quad agree on it); l is this
  // lane's partial sum over its own columns, joined across the quad at the end.
  float O_acc[kOutTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  // ldmatrix addresses into K_j and V_j, split into what depends on the lane
  // (fixed for the whole kernel) and compile-time offsets, so the unrolled loops
  // below need no per-load index arithmetic. The rows a lane addresses are
  // lane_row + a multiple of 8, so their row % 8 is lane_row % 8; and for an
  // even chunk c, (c + x) ^ r = c ^ (x ^ r): the swizzle is one XOR with a
  // per-lane constant. (Same offsets as swizzled_offset, computed cheaply.)
  constexpr int kRowBytes = D * 2;
  const int k_lane_row = (lane & 7) + ((lane >> 4) << 3);  // key within 16: tile n (lanes 0-15), n+1 (16-31)
  const int k_lane_xor = ((lane >> 3) & 1) ^ (lane & 7);   // chunk 2k (lanes 0-7) or 2k+1 (8-15), swizzled
  const int v_lane_row = lane & 15;                        // key within a 16-key step
  const int v_lane_xor = (lane >> 4) ^ (lane & 7);         // chunk c (lanes 0-15) or c+1 (16-31), swizzled
  const std::uint32_t K_lane = K_tile + k_lane_row * kRowBytes;
  const std::uint32_t V_lane = V_tile + v_lane_row * kRowBytes;

  for (int j = 0; j < Tc; ++j) {
    const int kv0 = j * Bc;
    // K_j has landed, and every warp is done reading V_{j-1}: V_j may overwrite it.
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async<Bc, D, kThreads>(V_tile, V_head, kv0, s.kv_len, kv_stride, tid);
    cp_async_commit();

    // S = Q_i K_j^T. K_j is [key][d] row-major, i.e. B = K_j^T stored "col": a
    // plain ldmatrix of 8 keys x 8 dims is a B register. One x4 load serves two
    // n8 tiles: lanes 0-7 keys 0-7 chunk 2k (b0 of tile n), lanes 8-15 keys 0-7
    // chunk 2k+1 (b1 of tile n), lanes 16-31 the same for keys 8-15 (tile n+1).
    float S[kKeyTiles][4] = {};
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, K_lane + n * 8 * kRowBytes + (((2 * k) ^ k_lane_xor) << 4));
        mma_m16n8k16<T>(S[n], q_frag[k], kb[0], kb[1]);
        mma_m16n8k16<T>(S[n + 1], q_frag[k], kb[2], kb[3]);
      }
    }

    // V_j has landed, and every warp is done reading K_j: K_{j+1} may overwrite it
    // while this tile's softmax and P V_j run.
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < Tc) load_tile_async<Bc, D, kThreads>(K_tile, K_head, kv0 + Bc, s.kv_len, kv_stride, tid);
    cp_async_commit();

    // Scale, and mask as every step before: a key past kv_len, a key above the
    // diagonal, or a row past q_len gives -inf. S[n][e] is row g + 8 (e >= 2),
    // key n*8 + 2t + (e & 1).
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = warp_row0 + g + (e >= 2 ? 8 : 0);
        const int key = kv0 + n * 8 + 2 * t + (e & 1);
        const bool valid = row < s.q_len && key < s.kv_len && (!s.causal || key <= row);
        S[n][e] = valid ? s.scale * S[n][e] : -INFINITY;
      }
    }

    // Online softmax on the fragments, for this lane's two rows (r = 0: row g,
    // elements 0-1 of each tile; r = 1: row g+8, elements 2-3). A row's Bc values
    // are spread over the 4 lanes of a quad, so its max is joined with two
    // butterfly shuffles (lane ^ 1, lane ^ 2).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) row_max = fmaxf(row_max, fmaxf(S[n][2 * r], S[n][2 * r + 1]));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
      row_max = fmaxf(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
      const float m_new = fmaxf(m[r], row_max);
      // A row with every key so far masked keeps m = -inf; subtracting 0 instead
      // gives P = exp(-inf) = 0 and alpha = 0 rather than NaN from -inf - (-inf).
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = expf(m[r] - m_safe);
      m[r] = m_new;
      float row_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        S[n][2 * r] = expf(S[n][2 * r] - m_safe);
        S[n][2 * r + 1] = expf(S[n][2 * r + 1] - m_safe);
        row_sum += S[n][2 * r] + S[n][2 * r + 1];
      }
      l[r] = alpha * l[r] + row_sum;
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        O_acc[c][2 * r] *= alpha;
        O_acc[c][2 * r + 1] *= alpha;
      }
    }

    // P stays in registers: the C fragments of key tiles 2k and 2k+1 are, element
    // for element, the A fragment of k-step k (rows g / g+8, keys 2t.. / 2t+8..).
    std::uint32_t p_frag[kKeySteps][4];
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
      p_frag[k][0] = pack2<T>(S[2 * k][0], S[2 * k][1]);          // row g,   keys 16k + 2t
      p_frag[k][1] = pack2<T>(S[2 * k][2], S[2 * k][3]);          // row g+8, keys 16k + 2t
      p_frag[k][2] = pack2<T>(S[2 * k + 1][0], S[2 * k + 1][1]);  // row g,   keys 16k + 8 + 2t
      p_frag[k][3] = pack2<T>(S[2 * k + 1][2], S[2 * k + 1][3]);  // row g+8, keys 16k + 8 + 2t
    }

    // O_i += P V_j. V_j is [key][d] row-major = B stored row-major, so ldmatrix
    // .trans hands each lane the (key 2t, 2t+1; column g) pairs B needs. Lanes
    // 0-15 address keys 0-15 at chunk 2c, lanes 16-31 keys 0-15 at chunk 2c+1:
    // matrices = b0, b1 of column tile 2c, then b0, b1 of column tile 2c+1.
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
#pragma unroll
      for (int c = 0; c < kOutTiles; c += 2) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, V_lane + k * 16 * kRowBytes + ((c ^ v_lane_xor) << 4));
        mma_m16n8k16<T>(O_acc[c], p_frag[k], vb[0], vb[1]);
        mma_m16n8k16<T>(O_acc[c + 1], p_frag[k], vb[2], vb[3]);
      }
    }
  }

  // l: join the quad's partial sums, then O = O_acc / l rounded to T. Each lane
  // writes two adjacent columns of rows g and g+8 of every n8 tile; rows past
  // q_len (the last block's tail) are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float row_l = l[r];
    row_l += __shfl_xor_sync(kFullMask, row_l, 1);
    row_l += __shfl_xor_sync(kFullMask, row_l, 2);
    const float inv_l = row_l > 0.f ? 1.f / row_l : 0.f;
    const int i = warp_row0 + g + 8 * r;
    if (i < s.q_len) {
#pragma unroll
      for (int c = 0; c < kOutTiles; ++c) {
        const std::uint32_t bits = pack2<T>(O_acc[c][2 * r] * inv_l, O_acc[c][2 * r + 1] * inv_l);
        *reinterpret_cast<std::uint32_t*>(O_head + i * q_stride + c * 8 + 2 * t) = bits;
      }
      // The row's log-sum-exp, which the backward recomputes P from: exp(scale q.k - LSE) = P.
      if (s.LSE != nullptr && t == 0)
        s.lse_head(b, h)[i] = m[r] + logf(row_l);
    }
  }
}

/// Validates the problem, then launches kWarps warps per (Q tile, head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 10", [&]<class T, int D>() {
    constexpr int Br = kWarps * kRowsPerWarp;
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch);
    kit::launch(async_pipeline_kernel<T, D>, grid, kWarps * kWarpSize, shared_bytes<D, Br>(), stream,
                kit::heads<T, D>(p, t));
  });
}

}  // namespace

/// Step 10 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step10
