// Step 20: Hopper's own matrix instruction. Step 18 reaches FlashAttention-2 with mma.sync, which on an
// H100 runs at about half of the tensor cores' rate: each warp feeds them 16 x 8 x 16 at a time from
// registers it first loaded with ldmatrix. Hopper multiplies per warpgroup (4 warps, 128 threads): one
// wgmma.mma_async computes 64 x N x 16 straight from shared memory, asynchronously, while the threads go
// on. It reads its operands through descriptors, from tiles in one of a few canonical layouts; here the
// threads themselves put Q, K and V there with step 18's cp.async, 128-byte swizzled. Then one rule of
// Hopper: wgmma reads shared memory through the async proxy, which does not see the threads' writes
// until each writer runs fence.proxy.async and a barrier collects them. Each of two warpgroups owns 64
// of the block's 128 query rows; K/V tiles of 128 keys stream through two stages. The softmax is step
// 18's, on the same fragment layout: a wgmma accumulator is mma.sync's, stacked over 4 warps.
#include "09_tensor_cores/mma.cuh"
#include "11_exp2_softmax/exp2.cuh"
#include "10_async_pipeline/cp_async.cuh"
#include "20_wgmma/wgmma.cuh"
#include "fa/kit.cuh"

#include <cstdint>
#include <type_traits>

namespace fa::step20 {
namespace {

using namespace hopper;
using namespace tc;

/// What this step accepts: wgmma takes 16-bit inputs in this form; it is an sm_90a instruction, so the
/// step is built for sm_90a and runs on sm_90 (H100, H200) only; rows move as 16-byte vectors.
struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
  static constexpr int min_arch = 90;             ///< wgmma.mma_async: sm_90a
  static constexpr bool arch_specific = true;     ///< sm_90a code runs on sm_90 alone
  static constexpr int pointer_alignment = 16;    ///< rows move as 16-byte vectors (cp.async)
};

/// Warpgroups per block: warpgroup w owns query rows 64w .. 64w + 63 of the block's Br = 128, the M of
/// its wgmma.
constexpr int kWarpGroups = 2;                      ///< warpgroups per block
constexpr int kGroupThreads = 4 * kWarpSize;        ///< 128 threads, 4 warps, in a warpgroup
constexpr int kThreads = kWarpGroups * kGroupThreads;  ///< 256 threads per block
constexpr int kGroupRows = 64;                      ///< query rows per warpgroup: wgmma's M
constexpr int Br = kWarpGroups * kGroupRows;        ///< 128 query rows per block

/// Keys per K/V tile: 128, the N of S = Q K^T's wgmma. S (Bc / 8 accumulator tiles) and O (D / 8) hold
/// 64 + 64 floats per thread at d = 128: a warpgroup spreads its 64 rows over 128 threads.
template <int D>
constexpr int kv_tile() {
  return 128;
}

/// Whether a warp skips O's rescale when none of its rows' maxima grew (step 18's vote): at d = 128.
template <int D>
constexpr bool kSkipRescale = D == 128;

/// Blocks per SM the registers are budgeted for (__launch_bounds__): at d = 64 two blocks fit in
/// shared memory (80 KiB each), and while one is in its softmax the other's wgmmas keep the tensor
/// cores busy; that needs at most 128 registers per thread.
template <int D>
constexpr int kBlocksPerSM = D == 64 ? 2 : 1;

/// K/V stages: tile j lives in stage j % kStages.
constexpr int kStages = 2;

/// Columns per chunk: 64 16-bit elements are 128 bytes, one row of the 128-byte swizzle. A tile of
/// width D is stored as D / 64 chunks [rows][64], one after the other: wgmma's canonical K-major layout.
constexpr int kChunk = 64;
constexpr int kChunkRowBytes = 128;  ///< bytes of one row of a chunk

/// Dynamic shared memory: Q_i (Br x D), kStages K tiles and kStages V tiles (Bc x D), all 16-bit; plus
/// 1024 bytes to align the start to a swizzle atom.
template <int D>
constexpr int shared_bytes() {
  return 2 * (Br * D + kStages * 2 * kv_tile<D>() * D) + 1024;
}

/// Starts copying rows [row0, row0 + Rows) of one head of Q, K or V (row r at head + r * stride) into
/// the canonical layout: 16-byte piece p (of 8) of row r of a 64-column chunk goes to piece p ^ (r % 8)
/// of that chunk's row r, the pattern the 128-byte swizzle of a descriptor reads back. Rows at or past
/// `len` are zero-filled. Consecutive threads take consecutive pieces of a row, so the global reads are
/// coalesced and each 8-thread store phase covers one 128-byte row: conflict-free. A thread's rows are
/// kRowsPerPass apart, a multiple of 8, so its swizzle is the same on every pass.
template <int Rows, int D, int kThreads, class T>
__device__ __forceinline__ void load_canonical_async(std::uint32_t tile, const T* head, int row0, int len,
                                                     int stride, int tid) {
  constexpr int kPieces = D / 8;                       // 16-byte pieces per row
  constexpr int kRowsPerPass = kThreads / kPieces;     // rows the block covers per pass
  static_assert(kThreads % kPieces == 0 && Rows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "every thread copies the same number of pieces, with one swizzle");
  const int row = tid / kPieces, piece = tid % kPieces;
  const std::uint32_t dst =
      tile + (piece / 8) * Rows * kChunkRowBytes + row * kChunkRowBytes + (((piece % 8) ^ (row & 7)) << 4);
  const T* src = head + (row0 + row) * stride + piece * 8;
  const int rows_left = len - row0 - row;  // this thread's rows at or past len are zero-filled
#pragma unroll
  for (int pass = 0; pass < Rows / kRowsPerPass; ++pass) {
    const bool in_range = pass * kRowsPerPass < rows_left;
    // Out-of-range rows read nothing, but still name a valid address.
    cp_async_16(dst + pass * kRowsPerPass * kChunkRowBytes, in_range ? src + pass * kRowsPerPass * stride : head,
                in_range ? 16 : 0);
  }
}

/// FlashAttention-2 forward on Hopper's warpgroup MMA. Grid (Tr, q_heads, batch), block of kWarpGroups
/// warpgroups; block x computes rows [q_tile * Br, q_tile * Br + Br) of head h, and warpgroup w owns
/// rows w*64 .. w*64 + 63 of the tile; warp v of it rows 16v .. 16v + 15 of those. kRawMax: the scale
/// is positive, so the row max is taken over raw scores and each exponent is one FMA.
template <class T, int D, bool kRawMax>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM<D>)
wgmma_kernel(kit::Heads<T, D> s, float scale_log2) {
  constexpr int Bc = kv_tile<D>();
  constexpr int kDSteps = D / 16;    // k-steps of S = Q K^T (over the head dimension)
  constexpr int kKeyTiles = Bc / 8;  // n8 tiles of S (keys)
  constexpr int kKeySteps = Bc / 16; // k-steps of O = P V (over keys)
  constexpr int kOutTiles = D / 8;   // n8 tiles of O (columns)
  constexpr std::uint32_t kTileBytes = 2 * Bc * D;  // one K or V tile
  static_assert(D % kChunk == 0 && Bc % 16 == 0, "tiles are whole 64-column chunks and 16-key steps");

  // Every tile starts on a 1024-byte boundary (a swizzle atom), so the descriptors' base offset is 0.
  extern __shared__ __align__(1024) unsigned char shared[];
  const std::uint32_t Q_tile = (smem_address(shared) + 1023) & ~1023u;  // D / kChunk x [Br][64] swizzled
  const std::uint32_t K_tile = Q_tile + 2 * Br * D;                     // stage s: + s * kTileBytes
  const std::uint32_t V_tile = K_tile + kStages * kTileBytes;           // stage s: + s * kTileBytes

  const int tid = threadIdx.x;
  const int group = tid / kGroupThreads;           // warpgroup
  const int warp = (tid % kGroupThreads) / kWarpSize;  // warp within the warpgroup
  const int lane = tid % kWarpSize;
  const int g = lane >> 2;  // groupID: this lane's rows are g and g + 8 of its warp's 16
  const int t = lane & 3;   // threadID_in_group: its columns are 2t, 2t+1 of every n8 tile
  // Causal blocks further down the sequence do more work: start them first.
  const int q_tile = s.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = q_tile * Br;              // first row of the block
  const int warp_row0 = i0 + group * kGroupRows + warp * 16;
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

  // Tile j's K and V go to stage j % kStages, every thread copying its pieces with cp.async, one
  // commit group per tile (empty past the last tile, so every tile's group is the same count back).
  // Keys past kv_len (of this sequence) arrive as zeros and are masked below.
  auto load_kv = [&](int j) {
    const int stage = j % kStages;
    if (j < Tc) {
      load_canonical_async<Bc, D, kThreads>(K_tile + stage * kTileBytes, K_head, j * Bc, s.kv_len, kv_stride, tid);
      load_canonical_async<Bc, D, kThreads>(V_tile + stage * kTileBytes, V_head, j * Bc, s.kv_len, kv_stride, tid);
    }
    cp_async_commit();
  };

  // Q_i joins tile 0's group; the first kStages K/V tiles start on their way. Rows of Q past q_len
  // arrive as zeros.
  load_canonical_async<Br, D, kThreads>(Q_tile, Q_head, i0, s.q_len, q_stride, tid);
  for (int j = 0; j < kStages; ++j) load_kv(j);

  // Per thread: O for rows g, g+8 of its warp as kOutTiles accumulator tiles; m and l for the same
  // rows. m is the full row max (the 4 lanes of a quad agree on it), of the raw scores when kRawMax,
  // else in log2 units (scores times scale_log2); l is this lane's partial sum over its own columns,
  // joined across the quad at the end.
  float O_acc[kOutTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

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

  // One K/V tile: S = Q_i K_j^T, the online softmax, O_i += P V_j. `masked` is
  // std::true_type or std::false_type, so kMasked is known at compile time and
  // the unmasked copy of this body holds no mask code at all.
  auto process_tile = [&](const int j, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int kv0 = j * Bc;
    const int stage = j % kStages;

    // Tile j has landed: this thread's copies (all groups but tile j + 1's),
    // made visible to wgmma, which reads through the async proxy (the fence),
    // then everyone's (the barrier).
    cp_async_wait<kStages - 1>();
    fence_proxy_async();
    __syncthreads();

    // S = Q_i K_j^T: kDSteps wgmmas, issued back to back, one group, then wait for it.
    float S[kKeyTiles][4];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDSteps; ++k) wgmma_ss<T>(S, q_desc(k), k_desc(stage, k), k > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(S);

    // Without kRawMax, scale into log2 units; then, in the masked copy only,
    // set to -inf the scores of keys past kv_len and, when causal, of keys
    // after their row.
    // Rows past q_len are no longer masked: their
    // Q rows are zeros, so their scores are finite, and they are never written.
    // S[n][e] is row g + 8 (e >= 2) of the warp's 16, key n*8 + 2t + (e & 1).
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (!kRawMax) S[n][e] *= scale_log2;
        if constexpr (kMasked) {
          const int row = warp_row0 + g + (e >= 2 ? 8 : 0);
          const int key = kv0 + n * 8 + 2 * t + (e & 1);
          if (key >= s.kv_len || (s.causal && key > row)) S[n][e] = -INFINITY;
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
    std::uint32_t p_frag[kKeySteps][4];
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) {
      p_frag[k][0] = pack2<T>(S[2 * k][0], S[2 * k][1]);          // row g,   keys 16k + 2t
      p_frag[k][1] = pack2<T>(S[2 * k][2], S[2 * k][3]);          // row g+8, keys 16k + 2t
      p_frag[k][2] = pack2<T>(S[2 * k + 1][0], S[2 * k + 1][1]);  // row g,   keys 16k + 8 + 2t
      p_frag[k][3] = pack2<T>(S[2 * k + 1][2], S[2 * k + 1][3]);  // row g+8, keys 16k + 8 + 2t
    }

    // O_i += P V_j: kKeySteps wgmmas with P from registers and V_j from shared
    // memory, one group. The fence orders the rescale and the packing before them.
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKeySteps; ++k) wgmma_rs<T>(O_acc, p_frag[k], v_desc(stage, k));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(O_acc);

    // Both warpgroups are done reading stage j % kStages (their wgmmas waited
    // for): the threads refill it with tile j + kStages, which loads while the
    // next kStages - 1 tiles compute.
    __syncthreads();
    load_kv(j + kStages);
  };

  // The tiles no row of the block needs masked come first: every key below
  // kv_len and, when causal, at or before the block's first row i0. Only the
  // last tile (when kv_len is not a multiple of Bc) and, when causal, the tile
  // crossing the block's diagonal are left for the masked copy.
  int unmasked_tiles = min(Tc, s.kv_len / Bc);
  if (s.causal) unmasked_tiles = min(unmasked_tiles, (i0 + 1) / Bc);
  int j = 0;
  for (; j < unmasked_tiles; ++j) process_tile(j, std::false_type{});
  for (; j < Tc; ++j) process_tile(j, std::true_type{});

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
        s.lse_head(b, h)[i] =
            row_l > 0.f ? (m[r] * (kRawMax ? scale_log2 : 1.f) + log2f(row_l)) * (1.f / kLog2e) : INFINITY;
    }
  }
}

/// Validates the problem, then launches kWarpGroups warpgroups per (Q tile, head, batch) on `stream`.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 20", [&]<class T, int D>() {
    const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch);
    const float scale_log2 = p.softmax_scale() * kLog2e;  // exp(scale x) = 2^(scale log2(e) x)
    // max(c x) = c max(x) only for c > 0: a zero or negative scale scales first.
    const auto kernel = scale_log2 > 0.f ? wgmma_kernel<T, D, true> : wgmma_kernel<T, D, false>;
    kit::launch(kernel, grid, kThreads, shared_bytes<D>(), stream, kit::heads<T, D>(p, t), scale_log2);
  });
}

}  // namespace

/// Step 20 as the registry lists it.
Launcher launcher() { return kit::launcher<Support>(&launch); }

}  // namespace fa::step20
