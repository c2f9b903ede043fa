/// @file kit.hpp
/// @brief The host half of the steps' kit (see kit.cuh): refusals, launch checks and resources,
/// compiled once in kit.cpp.
#pragma once

#include "fa/device.hpp"
#include "fa/problem.hpp"
#include "fa/registry.hpp"

#include <cuda_runtime.h>

#include <cstddef>

namespace fa::kit {

/// Throws InvalidProblem naming the step, p's dtype or head_dim that `supported` does not list, and
/// what it lists.
[[noreturn]] void refuse_unsupported(const char* step, const AttentionProblem& p, const Launcher& supported);
/// The alignment of a workspace and of a cache status record, whatever the step (16-byte vectors).
inline constexpr unsigned kWorkspaceAlignment = 16;
/// Throws InvalidProblem unless every tensor the pass uses is set and `alignment`-byte aligned and,
/// when `needs_workspace`, t.workspace is set; a workspace and a cache status record, when set, must be
/// kWorkspaceAlignment-byte aligned. LSE is optional in the forward, required in the backward.
void check_tensors(const char* step, const AttentionTensors& t, int alignment, bool needs_workspace,
                   Pass pass = Pass::forward);
/// Throws InvalidProblem unless the device copies the KV-cache forms and features p uses are set: t.kv_lens with
/// per-sequence lengths, t.page_table with a paged cache, t.sinks with sinks, and in the backward t.dsinks (the
/// sinks' gradient, an output) with sinks.
void check_cache_tensors(const char* step, const AttentionProblem& p, const AttentionTensors& t,
                         Pass pass = Pass::forward);
/// Zeroes `bytes` at `data` on `stream` (cudaMemsetAsync), for an output a step sums into with atomics; does
/// nothing while resources() probes the launcher (its tensors are placeholders).
void zero_async(void* data, std::size_t bytes, cudaStream_t stream);

/// While dispatch() runs a step's body, the step and problem that kit::launch reports in its messages,
/// and the compute capability it checks. One per thread; dispatch sets and restores it.
class LaunchScope {
 public:
  /// Makes this the current scope of the calling thread until it is destroyed.
  LaunchScope(const char* step, const AttentionProblem& problem, int min_arch, bool arch_specific = false);
  ~LaunchScope();
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;
  const char* step;                ///< "step 06"
  const AttentionProblem& problem;  ///< the problem being launched
  int min_arch;                    ///< the step's minimum compute capability (0: any)
  bool arch_specific;              ///< the step runs on exactly min_arch (built for sm_90a)

 private:
  LaunchScope* previous_;
};

/// Checks a launch of `kernel` against the grid and block limits, the device's compute capability and
/// shared memory, and opts the kernel into more than 48 KiB of dynamic shared memory on this device
/// (once per kernel and device). Returns true if the launch should go ahead, false when resources()
/// is probing (it then records the kernel's resources instead). Throws InvalidProblem on a refusal.
bool prepare_launch(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes);

/// Resources (threads, shared memory, registers, resident blocks per SM) of the kernel that `launch`
/// would launch for p, found by running the launcher in a mode where kit::launch records instead of
/// launching. Needs a device; launches nothing. Throws InvalidProblem where the launcher would.
KernelResources resources(LaunchFn launch, const AttentionProblem& p);

/// How many blocks of `kernel` (of `threads` threads and `shared_bytes` of dynamic shared memory) one SM of the
/// current device holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor; at least 1): with
/// device_multiprocessors(), the blocks of one full wave. Asked once per kernel, block and device.
int resident_blocks(const void* kernel, int threads, std::size_t shared_bytes);

/// The most shared memory any CUDA GPU gives one block: 227 KiB on sm_90 and sm_100 (H100, H200, B200), after opting
/// in; an A100 gives 163 KiB, an L4 99 KiB, a T4 64 KiB.
constexpr std::size_t kLargestSharedPerBlock = 232448;

/// Throws for a block of `who`'s kernel that asks for `bytes` of shared memory where `device` gives at most `optin`:
/// DeviceLimit when a larger GPU gives that much (the call runs there), InvalidProblem when none does (a mistake in
/// the kernel's sizes, on every GPU). Both name the bytes asked for and the bytes this GPU allows.
[[noreturn]] void refuse_shared_memory(const std::string& who, std::size_t bytes, std::size_t optin,
                                       const std::string& device);

/// Compute capability of the current device, as 10 * major + minor (90 for an H100).
int device_arch();
/// Streaming multiprocessors of the current device (132 on an H100 SXM): a persistent grid's size.
int device_multiprocessors();
/// Throws InvalidProblem unless a device of compute capability `device` (10 * major + minor) meets
/// the step's minimum `min_arch` (equals it, when `arch_specific`: code built for sm_90a runs on sm_90
/// alone). The message names the GPU's and the step's architectures.
void check_arch(const char* step, int device, int min_arch, bool arch_specific = false);

}  // namespace fa::kit
