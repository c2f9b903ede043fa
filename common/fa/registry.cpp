// The registry: every step of the course in order. A step's .cu file defines
// fa::stepNN::launch (and workspace_bytes when it needs scratch memory); the
// entry below says what the step is and what it accepts. The harness tests
// every entry on every dtype and head_dim it lists, and checks that it refuses
// the ones it does not list.
#include "fa/registry.hpp"

#include <algorithm>
#include <sstream>

namespace fa {

// Launchers, one per step (defined in steps/NN_name/*.cu).
namespace step01 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t); }
namespace step02 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t); }
namespace step03 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   std::size_t workspace_bytes(const AttentionProblem&); }
namespace step04 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources(const AttentionProblem&); }
namespace step05 { void launch_pad1(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_pad4(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_pad4_vec4(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_transpose(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources_pad1(const AttentionProblem&);
                   KernelResources resources_pad4(const AttentionProblem&);
                   KernelResources resources_pad4_vec4(const AttentionProblem&);
                   KernelResources resources_transpose(const AttentionProblem&); }
namespace step06 { void launch_br8(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_br16(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_br32(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources_br8(const AttentionProblem&);
                   KernelResources resources_br16(const AttentionProblem&);
                   KernelResources resources_br32(const AttentionProblem&); }
namespace step07 { void launch_double(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_ff(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources_double(const AttentionProblem&);
                   KernelResources resources_ff(const AttentionProblem&); }
namespace step08 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources(const AttentionProblem&); }
namespace step09 { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   void launch_br64(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   KernelResources resources(const AttentionProblem&);
                   KernelResources resources_br64(const AttentionProblem&); }
// The baseline (bench/cublas_baseline.cu).
namespace cublas { void launch(const AttentionProblem&, const AttentionTensors&, cudaStream_t);
                   std::size_t workspace_bytes(const AttentionProblem&); }

const std::vector<StepInfo>& all_steps() {
  static const std::vector<StepInfo> steps = {
      {"01", "", "naive", "one thread per output element; every score recomputed 3*d times",
       {DType::f32, DType::f16}, {32, 64, 128}, &step01::launch},
      {"02", "", "reductions", "one block per row; keys split over threads, m and l joined by block reductions",
       {DType::f32, DType::f16}, {32, 64, 128}, &step02::launch},
      {"03", "", "minimal_fa1",
       "FlashAttention-1 loop order: block per (batch, head), thread per query row, O/l/m in HBM between K/V tiles",
       {DType::f32, DType::f16}, {32, 64, 128}, &step03::launch, &step03::workspace_bytes},
      {"04", "", "tiled_online_softmax",
       "FA2 loop order: a block keeps its Q tile and O, l, m on chip and streams K/V tiles past it",
       {DType::f32, DType::f16}, {32, 64, 128}, &step04::launch, nullptr, &step04::resources},
      {"05", "pad1", "bank_conflicts", "K/V shared rows padded by one word: lane x starts in bank x",
       {DType::f32, DType::f16}, {32, 64, 128}, &step05::launch_pad1, nullptr,
       &step05::resources_pad1},
      {"05", "pad4", "bank_conflicts", "K/V shared rows padded by four words, scalar reads: still 4-way conflicts",
       {DType::f32, DType::f16}, {32, 64, 128}, &step05::launch_pad4, nullptr,
       &step05::resources_pad4},
      {"05", "pad4_vec4", "bank_conflicts", "K/V shared rows padded by four words, read as float4: conflict-free",
       {DType::f32, DType::f16}, {32, 64, 128}, &step05::launch_pad4_vec4, nullptr,
       &step05::resources_pad4_vec4},
      {"05", "transpose", "bank_conflicts", "K/V tiles stored transposed: conflict-free reads, 32-way conflicted stores",
       {DType::f32, DType::f16}, {32, 64, 128}, &step05::launch_transpose, nullptr,
       &step05::resources_transpose},
      {"06", "br8", "sp_reuse", "S and P share one shared tile, O in registers; Br = 8 rows, 256 threads",
       {DType::f32, DType::f16}, {32, 64, 128}, &step06::launch_br8, nullptr, &step06::resources_br8},
      {"06", "br16", "sp_reuse", "S and P share one shared tile, O in registers; Br = 16 rows, 512 threads",
       {DType::f32, DType::f16}, {32, 64, 128}, &step06::launch_br16, nullptr, &step06::resources_br16},
      {"06", "br32", "sp_reuse", "S and P share one shared tile, O in registers; Br = 32 rows, 1024 threads",
       {DType::f32, DType::f16}, {32, 64, 128}, &step06::launch_br32, nullptr, &step06::resources_br32},
      {"07", "double", "double_accumulation",
       "step 06 with S, P, m, l and O accumulated in double (FP64 arithmetic, exp in double)",
       {DType::f32, DType::f16}, {32, 64, 128}, &step07::launch_double, nullptr, &step07::resources_double,
       /*high_precision_accumulation=*/true},
      {"07", "ff", "double_accumulation",
       "step 06 with S, P, m, l and O accumulated in float-float pairs (FP32 error-free transformations)",
       {DType::f32, DType::f16}, {32, 64, 128}, &step07::launch_ff, nullptr, &step07::resources_ff,
       /*high_precision_accumulation=*/true},
      {"08", "", "register_tiling",
       "each thread an 8x8 tile of S and 8 x d/8 of O in registers; float4 loads, transposed Q/K/P tiles",
       {DType::f32, DType::f16}, {32, 64, 128}, &step08::launch, nullptr, &step08::resources,
       /*high_precision_accumulation=*/false, /*pointer_alignment=*/16},
      {"09", "br128", "tensor_cores",
       "FA2 forward on tensor cores: mma.sync m16n8k16, ldmatrix from swizzled tiles, P in registers, Br = 128",
       {DType::f16, DType::bf16}, {64, 128}, &step09::launch, nullptr, &step09::resources,
       /*high_precision_accumulation=*/false, /*pointer_alignment=*/16},
      {"09", "br64", "tensor_cores", "step 09 with Br = 64 (4 warps): more, smaller blocks; twice the K/V reads",
       {DType::f16, DType::bf16}, {64, 128}, &step09::launch_br64, nullptr, &step09::resources_br64,
       /*high_precision_accumulation=*/false, /*pointer_alignment=*/16},
  };
  return steps;
}

const StepInfo& cublas_baseline() {
  static const StepInfo baseline = {
      "cublas", "", "cublas standard attention",
      "S = QK^T with cuBLAS, softmax kernel, O = PV with cuBLAS (N x N scores in memory)",
      {DType::f32, DType::f16, DType::bf16}, {32, 64, 128}, &cublas::launch, &cublas::workspace_bytes};
  return baseline;
}

bool StepInfo::supports(DType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

bool StepInfo::supports_head_dim(int head_dim) const {
  return std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end();
}

std::string StepInfo::label() const { return variant.empty() ? id : id + "-" + variant; }

std::size_t StepInfo::workspace_for(const AttentionProblem& p) const {
  return workspace_bytes ? workspace_bytes(p) : 0;
}

std::vector<const StepInfo*> select_steps(const std::string& spec) {
  std::vector<const StepInfo*> chosen;
  auto add = [&](const StepInfo& s) {
    if (std::find(chosen.begin(), chosen.end(), &s) == chosen.end()) chosen.push_back(&s);
  };
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    bool found = false;
    if (item == "all") {
      for (const auto& s : all_steps()) add(s);
      found = true;
    }
    if (item == cublas_baseline().id) {
      add(cublas_baseline());
      found = true;
    }
    for (const auto& s : all_steps()) {
      if (s.id == item || s.label() == item) {
        add(s);
        found = true;
      }
    }
    if (!found) throw std::invalid_argument("no step or baseline called '" + item + "'");
  }
  return chosen;
}

DeviceAttention::DeviceAttention(const AttentionProblem& p, const AttentionInputs& inputs,
                                 std::size_t workspace_bytes)
    : q(inputs.q.byte_size()),
      k(inputs.k.byte_size()),
      v(inputs.v.byte_size()),
      o(std::size_t(p.q_elements()) * size_of(p.dtype)),
      workspace(workspace_bytes) {
  auto check = [&](const HostTensor& t, const char* name, const std::vector<std::int64_t>& shape) {
    if (t.dtype != p.dtype || t.shape != shape)
      throw InvalidProblem(std::string(name) + " does not have the problem's dtype and shape (" +
                           p.describe() + ")");
  };
  check(inputs.q, "Q", q_shape(p));
  check(inputs.k, "K", kv_shape(p));
  check(inputs.v, "V", kv_shape(p));
  q.upload(inputs.q.bytes.data(), inputs.q.byte_size());
  k.upload(inputs.k.bytes.data(), inputs.k.byte_size());
  v.upload(inputs.v.bytes.data(), inputs.v.byte_size());
}

HostTensor run_step(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& inputs) {
  validate(p);
  DeviceAttention device(p, inputs, step.workspace_for(p));
  device.o.poison();
  step.launch(p, device.tensors(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor out(p.dtype, q_shape(p));
  device.o.download(out.bytes.data(), out.byte_size());
  return out;
}

}  // namespace fa
