/// @file split_kv.cuh
/// @brief Step 42's pieces of split-KV decoding that the later decode steps include: 16-byte loads unpacked to
/// floats, the split rule and the workspace it sizes, and the combine kernel that merges the splits' partial O with their log-sum-exp weights.
#pragma once

#include "fa/kit.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace fa::decode {

/// 8 elements of a 16-byte load as floats.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&out)[8]) {
  const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = kit::to_float(x[e]);
}

/// @name The split rule (host)
/// How many splits each (head, batch) of a decode step gets, chosen from the work and the GPU.
///@{
constexpr int kMinKeysPerSplit = 256;  ///< no split reads fewer keys than this (the merge is not free)
constexpr int kMaxSplits = 128;        ///< the most splits of one (head, batch)
constexpr int kMaxWaves = 4;           ///< the split rule weighs up to this many waves of blocks

/// The most splits the rule below weighs: no split shorter than kMinKeysPerSplit keys, at most kMaxSplits, and no
/// more than kMaxWaves waves of `slots` blocks with `work` blocks a split.
inline int most_splits(int kv_len, std::int64_t work, int slots) {
  const std::int64_t by_waves = std::max<std::int64_t>(1, kMaxWaves * std::int64_t(slots) / work);
  return int(std::clamp<std::int64_t>(std::min<std::int64_t>({by_waves, kv_len / kMinKeysPerSplit, kMaxSplits}), 1,
                                      kMaxSplits));
}

/// How many splits each (head, batch) gets. `slots` split blocks run at once (resident blocks per SM x SMs), and a
/// split has `work` blocks (step 42: batch x q_heads). With s splits there are work x s blocks,
/// waves = work x s / slots of them, and unless waves is whole the last wave leaves SMs idle while the others read:
/// the fill of s is waves / ceil(waves). The rule takes the fewest splits whose fill is within 1 % of the best of
/// 1 .. most_splits (where the work alone fills the GPU in even waves, one split, and no combine).
inline int splits_for(int kv_len, std::int64_t work, int slots) {
  const int most = most_splits(kv_len, work, slots);
  auto fill = [&](int s) {
    const double waves = double(work) * s / slots;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int s = 1; s <= most; ++s) best = std::max(best, fill(s));
  int splits = 1;
  while (fill(splits) < 0.99 * best) ++splits;
  return splits;
}

/// The workspace of a split-KV launch: the splits' partial O ([splits][batch][q_len][q_heads][D] floats), then their
/// LSE ([splits][batch][q_len][q_heads] floats, log2 units); sized for the most splits any launch takes with `work`
/// blocks a split and as many blocks an SM as `threads` a block allow (the launcher counts that many or fewer).
inline std::size_t workspace_bytes(const AttentionProblem& p, std::int64_t work, int threads) {
  const int slots = (2048 / threads) * kit::device_multiprocessors();
  const std::size_t splits = std::size_t(most_splits(p.kv_len, work, slots));
  return splits * std::size_t(p.q_elements() + p.lse_elements()) * sizeof(float);
}
///@}

/// One block per output row (b, i, h), one thread per column: the splits' partials merged with their
/// log-sum-exp weights, O in the tensor's type and, when asked for, LSE (natural log). A row no split saw a key
/// of gets O = 0 and LSE = -inf.
template <class T, int D>
__global__ void __launch_bounds__(D)
combine_kernel(kit::Heads<T, D> s, const float* __restrict__ partial_o, const float* __restrict__ partial_lse,
               int splits, int batch) {
  const int h = blockIdx.x % s.q_heads, i = (blockIdx.x / s.q_heads) % s.q_len, b = blockIdx.x / (s.q_heads * s.q_len);
  const int c = threadIdx.x;
  auto at = [&](int split) { return ((std::int64_t(split) * batch + b) * s.q_len + i) * s.q_heads + h; };
  float M = -INFINITY;
  for (int x = 0; x < splits; ++x) M = fmaxf(M, partial_lse[at(x)]);
  float L = 0.f, O = 0.f;
  if (M != -INFINITY) {
    for (int x = 0; x < splits; ++x) {
      const float w = exp2f(partial_lse[at(x)] - M);  // 0 for a split that saw no key of this row
      L += w;
      O += w * partial_o[at(x) * D + c];
    }
  }
  s.o_head(b, h)[i * s.q_stride() + c] = kit::from_float<T>(L > 0.f ? O / L : 0.f);
  if (s.LSE && c == 0) s.lse_head(b, h)[i] = L > 0.f ? (M + log2f(L)) * 0.69314718f : -INFINITY;  // ln 2
}

}  // namespace fa::decode
