/// @file float_float.cuh
/// @brief Float-float arithmetic for step 07: a value held as an unevaluated
/// sum hi + lo of two floats (48 significand bits), built from error-free
/// transformations that use only FP32 instructions.
///
/// Why: most GPUs run FP64 at 1/64 of FP32 (the H100 is the exception), so a
/// second float that carries the rounding error of the first is the portable
/// way to accumulate with more than 24 bits. u = 2^-24 is float's unit
/// roundoff below. The transformations are exact: TwoSum and TwoProd return the
/// rounded result and its rounding error, which is itself a float. Functions
/// are __host__ __device__ so the CPU can check them too.
///
/// References: Knuth, TAOCP vol. 2 (TwoSum); Dekker 1971 (Fast2Sum, the
/// "sloppy" addition and the product); Joldes, Muller, Popescu, "Tight and
/// rigorous error bounds for basic building blocks of double-word arithmetic",
/// ACM TOMS 2017 (the error bounds quoted below).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace fa::ff {

/// hi + lo with |lo| <= ulp(hi) / 2 (normalised). 8 bytes, 8-aligned, so a
/// warp that reads 32 consecutive pairs issues 64-bit loads like for double.
struct __align__(8) FloatFloat {
  float hi;  ///< the value rounded to float
  float lo;  ///< what that rounding lost
  FloatFloat() = default;
  /// hi + lo; a float converts exactly (lo = 0), so FloatFloat(0.f) and FloatFloat(-INFINITY) work.
  __host__ __device__ constexpr FloatFloat(float high, float low = 0.f) : hi(high), lo(low) {}
};

/// TwoSum (Knuth): s + e == a + b exactly, s = fl(a + b). 6 flops, no
/// condition on the operands.
__host__ __device__ inline FloatFloat two_sum(float a, float b) {
  const float s = a + b;
  const float b_part = s - a;       // the part of b that made it into s
  const float a_part = s - b_part;  // the part of a that made it into s
  return {s, (a - a_part) + (b - b_part)};
}

/// Fast2Sum (Dekker): s + e == a + b exactly when |a| >= |b| (or a == 0).
/// 3 flops: used only where the order of magnitude is known.
__host__ __device__ inline FloatFloat fast_two_sum(float a, float b) {
  const float s = a + b;
  return {s, b - (s - a)};
}

/// TwoProd: p + e == a * b exactly, p = fl(a * b). The error of a product is
/// a float, and fmaf computes a*b - p with a single rounding, so exactly.
/// 2 flops.
__host__ __device__ inline FloatFloat two_prod(float a, float b) {
  const float p = a * b;
  return {p, fmaf(a, b, -p)};
}

/// a + b ("sloppy" addition, 11 flops): the hi parts are added exactly, the lo
/// parts and that sum's error in plain float. Absolute error of order
/// u^2 (|a| + |b|): as good as a sum of many terms needs, since float's own
/// sum is off by order u times the sum of the magnitudes. (Its relative error
/// is unbounded under cancellation; nothing here needs it to be.)
__host__ __device__ inline FloatFloat add(FloatFloat a, FloatFloat b) {
  FloatFloat s = two_sum(a.hi, b.hi);
  s.lo += a.lo + b.lo;
  return fast_two_sum(s.hi, s.lo);  // |s.lo| is at most about ulp(s.hi): renormalise
}

/// a - b, as add(a, -b).
__host__ __device__ inline FloatFloat sub(FloatFloat a, FloatFloat b) { return add(a, {-b.hi, -b.lo}); }

/// a * b for a float b (6 flops): the hi product exactly, lo * b added to its
/// error. Relative error of order u^2.
__host__ __device__ inline FloatFloat mul(FloatFloat a, float b) {
  FloatFloat p = two_prod(a.hi, b);
  p.lo = fmaf(a.lo, b, p.lo);
  return fast_two_sum(p.hi, p.lo);
}

/// a * b (8 flops): as above plus the cross term a.hi * b.lo; a.lo * b.lo is
/// of order u^2 |ab| and dropped. Relative error of order u^2.
__host__ __device__ inline FloatFloat mul(FloatFloat a, FloatFloat b) {
  FloatFloat p = two_prod(a.hi, b.hi);
  p.lo = fmaf(a.hi, b.lo, fmaf(a.lo, b.hi, p.lo));
  return fast_two_sum(p.hi, p.lo);
}

/// a * b + c for floats a, b: the product exactly, then one float-float add.
__host__ __device__ inline FloatFloat fma(float a, float b, FloatFloat c) { return add(c, two_prod(a, b)); }

/// a * b + c for a float-float a and a float b.
__host__ __device__ inline FloatFloat fma(FloatFloat a, float b, FloatFloat c) { return add(c, mul(a, b)); }

/// The larger of a and b: compare hi, then lo (exact for normalised pairs).
__host__ __device__ inline FloatFloat max(FloatFloat a, FloatFloat b) {
  return (a.hi > b.hi || (a.hi == b.hi && a.lo > b.lo)) ? a : b;
}

/// exp(x) for x = hi + lo, as expf(hi) * (1 + lo).
///
/// exp(hi + lo) = exp(hi) * exp(lo) and exp(lo) = 1 + lo + lo^2/2 + ...;
/// |lo| <= u |hi|, so dropping lo^2/2 costs a relative u^2 hi^2 / 2, below
/// 2^-35 for every |hi| <= 88 (where expf over- or underflows). What remains is
/// expf's own error, at most 2 ulp (CUDA Programming Guide, single-precision
/// functions): the result is as accurate as a float, not as a float-float. The
/// lo correction still matters: it is the part of x that float rounding would
/// have thrown away, and exp turns an absolute error in x into a relative
/// error in the result (for |x| ~ 30 that is ~30u, far above 2 ulp).
/// fast_two_sum is exact here: |e * lo| < |e| because |lo| < 1.
__host__ __device__ inline FloatFloat exp(FloatFloat x) {
  const float e = expf(x.hi);
  return fast_two_sum(e, e * x.lo);
}

/// exp(a - b) for a finite b and an a that may be -infinity (a masked score,
/// or the running max before the first key): -inf - b in TwoSum would make
/// NaN (inf - inf), so that case returns 0 directly.
__host__ __device__ inline FloatFloat exp_of_difference(FloatFloat a, FloatFloat b) {
  if (a.hi == -INFINITY) return {0.f, 0.f};
  return exp(sub(a, b));
}

/// a / b rounded to float: q = a.hi / b.hi, then one correction with the exact
/// remainder (a.hi - q * b.hi is a float when q is the correctly rounded
/// quotient, and fmaf computes it with no rounding). The lo parts move the
/// quotient by up to ~u relative, so ignoring them would cost as much as the
/// final rounding itself.
__host__ __device__ inline float div_to_float(FloatFloat a, FloatFloat b) {
  const float q = a.hi / b.hi;
  const float remainder = fmaf(-q, b.hi, a.hi) + a.lo - q * b.lo;
  return q + remainder / b.hi;
}

/// The operators step 07's kernel uses, so that the kernel reads the same for Acc = double and
/// Acc = FloatFloat: a + b, a * b and a *= b are add and mul above; a == b compares both parts.
///@{
__host__ __device__ inline FloatFloat operator+(FloatFloat a, FloatFloat b) { return add(a, b); }
__host__ __device__ inline FloatFloat operator*(FloatFloat a, FloatFloat b) { return mul(a, b); }
__host__ __device__ inline FloatFloat operator*(FloatFloat a, float b) { return mul(a, b); }
__host__ __device__ inline FloatFloat operator*(float a, FloatFloat b) { return mul(b, a); }
__host__ __device__ inline FloatFloat& operator*=(FloatFloat& a, FloatFloat b) { return a = mul(a, b); }
__host__ __device__ inline bool operator==(FloatFloat a, FloatFloat b) { return a.hi == b.hi && a.lo == b.lo; }
///@}

#ifdef __CUDACC__
/// Lane (this lane ^ lane_mask)'s float-float: both halves move together. Step 02's warp
/// reductions find it by argument-dependent lookup (see step02::shuffle_xor).
__device__ inline FloatFloat shuffle_xor(FloatFloat v, int lane_mask) {
  return {__shfl_xor_sync(0xffffffffu, v.hi, lane_mask), __shfl_xor_sync(0xffffffffu, v.lo, lane_mask)};
}
#endif

}  // namespace fa::ff
