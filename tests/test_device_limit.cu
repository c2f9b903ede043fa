// A limit of the GPU is refused as one. A kernel that asks for more shared memory a block than this GPU gives, and a
// larger GPU gives, is refused with DeviceLimit before anything is launched: an InvalidProblem, so fa-run and fa-bench
// print it as they print any refusal (the CPU test of kit::refuse_shared_memory checks both sides of the rule). The harness passes it on, and its callers (the step tests, the grader, the mutation suite) skip
// the case rather than fail it: step 08 at d = 128 on a T4 (64 KiB a block) is not a wrong kernel. Any other
// refusal of a case a step should run still fails the case.
#include "fa/cuda_check.hpp"
#include "fa/kit.hpp"
#include "gpu.hpp"
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace fa;
using Catch::Matchers::Contains;

namespace {

__global__ void empty_kernel() {}

/// A problem any test launcher takes.
test::Case small_case() {
  test::Case c{"a small problem", {}, test::InputKind::uniform};
  AttentionProblem& p = c.problem;
  p.batch = 1, p.q_len = 7, p.kv_len = 9, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 64, p.dtype = DType::f16;
  return c;
}

/// A registry entry for a launcher that refuses every problem the way `launch` does.
StepInfo refusing_step(LaunchFn launch) {
  Launcher launcher;
  launcher.launch = launch;
  launcher.dtypes = {DType::f16};
  launcher.head_dims = {64};
  return StepInfo("99", "", "refusing", "refuses every problem", launcher);
}

}  // namespace

TEST_CASE("more shared memory a block than this GPU gives is refused before launch, as its limit where a larger GPU gives it", "[gpu][kit]") {
  FA_REQUIRE_GPU();
  int device = 0, optin = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const void* kernel = reinterpret_cast<const void*>(&empty_kernel);
  const std::size_t too_much = std::size_t(optin) + 1;
  CHECK_THROWS_AS(kit::prepare_launch(kernel, dim3(1), dim3(32), too_much), InvalidProblem);
  CHECK_THROWS_WITH(kit::prepare_launch(kernel, dim3(1), dim3(32), too_much),
                    Contains(std::to_string(too_much) + " bytes of shared memory per block") &&
                        Contains("allows at most " + std::to_string(optin)));
  // A limit of this GPU where a larger one gives that much; on the largest (an H100: 232448 bytes), a mistake.
  bool limit = false;
  try {
    kit::prepare_launch(kernel, dim3(1), dim3(32), too_much);
  } catch (const DeviceLimit&) {
    limit = true;
  } catch (const InvalidProblem&) {
  }
  CHECK(limit == (too_much <= kit::kLargestSharedPerBlock));
  CHECK_NOTHROW(kit::prepare_launch(kernel, dim3(1), dim3(32), std::size_t(optin)));  // all it gives is fine
}

TEST_CASE("the harness passes a limit of the GPU on to be skipped, and fails any other refusal", "[gpu][kit]") {
  FA_REQUIRE_GPU();
  const test::Case c = small_case();
  const test::Prepared prepared = test::prepare(c, 1);
  const StepInfo too_large = refusing_step([](const AttentionProblem&, const AttentionTensors&, cudaStream_t) {
    throw DeviceLimit("step 99: needs 300000 bytes of shared memory per block; this GPU allows at most 232448");
  });
  CHECK_THROWS_AS(test::run_case(too_large, c, prepared), DeviceLimit);
  const StepInfo wrong = refusing_step([](const AttentionProblem&, const AttentionTensors&, cudaStream_t) {
    throw InvalidProblem("step 99: kv_len = 9 is not supported; supported: multiples of 64");
  });
  const Verdict verdict = test::run_case(wrong, c, prepared);
  CHECK_FALSE(verdict.passed());
  CHECK_THAT(verdict.failed, Contains("threw: step 99: kv_len = 9"));
}
