// Every step refuses bad and unsupported problems before it touches the GPU.
// These run without a device: a launcher that reached the CUDA runtime first
// would fail with a CudaError (or launch on null pointers), not InvalidProblem.
#include "fa/registry.hpp"

#include <catch2/catch.hpp>

#include <array>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

TEST_CASE("problems with a KV cache's forms are checked, and refused by the steps that do not take them",
          "[cpu][validation]") {
  AttentionProblem p;
  p.batch = 3, p.q_len = 2, p.kv_len = 128, p.q_heads = 4, p.kv_heads = 2, p.head_dim = 64;
  SECTION("per-sequence lengths: one per sequence, each 0 .. kv_len") {
    p.kv_lens = {5, 128};
    CHECK_THROWS_WITH(validate(p), Contains("kv_lens has 2 entries; batch = 3"));
    p.kv_lens = {5, 129, 0};
    CHECK_THROWS_WITH(validate(p), Contains("kv_lens[1] = 129 is outside 0 .. kv_len = 128"));
    p.kv_lens = {5, -1, 0};
    CHECK_THROWS_WITH(validate(p), Contains("kv_lens[1] = -1"));
    p.kv_lens = {5, 128, 0};
    CHECK_NOTHROW(validate(p));
  }
  SECTION("a paged cache: kv_len a multiple of the page, a pool of pages") {
    p.page_size = 48;
    p.pages = 10;
    CHECK_THROWS_WITH(validate(p), Contains("kv_len = 128 is not a multiple of page_size = 48"));
    p.page_size = 64, p.pages = 0;
    CHECK_THROWS_WITH(validate(p), Contains("pages = 0"));
    p.page_size = 0, p.pages = 4;
    CHECK_THROWS_WITH(validate(p), Contains("pages = 4 needs page_size > 0"));
    p.page_size = -64;
    CHECK_THROWS_WITH(validate(p), Contains("page_size = -64"));
    p.page_size = 64, p.pages = 4;
    CHECK_NOTHROW(validate(p));
    CHECK(p.pages_per_sequence() == 2);
  }
  SECTION("a page table: every page a length reaches is in the pool; entries past a length may hold anything") {
    p.page_size = 32, p.pages = 9, p.kv_lens = {5, 128, 0};  // 4 pages a sequence: pages 1, 4 and 0 reached
    std::vector<int> table = {3, -1, 99, 7, 0, 1, 2, 8, -5, 12345, -1, 4};
    CHECK_NOTHROW(validate_page_table(p, table));
    table[6] = 9;  // sequence 1's page 2: its 128 keys reach it
    CHECK_THROWS_WITH(validate_page_table(p, table),
                      Contains("page_table[1][2] = 9 is outside the pool's pages 0 .. 8"));
    table[6] = 2, table[0] = -3;  // sequence 0's 5 keys are in page 0
    CHECK_THROWS_WITH(validate_page_table(p, table), Contains("page_table[0][0] = -3"));
    table.pop_back();
    CHECK_THROWS_WITH(validate_page_table(p, table), Contains("the page table has 11 entries"));
  }
  SECTION("a decode step's fault record reads as the host's refusal of the same value, in the same words") {
    p.kv_lens = {5, 129, 0};
    std::string host;
    try {
      validate(p);
    } catch (const InvalidProblem& e) {
      host = e.what();
    }
    const int length[4] = {1 * 4 + int(CacheFault::length), 0, 129, 128};
    CHECK(cache_fault_message(length) == host);
    const int page[4] = {2 * 4 + int(CacheFault::page), 3, -7, 64};
    CHECK(cache_fault_message(page) == page_fault(2, 3, -7, 64));
    CHECK_THAT(cache_fault_message(page), Contains("page_table[2][3] = -7 is outside the pool's pages 0 .. 63"));
    const int none[4] = {0, 0, 0, 0};
    CHECK(cache_fault_message(none).empty());
  }
  SECTION("bottom-right alignment needs the causal mask") {
    p.causal_align = CausalAlign::bottom_right;
    CHECK_THROWS_WITH(validate(p), Contains("causal_align = bottom-right needs causal = true"));
    p.causal = true;
    CHECK_NOTHROW(validate(p));
  }
  SECTION("every step and the baseline refuse, by name, each form and feature they do not take, before the GPU") {
    const AttentionTensors null_tensors{};
    for (const StepInfo* step : steps_and_baseline()) {
      INFO("step " << step->label());
      AttentionProblem good = supported_problem(*step);
      auto with_lens = good;
      with_lens.kv_lens.assign(std::size_t(good.batch), good.kv_len - 1);
      auto paged = good;
      paged.kv_len = 16, paged.page_size = 8, paged.pages = 4;
      auto bottom_right = good;
      bottom_right.causal = true, bottom_right.causal_align = CausalAlign::bottom_right;
      if (!step->cache_forms.kv_lens) {
        CHECK_FALSE(step->supports(with_lens));
        CHECK_THROWS_WITH(step->launch(with_lens, null_tensors, nullptr),
                          Contains("kv_lens") && Contains("not supported"));
      }
      if (!step->cache_forms.paged) {
        CHECK_FALSE(step->supports(paged));
        CHECK_THROWS_WITH(step->launch(paged, null_tensors, nullptr), Contains("page_size = 8 is not supported"));
      }
      if (!step->cache_forms.bottom_right) {
        CHECK_FALSE(step->supports(bottom_right));
        CHECK_THROWS_WITH(step->launch(bottom_right, null_tensors, nullptr),
                          Contains("causal_align = bottom-right is not supported"));
      }
      // The models' features (issue 58): a window, a soft-cap, sinks, packed variable lengths; refused by the
      // launcher before the GPU.
      for (int feature = 0; feature < 4; ++feature) {
        auto f = good;
        if (feature == 0) f.window_left = 4;
        if (feature == 1) f.softcap = 30.f;
        if (feature == 2) f.sinks = true;
        if (feature == 3)
          for (int b = 0; b <= f.batch; ++b)
            f.cu_seqlens_q.push_back(b * f.q_len), f.cu_seqlens_k.push_back(b * f.kv_len);
        const bool takes = feature == 0   ? step->features.window
                           : feature == 1 ? step->features.softcap
                           : feature == 2 ? step->features.sinks
                                          : step->features.varlen;
        CHECK(takes_features(f, step->features) == takes);
        if (takes) continue;
        CHECK_FALSE(step->supports(f));
        const char* said = feature == 0   ? "window = (4, "
                           : feature == 1 ? "softcap = 30"
                           : feature == 2 ? "sinks = on"
                                          : "cu_seqlens = ";
        CHECK_THROWS_WITH(step->launch(f, null_tensors, nullptr), Contains(said) && Contains("is not supported"));
      }
      if (step->pass == Pass::backward && step->features.sinks) {
        // The backward with sinks writes their gradient: every other tensor given, a missing dsinks is refused by
        // name, before the GPU (the pointers are placeholders, 16-byte aligned, never dereferenced).
        auto f = good;
        f.sinks = true;
        void* placeholder = reinterpret_cast<void*>(std::uintptr_t(1) << 20);
        AttentionTensors t{placeholder, placeholder, placeholder, placeholder, placeholder};
        t.lse = static_cast<float*>(placeholder), t.sinks = static_cast<const float*>(placeholder);
        t.d_o = t.dq = t.dk = t.dv = placeholder;
        CHECK_THROWS_WITH(step->launch(f, t, nullptr),
                          Contains("tensor dsinks is missing") && Contains("float32 [q_heads]"));
      }
      if (step->cache_forms.max_q_len > 0) {  // a decode step: a few new tokens per sequence, no more
        auto long_queries = good;
        long_queries.q_len = step->cache_forms.max_q_len + 1;
        CHECK_FALSE(step->supports(long_queries));
        CHECK_THROWS_WITH(step->launch(long_queries, null_tensors, nullptr),
                          Contains("q_len = " + std::to_string(long_queries.q_len) + " is not supported") &&
                              Contains("1 .. " + std::to_string(step->cache_forms.max_q_len)));
      }
    }
  }
}
