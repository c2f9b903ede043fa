/// @file kit.cuh
/// @brief The steps' kit: everything a step's .cu file needs that is not its lesson, written once.
///
/// A step file holds the idea (its kernel); the kit holds the plumbing around it:
///  1. element types: load f32/f16/bf16 as float (to_float), store float as the tensor's type (from_float);
///  2. kernel arguments: Heads<T>, the tensors and sizes of one problem, with 64-bit offsets of each
///     (batch, head), so no problem is capped at 2^31 elements in total;
///  3. what a step supports: Support<DTypes<...>, HeadDims<...>>, declared once at compile time; the
///     registry reads its lists (launcher()) and dispatch() instantiates exactly those;
///  4. launch checks derived from the launch itself: grid and block limits, shared memory against what
///     the device offers (opting in above 48 KiB once per kernel and device), the step's minimum
///     compute capability; and the kernel's resources (registers, occupancy) from the same launch.
///
/// A step's launcher, whole:
/// @code
///   using Support = kit::Support<kit::DTypes<float, __half>, kit::HeadDims<32, 64, 128>>;
///   void launch(const AttentionProblem& p, const AttentionTensors& t, cudaStream_t stream) {
///     kit::dispatch<Support>(p, t, "step 06", [&]<class T, int D>() {
///       const dim3 grid(kit::ceil_div(p.q_len, Br), p.q_heads, p.batch), block(Bc, Br);
///       kit::launch(sp_reuse_kernel<T, D>, grid, block, shared_bytes<D>(), stream, kit::heads<T, D>(p, t));
///     });
///   }
///   Launcher launcher() { return kit::launcher<Support>(&launch); }  // what the registry lists
/// @endcode
#pragma once

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/problem.hpp"
#include "fa/kit.hpp"
#include "fa/registry.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace fa::kit {

// ---------------------------------------------------------------------------
// 1. Element types. Tensors are stored as float, __half or __nv_bfloat16;
//    every step computes in float (or wider) and converts only at loads and stores.
// ---------------------------------------------------------------------------

/// An element of Q, K or V as float (exact for all three types).
///@{
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
///@}

/// A float rounded to nearest in the output's type T.
///@{
template <class T> __device__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
///@}

/// The DType of element type T.
template <class T> inline constexpr DType dtype_of = DType::f32;
/// @cond
template <> inline constexpr DType dtype_of<__half> = DType::f16;
template <> inline constexpr DType dtype_of<__nv_bfloat16> = DType::bf16;
/// @endcond

// ---------------------------------------------------------------------------
// 2. Kernel arguments.
// ---------------------------------------------------------------------------

/// One problem as a kernel sees it: the four tensors ([batch, seq, heads, head_dim], contiguous), the
/// sizes, the mask and the scale. Passed by value. The head accessors add the (batch, head) offset in
/// 64-bit arithmetic; offsets inside one sequence (row * stride + column) stay 32-bit, which validate()
/// guarantees: q_len * q_heads * head_dim and kv_len * kv_heads * head_dim are below 2^31.
///
/// D is the head dimension when the kernel is compiled for one (its template parameter), so that
/// strides and offsets are multiples of a constant the compiler sees; D = 0 reads head_dim at run time.
/// Kernels copy the head pointers into `__restrict__` locals: the compiler honours __restrict__ on
/// kernel parameters and locals, not on struct members, and it lets loads use the read-only path.
template <class T, int D = 0>
struct Heads {
  const T* Q;  ///< [batch, q_len, q_heads, head_dim]
  const T* K;  ///< [batch, kv_len, kv_heads, head_dim]
  const T* V;  ///< [batch, kv_len, kv_heads, head_dim]
  T* O;        ///< [batch, q_len, q_heads, head_dim]
  float* LSE;  ///< [batch, q_heads, q_len] fp32 row log-sum-exp; nullptr when the caller does not ask for it
  int q_len;     ///< Nq: query rows per sequence
  int kv_len;    ///< Nkv: keys per sequence
  int q_heads;   ///< query heads
  int kv_heads;  ///< KV heads (q_heads is a multiple)
  int head_dim;  ///< d (equal to D when D > 0)
  bool causal;   ///< top-left causal mask: query i sees keys j <= i
  float scale;   ///< softmax scale applied to Q·Kᵀ

  /// The head dimension: D, or head_dim when the kernel is not compiled for one.
  __host__ __device__ int dim() const {
    if constexpr (D > 0) return D;
    else return head_dim;
  }
  /// Elements from one row of a query (or output) head to the next: q_heads * d.
  __host__ __device__ int q_stride() const { return q_heads * dim(); }
  /// Elements from one row of a key (or value) head to the next: kv_heads * d.
  __host__ __device__ int kv_stride() const { return kv_heads * dim(); }
  /// First element of query head h of sequence b (row 0); row i is i * q_stride() further.
  __host__ __device__ const T* q_head(int b, int h) const { return Q + q_offset(b, h); }
  /// First element of output head h of sequence b.
  __host__ __device__ T* o_head(int b, int h) const { return O + q_offset(b, h); }
  /// First element of key head kv_h of sequence b; row j is j * kv_stride() further.
  __host__ __device__ const T* k_head(int b, int kv_h) const { return K + kv_offset(b, kv_h); }
  /// First element of value head kv_h of sequence b.
  __host__ __device__ const T* v_head(int b, int kv_h) const { return V + kv_offset(b, kv_h); }
  /// Log-sum-exp of query head h of sequence b, row 0; row i is i further (LSE is [batch, q_heads, q_len]).
  __host__ __device__ float* lse_head(int b, int h) const { return LSE + (std::int64_t(b) * q_heads + h) * q_len; }

  /// Offset of (b, h, row 0) in a tensor shaped like Q: Q, O, and the backward's dO and dQ.
  __host__ __device__ std::int64_t q_offset(int b, int h) const {
    return (std::int64_t(b) * q_len * q_heads + h) * dim();
  }
  /// Offset of (b, kv_h, row 0) in a tensor shaped like K: K, V, and the backward's dK and dV.
  __host__ __device__ std::int64_t kv_offset(int b, int kv_h) const {
    return (std::int64_t(b) * kv_len * kv_heads + kv_h) * dim();
  }
};

/// The backward's arguments: the forward's (Q, K, V, O, LSE and the sizes) and the gradients. dO and dQ
/// are shaped like Q, dK and dV like K; the offsets are the forward's.
template <class T, int D = 0>
struct Grads : Heads<T, D> {
  const T* dO;  ///< dLoss/dO, [batch, q_len, q_heads, head_dim]
  T* dQ;        ///< [batch, q_len, q_heads, head_dim]
  T* dK;        ///< [batch, kv_len, kv_heads, head_dim], summed over the query heads that share the KV head
  T* dV;        ///< [batch, kv_len, kv_heads, head_dim], summed likewise

  /// First element of dO's head h of sequence b.
  __host__ __device__ const T* do_head(int b, int h) const { return dO + this->q_offset(b, h); }
  /// First element of dQ's head h of sequence b.
  __host__ __device__ T* dq_head(int b, int h) const { return dQ + this->q_offset(b, h); }
  /// First element of dK's head kv_h of sequence b.
  __host__ __device__ T* dk_head(int b, int kv_h) const { return dK + this->kv_offset(b, kv_h); }
  /// First element of dV's head kv_h of sequence b.
  __host__ __device__ T* dv_head(int b, int kv_h) const { return dV + this->kv_offset(b, kv_h); }
};

/// The kernel arguments of problem p on tensors t, for element type T (and head dimension D, if the
/// kernel is compiled for one).
template <class T, int D = 0>
Heads<T, D> heads(const AttentionProblem& p, const AttentionTensors& t) {
  return {static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o),
          t.lse, p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.head_dim, p.causal, p.softmax_scale()};
}

/// The backward's kernel arguments of problem p on tensors t (O and LSE read, dQ, dK, dV written).
template <class T, int D = 0>
Grads<T, D> grads(const AttentionProblem& p, const AttentionTensors& t) {
  return {heads<T, D>(p, t), static_cast<const T*>(t.d_o), static_cast<T*>(t.dq), static_cast<T*>(t.dk),
          static_cast<T*>(t.dv)};
}

/// A KV cache's forms as a decode kernel reads them (problem.hpp): each sequence's length, its page table, and
/// where the causal mask's diagonal sits. Passed by value beside Heads.
///
/// The lengths and the table are values on the GPU that the host never reads (a serving loop cannot wait for them):
/// len() and page() check each value as they read it. A length outside 0 .. kv_len reads as 0 keys and a page entry
/// outside the pool as page 0, so a caller's bad value never makes a kernel read outside the cache; the value is
/// recorded in `status` (AttentionTensors::cache_status), which the caller reads after the call.
struct Cache {
  const int* kv_lens;     ///< int32 [batch]: each sequence's keys; nullptr: every sequence has kv_len
  const int* page_table;  ///< int32 [batch, kv_len / page_size]: each sequence's pages; nullptr: contiguous
  int kv_len;             ///< the cache's capacity per sequence
  int page_size;          ///< tokens per page (0: K and V contiguous)
  int pages;              ///< pages in the pool (paged)
  bool bottom_right;      ///< the causal mask's or a window's diagonal aligned to each sequence's end
  int* status;            ///< int32[4]: the record of a refused value (CacheFault), or nullptr

  /// Keys of sequence b (0 for a length outside 0 .. kv_len, recorded).
  __device__ int len(int b) const {
    if (!kv_lens) return kv_len;
    const int n = kv_lens[b];
    if (unsigned(n) <= unsigned(kv_len)) return n;
    refuse(CacheFault::length, b, 0, n, kv_len);
    return 0;
  }
  /// The pool page of page i of sequence b, whose row of the table is `row` (page_table + b x kv_len / page_size)
  /// and whose length is len: row[i], or page 0 for an entry outside the pool (recorded when the length reaches
  /// page i; an entry past it is never a key's and may hold anything).
  __device__ int page(const int* row, int b, int i, int len) const {
    const int entry = row[i];
    if (unsigned(entry) < unsigned(pages)) return entry;
    if (i * page_size < len) refuse(CacheFault::page, b, i, entry, pages);
    return 0;
  }
  /// Records a refused value: {b x 4 + kind, index, value, limit} in one 16-byte store.
  __device__ void refuse(CacheFault kind, int b, int index, int value, int limit) const {
    if (status) *reinterpret_cast<int4*>(status) = make_int4(b * 4 + int(kind), index, value, limit);
  }
};

/// The cache view of problem p on tensors t.
inline Cache cache(const AttentionProblem& p, const AttentionTensors& t) {
  return {t.kv_lens, t.page_table, p.kv_len, p.page_size, p.pages,
          (p.causal || p.windowed()) && p.causal_align == CausalAlign::bottom_right, t.cache_status};
}

/// a / b rounded up: how many tiles of b cover a.
__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

/// A one-dimensional grid of `count` blocks. A count beyond 32 bits saturates instead of wrapping,
/// so kit::launch refuses it (CUDA allows 2^31 - 1 blocks in x).
inline dim3 grid_1d(std::int64_t count) {
  return dim3(unsigned(count < 0 ? 0 : count > 0xffffffffLL ? 0xffffffffLL : count));
}

// ---------------------------------------------------------------------------
// 3. What a step supports, declared once.
// ---------------------------------------------------------------------------

/// The element types a step accepts (float, __half, __nv_bfloat16).
template <class... T> struct DTypes {};
/// The head dimensions a step accepts (each one a template instantiation of its kernel).
template <int... D> struct HeadDims {};

/// What a step supports. Derive from it to change the defaults:
/// @code
///   struct Support : kit::Support<kit::DTypes<__half, __nv_bfloat16>, kit::HeadDims<64, 128>> {
///     static constexpr int min_arch = 80;           // mma.sync needs sm_80
///     static constexpr int pointer_alignment = 16;  // 16-byte vector loads
///   };
/// A step built for sm_90a (wgmma) also sets `arch_specific = true`: it then runs on sm_90 only.
/// @endcode
template <class DTypeList, class HeadDimList>
struct Support;

/// @cond
template <class... T, int... D>
struct Support<DTypes<T...>, HeadDims<D...>> {
  using dtype_list = DTypes<T...>;
  using head_dim_list = HeadDims<D...>;
  static constexpr int min_arch = 0;            ///< lowest compute capability, 10 * major + minor; 0: any
  static constexpr int pointer_alignment = 0;   ///< bytes Q, K, V, O must be aligned to; 0: any
  static constexpr bool needs_workspace = false;  ///< the launcher needs the registry's workspace
  static constexpr Pass pass = Pass::forward;     ///< the half of attention it computes
  /// The KV-cache forms it takes (problem.hpp): none unless a step says, e.g.
  /// `static constexpr CacheForms cache_forms{.kv_lens = true, .bottom_right = true};`
  static constexpr CacheForms cache_forms{};
  /// The models' features it takes (problem.hpp): none unless a step says, e.g.
  /// `static constexpr Features features{.window = true};`
  static constexpr Features features{};
  /// Built for an architecture-specific target (sm_90a: wgmma, setmaxnreg), whose code runs on exactly
  /// min_arch and on no later GPU.
  static constexpr bool arch_specific = false;
};
/// @endcond

/// What the registry lists for a step's launch function `launch` with support S.
template <class S, class... T, int... D>
Launcher launcher_of(LaunchFn launch, WorkspaceFn workspace, DTypes<T...>, HeadDims<D...>) {
  return {launch,    {dtype_of<T>...}, {D...}, S::min_arch, S::pointer_alignment, workspace, S::arch_specific,
          S::pass,   S::cache_forms, S::features};
}
/// What the registry lists for `launch`, read off the step's Support (and its workspace size, if any).
template <class S>
Launcher launcher(LaunchFn launch, WorkspaceFn workspace = nullptr) {
  return launcher_of<S>(launch, workspace, typename S::dtype_list{}, typename S::head_dim_list{});
}

// ---------------------------------------------------------------------------
// 4. Dispatch and launch (their host halves are declared in kit.hpp, defined in kit.cpp).
// ---------------------------------------------------------------------------

/// Launches `kernel` on `stream` after prepare_launch's checks, then checks the launch.
/// `args` convert to the kernel's parameters as in a <<<...>>> launch.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  if (!prepare_launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes)) return;
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  FA_CHECK_LAUNCH();
}

/// How many blocks of `kernel` one SM holds at once, for blocks of `threads` threads and `shared_bytes` of dynamic
/// shared memory (kit.hpp's resident_blocks).
template <class... Params>
int resident_blocks(void (*kernel)(Params...), int threads, std::size_t shared_bytes) {
  return resident_blocks(reinterpret_cast<const void*>(kernel), threads, shared_bytes);
}

/// @cond
template <class... T, int... D>
constexpr bool lists(const AttentionProblem& p, DTypes<T...>, HeadDims<D...>) {
  return ((p.dtype == dtype_of<T>) || ...) && ((p.head_dim == D) || ...);
}
template <class Body, class T, int... D>
bool dispatch_head_dim(int head_dim, Body& body, HeadDims<D...>) {
  return ((head_dim == D ? (body.template operator()<T, D>(), true) : false) || ...);
}
template <class Body, class... T, int... D>
bool dispatch_all(const AttentionProblem& p, Body& body, DTypes<T...>, HeadDims<D...> dims) {
  return ((p.dtype == dtype_of<T> && dispatch_head_dim<Body, T>(p.head_dim, body, dims)) || ...);
}
/// @endcond

/// Validates p, refuses what Support S does not list (before touching the GPU), then runs
/// `body.template operator()<T, D>()` for p's element type T and head dimension D: exactly the
/// instantiations S lists exist. `step` names the step in every message ("step 06").
template <class S, class Body>
void dispatch(const AttentionProblem& p, const AttentionTensors& t, const char* step, Body&& body) {
#ifdef __CUDA_ARCH__
  // Device code of a step is only compiled for GPUs it supports (add_step's MIN_ARCH in CMake).
  static_assert(__CUDA_ARCH__ >= S::min_arch * 10, "this step's device code needs a newer GPU architecture");
#endif
  validate(p);
  if (!lists(p, typename S::dtype_list{}, typename S::head_dim_list{})) refuse_unsupported(step, p, launcher<S>(nullptr));
  refuse_cache_forms(step, p, S::cache_forms);
  refuse_features(step, p, S::features);
  check_tensors(step, t, S::pointer_alignment, S::needs_workspace, S::pass);
  check_cache_tensors(step, p, t, S::pass);
  const LaunchScope scope(step, p, S::min_arch, S::arch_specific);
  dispatch_all(p, body, typename S::dtype_list{}, typename S::head_dim_list{});
}

}  // namespace fa::kit
