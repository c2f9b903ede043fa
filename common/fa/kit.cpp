/// @file kit.cpp
/// @brief The host half of the steps' kit: refusals, launch checks, shared-memory opt-in, resources.
// The host half of the steps' kit (kit.cuh, kit.hpp): refusals, launch checks, the per-device shared-memory
// opt-in, and resources probed from a launcher. Written once for every step.
#include "fa/kit.hpp"

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>
#include <string>
#include <utility>

namespace fa::kit {
namespace {

// CUDA's grid and block limits, the same on every GPU since compute capability 3.0 (CUDA C++
// Programming Guide, "Compute Capabilities", table of technical specifications). Checked without a
// device, so a refusal never depends on one being present.
constexpr unsigned kMaxGridX = 2147483647u;             ///< 2^31 - 1 blocks in x
constexpr unsigned kMaxGridYZ = 65535u;                 ///< blocks in y and in z
constexpr unsigned kMaxThreadsPerBlock = 1024u;         ///< threads in a block
constexpr std::size_t kDefaultSharedLimit = 48 * 1024;  ///< dynamic shared memory without opting in

thread_local LaunchScope* g_scope = nullptr;      ///< set by dispatch() while a step's body runs
thread_local KernelResources* g_probe = nullptr;  ///< set by resources(): record, do not launch
thread_local bool g_probed = false;               ///< resources() recorded a kernel already

/// What the kit needs to know about one device, read once.
struct DeviceInfo {
  int arch = 0;                  ///< 10 * major + minor
  std::size_t shared_optin = 0;  ///< most shared memory one block may use (after opting in)
  int multiprocessors = 0;       ///< SMs (132 on an H100 SXM)
  std::string name;              ///< "NVIDIA H100 80GB HBM3"
};

/// What the kit knows about one kernel on one device.
struct KernelInfo {
  cudaFuncAttributes attributes{};             ///< registers, static shared memory, max threads
  std::size_t opted_in = kDefaultSharedLimit;  ///< dynamic shared memory the kernel may use so far
  int resident = 0;  ///< resident_blocks' last answer (blocks an SM holds); 0: not asked yet
  std::pair<int, std::size_t> resident_for{0, 0};  ///< the block it answered for: threads, dynamic shared bytes
};

std::mutex g_mutex;                                           ///< guards the two caches below
std::map<int, DeviceInfo> g_devices;                          ///< by device ordinal
std::map<std::pair<const void*, int>, KernelInfo> g_kernels;  ///< by (kernel, device)

/// The current device's ordinal.
int current_device() {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// The current device's info (queried on first use). Caller holds g_mutex.
const DeviceInfo& device_info(int device) {
  auto it = g_devices.find(device);
  if (it != g_devices.end()) return it->second;
  DeviceInfo info;
  int major = 0, minor = 0, optin = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  info.arch = 10 * major + minor;
  info.shared_optin = std::size_t(optin);
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp props{};
  FA_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  info.name = props.name;
  return g_devices.emplace(device, info).first->second;
}

/// "sm_90" for 90.
std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

/// "step 06" and the problem of the launch in progress, for messages.
std::string who() {
  if (!g_scope) return "kernel launch";
  return std::string(g_scope->step) + " (" + g_scope->problem.describe() + ")";
}

/// "16 x 8 x 4".
std::string dims(dim3 d) {
  return std::to_string(d.x) + " x " + std::to_string(d.y) + " x " + std::to_string(d.z);
}

/// What is known of `kernel` on `device`, its attributes asked at first use. Call with g_mutex held.
KernelInfo& kernel_info(const void* kernel, int device) {
  auto [it, first_use] = g_kernels.try_emplace({kernel, device});
  if (first_use) FA_CUDA_CHECK(cudaFuncGetAttributes(&it->second.attributes, kernel));
  return it->second;
}

/// Above 48 KiB of dynamic shared memory a kernel must opt in, per device: once, here. Call with g_mutex held.
void opt_in(KernelInfo& info, const void* kernel, std::size_t shared_bytes) {
  if (shared_bytes > info.opted_in) {
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
    info.opted_in = shared_bytes;
  }
}

}  // namespace

void refuse_unsupported(const char* step, const AttentionProblem& p, const Launcher& supported) {
  auto join = [](const auto& items, auto text) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + text(item);
    return out;
  };
  bool dtype_ok = false;
  for (DType d : supported.dtypes) dtype_ok |= d == p.dtype;
  if (!dtype_ok)
    throw_unsupported(step, "dtype", to_string(p.dtype),
                      join(supported.dtypes, [](DType d) { return std::string(to_string(d)); }));
  throw_unsupported(step, "head_dim", std::to_string(p.head_dim),
                    join(supported.head_dims, [](int d) { return std::to_string(d); }));
}

namespace {
/// "0x7f3a00000001 (workspace)". snprintf, not an ostream: in a Python process that loaded another C++ runtime
/// first (PyTorch's), the module's ostream number formatting crashed on the H200 machine (issue 55).
std::string address_text(std::uintptr_t address, const char* name) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%jx", std::uintmax_t(address));
  return std::string(text) + " (" + name + ")";
}
}  // namespace

void check_tensors(const char* step, const AttentionTensors& t, int alignment, bool needs_workspace, Pass pass) {
  std::vector<std::pair<const char*, const void*>> tensors = {{"Q", t.q}, {"K", t.k}, {"V", t.v}, {"O", t.o}};
  if (pass == Pass::backward)
    tensors.insert(tensors.end(), {{"LSE", t.lse}, {"dO", t.d_o}, {"dQ", t.dq}, {"dK", t.dk}, {"dV", t.dv}});
  for (const auto& [name, pointer] : tensors)
    if (!pointer)
      throw InvalidProblem(std::string(step) + ": tensor " + name + " is missing (a null pointer); the " +
                           to_string(pass) + " pass needs Q, K, V, O" +
                           (pass == Pass::backward ? ", LSE, dO, dQ, dK and dV" : " (and LSE only if asked for)"));
  if (alignment > 1) {
    for (const auto& [name, pointer] : tensors) {
      const auto address = reinterpret_cast<std::uintptr_t>(pointer);
      if (address % unsigned(alignment) != 0) {
        throw_unsupported(step, "tensor address", address_text(address, name),
                          std::to_string(alignment) + "-byte aligned pointers (the kernel moves " +
                              std::to_string(alignment) + "-byte vectors)");
      }
    }
  }
  if (needs_workspace && !t.workspace)
    throw InvalidProblem(std::string(step) +
                         ": needs a workspace of the size its registry entry's workspace_bytes() gives; got none");
  // The workspace and the cache's status record are read and written in 16-byte vectors (partial O, a fault
  // record), whatever the step's inputs: a caller's buffer at an odd address would fault on the GPU.
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"workspace", t.workspace},
                                      {"cache_status", t.cache_status}}) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    if (address % kWorkspaceAlignment != 0) {
      throw_unsupported(step, "tensor address", address_text(address, name),
                        std::to_string(kWorkspaceAlignment) + "-byte aligned " + name +
                            " (cudaMalloc and PyTorch's allocator give 256-byte aligned memory)");
    }
  }
}

void check_cache_tensors(const char* step, const AttentionProblem& p, const AttentionTensors& t, Pass pass) {
  if (!p.kv_lens.empty() && !t.kv_lens)
    throw InvalidProblem(std::string(step) + ": tensor kv_lens is missing (a null pointer); per-sequence lengths " +
                         "need their device copy, int32 [batch]");
  if (p.paged() && !t.page_table)
    throw InvalidProblem(std::string(step) + ": tensor page_table is missing (a null pointer); a paged cache " +
                         "needs it, int32 [batch, kv_len / page_size]");
  if (p.sinks && !t.sinks)
    throw InvalidProblem(std::string(step) + ": tensor sinks is missing (a null pointer); sinks need their logits, " +
                         "float32 [q_heads]");
  if (p.varlen() && (!t.cu_seqlens_q || !t.cu_seqlens_k))
    throw InvalidProblem(std::string(step) + ": tensor " + (t.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q") +
                         " is missing (a null pointer); packed variable lengths need the device copies of both "
                         "offsets, int32 [batch + 1]");
  if (pass == Pass::backward && p.sinks && !t.dsinks)
    throw InvalidProblem(std::string(step) + ": tensor dsinks is missing (a null pointer); the backward with sinks " +
                         "writes their gradient there, float32 [q_heads]");
}

void zero_async(void* data, std::size_t bytes, cudaStream_t stream) {
  if (g_probe || bytes == 0) return;
  FA_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream));
}

LaunchScope::LaunchScope(const char* step_name, const AttentionProblem& p, int arch, bool specific)
    : step(step_name), problem(p), min_arch(arch), arch_specific(specific), previous_(g_scope) {
  g_scope = this;
}

LaunchScope::~LaunchScope() { g_scope = previous_; }

int device_arch() {
  const int device = current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  return device_info(device).arch;
}

int device_multiprocessors() {
  const int device = current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  return device_info(device).multiprocessors;
}

int resident_blocks(const void* kernel, int threads, std::size_t shared_bytes) {
  const int device = current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  KernelInfo& info = kernel_info(kernel, device);
  if (info.resident == 0 || info.resident_for != std::pair{threads, shared_bytes}) {
    // Without the opt-in, the GPU counts 0 blocks of more than 48 KiB of dynamic shared memory.
    opt_in(info, kernel, shared_bytes);
    int blocks = 0;
    FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes));
    info.resident = std::max(blocks, 1);
    info.resident_for = {threads, shared_bytes};
  }
  return info.resident;
}

void check_arch(const char* step, int device, int min_arch, bool arch_specific) {
  if (arch_specific && device != min_arch)
    throw_unsupported(step, "GPU architecture", arch_name(device),
                      arch_name(min_arch) + " only (the step is built for " + arch_name(min_arch) +
                          "a, whose instructions, such as wgmma, exist on that architecture alone)");
  if (device < min_arch)
    throw_unsupported(step, "GPU architecture", arch_name(device), arch_name(min_arch) + " or newer");
}

void refuse_shared_memory(const std::string& who, std::size_t bytes, std::size_t optin, const std::string& device) {
  const std::string what = who + ": needs " + std::to_string(bytes) + " bytes of shared memory per block; " + device +
                           " allows at most " + std::to_string(optin);
  if (bytes <= kLargestSharedPerBlock)
    throw DeviceLimit(what + " (a GPU of sm_90 or sm_100 gives " + std::to_string(kLargestSharedPerBlock) + ")");
  throw InvalidProblem(what + ", and no GPU gives more than " + std::to_string(kLargestSharedPerBlock));
}

bool prepare_launch(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes) {
  // Limits every CUDA GPU shares: refused before the device is asked anything.
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock)
    throw InvalidProblem(who() + ": a block of " + dims(block) + " threads; CUDA allows 1 to " +
                         std::to_string(kMaxThreadsPerBlock));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridX || grid.y > kMaxGridYZ ||
      grid.z > kMaxGridYZ)
    throw InvalidProblem(who() + ": needs a grid of " + dims(grid) + " blocks; CUDA allows at most " +
                         std::to_string(kMaxGridX) + " x " + std::to_string(kMaxGridYZ) + " x " +
                         std::to_string(kMaxGridYZ) + " (the step's launcher maps sizes onto x, y, z)");

  const int device = current_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  const DeviceInfo& dev = device_info(device);
  if (g_scope) check_arch(g_scope->step, dev.arch, g_scope->min_arch, g_scope->arch_specific);

  KernelInfo& info = kernel_info(kernel, device);
  if (threads > unsigned(info.attributes.maxThreadsPerBlock))
    throw InvalidProblem(who() + ": a block of " + std::to_string(threads) + " threads; this kernel (" +
                         std::to_string(info.attributes.numRegs) + " registers per thread) allows at most " +
                         std::to_string(info.attributes.maxThreadsPerBlock) + " on " + dev.name);
  const std::size_t total_shared = info.attributes.sharedSizeBytes + shared_bytes;
  if (total_shared > dev.shared_optin) refuse_shared_memory(who(), total_shared, dev.shared_optin, dev.name);
  opt_in(info, kernel, shared_bytes);

  if (!g_probe) return true;
  if (!g_probed) {  // the first kernel a launcher launches is the one reported
    KernelResources& r = *g_probe;
    r.threads_per_block = int(threads);
    r.shared_bytes = int(total_shared);
    r.registers = info.attributes.numRegs;
    FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, kernel, int(threads), shared_bytes));
    g_probed = true;
  }
  return false;
}

KernelResources resources(LaunchFn launch, const AttentionProblem& p) {
  // Tensors the launcher never dereferences (nothing is launched): aligned, non-null addresses so
  // that the pointer checks pass and only the problem decides.
  void* placeholder = reinterpret_cast<void*>(std::uintptr_t(1) << 20);
  AttentionTensors tensors{placeholder, placeholder, placeholder, placeholder, placeholder};
  tensors.lse = static_cast<float*>(placeholder);
  tensors.d_o = tensors.dq = tensors.dk = tensors.dv = placeholder;
  tensors.sinks = tensors.dsinks = static_cast<float*>(placeholder);
  KernelResources result;
  g_probe = &result;
  g_probed = false;
  try {
    launch(p, tensors, nullptr);
  } catch (...) {
    g_probe = nullptr;
    throw;
  }
  g_probe = nullptr;
  if (!g_probed) throw std::logic_error("kit::resources: the launcher launched no kernel through kit::launch");
  return result;
}

}  // namespace fa::kit
