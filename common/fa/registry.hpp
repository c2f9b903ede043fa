/// @file registry.hpp
/// @brief Every step of the course, listed in one place, and how to run one.
///
/// The harness and the runner see steps only through this list: adding a step
/// is one folder under steps/ plus one line in registry.cpp.
#pragma once

#include "fa/device.hpp"
#include "fa/host_tensor.hpp"
#include "fa/problem.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace fa {

/// Runs one attention call on `stream`. Validates the problem first and throws
/// InvalidProblem before touching the GPU if it is malformed or unsupported.
using LaunchFn = void (*)(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
/// Bytes of scratch device memory a call needs (beyond Q, K, V and O).
using WorkspaceFn = std::size_t (*)(const AttentionProblem&);

/// What a step's .cu file exports for one of its variants, made by kit::launcher<Support>(): the
/// launch function, and what it accepts, read from the step's compile-time Support (kit.cuh). The
/// registry copies it into the step's StepInfo; nothing else writes a step's support down.
struct Launcher {
  LaunchFn launch = nullptr;    ///< validates, then launches on the given stream
  std::vector<DType> dtypes;    ///< element types it accepts
  std::vector<int> head_dims;   ///< head dimensions it accepts
  int min_arch = 0;             ///< lowest compute capability, 10 * major + minor (80 = sm_80); 0: any
  int pointer_alignment = 0;    ///< bytes Q, K, V and O must be aligned to (0: any)
  WorkspaceFn workspace_bytes = nullptr;  ///< nullptr: needs no workspace
  bool arch_specific = false;   ///< built for sm_<min_arch>a: runs on exactly min_arch
  Pass pass = Pass::forward;    ///< the half of attention it computes
  CacheForms cache_forms;       ///< the KV-cache forms it takes (none: contiguous K/V, one length, top-left)
  Features features;            ///< the models' features it takes (none: no window, soft-cap or sinks)
};

/// One registered implementation: a step (or one variant of a step), or a baseline.
struct StepInfo {
  /// An entry of the registry: who the step is, and what its .cu file exports.
  StepInfo(std::string id, std::string variant, std::string name, std::string summary, const Launcher& launcher,
           bool high_precision_accumulation = false, bool reports_resources = true);

  std::string id;       ///< "01".."NN", or a baseline's name ("cublas")
  std::string variant;  ///< "" for a step's only version; "pad4", "ktrans"... otherwise
  std::string name;     ///< folder name without the number: "naive"
  std::string summary;  ///< one line: what this step changes
  LaunchFn launch = nullptr;   ///< validates, then launches on the given stream
  std::vector<DType> dtypes;   ///< element types it accepts
  std::vector<int> head_dims;  ///< head dimensions it accepts
  int min_arch = 0;            ///< lowest compute capability (80 = sm_80); 0: any GPU
  /// Built for an architecture-specific target (sm_90a, for wgmma): runs on min_arch and no other GPU.
  bool arch_specific = false;
  int pointer_alignment = 0;   ///< bytes Q, K, V and O must be aligned to (0: any)
  WorkspaceFn workspace_bytes = nullptr;  ///< nullptr: needs no workspace
  Pass pass = Pass::forward;   ///< forward (O and LSE) or backward (dQ, dK, dV)
  CacheForms cache_forms;      ///< the KV-cache forms it takes: per-sequence lengths, pages, bottom-right causal
  Features features;           ///< the models' features it takes: a window, soft-capping, sinks
  /// Accumulates in more than float precision (step 07): the harness checks
  /// that its error stays well below step 06's on a long sequence.
  bool high_precision_accumulation = false;
  /// Launches its kernels through kit::launch only, so resources() can probe them (not the cuBLAS baseline).
  bool reports_resources = true;

  /// Whether `dtype` is in dtypes.
  bool supports(DType dtype) const;
  /// Whether `head_dim` is in head_dims.
  bool supports_head_dim(int head_dim) const;
  /// Whether it takes p's dtype, head_dim, KV-cache forms and features (not whether this GPU runs it: runs_on).
  bool supports(const AttentionProblem& p) const {
    return supports(p.dtype) && supports_head_dim(p.head_dim) && takes_cache_forms(p, cache_forms) &&
           takes_features(p, features);
  }
  /// "01", "05-pad4", "cublas".
  std::string label() const;
  /// "sm_80" (or newer), "sm_90a" (exactly sm_90), or "any" when the step runs on every CUDA GPU.
  std::string min_gpu() const;
  /// Whether the step runs on a GPU of compute capability `arch` (10 * major + minor).
  bool runs_on(int arch) const { return arch_specific ? arch == min_arch : arch >= min_arch; }
  /// Scratch bytes for this problem (0 without a WorkspaceFn).
  std::size_t workspace_for(const AttentionProblem& p) const;
  /// Threads, shared memory, registers and resident blocks per SM of the kernel launch() would launch
  /// for p (fa-bench --resources). Needs a device; launches nothing (kit::resources).
  KernelResources resources(const AttentionProblem& p) const;
};

/// Every step in course order.
const std::vector<StepInfo>& all_steps();
/// The standard-attention baseline built from cuBLAS (materialises Nq x Nkv).
const StepInfo& cublas_baseline();
/// Steps and baselines matching a comma-separated list of ids or labels
/// ("01,03", "05-pad4", "cublas"); "all" selects every step (not the baseline).
/// Throws std::invalid_argument naming an id that matches nothing (unknown_step_message).
std::vector<const StepInfo*> select_steps(const std::string& spec);
/// The one implementation a tool that runs one is asked for (fa-run --step, the Python module): the step or
/// baseline whose label is exactly `label` ("11" is step 11, not also 11-f32), else the one implementation
/// select_steps(label) selects. Throws std::invalid_argument naming the labels to choose from when `label` selects
/// several (an id of variants, "05"), and unknown_step_message when it selects none. `listing` names where the
/// list is printed ("fa-run --list").
const StepInfo& step_named(const std::string& label, const std::string& listing);
/// "no step or baseline called '5' (did you mean 05?); known: 01 to 46 (a variant by its label, e.g. 05-pad1),
/// cublas": the refusal of an id that names nothing, with the ids the registry has and what `item` may have meant
/// (the zero-padded id, the id of a step's name, labels that start with it, the label it starts with).
std::string unknown_step_message(const std::string& item);

/// Device copies of one problem's tensors: the inputs, the outputs (poisoned with NaN until a step
/// writes them) and the workspace. A forward call gets Q, K, V, O and LSE; a backward call also O, LSE
/// and dO as inputs and dQ, dK, dV (and, with sinks, dsinks) as outputs.
struct DeviceAttention {
  static constexpr std::uint64_t kPageSeed = 20261127;  ///< the page order of every paged upload
  DeviceBuffer q;          ///< Q on the device
  DeviceBuffer k;          ///< K on the device
  DeviceBuffer v;          ///< V on the device
  DeviceBuffer o;          ///< O: the forward's output (poisoned), or the backward's input
  DeviceBuffer lse;        ///< LSE, f32: the forward's output (poisoned), or the backward's input
  DeviceBuffer workspace;  ///< the step's scratch memory (empty when it needs none)
  DeviceBuffer d_o;        ///< dO (backward only)
  DeviceBuffer dq;         ///< dQ (backward only), poisoned
  DeviceBuffer dk;         ///< dK (backward only), poisoned
  DeviceBuffer dv;         ///< dV (backward only), poisoned
  DeviceBuffer kv_lens;    ///< the problem's per-sequence lengths, int32 [batch] (when it has them)
  DeviceBuffer page_table; ///< a paged problem's page table, int32 [batch, kv_len / page_size]
  DeviceBuffer cache_status;  ///< int32[4], zero: where a decode step records a refused length or page entry
  DeviceBuffer sinks;      ///< the sinks' logits, f32 [q_heads] (with AttentionProblem::sinks)
  DeviceBuffer dsinks;     ///< their gradient, f32 [q_heads] (backward with sinks only), poisoned
  DeviceBuffer cu_seqlens_q;  ///< packed lengths' offsets, int32 [batch + 1] (varlen)
  DeviceBuffer cu_seqlens_k;  ///< the keys' offsets, int32 [batch + 1] (varlen)
  /// Uploads the inputs (and, for a backward call, `backward`'s O, LSE and dO), allocates the outputs
  /// poisoned with NaN and `workspace_bytes` of workspace. A paged problem's K and V are uploaded as its page
  /// pools (to_pages), each sequence's pages in a shuffled order (shuffled_page_table, kPageSeed), the pool's
  /// other pages NaN; per-sequence lengths and the sinks' logits are uploaded too.
  DeviceAttention(const AttentionProblem& p, const AttentionInputs& inputs, std::size_t workspace_bytes,
                  const BackwardInputs* backward = nullptr);
  /// Poisons every output of the pass with NaN (O and LSE, or dQ, dK, dV and, with sinks, dsinks).
  void poison_outputs();
  /// The pointers a LaunchFn takes.
  AttentionTensors tensors() const;
  /// O and LSE as the forward left them.
  HostTensor download_o(const AttentionProblem& p) const;
  HostTensor download_lse(const AttentionProblem& p) const;  ///< LSE, f32 [batch, q_heads, q_len] ([q_heads, total_q])
  /// dQ, dK and dV as the backward left them, and dsinks with sinks.
  Gradients download_gradients(const AttentionProblem& p) const;
  /// The message of the value a decode step refused (cache_fault_message), "" when it refused none.
  std::string cache_fault() const;

 private:
  bool backward_ = false;
};

/// Uploads the inputs, poisons O with NaN, runs a forward step once, waits, and
/// returns O. Throws InvalidProblem (before any GPU work) or CudaError.
HostTensor run_step(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& inputs);

/// The forward step that makes a backward call's O and LSE for p on a GPU of compute capability `arch`: the last
/// in the registry that takes p and runs there (the fastest the course has), among the steps for whole query
/// sequences (a decode step, which takes a few new tokens, is not one). nullptr when none does.
const StepInfo* forward_step_for_backward(const AttentionProblem& p, int arch);

/// A backward call's inputs for timing, where no float64 reference is needed: O and LSE from
/// forward_step_for_backward on this GPU, and a dO uniform in [-1, 1) drawn from `seed`. Throws InvalidProblem when
/// no forward step takes p.
BackwardInputs forward_for_backward(const AttentionProblem& p, const AttentionInputs& inputs, std::uint64_t seed);

/// The same for a backward step: uploads Q, K, V and `backward` (O, LSE, dO), poisons dQ, dK and dV,
/// runs the step once, waits, and returns the gradients.
Gradients run_backward(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& inputs,
                       const BackwardInputs& backward);

}  // namespace fa
