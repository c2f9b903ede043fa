/// @file module.cpp
/// @brief fa_course._ext: the course's registered steps called from Python on DLPack tensors (PyTorch, CuPy, JAX),
/// in place and on the caller's stream. Every check is the kit's or fa-run's, with the same message, raised as
/// ValueError (a refusal) or RuntimeError (a CUDA error); the pure-Python package (fa_course/) wraps it for
/// PyTorch.
///
/// Order of the checks, so that a machine without a GPU can test every refusal: the step's name; the shapes
/// (fa-run's messages); the problem and what the step takes (the kit's); where each tensor lives and its layout;
/// then the step's launcher, which checks the GPU and launches.
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

#include <cstdint>
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

/// One call's problem and device pointers, read off the tensors with every check that needs no GPU.
struct Call {
  const StepInfo& step;
  AttentionProblem p;
  AttentionTensors t;
  int device = -1;  ///< the CUDA device of Q (when Q is in CUDA memory)
};

/// The problem of a forward call (or of a backward one: O, LSE and dO are checked by the caller): Q, K and V,
/// the causal mask, the scale and the KV cache's forms. A page table makes K and V page pools [pages,
/// page_size, Hkv, d] and the cache's capacity pages_per_sequence x page_size; kv_lens are copied to the host for
/// the kit's checks (the reference reads them there too), which waits for the device.
Call call_for(const std::string& label, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
              std::optional<double> scale, const std::string& causal_align, const OptionalTensor& kv_lens,
              const OptionalTensor& page_table, fa::Pass pass) {
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
  Call call{step, fa::problem_from(q_shape, k_shape, v_shape), {}};
  AttentionProblem& p = call.p;
  p.causal = causal;
  if (scale) p.scale = float(*scale);
  p.causal_align = causal_align_named(causal_align);
  if (page_table) {
    check_ints(*page_table, "page_table", {p.batch, std::int64_t(page_table->shape(1))});
    p.page_size = int(page_size), p.pages = int(pages);
  }
  if (kv_lens) {  // the lengths' values are on the GPU: until they are read, each is the capacity
    check_ints(*kv_lens, "kv_lens", {p.batch});
    p.kv_lens.assign(std::size_t(p.batch), p.kv_len);
  }
  // What the step takes, refused by the kit's own words before anything touches the GPU.
  const std::string name = "step " + step.label();
  fa::validate(p);
  if (!step.supports(p.dtype) || !step.supports_head_dim(p.head_dim)) {
    fa::Launcher takes;
    takes.dtypes = step.dtypes, takes.head_dims = step.head_dims;
    fa::kit::refuse_unsupported(name.c_str(), p, takes);
  }
  fa::refuse_cache_forms(name.c_str(), p, step.cache_forms);
  // Where the tensors live; then the lengths, which the checks read on the host.
  check_memory(q, "q", -1);
  call.device = q.device_id();
  check_memory(k, "k", call.device), check_memory(v, "v", call.device);
  call.t.q = q.data(), call.t.k = k.data(), call.t.v = v.data();
  if (page_table) {
    check_memory(*page_table, "page_table", call.device);
    call.t.page_table = static_cast<const int*>(page_table->data());
  }
  if (kv_lens) {
    check_memory(*kv_lens, "kv_lens", call.device);
    FA_CUDA_CHECK(cudaSetDevice(call.device));
    FA_CUDA_CHECK(cudaMemcpy(p.kv_lens.data(), kv_lens->data(), p.kv_lens.size() * sizeof(int), cudaMemcpyDefault));
    call.t.kv_lens = static_cast<const int*>(kv_lens->data());
  }
  fa::validate(p);  // the lengths read: each 0 .. kv_len
  return call;
}

/// Checks an output or extra input of Q's shape (O, dO, dQ) or K's (dK, dV) and the problem's dtype, or LSE's
/// float32 [B, Hq, Nq]; on the call's device, contiguous.
void check_like(const Call& call, const Tensor& t, const std::string& name, const std::vector<std::int64_t>& shape,
                DType dtype) {
  const DType got = dtype_of(t, name);
  if (shape_vector(t) != shape || got != dtype)
    throw std::invalid_argument(name + ": must be " + fa::to_string(dtype) + " " + fa::shape_text(shape) + "; got " +
                                fa::to_string(got) + " " + fa::shape_text(shape_vector(t)));
  check_memory(t, name, call.device);
}

/// The workspace a step asks for: checked for size and place, or refused when missing.
void* workspace_of(const Call& call, const OptionalTensor& workspace) {
  const std::size_t bytes = call.step.workspace_for(call.p);
  if (bytes == 0) return nullptr;
  if (!workspace)
    throw std::invalid_argument("step " + call.step.label() + " needs a workspace of " + std::to_string(bytes) +
                                " bytes (workspace_bytes() says so): pass workspace=, zero-filled, uint8 on the "
                                "call's device");
  if (workspace->nbytes() < bytes)
    throw std::invalid_argument("workspace: step " + call.step.label() + " needs " + std::to_string(bytes) +
                                " bytes; got " + std::to_string(workspace->nbytes()));
  check_memory(*workspace, "workspace", call.device);
  return workspace->data();
}

/// Runs the step's launcher on `stream` (a cudaStream_t as an integer: 0 is the legacy default stream).
void launch(const Call& call, std::uintptr_t stream) {
  FA_CUDA_CHECK(cudaSetDevice(call.device));
  call.step.launch(call.p, call.t, reinterpret_cast<cudaStream_t>(stream));
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
           const OptionalTensor& page_table) {
          const fa::Pass pass = step_named(step).pass;
          const Call call = call_for(step, q, k, v, causal, scale, causal_align, kv_lens, page_table, pass);
          return call.step.workspace_for(call.p);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), nb::arg("causal") = false,
        nb::arg("scale") = nb::none(), nb::arg("causal_align") = "top-left", nb::arg("kv_lens") = nb::none(),
        nb::arg("page_table") = nb::none(),
        "Bytes of zero-filled workspace the step needs for this call (0: none).");

  m.def("forward",
        [](const std::string& step, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
           const OptionalTensor& lse, const OptionalTensor& workspace, bool causal, std::optional<double> scale,
           const std::string& causal_align, const OptionalTensor& kv_lens, const OptionalTensor& page_table,
           std::uintptr_t stream) {
          Call call = call_for(step, q, k, v, causal, scale, causal_align, kv_lens, page_table, fa::Pass::forward);
          check_like(call, out, "out", fa::q_shape(call.p), call.p.dtype);
          call.t.o = out.data();
          if (lse) {
            check_like(call, *lse, "lse", fa::lse_shape(call.p), DType::f32);
            call.t.lse = static_cast<float*>(lse->data());
          }
          call.t.workspace = workspace_of(call, workspace);
          launch(call, stream);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::kw_only(),
        nb::arg("lse") = nb::none(), nb::arg("workspace") = nb::none(), nb::arg("causal") = false,
        nb::arg("scale") = nb::none(), nb::arg("causal_align") = "top-left", nb::arg("kv_lens") = nb::none(),
        nb::arg("page_table") = nb::none(), nb::arg("stream") = 0,
        "O (and, when given, the rows' log-sum-exp LSE, float32 [B, Hq, Nq]) of a forward or decode step, written "
        "into out [B, Nq, Hq, d], on `stream`.");

  m.def("backward",
        [](const std::string& step, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
           const Tensor& lse, const Tensor& d_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
           const OptionalTensor& workspace, bool causal, std::optional<double> scale, std::uintptr_t stream) {
          Call call = call_for(step, q, k, v, causal, scale, "top-left", std::nullopt, std::nullopt,
                               fa::Pass::backward);
          fa::check_backward_shapes(call.p, shape_of(out, "out"), shape_of(lse, "lse"), shape_of(d_out, "d_out"));
          check_memory(out, "out", call.device), check_memory(lse, "lse", call.device);
          check_memory(d_out, "d_out", call.device);
          check_like(call, dq, "dq", fa::q_shape(call.p), call.p.dtype);
          check_like(call, dk, "dk", fa::kv_shape(call.p), call.p.dtype);
          check_like(call, dv, "dv", fa::kv_shape(call.p), call.p.dtype);
          call.t.o = out.data(), call.t.lse = static_cast<float*>(lse.data()), call.t.d_o = d_out.data();
          call.t.dq = dq.data(), call.t.dk = dk.data(), call.t.dv = dv.data();
          call.t.workspace = workspace_of(call, workspace);
          launch(call, stream);
        },
        nb::arg("step"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("d_out"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::kw_only(),
        nb::arg("workspace") = nb::none(), nb::arg("causal") = false, nb::arg("scale") = nb::none(),
        nb::arg("stream") = 0,
        "dQ, dK and dV of a backward step from Q, K, V, the forward's O and LSE, and dO, written into dq, dk, dv, "
        "on `stream`.");
}
