// Every step refuses bad and unsupported problems before it touches the GPU.
// These run without a device: a launcher that reached the CUDA runtime first
// would fail with a CudaError (or launch on null pointers), not InvalidProblem.
#include "fa/registry.hpp"

#include <catch2/catch.hpp>

#include <array>

#include <cmath>
#include <cstdint>

using namespace fa;
using Catch::Matchers::Contains;

namespace {
std::vector<const StepInfo*> steps_and_baseline() {
  std::vector<const StepInfo*> all;
  for (const auto& s : all_steps()) all.push_back(&s);
  all.push_back(&cublas_baseline());
  return all;
}

AttentionProblem supported_problem(const StepInfo& step) {
  AttentionProblem p;
  p.batch = 2, p.q_len = 5, p.kv_len = 9, p.q_heads = 4, p.kv_heads = 2;
  p.head_dim = step.head_dims.front();
  p.dtype = step.dtypes.front();
  return p;
}
}  // namespace

TEST_CASE("launchers refuse malformed problems before launching", "[cpu][validation]") {
  const AttentionTensors null_tensors{};
  for (const StepInfo* step : steps_and_baseline()) {
    INFO("step " << step->label());
    const AttentionProblem good = supported_problem(*step);
    auto bad = good;
    bad.kv_heads = 3;
    CHECK_THROWS_AS(step->launch(bad, null_tensors, nullptr), InvalidProblem);
    bad = good, bad.batch = 0;
    CHECK_THROWS_AS(step->launch(bad, null_tensors, nullptr), InvalidProblem);
    bad = good, bad.q_len = 0;
    CHECK_THROWS_AS(step->launch(bad, null_tensors, nullptr), InvalidProblem);
    bad = good, bad.kv_len = -1;
    CHECK_THROWS_AS(step->launch(bad, null_tensors, nullptr), InvalidProblem);
    bad = good, bad.scale = INFINITY;
    CHECK_THROWS_AS(step->launch(bad, null_tensors, nullptr), InvalidProblem);
  }
}

TEST_CASE("launchers refuse head_dims and dtypes their registry entry does not list", "[cpu][validation]") {
  const AttentionTensors null_tensors{};
  for (const StepInfo* step : steps_and_baseline()) {
    INFO("step " << step->label());
    for (int head_dim : {1, 7, 16, 32, 48, 64, 80, 96, 100, 128, 160, 192, 256, 512}) {
      if (step->supports_head_dim(head_dim)) continue;
      INFO("head_dim " << head_dim);
      auto p = supported_problem(*step);
      p.head_dim = head_dim;
      CHECK_THROWS_WITH(step->launch(p, null_tensors, nullptr), Contains("head_dim"));
    }
    for (DType dtype : kAllDTypes) {
      if (step->supports(dtype)) continue;
      INFO("dtype " << to_string(dtype));
      auto p = supported_problem(*step);
      p.dtype = dtype;
      CHECK_THROWS_WITH(step->launch(p, null_tensors, nullptr), Contains("dtype"));
    }
  }
}

TEST_CASE("launchers that need aligned tensors refuse misaligned ones before launching", "[cpu][validation]") {
  // A pointer 4 bytes past a 256-byte boundary (as from an offset into a larger
  // buffer): fine for the scalar steps, a fault for 16-byte vector loads.
  void* misaligned = reinterpret_cast<void*>(std::uintptr_t(0x10000) + 4);
  void* aligned = reinterpret_cast<void*>(std::uintptr_t(0x20000));  // the others: set and aligned
  for (const StepInfo* step : steps_and_baseline()) {
    if (step->pointer_alignment <= 1) continue;
    INFO("step " << step->label() << " needs " << step->pointer_alignment << "-byte alignment");
    const AttentionProblem p = supported_problem(*step);
    const int tensors = step->pass == Pass::backward ? 8 : 4;  // Q, K, V, O (, dO, dQ, dK, dV)
    for (int which = 0; which < tensors; ++which) {
      static constexpr std::array<const char*, 8> kNames = {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV"};
      INFO("tensor " << kNames[which]);
      AttentionTensors t{aligned, aligned, aligned, aligned, aligned};
      t.lse = static_cast<float*>(aligned);
      t.d_o = t.dq = t.dk = t.dv = aligned;
      if (which == 0) t.q = misaligned;
      if (which == 1) t.k = misaligned;
      if (which == 2) t.v = misaligned;
      if (which == 3) t.o = misaligned;
      if (which == 4) t.d_o = misaligned;
      if (which == 5) t.dq = misaligned;
      if (which == 6) t.dk = misaligned;
      if (which == 7) t.dv = misaligned;
      CHECK_THROWS_WITH(step->launch(p, t, nullptr), Contains("aligned"));
    }
  }
}
