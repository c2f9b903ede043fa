// Step 27: FlashAttention-2's backward: K/V tiles outside, Q tiles streamed, nothing N x N in memory.
//
// Step 26 wrote P and dS for every (query, key) pair. Here one block owns a tile of Bc keys of one KV
// head and keeps its dK_j and dV_j in registers while it streams every Q_i, dO_i tile (of every query
// head of the GQA group) past it (FlashAttention-2, Algorithm 2): S_ij and P_ij are recomputed from the
// forward's LSE, dS_ij follows from D_i, which a small first kernel computes once per row, and each
// block adds its share of dQ_i = scale dS_ij K_j into a float copy of dQ with atomics, because every
// K/V tile contributes to every row. Memory beyond the inputs and outputs: D and the float dQ, O(N).
#include "26_naive_backward/row_dot.cuh"
#include "27_flash_backward/float_dq.cuh"
#include "fa/kit.cuh"

namespace fa::step27 {
namespace {

/// What this step accepts: CUDA cores in float, like step 26; the workspace holds D and the float dQ.
struct Support : kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>> {
  static constexpr Pass pass = Pass::backward;   ///< dQ, dK, dV from Q, K, V, O, LSE and dO
  static constexpr bool needs_workspace = true;  ///< D and dQ in float; the float dQ starts zero and is left zero
};

constexpr int Br = 16;                 ///< query rows per Q tile
constexpr int Bc = 16;                 ///< keys per K/V tile, one block's
constexpr int kPad = 1;                ///< one word of padding per shared row: lane x starts in bank x (step 05)

/// Shared memory: K_j, V_j (Bc rows), Q_i, dO_i (Br rows), each D + kPad floats a row; P_ij and dS_ij
/// (Br x Bc, padded); LSE_i and D_i (Br each).
constexpr int shared_bytes(int D) {
  return int(sizeof(float)) * (2 * (Bc + Br) * (D + kPad) + 2 * Br * (Bc + kPad) + 2 * Br);
}

/// Block (key tile, kv_h, b), thread (x, y) = (key x of the tile, row y of a Q tile). Each thread holds
/// dK and dV of key x for the columns y, y + Br, ...; it computes S, P, dP and dS at (y, x) of each
/// Q tile, and adds dQ of row y, columns x, x + Bc, ... to the float dQ.
template <class T, int D>
__global__ void __launch_bounds__(Bc * Br)
flash_backward_kernel(kit::Grads<T, D> s, const float* __restrict__ D_rows, float* __restrict__ dQ_acc) {
  constexpr int kRow = D + kPad;         // floats from one shared row of K, V, Q or dO to the next
  constexpr int kColsPerThread = D / Br;  // dK and dV columns a thread accumulates
  constexpr int kQColsPerThread = D / Bc; // dQ columns a thread adds per Q tile
  extern __shared__ float shared[];
  float* K_j = shared;
  float* V_j = K_j + Bc * kRow;
  float* Q_i = V_j + Bc * kRow;
  float* dO_i = Q_i + Br * kRow;
  float* P_ij = dO_i + Br * kRow;                 // Br x (Bc + kPad)
  float* dS_ij = P_ij + Br * (Bc + kPad);         // Br x (Bc + kPad)
  float* LSE_i = dS_ij + Br * (Bc + kPad);
  float* D_i = LSE_i + Br;

  const int x = threadIdx.x, y = threadIdx.y, tid = y * Bc + x;
  const int j0 = blockIdx.x * Bc, kv_h = blockIdx.y, b = blockIdx.z;
  const int group = s.q_heads / s.kv_heads;

  // K_j and V_j stay in shared memory for the whole block; keys past kv_len are zeros (and masked).
  for (int e = tid; e < Bc * D; e += Bc * Br) {
    const int r = e / D, c = e % D;
    const bool key = j0 + r < s.kv_len;
    K_j[r * kRow + c] = key ? kit::to_float(s.k_head(b, kv_h)[(j0 + r) * s.kv_stride() + c]) : 0.f;
    V_j[r * kRow + c] = key ? kit::to_float(s.v_head(b, kv_h)[(j0 + r) * s.kv_stride() + c]) : 0.f;
  }
  float dK[kColsPerThread] = {}, dV[kColsPerThread] = {};

  // Top-left causal: row i sees key j only if j <= i, so rows before j0 see none of this tile.
  const int first_row = s.causal ? j0 : 0;
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    const float* lse_rows = s.lse_head(b, h);
    const float* d_rows = D_rows + (s.lse_head(b, h) - s.LSE);  // D has LSE's layout
    for (int i0 = first_row / Br * Br; i0 < s.q_len; i0 += Br) {
      __syncthreads();  // the previous Q tile's products are done with Q_i, dO_i, P_ij, dS_ij
      for (int e = tid; e < Br * D; e += Bc * Br) {
        const int r = e / D, c = e % D;
        const bool row = i0 + r < s.q_len;
        Q_i[r * kRow + c] = row ? kit::to_float(s.q_head(b, h)[(i0 + r) * s.q_stride() + c]) : 0.f;
        dO_i[r * kRow + c] = row ? kit::to_float(s.do_head(b, h)[(i0 + r) * s.q_stride() + c]) : 0.f;
      }
      if (tid < Br) {
        LSE_i[tid] = i0 + tid < s.q_len ? lse_rows[i0 + tid] : 0.f;
        D_i[tid] = i0 + tid < s.q_len ? d_rows[i0 + tid] : 0.f;
      }
      __syncthreads();

      // Thread (x, y): P_ij = exp(scale q_y . k_x - LSE_y), recomputed; dP = dO_y . v_x; dS = P (dP - D_y).
      const int i = i0 + y, j = j0 + x;
      float p = 0.f, dp = 0.f;
      if (i < s.q_len && j < s.kv_len && (!s.causal || j <= i)) {
        float dot = 0.f;
#pragma unroll 16
        for (int c = 0; c < D; ++c) {
          dot += Q_i[y * kRow + c] * K_j[x * kRow + c];
          dp += dO_i[y * kRow + c] * V_j[x * kRow + c];
        }
        p = expf(s.scale * dot - LSE_i[y]);
      }
      P_ij[y * (Bc + kPad) + x] = p;
      dS_ij[y * (Bc + kPad) + x] = p * (dp - D_i[y]);
      __syncthreads();

      // dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i (scale at the end): key x, columns y + k Br.
#pragma unroll
      for (int k = 0; k < kColsPerThread; ++k) {
        const int c = y + k * Br;
        for (int r = 0; r < Br; ++r) {
          dV[k] += P_ij[r * (Bc + kPad) + x] * dO_i[r * kRow + c];
          dK[k] += dS_ij[r * (Bc + kPad) + x] * Q_i[r * kRow + c];
        }
      }
      // dQ_i += scale dS_ij K_j: row y, columns x + k Bc. Every K/V tile adds to the same rows: atomics.
      if (i < s.q_len) {
        float* dq_row = dQ_acc + s.q_offset(b, h) + std::int64_t(i) * s.q_stride();
#pragma unroll
        for (int k = 0; k < kQColsPerThread; ++k) {
          const int c = x + k * Bc;
          float acc = 0.f;
          for (int r = 0; r < Bc; ++r) acc += dS_ij[y * (Bc + kPad) + r] * K_j[r * kRow + c];
          atomicAdd(dq_row + c, s.scale * acc);
        }
      }
    }
  }

  // dK and dV of the tile's keys, summed over every query row of every head of the group.
  const int j = j0 + x;
  if (j < s.kv_len) {
#pragma unroll
    for (int k = 0; k < kColsPerThread; ++k) {
      const int c = y + k * Br;
      s.dk_head(b, kv_h)[j * s.kv_stride() + c] = kit::from_float<T>(s.scale * dK[k]);
      s.dv_head(b, kv_h)[j * s.kv_stride() + c] = kit::from_float<T>(dV[k]);
    }
  }
}

/// Validates the problem, then launches D, the K/V-tile kernel and dQ's rounding.
void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
  kit::dispatch<Support>(p, t, "step 27", [&]<class T, int D>() {
    float* dQ_acc = static_cast<float*>(t.workspace);
    float* D_rows = dQ_acc + p.q_elements();
    kit::launch(bwd::row_dot_kernel<T>, bwd::row_blocks(p.lse_elements()), bwd::kRowThreads, 0, stream,
                kit::grads<T>(p, t), D_rows, p.lse_elements());
    const dim3 grid(kit::ceil_div(p.kv_len, Bc), p.kv_heads, p.batch), block(Bc, Br);
    kit::launch(flash_backward_kernel<T, D>, grid, block, shared_bytes(D), stream, kit::grads<T, D>(p, t), D_rows,
                dQ_acc);
    kit::launch(bwd::convert_dq_kernel<T>, bwd::row_blocks(p.q_elements()), bwd::kRowThreads, 0, stream, dQ_acc,
                static_cast<T*>(t.dq), p.q_elements());
  });
}

}  // namespace

/// Step 27 as the registry lists it: the launcher and its workspace.
Launcher launcher() { return kit::launcher<Support>(&launch, &bwd::workspace_bytes); }

}  // namespace fa::step27
