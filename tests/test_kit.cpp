// CPU tests of the steps' kit (common/fa/kit.hpp): what it refuses, and what it
// says, before any device is asked anything. These run without a GPU: a check
// that reached the CUDA runtime first would fail with a CudaError instead.
#include "fa/kit.hpp"
#include "fa/registry.hpp"
#include "fa/tma.hpp"

#include <catch2/catch.hpp>

#include <cstdint>

using namespace fa;
using Catch::Matchers::Contains;

TEST_CASE("kit refuses grids and blocks beyond CUDA's limits before touching the device", "[cpu][kit]") {
  // The kernel pointer is never used: the refusal comes first.
  const void* no_kernel = nullptr;
  CHECK_THROWS_AS(kit::prepare_launch(no_kernel, dim3(1, 65536, 1), dim3(32), 0), InvalidProblem);
  CHECK_THROWS_WITH(kit::prepare_launch(no_kernel, dim3(1, 1, 70000), dim3(32), 0),
                    Contains("1 x 1 x 70000") && Contains("65535"));
  CHECK_THROWS_WITH(kit::prepare_launch(no_kernel, dim3(1), dim3(32, 64), 0), Contains("2048") || Contains("32 x 64"));
  CHECK_THROWS_WITH(kit::prepare_launch(no_kernel, dim3(0), dim3(32), 0), Contains("grid"));
}

TEST_CASE("too much shared memory is this GPU's limit when a larger GPU gives it, a mistake when none does", "[cpu][kit]") {
  // Step 08 at d = 128 asks for 162 KiB a block: a T4 gives 64 KiB, an H100 227 KiB.
  CHECK_THROWS_AS(kit::refuse_shared_memory("step 08", 165888, 65536, "Tesla T4"), DeviceLimit);
  CHECK_THROWS_WITH(kit::refuse_shared_memory("step 08", 165888, 65536, "Tesla T4"),
                    Contains("step 08: needs 165888 bytes") && Contains("Tesla T4 allows at most 65536") &&
                        Contains("232448"));
  // More than any GPU gives: a mistake in the kernel's sizes, which the harness must fail, not skip.
  try {
    kit::refuse_shared_memory("step 99", kit::kLargestSharedPerBlock + 1, kit::kLargestSharedPerBlock, "H100");
    FAIL("no refusal");
  } catch (const DeviceLimit&) {
    FAIL("refused as a limit of the GPU, though no GPU gives that much");
  } catch (const InvalidProblem& e) {
    CHECK_THAT(std::string(e.what()), Contains("no GPU gives more than 232448"));
  }
}

TEST_CASE("a launch inside a step names the step and the problem when it is refused", "[cpu][kit]") {
  AttentionProblem p;
  p.batch = 70000;
  const kit::LaunchScope scope("step 03", p, 0);
  CHECK_THROWS_WITH(kit::prepare_launch(nullptr, dim3(1, 70000), dim3(32), 0),
                    Contains("step 03") && Contains("B=70000") && Contains("65535"));
}

TEST_CASE("the minimum GPU architecture is registry data, refused with both architectures named", "[cpu][kit]") {
  CHECK_THROWS_WITH(kit::check_arch("step 09", 75, 80), Contains("sm_75") && Contains("sm_80 or newer"));
  CHECK_NOTHROW(kit::check_arch("step 09", 90, 80));
  CHECK_NOTHROW(kit::check_arch("step 01", 50, 0));
  // Code built for sm_90a (wgmma) runs on sm_90 alone: a newer GPU is refused too.
  CHECK_NOTHROW(kit::check_arch("step 20", 90, 90, true));
  CHECK_THROWS_WITH(kit::check_arch("step 20", 100, 90, true), Contains("sm_100") && Contains("sm_90 only"));
  CHECK_THROWS_WITH(kit::check_arch("step 20", 80, 90, true), Contains("sm_80") && Contains("sm_90 only"));
  // Every step from 09 on (the tensor-core steps, and step 11's FP32 variant, built in the same
  // library) says it needs sm_80, except step 19, FP32 on the CUDA cores again, whose 195 KiB of
  // shared memory per block need sm_90, and the Hopper steps 20 to 25, built for sm_90a; the steps
  // before 09 run anywhere, and so do the backward's CUDA-core steps 26 and 27; step 28, the backward on
  // mma.sync, needs sm_80, and steps 29 on sm_90 for their vector reductions; the Hopper backward, steps 38
  // to 41, is built for sm_90a again; the decode steps, 42 to 48, read memory with 16-byte loads on sm_80 and newer;
  // the model features' steps, from 49, grow from the Hopper steps and are built for sm_90a, except step 59, the
  // features in decode, which grows from step 48.
  for (const StepInfo& step : all_steps()) {
    INFO("step " << step.label());
    const bool cuda_cores = step.id < "09" || step.id == "26" || step.id == "27";
    const bool decode = (step.id >= "42" && step.id <= "48") || step.id == "59";
    const bool hopper =
        (step.id >= "20" && step.id <= "25") || (step.id >= "38" && step.id <= "41") || (step.id >= "49" && !decode);
    const int expected = decode ? 80 : step.id == "19" || step.id >= "29" || hopper ? 90 : cuda_cores ? 0 : 80;
    CHECK(step.min_arch == expected);
    CHECK(step.arch_specific == hopper);
    CHECK(step.min_gpu() == (expected ? "sm_" + std::to_string(expected) + (hopper ? "a" : "") : std::string("any")));
    CHECK(step.runs_on(90));
    CHECK(step.runs_on(100) == !hopper);
  }
}

TEST_CASE("an unsupported dtype or head_dim is refused with the list the step supports", "[cpu][kit]") {
  const AttentionTensors none{};
  AttentionProblem p;
  p.dtype = DType::f32, p.head_dim = 64;
  const StepInfo& tensor_cores = *select_steps("09-br64").front();
  CHECK_THROWS_WITH(tensor_cores.launch(p, none, nullptr),
                    Contains("step 09") && Contains("dtype = f32") && Contains("supported: f16, bf16"));
  p.dtype = DType::f16, p.head_dim = 48;
  CHECK_THROWS_WITH(tensor_cores.launch(p, none, nullptr), Contains("head_dim = 48") && Contains("supported: 64, 128"));
  const StepInfo& naive = *select_steps("01").front();
  CHECK_THROWS_WITH(naive.launch(p, none, nullptr), Contains("supported: 32, 64, 128"));
  // head_dim 256 (Gemma-class models): step 57 lists it beside step 52's two, and step 52 refuses it by name.
  p.head_dim = 256;
  const StepInfo& varlen = *select_steps("52").front();
  CHECK_THROWS_WITH(varlen.launch(p, none, nullptr),
                    Contains("step 52") && Contains("head_dim = 256") && Contains("supported: 64, 128"));
  CHECK(select_steps("57").front()->head_dims == std::vector<int>{64, 128, 256});
  // The backward at 256: step 58 takes it, step 56, the backward it grows from, refuses it by name before any launch.
  const StepInfo& varlen_backward = *select_steps("56").front();
  CHECK_THROWS_WITH(varlen_backward.launch(p, none, nullptr),
                    Contains("step 56") && Contains("head_dim = 256") && Contains("supported: 64, 128"));
  CHECK(select_steps("58").front()->head_dims == std::vector<int>{64, 128, 256});
  p.head_dim = 192;
  CHECK_THROWS_WITH(select_steps("58").front()->launch(p, none, nullptr),
                    Contains("step 58") && Contains("head_dim = 192") && Contains("supported: 64, 128, 256"));
}

TEST_CASE("a decode step without the models' features refuses them by name, and step 59 takes them but not a pack",
          "[cpu][kit]") {
  const AttentionTensors none{};
  AttentionProblem p;
  p.batch = 2, p.q_len = 1, p.kv_len = 256, p.q_heads = 8, p.kv_heads = 2, p.head_dim = 64, p.dtype = DType::f16;
  p.causal = true, p.causal_align = CausalAlign::bottom_right, p.window_left = 64;
  CHECK_THROWS_WITH(select_steps("48").front()->launch(p, none, nullptr),
                    Contains("step 48") && Contains("window = (64, 0)") && Contains("is not supported"));
  p.window_left = -1, p.softcap = 30.f;
  CHECK_THROWS_WITH(select_steps("48").front()->launch(p, none, nullptr), Contains("step 48") && Contains("softcap"));
  const StepInfo& features = *select_steps("59").front();
  CHECK(features.features.window);
  CHECK(features.features.softcap);
  CHECK(features.features.sinks);
  CHECK(!features.features.varlen);
  CHECK(features.cache_forms.kv_lens);
  CHECK(features.cache_forms.paged);
  CHECK(features.cache_forms.bottom_right);
  CHECK(features.cache_forms.max_q_len == 8);
  // A window aligned at the last key without the causal mask: the alignment moves the window, so a step that
  // aligns at the first key (the prefill steps 49-58) refuses it by name rather than compute another window.
  p.softcap = 0.f, p.causal = false, p.window_left = 16, p.window_right = 4, p.q_len = 4;
  CHECK_THROWS_WITH(select_steps("57").front()->launch(p, none, nullptr),
                    Contains("step 57") && Contains("causal_align") && Contains("bottom-right"));
  CHECK(takes_cache_forms(p, features.cache_forms));
  p.window_left = p.window_right = -1, p.q_len = 1;
  p.causal_align = CausalAlign::top_left;
  p.cu_seqlens_q = {0, 1, 2}, p.cu_seqlens_k = {0, 30, 64};
  CHECK_THROWS_WITH(features.launch(p, none, nullptr), Contains("step 59") && Contains("cu_seqlens = 2 packed"));
}

TEST_CASE("a step that needs a workspace refuses to run without one", "[cpu][kit]") {
  AttentionProblem p;
  p.head_dim = 64;
  const StepInfo& fa1 = *select_steps("03").front();
  REQUIRE(fa1.workspace_bytes != nullptr);
  void* somewhere = reinterpret_cast<void*>(std::uintptr_t(1) << 20);  // never dereferenced: it refuses first
  CHECK_THROWS_WITH(fa1.launch(p, AttentionTensors{somewhere, somewhere, somewhere, somewhere, nullptr}, nullptr),
                    Contains("workspace"));
  CHECK_THROWS_WITH(fa1.launch(p, AttentionTensors{}, nullptr), Contains("tensor Q is missing"));
}

TEST_CASE("a workspace or a cache status record at an address not 16-byte aligned is refused before launch",
          "[cpu][kit]") {
  // Every step that takes a workspace: its partial results and counters are read in 16-byte vectors, so a
  // caller's buffer at an odd address would fault on the GPU ("misaligned address") and lose the context.
  void* somewhere = reinterpret_cast<void*>(std::uintptr_t(1) << 20);  // never dereferenced: it refuses first
  void* odd = reinterpret_cast<void*>((std::uintptr_t(1) << 21) + 8);
  int checked = 0;
  for (const StepInfo& step : all_steps()) {
    if (!step.workspace_bytes || step.pass != Pass::forward) continue;
    AttentionProblem p;
    p.head_dim = step.head_dims.front(), p.dtype = step.dtypes.front();
    INFO("step " << step.label());
    AttentionTensors t{somewhere, somewhere, somewhere, somewhere, odd};
    CHECK_THROWS_WITH(step.launch(p, t, nullptr),
                      Contains("tensor address = 0x200008 (workspace) is not supported") &&
                          Contains("16-byte aligned workspace"));
    t.workspace = somewhere, t.cache_status = static_cast<int*>(odd);
    CHECK_THROWS_WITH(step.launch(p, t, nullptr), Contains("(cache_status)"));
    ++checked;
  }
  CHECK(checked >= 6);  // step 03, step 25 and the decode steps at least
}

TEST_CASE("a tensor map refuses a head_dim or box its copies cannot cover, naming what it takes", "[cpu][kit]") {
  // A box row is 128 bytes: 64 columns of a 16-bit type, 32 floats (step 39's float dQ). The refusals come before
  // the driver is asked for the map, so no pointer is needed.
  CHECK_THROWS_WITH(kit::heads_tensor_map(nullptr, DType::f16, 1, 64, 1, 96, 64),
                    Contains("head_dim = 96") && Contains("f16") && Contains("multiples of 64"));
  CHECK_THROWS_WITH(kit::heads_tensor_map(nullptr, DType::f32, 1, 64, 1, 48, 64),
                    Contains("head_dim = 48") && Contains("f32") && Contains("multiples of 32"));
  CHECK_THROWS_WITH(kit::heads_tensor_map(nullptr, DType::bf16, 1, 64, 1, 128, 300),
                    Contains("box_rows = 300") && Contains("1 to 256"));
}
