/// @file reductions.cuh
/// @brief Warp and block reductions (sum and max) built on warp shuffles,
/// written once here and reused by later steps as "02_reductions/reductions.cuh".
///
/// Two levels, because the hardware has two:
///  - a warp (32 lanes that execute together) combines its values with
///    shuffles: each lane reads another lane's register directly, with no
///    shared memory and no barrier;
///  - a block then combines its warps' results through a small shared-memory
///    array (one value per warp), which needs __syncthreads.
///
/// Every function gives the result to every thread that calls it, so a kernel
/// can use a row maximum or a softmax sum right away without broadcasting it.
///
/// Usage (every thread of the block makes each block_* call):
/// @code
///   __shared__ fa::step02::BlockReduceScratch<float> scratch;
///   const float m = fa::step02::block_max(thread_max, scratch);
///   const float l = fa::step02::block_sum(thread_sum, scratch);  // same scratch again: safe
/// @endcode
///
/// The full-warp functions (warp_sum(v), warp_max(v), warp_reduce(v, op)) work
/// in a block of any shape: they only shuffle. The others assume one-dimensional
/// blocks (blockDim.y == blockDim.z == 1): a thread's lane is threadIdx.x % 32
/// and its warp threadIdx.x / 32. Steps 04-07 take their row max and row sum
/// from here.
#pragma once

#include <cuda_runtime.h>

namespace fa::step02 {

/// Lanes per warp on every NVIDIA GPU so far.
constexpr int kWarpSize = 32;
/// Most warps a block can have: 1024 threads / 32.
constexpr int kMaxWarpsPerBlock = 1024 / kWarpSize;
/// Shuffle mask naming all 32 lanes.
constexpr unsigned kFullWarpMask = 0xffffffffu;

/// The operation of warp_sum and block_sum: a + b.
struct SumOp {
  /// a + b.
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

/// The operation of warp_max and block_max: the larger of a and b.
struct MaxOp {
  /// The larger of a and b.
  ///@{
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
  __device__ int operator()(int a, int b) const { return max(a, b); }
  /// Any other type: its own max, found next to the type (step 07's float-float pair).
  template <class T>
  __device__ T operator()(T a, T b) const { return max(a, b); }
  ///@}
};

/// Lane (this lane ^ lane_mask)'s `value`: one step of a butterfly. For a type
/// the hardware cannot shuffle in one piece (step 07's float-float pair), an
/// overload next to that type, found by argument-dependent lookup, takes over.
template <class T>
__device__ T shuffle_xor(T value, int lane_mask) {
  return __shfl_xor_sync(kFullWarpMask, value, lane_mask);
}

/// Reduces `value` with `op` over the 32 lanes of the calling warp and returns
/// the result to every lane: a butterfly. At each of 5 steps lane L combines its
/// value with lane L ^ offset's (offset 16, 8, 4, 2, 1), so after the last step
/// every lane holds the result of all 32, bit for bit the same in every lane
/// (a + b == b + a in floating point too). Every lane must make the call.
///
/// @param value this lane's value
/// @param op    SumOp or MaxOp (any associative, commutative operation on T)
template <class T, class Op>
__device__ T warp_reduce(T value, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value = op(value, shuffle_xor(value, offset));
  return value;
}

/// Reduces `value` with `op` over lanes 0 .. lanes-1 of the calling warp and
/// returns the result to every one of those lanes.
///
/// A full warp (lanes == 32) is the butterfly above.
///
/// A partial warp (lanes < 32: the last warp of a block whose size is not a
/// multiple of 32) has no lanes lanes..31, and a shuffle from a lane that does
/// not exist returns garbage. So it folds the upper half onto the lower half
/// (__shfl_down_sync), a lane whose partner does not exist keeps its value (as
/// if the missing lane held the identity), lane 0 ends with the result and
/// broadcasts it. The shuffle mask names exactly the lanes that exist.
///
/// @param value this lane's value
/// @param op    SumOp or MaxOp (any associative, commutative operation)
/// @param lanes how many lanes, counted from lane 0, take part: 1..32; they
///              must all make the call (the warp must not be diverged here)
template <class T, class Op>
__device__ T warp_reduce(T value, Op op, int lanes) {
  if (lanes == kWarpSize) return warp_reduce(value, op);
  const unsigned mask = (1u << lanes) - 1u;  // lanes 0 .. lanes-1
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const T partner = __shfl_down_sync(mask, value, offset);
    if (lane + offset < lanes) value = op(value, partner);
  }
  return __shfl_sync(mask, value, 0);
}

/// Sum of `value` over the 32 lanes of the warp, returned to each of them.
template <class T>
__device__ T warp_sum(T value) {
  return warp_reduce(value, SumOp{});
}
/// Sum of `value` over lanes 0 .. lanes-1 of the warp, returned to each of them.
/// @see warp_reduce for the rules on `lanes`.
template <class T>
__device__ T warp_sum(T value, int lanes) {
  return warp_reduce(value, SumOp{}, lanes);
}

/// Maximum of `value` over the 32 lanes of the warp, returned to each of them.
template <class T>
__device__ T warp_max(T value) {
  return warp_reduce(value, MaxOp{});
}
/// Maximum of `value` over lanes 0 .. lanes-1 of the warp, returned to each of them.
/// @see warp_reduce for the rules on `lanes`.
template <class T>
__device__ T warp_max(T value, int lanes) {
  return warp_reduce(value, MaxOp{}, lanes);
}

/// Shared memory for one block reduction: one partial result per warp.
/// Declare it `__shared__` in the kernel; one object serves any number of
/// block reductions of type T, one after the other.
template <class T>
struct BlockReduceScratch {
  T warp_results[kMaxWarpsPerBlock];  ///< lane 0 of warp w writes entry w
};

/// Reduces `value` with `op` over every thread of the block and returns the
/// result to every thread (bit for bit the same in all of them).
///
/// Level 1: each warp reduces its own lanes with shuffles (the last warp may
/// be partial). Level 2: lane 0 of each warp writes its warp's result to
/// `scratch`, and after a barrier every thread combines those (at most 32)
/// values in the same order; the reads are broadcasts (every lane reads the
/// same address), so no bank conflicts. A block of one warp stops after level 1.
///
/// A barrier before the write makes back-to-back calls on the same scratch
/// safe: no warp overwrites a partial result that a slower warp is still
/// reading in the previous call. Code that writes `scratch` for any other
/// purpose after a call needs its own __syncthreads first.
///
/// Every thread of the block must make the call (it contains __syncthreads),
/// for any blockDim.x from 1 to 1024.
template <class T, class Op>
__device__ T block_reduce(T value, Op op, BlockReduceScratch<T>& scratch) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warps = (int(blockDim.x) + kWarpSize - 1) / kWarpSize;

  // Level 1: within each warp.
  const int lanes_in_warp = min(kWarpSize, int(blockDim.x) - warp * kWarpSize);
  value = warp_reduce(value, op, lanes_in_warp);
  if (warps == 1) return value;  // the same for every thread of the block: no divergent barrier

  // Level 2: across warps, through shared memory.
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch.warp_results[warp] = value;
  __syncthreads();  // every warp's result is written before anyone reads
  T result = scratch.warp_results[0];
  for (int w = 1; w < warps; ++w) result = op(result, scratch.warp_results[w]);
  return result;
}

/// Sum of `value` over every thread of the block, returned to every thread.
/// Every thread of the block must call it. @see block_reduce
template <class T>
__device__ T block_sum(T value, BlockReduceScratch<T>& scratch) {
  return block_reduce(value, SumOp{}, scratch);
}

/// Maximum of `value` over every thread of the block, returned to every thread.
/// Every thread of the block must call it. @see block_reduce
template <class T>
__device__ T block_max(T value, BlockReduceScratch<T>& scratch) {
  return block_reduce(value, MaxOp{}, scratch);
}

}  // namespace fa::step02
