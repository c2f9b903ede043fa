/// @file module.cpp
/// @brief fa_course._ext: the course's registered steps called from Python on DLPack tensors (PyTorch, CuPy, JAX),
/// in place and on the caller's stream. Every check is the kit's or fa-run's, with the same message, raised as
/// ValueError (a refusal) or RuntimeError (a CUDA error); the pure-Python package (fa_course/) wraps it for
/// PyTorch.
///
/// Order of the checks, so that a machine without a GPU can test every refusal that needs no GPU:
///  0. a fault an earlier decode call on Q's device recorded (see "Values on the GPU" below);
///  1. the step's name;
///  2. the shapes and element types of every tensor (fa-run's messages);
///  3. the problem and what the step takes (the kit's);
///  4. outputs that share memory with an input or another output (their byte ranges, wherever they live);
///  5. the workspace: there, large enough (its size is asked with Q's device current: a decode step's size
///     follows the SM count) and aligned, with Q, K, V and O's alignment (kit::check_tensors's words);
///  6. where each tensor lives (CUDA memory, Q's device) and its layout;
///  7. then, with Q's device current, the step's launcher, which checks the GPU and launches.
///
/// Values on the GPU. kv_lens and page_table are values on the GPU that no call reads back: a decode call makes no
/// host sync, so a serving loop keeps the GPU fed and torch.cuda.graph can capture the call. The decode kernels
/// check each value as they read it (kit.cuh's Cache): a length outside 0 .. kv_len reads as 0 keys, a page entry
/// outside the pool as page 0, and the kernel records the value in AttentionTensors::cache_status. The module gives
/// every decode call its device's status record, 16 bytes of mapped pinned host memory, and reads it on the host
/// without a sync at the start of the next call on that device, and in check(), which first waits for the device.
/// A record found is cleared and raised as ValueError (fa::cache_fault_message's words, as fa-run and the harness
/// give them): the errors come later, as CUDA reports a kernel's asynchronous errors.
///
/// Devices: every call makes Q's device current while it runs (a decode step's workspace size and split count
/// follow that device's SM count) and gives the caller's current device back when it returns or throws.
#include "fa/call_shapes.hpp"
#include "fa/cuda_check.hpp"
#include "fa/host_tensor.hpp"
#include "fa/kit.hpp"
#include "fa/registry.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace {

using fa::AttentionProblem;
using fa::AttentionTensors;
using fa::DType;
using fa::StepInfo;
using fa::TensorShape;

/// A tensor as Python hands it over: any dtype, shape and device (checked here, by name).
using Tensor = nb::ndarray<>;
using OptionalTensor = std::optional<Tensor>;

/// Makes a device current for the rest of one call, and gives the caller's current device back when the call
/// returns or throws. Nothing is changed (nor asked of CUDA) until use() is called.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0 && current_ != previous_) cudaSetDevice(previous_);  // a destructor does not throw
  }
  /// Makes `device` current (nothing to do where it already is, as in a graph's capture on that device).
  void use(int device) {
    if (previous_ < 0) {
      FA_CUDA_CHECK(cudaGetDevice(&previous_));
      current_ = previous_;
    }
    if (device != current_) {
      FA_CUDA_CHECK(cudaSetDevice(device));
      current_ = device;
    }
  }

 private:
  int previous_ = -1;  ///< the caller's current device (-1: not asked yet)
  int current_ = -1;   ///< the device this guard made current
};

/// Each CUDA device's cache status record (AttentionTensors::cache_status): 4 int32 of pinned host memory mapped
/// into every device's address space, which a decode kernel writes when it refuses a value of kv_lens or
/// page_table, and which the host reads without a sync. Allocated at a device's first decode call, kept for the
/// process.
class CacheStatus {
 public:
  /// The record of `device` as the GPU addresses it, allocated on first use with `device` current.
  static int* on(int device) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto found = records_.find(device);
    if (found != records_.end()) return found->second.device;
    // A first decode call inside a stream capture: allocating pinned memory is not a stream operation, so the
    // capture may allow it (torch.cuda.graph captures in its global mode; a warm-up call before it, as PyTorch's
    // documentation asks, makes the record first).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    FA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* host = nullptr;
    const cudaError_t allocated = cudaHostAlloc(&host, 4 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable);
    void* mapped = nullptr;
    const cudaError_t got = allocated == cudaSuccess ? cudaHostGetDevicePointer(&mapped, host, 0) : allocated;
    FA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    FA_CUDA_CHECK(allocated);
    FA_CUDA_CHECK(got);
    volatile int* record = static_cast<volatile int*>(host);
    for (int i = 0; i < 4; ++i) record[i] = 0;
    records_[device] = {static_cast<int*>(host), static_cast<int*>(mapped)};
    return static_cast<int*>(mapped);
  }

  /// Throws ValueError for a fault `device`'s decode calls recorded, and clears the record; reads it as it stands
  /// (a kernel still running may write it later: check() waits for the device first). `reporter` says who reads.
  static void report(int device, const std::string& reporter) {
    int record[4] = {0, 0, 0, 0};
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto found = records_.find(device);
      if (found == records_.end()) return;
      volatile int* host = found->second.host;
      if (host[0] == 0) return;  // kind 0 in sequence 0: nothing recorded
      for (int i = 0; i < 4; ++i) record[i] = host[i];
      for (int i = 0; i < 4; ++i) host[i] = 0;
    }
    throw std::invalid_argument(fa::cache_fault_message(record) + " (recorded by a decode call on CUDA device " +
                                std::to_string(device) + ", reported by " + reporter + ")");
  }

 private:
  struct Record {
    int* host;    ///< where the host reads it
    int* device;  ///< where the GPU writes it
  };
  static inline std::mutex mutex_;
  static inline std::map<int, Record> records_;
};

/// Reports (step 0 of the checks) a fault an earlier decode call on the device of `q` recorded.
void report_earlier_faults(const Tensor& q) {
  if (q.device_type() == nb::device::cuda::value)
    CacheStatus::report(q.device_id(), "the next call on it; fa_course.check() waits for the calls in flight");
}

/// The registered step whose label is `label` ("11", "11-f32", "05-pad4"), else the one step `label` selects, or
/// a refusal naming what it selects (fa::step_named).
const StepInfo& step_named(const std::string& label) { return fa::step_named(label, "fa_course.steps()"); }

/// "DLPack code 2, 64 bits": an element type the messages can name.
std::string dlpack_name(const nb::dlpack::dtype& d) {
  return "DLPack code " + std::to_string(int(d.code)) + ", " + std::to_string(int(d.bits)) + " bits";
}

/// The course's element type of t, or a refusal naming it.
DType dtype_of(const Tensor& t, const std::string& name) {
  const nb::dlpack::dtype d = t.dtype();
  if (d.lanes == 1 && d.code == std::uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 32) return DType::f32;
  if (d.lanes == 1 && d.code == std::uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 16) return DType::f16;
  if (d.lanes == 1 && d.code == std::uint8_t(nb::dlpack::dtype_code::Bfloat) && d.bits == 16) return DType::bf16;
  throw std::invalid_argument(name + ": its element type (" + dlpack_name(d) +
                              ") is not one the steps take: float32, float16 or bfloat16");
}

/// t's shape as a vector.
std::vector<std::int64_t> shape_vector(const Tensor& t) {
  std::vector<std::int64_t> shape(t.ndim());
  for (std::size_t i = 0; i < t.ndim(); ++i) shape[i] = std::int64_t(t.shape(i));
  return shape;
}

/// t's name, shape and element type, for call_shapes' checks.
TensorShape shape_of(const Tensor& t, const std::string& name) { return {name, shape_vector(t), dtype_of(t, name)}; }

/// Refuses a tensor that is not in CUDA device memory, not on `device` (when >= 0), or not contiguous row-major.
void check_memory(const Tensor& t, const std::string& name, int device) {
  if (t.device_type() != nb::device::cuda::value)
    throw std::invalid_argument(name + ": the tensor is not in CUDA device memory (DLPack device type " +
                                std::to_string(t.device_type()) + "); the steps read and write GPU memory: move "
                                "it there first (tensor.cuda() in PyTorch)");
  if (device >= 0 && t.device_id() != device)
    throw std::invalid_argument(name + ": the tensor is on CUDA device " + std::to_string(t.device_id()) +
                                ", the call's Q on device " + std::to_string(device) + "; put them on one device");
  std::int64_t expected = 1;
  for (std::size_t i = t.ndim(); i-- > 0;) {
    if (t.shape(i) != 1 && t.stride(i) != expected)
      throw std::invalid_argument(name + ": its strides are not those of a contiguous row-major tensor of shape " +
                                  fa::shape_text(shape_vector(t)) + "; pass tensor.contiguous()");
    expected *= std::int64_t(t.shape(i));
  }
}

/// Refuses an int32 tensor of another shape than `shape` (kv_lens, the page table).
void check_ints(const Tensor& t, const std::string& name, const std::vector<std::int64_t>& shape) {
  const nb::dlpack::dtype d = t.dtype();
  if (d.lanes != 1 || d.code != std::uint8_t(nb::dlpack::dtype_code::Int) || d.bits != 32 || shape_vector(t) != shape)
    throw std::invalid_argument(name + ": must be int32 " + fa::shape_text(shape) + "; got " +
                                fa::shape_text(shape_vector(t)) + " " + dlpack_name(d));
}

/// "top-left" or "bottom-right".
fa::CausalAlign causal_align_named(const std::string& text) {
  if (text == "top-left") return fa::CausalAlign::top_left;
  if (text == "bottom-right") return fa::CausalAlign::bottom_right;
  throw std::invalid_argument("causal_align '" + text + "' is not one of: top-left, bottom-right");
}

/// A tensor of a call by its argument's name (nullptr: not given).
struct Named {
  const char* name;
  const Tensor* tensor;
};

/// The bytes a tensor's elements span, [low, high) from its data pointer and strides (empty for no elements), on
/// its device (DLPack's device type and id).
struct Span {
  std::int32_t type = 0, id = 0;
  std::uintptr_t low = 0, high = 0;
};

Span span_of(const Tensor& t) {
  const std::int64_t item = (std::int64_t(t.dtype().bits) * t.dtype().lanes + 7) / 8;
  std::int64_t below = 0, above = 0;  // element offsets of the first and last element from data()
  for (std::size_t i = 0; i < t.ndim(); ++i) {
    if (t.shape(i) == 0) return {t.device_type(), t.device_id(), 0, 0};
    const std::int64_t reach = (std::int64_t(t.shape(i)) - 1) * std::int64_t(t.stride(i));
    (reach < 0 ? below : above) += reach;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(t.data());
  return {t.device_type(), t.device_id(), base + std::uintptr_t(below * item),
          base + std::uintptr_t((above + 1) * item)};
}

/// Refuses an output whose bytes overlap an input's or an earlier output's: the kernels would race on them (dK
/// written over Q while blocks still read Q), with a wrong result and no error.
void check_overlaps(const std::vector<Named>& outputs, const std::vector<Named>& inputs) {
  std::vector<Named> seen = inputs;
  for (const Named& out : outputs) {
    if (!out.tensor) continue;
    const Span o = span_of(*out.tensor);
    for (const Named& other : seen) {
      if (!other.tensor) continue;
      const Span s = span_of(*other.tensor);
      if (o.type == s.type && o.id == s.id && o.low < s.high && s.low < o.high)
        throw std::invalid_argument(std::string(out.name) + " overlaps " + other.name +
                                    ": an output may not share memory with an input or another output (they "
                                    "would race); pass a separate tensor");
    }
    seen.push_back(out);
  }
}

/// One call's problem and pointers, read off the tensors with every check that needs no GPU.
struct Call {
  const StepInfo& step;
  AttentionProblem p;
  AttentionTensors t;
  bool on_gpu = false;  ///< Q is in CUDA memory (refused at the memory checks otherwise)
  int device = -1;      ///< the CUDA device of Q, when on_gpu
  std::string name;     ///< "step 46", as the kit's messages name it
  std::size_t workspace_bytes = 0;  ///< what the step asks for (check 5)
};

/// The problem of a call, with checks 1-3 (the backward's O, LSE and dO are checked by the caller): Q, K and V,
/// the causal mask, the scale and the KV cache's forms. A page table makes K and V page pools [pages, page_size,
/// Hkv, d] and the cache's capacity pages_per_sequence x page_size. kv_lens and the page table are never read on
/// the host: the problem takes each length as the capacity, and the decode kernels check the values (see the top).
/// The models' features of a call (issue 58), FlashAttention's names: window_size = (left, right) (-1: an open
/// side), softcap (0: none), sinks (float32 [Hq], one logit a query head, or none), and a pack's offsets
/// cu_seqlens_q and cu_seqlens_k (int32 [B + 1] each; Q, K, V then [total, H, d]).
struct FeatureArgs {
  int window_left = -1;
  int window_right = -1;
  double softcap = 0;
  OptionalTensor sinks;
  OptionalTensor cu_seqlens_q;
  OptionalTensor cu_seqlens_k;
};

/// A pack's offsets as the host reads them: int32 [n], copied from the GPU when they live there (cudaMemcpy: the
/// one host sync of a packed call; the problem's validation and the launcher's tile count read them).
std::vector<int> offsets_of(const Tensor& t, const std::string& name) {
  if (t.ndim() != 1) throw std::invalid_argument(name + ": must be int32 [B + 1]; got " + fa::shape_text(shape_vector(t)));
  check_ints(t, name, {std::int64_t(t.shape(0))});
  std::vector<int> values(t.shape(0));
  if (t.device_type() == nb::device::cuda::value)
    FA_CUDA_CHECK(cudaMemcpy(values.data(), t.data(), values.size() * sizeof(int), cudaMemcpyDeviceToHost));
  else
    std::memcpy(values.data(), t.data(), values.size() * sizeof(int));
  return values;
}

Call call_for(const std::string& label, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
              std::optional<double> scale, const std::string& causal_align, const OptionalTensor& kv_lens,
              const OptionalTensor& page_table, fa::Pass pass, const FeatureArgs& features = {}) {
  const StepInfo& step = step_named(label);
  if (step.pass != pass)
    throw std::invalid_argument("step " + step.label() + " is a " + fa::to_string(step.pass) + " step; call " +
                                (step.pass == fa::Pass::backward ? "backward()" : "forward()") + " with it");
  const TensorShape q_shape = shape_of(q, "q");  // q, k, v: the first one refused is the first named
  TensorShape k_shape = shape_of(k, "k"), v_shape = shape_of(v, "v");
  std::int64_t page_size = 0, pages = 0;
  if (page_table) {  // K and V are pools: read the problem off the shape they would have unpaged
    if (k_shape.shape.size() != 4 || v_shape.shape != k_shape.shape || page_table->ndim() != 2 ||
        q.ndim() != 4 || std::int64_t(page_table->shape(0)) != std::int64_t(q.shape(0)))
      throw std::invalid_argument("page_table: a paged call takes the page table int32 [B, pages per sequence] "
                                  "with Q's batch, and K and V pools [pages, page_size, Hkv, d] of one shape; got "
                                  "page_table " + fa::shape_text(shape_vector(*page_table)) + ", K " +
                                  fa::shape_text(k_shape.shape) + ", V " + fa::shape_text(v_shape.shape));
    pages = k_shape.shape[0], page_size = k_shape.shape[1];
    k_shape.shape = v_shape.shape = {std::int64_t(q.shape(0)), std::int64_t(page_table->shape(1)) * page_size,
                                     k_shape.shape[2], k_shape.shape[3]};
  }
  if (features.cu_seqlens_q.has_value() != features.cu_seqlens_k.has_value())
    throw std::invalid_argument("a pack needs both cu_seqlens_q and cu_seqlens_k (int32 [B + 1] each; equal for "
                                "self-attention)");
  if (features.cu_seqlens_q && (page_table || kv_lens))
    throw std::invalid_argument("a pack (cu_seqlens_q, cu_seqlens_k) takes no page_table or kv_lens: its sequences' "
                                "lengths are in its offsets");
  Call call{step,
            features.cu_seqlens_q
                ? fa::problem_from_packed(q_shape, k_shape, v_shape, offsets_of(*features.cu_seqlens_q, "cu_seqlens_q"),
                                          offsets_of(*features.cu_seqlens_k, "cu_seqlens_k"))
                : fa::problem_from(q_shape, k_shape, v_shape),
            {}, false, -1, "step " + step.label(), 0};
  AttentionProblem& p = call.p;
  p.causal = causal;
  if (scale) p.scale = float(*scale);
  p.causal_align = causal_align_named(causal_align);
  if (page_table) {
    check_ints(*page_table, "page_table", {p.batch, std::int64_t(page_table->shape(1))});
    p.page_size = int(page_size), p.pages = int(pages);
  }
  if (kv_lens) {  // the lengths' values stay on the GPU: to the host, each is the capacity
    check_ints(*kv_lens, "kv_lens", {p.batch});
    p.kv_lens.assign(std::size_t(p.batch), p.kv_len);
  }
  p.window_left = features.window_left, p.window_right = features.window_right;
  p.softcap = float(features.softcap), p.sinks = features.sinks.has_value();
  if (features.sinks) {
    const TensorShape sinks_shape = shape_of(*features.sinks, "sinks");
    if (sinks_shape.dtype != DType::f32 || sinks_shape.shape != std::vector<std::int64_t>{p.q_heads})
      throw std::invalid_argument("sinks: one float32 logit a query head, float32 [" + std::to_string(p.q_heads) +
                                  "]; got " + fa::to_string(sinks_shape.dtype) + " " +
                                  fa::shape_text(sinks_shape.shape));
  }
  // What the step takes, refused by the kit's own words before anything touches the GPU.
  fa::validate(p);
  if (!step.supports(p.dtype) || !step.supports_head_dim(p.head_dim)) {
    fa::Launcher takes;
    takes.dtypes = step.dtypes, takes.head_dims = step.head_dims;
    fa::kit::refuse_unsupported(call.name.c_str(), p, takes);
  }
  fa::refuse_cache_forms(call.name.c_str(), p, step.cache_forms);
  fa::refuse_features(call.name.c_str(), p, step.features);
  call.t.q = q.data(), call.t.k = k.data(), call.t.v = v.data();
  if (page_table) call.t.page_table = static_cast<const int*>(page_table->data());
  if (kv_lens) call.t.kv_lens = static_cast<const int*>(kv_lens->data());
  if (features.sinks) call.t.sinks = static_cast<const float*>(features.sinks->data());
  if (features.cu_seqlens_q) {
    call.t.cu_seqlens_q = static_cast<const int*>(features.cu_seqlens_q->data());
    call.t.cu_seqlens_k = static_cast<const int*>(features.cu_seqlens_k->data());
  }
  call.on_gpu = q.device_type() == nb::device::cuda::value;
  if (call.on_gpu) call.device = q.device_id();
  return call;
}

/// Refuses an output or extra input of other than `shape` (Q's for O, dO, dQ; K's for dK, dV; LSE's float32
/// [B, Hq, Nq]) and `dtype`.
void check_form(const Tensor& t, const std::string& name, const std::vector<std::int64_t>& shape, DType dtype) {
  const DType got = dtype_of(t, name);
  if (shape_vector(t) != shape || got != dtype)
    throw std::invalid_argument(name + ": must be " + fa::to_string(dtype) + " " + fa::shape_text(shape) + "; got " +
                                fa::to_string(got) + " " + fa::shape_text(shape_vector(t)));
}

/// Bytes of workspace the step asks for this call, asked with Q's device current (a decode step sizes its splits
/// by the SM count). With Q in host memory (a refusal at the memory checks), the size where it needs no GPU.
std::optional<std::size_t> workspace_needed(const Call& call, DeviceGuard& guard) {
  if (call.on_gpu) {
    guard.use(call.device);
    return call.step.workspace_for(call.p);
  }
  try {
    return call.step.workspace_for(call.p);
  } catch (const fa::CudaError&) {  // no GPU to ask: Q's place is refused next
    return std::nullopt;
  }
}

/// Check 5: the workspace a step asks for, there and large enough; then the kit's checks of the pointers (Q, K, V
/// and O aligned as the step loads them, the workspace kWorkspaceAlignment-aligned), before any is dereferenced.
void check_workspace(Call& call, const OptionalTensor& workspace, DeviceGuard& guard) {
  const std::optional<std::size_t> bytes = workspace_needed(call, guard);
  if (bytes && *bytes > 0 && !workspace)
    throw std::invalid_argument(call.name + " needs a workspace of " + std::to_string(*bytes) +
                                " bytes (workspace_bytes() says so): pass workspace=, uint8 on the call's device");
  if (bytes && workspace && workspace->nbytes() < *bytes)
    throw std::invalid_argument("workspace: " + call.name + " needs " + std::to_string(*bytes) + " bytes; got " +
                                std::to_string(workspace->nbytes()));
  call.workspace_bytes = bytes.value_or(0);
  if (workspace) call.t.workspace = workspace->data();
  fa::kit::check_tensors(call.name.c_str(), call.t, call.step.pointer_alignment, false, call.step.pass);
}

/// Check 7: with Q's device current, a decode call's status record, the workspace zeroed on `stream`, and the
/// step's launcher on `stream` (a cudaStream_t as an integer: 0 is the legacy default stream). A step's partial
/// sums start from a zero workspace, and a buffer a caller hands in cannot be trusted to be zero (a step leaves
/// it zero, but an aborted call or another user may not): the memset is a stream operation, so a graph captures
/// it.
void launch(Call& call, std::uintptr_t stream, DeviceGuard& guard) {
  guard.use(call.device);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (call.t.kv_lens || call.t.page_table) call.t.cache_status = CacheStatus::on(call.device);
  if (call.t.workspace && call.workspace_bytes > 0)
    FA_CUDA_CHECK(cudaMemsetAsync(call.t.workspace, 0, call.workspace_bytes, s));
  call.step.launch(call.p, call.t, s);
}

/// A dict of what a step is and takes, for steps().
nb::dict describe(const StepInfo& s) {
  nb::dict d;
  d["id"] = s.id, d["variant"] = s.variant, d["label"] = s.label(), d["name"] = s.name, d["summary"] = s.summary;
  d["pass"] = std::string(fa::to_string(s.pass));
  std::vector<std::string> dtypes;
  for (DType t : s.dtypes) dtypes.push_back(fa::to_string(t));
  d["dtypes"] = dtypes, d["head_dims"] = s.head_dims, d["min_gpu"] = s.min_gpu();
  d["needs_workspace"] = s.workspace_bytes != nullptr;
  d["kv_lens"] = s.cache_forms.kv_lens, d["paged"] = s.cache_forms.paged;
  d["bottom_right"] = s.cache_forms.bottom_right, d["max_q_len"] = s.cache_forms.max_q_len;
  d["window"] = s.features.window, d["softcap"] = s.features.softcap, d["sinks"] = s.features.sinks;
  d["varlen"] = s.features.varlen;
  return d;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "The FlashAttention course's steps on DLPack tensors (PyTorch, CuPy, JAX), in place; see fa_course.";

  m.def("steps", [] {
    std::vector<nb::dict> out;
    for (const StepInfo& s : fa::all_steps()) out.push_back(describe(s));
    return out;
  }, "Every registered step, in course order: id, label, pass, dtypes, head_dims, min_gpu and the KV-cache forms "
     "it takes.");

  m.def("workspace_bytes",
        [](const std::string& step, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
           std::optional<double> scale, const std::string& causal_align, const OptionalTensor& kv_lens,
           const OptionalTensor& page_table, int window_left, int window_right, double softcap,
           const OptionalTensor& sinks, const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k) {
          report_earlier_faults(q);
          const fa::Pass pass = step_named(step).pass;
          const Call call = call_for(step, q, k, v, causal, scale, causal_align, kv_lens, page_table, pass,
                                     {window_left, window_right, softcap, sinks, cu_seqlens_q, cu_seqlens_k});
          check_memory(q, "q", -1), check_memory(k, "k", call.device), check_memory(v, "v", call.device);
          if (kv_lens) check_memory(*kv_lens, "kv_lens", call.device);
          if (page_table) check_memory(*page_table, "page_table", call.device);
          DeviceGuard guard;
          guard.use(call.device);
          return call.step.workspace_for(call.p);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), nb::arg("causal") = false,
        nb::arg("scale") = nb::none(), nb::arg("causal_align") = "top-left", nb::arg("kv_lens") = nb::none(),
        nb::arg("page_table") = nb::none(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0, nb::arg("sinks") = nb::none(), nb::arg("cu_seqlens_q") = nb::none(),
        nb::arg("cu_seqlens_k") = nb::none(),
        "Bytes of workspace the step needs for this call on q's device (0: none). The size follows that device's "
        "SM count for the decode steps.");

  m.def("forward",
        [](const std::string& step, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
           const OptionalTensor& lse, const OptionalTensor& workspace, bool causal, std::optional<double> scale,
           const std::string& causal_align, const OptionalTensor& kv_lens, const OptionalTensor& page_table,
           int window_left, int window_right, double softcap, const OptionalTensor& sinks,
           const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k, std::uintptr_t stream) {
          report_earlier_faults(q);
          Call call = call_for(step, q, k, v, causal, scale, causal_align, kv_lens, page_table, fa::Pass::forward,
                               {window_left, window_right, softcap, sinks, cu_seqlens_q, cu_seqlens_k});
          check_form(out, "out", fa::q_shape(call.p), call.p.dtype);
          if (lse) check_form(*lse, "lse", fa::lse_shape(call.p), DType::f32);
          check_overlaps({{"out", &out}, {"lse", lse ? &*lse : nullptr}, {"workspace", workspace ? &*workspace : nullptr}},
                         {{"q", &q}, {"k", &k}, {"v", &v}, {"kv_lens", kv_lens ? &*kv_lens : nullptr},
                          {"page_table", page_table ? &*page_table : nullptr}, {"sinks", sinks ? &*sinks : nullptr},
                          {"cu_seqlens_q", cu_seqlens_q ? &*cu_seqlens_q : nullptr},
                          {"cu_seqlens_k", cu_seqlens_k ? &*cu_seqlens_k : nullptr}});
          call.t.o = out.data();
          if (lse) call.t.lse = static_cast<float*>(lse->data());
          DeviceGuard guard;
          check_workspace(call, workspace, guard);
          check_memory(q, "q", -1), check_memory(k, "k", call.device), check_memory(v, "v", call.device);
          if (page_table) check_memory(*page_table, "page_table", call.device);
          if (kv_lens) check_memory(*kv_lens, "kv_lens", call.device);
          if (sinks) check_memory(*sinks, "sinks", call.device);
          if (cu_seqlens_q) check_memory(*cu_seqlens_q, "cu_seqlens_q", call.device);
          if (cu_seqlens_k) check_memory(*cu_seqlens_k, "cu_seqlens_k", call.device);
          check_memory(out, "out", call.device);
          if (lse) check_memory(*lse, "lse", call.device);
          if (workspace) check_memory(*workspace, "workspace", call.device);
          launch(call, stream, guard);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::kw_only(),
        nb::arg("lse") = nb::none(), nb::arg("workspace") = nb::none(), nb::arg("causal") = false,
        nb::arg("scale") = nb::none(), nb::arg("causal_align") = "top-left", nb::arg("kv_lens") = nb::none(),
        nb::arg("page_table") = nb::none(), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0, nb::arg("sinks") = nb::none(), nb::arg("cu_seqlens_q") = nb::none(),
        nb::arg("cu_seqlens_k") = nb::none(), nb::arg("stream") = 0,
        "O (and, when given, the rows' log-sum-exp LSE, float32 [B, Hq, Nq]) of a forward or decode step, written "
        "into out [B, Nq, Hq, d], on `stream`, with q's device current. The workspace (workspace_bytes() of it, "
        "uint8, 16-byte aligned) is zeroed on `stream` before the launch. kv_lens and page_table stay on the GPU: "
        "the kernel checks their values, and a value it refuses (a length outside 0 .. capacity, a page entry "
        "outside the pool) is raised as ValueError by the next call on this device or by check(). No host sync "
        "and no allocation: a CUDA graph can capture the call (after one call outside the capture, which makes "
        "the device's status record). window_left and window_right (FlashAttention's window_size, -1 an open side), "
        "softcap and sinks (float32 [Hq]) are the models' features, taken by the steps that list them (steps()); "
        "so is a pack (FlashAttention's varlen): cu_seqlens_q and cu_seqlens_k, int32 [B + 1] on q's device, with "
        "q, out [total_q, Hq, d], k, v [total_k, Hkv, d] and lse float32 [Hq, total_q]. A packed call reads the "
        "offsets back to the host (one sync: the problem's checks and the launcher's tile count need them), so a "
        "CUDA graph cannot capture it.");

  m.def("backward",
        [](const std::string& step, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
           const Tensor& lse, const Tensor& d_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
           const OptionalTensor& workspace, bool causal, std::optional<double> scale, const std::string& causal_align,
           int window_left, int window_right, double softcap, const OptionalTensor& sinks,
           const OptionalTensor& dsinks, const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
           std::uintptr_t stream) {
          report_earlier_faults(q);
          Call call = call_for(step, q, k, v, causal, scale, causal_align, std::nullopt, std::nullopt,
                               fa::Pass::backward,
                               {window_left, window_right, softcap, sinks, cu_seqlens_q, cu_seqlens_k});
          fa::check_backward_shapes(call.p, shape_of(out, "out"), shape_of(lse, "lse"), shape_of(d_out, "d_out"));
          check_form(dq, "dq", fa::q_shape(call.p), call.p.dtype);
          check_form(dk, "dk", fa::kv_shape(call.p), call.p.dtype);
          check_form(dv, "dv", fa::kv_shape(call.p), call.p.dtype);
          // The sinks' gradient is an output of a backward with sinks, and of no other.
          if (sinks && !dsinks)
            throw std::invalid_argument("dsinks: a backward with sinks writes their gradient; pass dsinks=, float32 [" +
                                        std::to_string(call.p.q_heads) + "] on the call's device");
          if (dsinks && !sinks)
            throw std::invalid_argument("dsinks: given without sinks; a backward writes dsinks only with sinks=");
          if (dsinks) check_form(*dsinks, "dsinks", {call.p.q_heads}, DType::f32);
          check_overlaps({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dsinks", dsinks ? &*dsinks : nullptr},
                          {"workspace", workspace ? &*workspace : nullptr}},
                         {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"d_out", &d_out},
                          {"sinks", sinks ? &*sinks : nullptr},
                          {"cu_seqlens_q", cu_seqlens_q ? &*cu_seqlens_q : nullptr},
                          {"cu_seqlens_k", cu_seqlens_k ? &*cu_seqlens_k : nullptr}});
          call.t.o = out.data(), call.t.lse = static_cast<float*>(lse.data()), call.t.d_o = d_out.data();
          call.t.dq = dq.data(), call.t.dk = dk.data(), call.t.dv = dv.data();
          if (dsinks) call.t.dsinks = static_cast<float*>(dsinks->data());
          DeviceGuard guard;
          check_workspace(call, workspace, guard);
          check_memory(q, "q", -1), check_memory(k, "k", call.device), check_memory(v, "v", call.device);
          check_memory(out, "out", call.device), check_memory(lse, "lse", call.device);
          check_memory(d_out, "d_out", call.device);
          if (sinks) check_memory(*sinks, "sinks", call.device);
          if (cu_seqlens_q) check_memory(*cu_seqlens_q, "cu_seqlens_q", call.device);
          if (cu_seqlens_k) check_memory(*cu_seqlens_k, "cu_seqlens_k", call.device);
          check_memory(dq, "dq", call.device), check_memory(dk, "dk", call.device);
          check_memory(dv, "dv", call.device);
          if (dsinks) check_memory(*dsinks, "dsinks", call.device);
          if (workspace) check_memory(*workspace, "workspace", call.device);
          launch(call, stream, guard);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("d_out"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::kw_only(),
        nb::arg("workspace") = nb::none(), nb::arg("causal") = false, nb::arg("scale") = nb::none(),
        nb::arg("causal_align") = "top-left", nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0, nb::arg("sinks") = nb::none(), nb::arg("dsinks") = nb::none(),
        nb::arg("cu_seqlens_q") = nb::none(), nb::arg("cu_seqlens_k") = nb::none(), nb::arg("stream") = 0,
        "dQ, dK and dV of a backward step from Q, K, V, the forward's O and LSE, and dO, written into dq, dk, dv, "
        "on `stream`, with q's device current. The workspace (the float dQ the blocks add into) is zeroed on "
        "`stream` before the launch. causal_align as forward() takes it, for the backward steps that list "
        "bottom_right. The models' features as forward() takes them, for the backward steps that "
        "list them (steps()): window_left and window_right, softcap, and sinks (float32 [Hq]), whose gradient goes "
        "to dsinks (float32 [Hq], needed with sinks; the step zeroes it on `stream`); a pack's cu_seqlens_q and "
        "cu_seqlens_k as forward() takes them, with lse float32 [Hq, total_q].");

  m.def("check",
        [](std::optional<int> device) {
          DeviceGuard guard;
          int d = 0;
          if (device) {
            d = *device;
          } else {
            FA_CUDA_CHECK(cudaGetDevice(&d));
          }
          guard.use(d);
          {
            nb::gil_scoped_release released;
            FA_CUDA_CHECK(cudaDeviceSynchronize());
          }
          CacheStatus::report(d, "fa_course.check()");
        },
        nb::arg("device") = nb::none(),
        "Waits for every call in flight on CUDA device `device` (default: the current one), then raises ValueError "
        "for a value of kv_lens or page_table a decode kernel refused since the last report (RuntimeError for a "
        "CUDA error).");
}
