/// @file split_kv.cuh
/// @brief Step 41's pieces of split-KV decoding that the later decode steps include: 16-byte loads unpacked to
/// floats, and the combine kernel that merges the splits' partial O with their log-sum-exp weights.
#pragma once

#include "fa/kit.cuh"

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
