// The harness as a grader: every known-wrong kernel (tests/mutants/) must fail it. Each mutant runs
// through the same cases as the steps, in the same order (the shape table, then the stress cases),
// until one fails; the table printed at the end names each mutant and the check that caught it.
// Mutants that write out of bounds are not run here (a fault would end the process): they run under
// compute-sanitizer, one process each ("[mutant-run]", registered by tests/CMakeLists.txt).
#include "gpu.hpp"
#include "harness.hpp"
#include "mutants.hpp"
#include "watchdog.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <map>

using namespace fa;

TEST_CASE("every known-wrong kernel fails the harness", "[gpu][mutants]") {
  FA_REQUIRE_GPU();
  const std::vector<DType> dtypes(kAllDTypes, kAllDTypes + 3);
  const std::vector<int> head_dims = {32, 64, 128};
  // The cases of each pass, in the harness's order (a backward mutant meets the backward's cases).
  std::map<Pass, std::vector<test::Case>> cases_of;
  for (Pass pass : {Pass::forward, Pass::backward})
    cases_of[pass] = test::graded_cases(dtypes, head_dims, test::max_len(), pass);

  // Each case's inputs and expected output, made once and shared by the mutants that reach it.
  const std::uint64_t seed = test::fresh_seed();
  std::map<std::pair<Pass, std::size_t>, test::Prepared> prepared;
  auto prepare = [&](Pass pass, std::size_t i) -> const test::Prepared& {
    auto it = prepared.find({pass, i});
    if (it == prepared.end())
      it = prepared.emplace(std::pair{pass, i}, test::prepare(cases_of[pass][i], seed + i, pass)).first;
    return it->second;
  };

  // A mutant that deadlocks would hang the suite: the watchdog names it and ends the process instead.
  test::Watchdog watchdog(60, "a mutant must give wrong answers, not hang (make it a probe or change it)");
  std::printf("\n%-26s %-5s %-10s %s\n", "mutant", "step", "caught by", "first failing case and check");
  for (const test::Mutant& mutant : test::all_mutants()) {
    INFO("mutant " << mutant.name << " (step " << mutant.step << "): " << mutant.mistake << "; seed=" << seed);
    if (mutant.caught_by == "zero-tiles") continue;  // not a mistake: the zero-tile test's probe
    if (mutant.caught_by == "sass") {
      std::printf("%-26s %-5s %-10s not run: the machine code shows it (mutants/sass check catches ...)\n",
                  mutant.name.c_str(), mutant.step.c_str(), "sass");
      continue;
    }
    if (mutant.caught_by == "memcheck") {
      std::printf("%-26s %-5s %-10s not run in-process (writes out of bounds): see mutants/memcheck\n",
                  mutant.name.c_str(), mutant.step.c_str(), "memcheck");
      continue;
    }
    const StepInfo step = mutant.as_step();
    if (!test::runs_here(step, /*count_as_skip=*/false)) {
      std::printf("%-26s %-5s %-10s not run: needs %s\n", mutant.name.c_str(), mutant.step.c_str(), "-",
                  step.min_gpu().c_str());
      continue;
    }
    std::string caught = "nothing: PASSES THE HARNESS";
    const std::vector<test::Case>& cases = cases_of[step.pass];
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (!step.supports(cases[i].problem)) continue;
      watchdog.start("mutant " + mutant.name + ", " + cases[i].describe(), 0);
      Verdict verdict;
      try {
        verdict = test::run_case(step, cases[i], prepare(step.pass, i));
      } catch (const DeviceLimit&) {  // not on this GPU: the case proves nothing either way
        watchdog.stop();
        continue;
      }
      watchdog.stop();
      if (!verdict.passed()) {
        caught = cases[i].describe() + " -> " + verdict.tensor + ": " + verdict.failed;
        break;
      }
    }
    const bool by_harness = caught.rfind("nothing", 0) != 0;
    std::printf("%-26s %-5s %-10s %s\n", mutant.name.c_str(), mutant.step.c_str(),
                by_harness ? "harness" : mutant.caught_by.c_str(), caught.c_str());
    INFO("first failing case: " << caught);
    if (mutant.caught_by == "harness") CHECK(by_harness);
  }
  std::fflush(stdout);
}

TEST_CASE("run one mutant on a small problem, for a sanitizer to watch", "[.][mutant-run]") {
  // compute-sanitizer --tool racecheck|memcheck fa_tests "[mutant-run]" --mutant NAME: the sanitizer,
  // not this case, decides (the output is not checked: a racy or out-of-bounds kernel may still
  // happen to produce the right numbers).
  FA_REQUIRE_GPU();
  const std::string name = test::mutant_filter();
  const test::Mutant* mutant = nullptr;
  for (const test::Mutant& m : test::all_mutants())
    if (m.name == name) mutant = &m;
  INFO("--mutant " << name);
  REQUIRE(mutant != nullptr);
  if (!test::runs_here(mutant->as_step())) return;
  test::Case c{"a sanitizer's small problem", {}, test::InputKind::uniform};
  AttentionProblem& p = c.problem;
  p.batch = 1, p.q_len = 7, p.kv_len = 100, p.q_heads = 2, p.kv_heads = 1;
  p.head_dim = mutant->launcher.head_dims.front(), p.dtype = mutant->launcher.dtypes.front();
  const StepInfo step = mutant->as_step();
  const test::Prepared prepared = test::prepare(c, test::fresh_seed(), step.pass);
  test::run_case(step, c, prepared);  // the verdict does not matter here
}

TEST_CASE("the Hopper steps finish with zero K/V tiles and write O = 0", "[gpu][mutants]") {
  // No block has zero K/V tiles today (kv_len >= 1, and a top-left causal mask leaves every block key
  // 0), but one will once a block's key range can be empty (per-sequence lengths, split-KV, a causal
  // mask aligned to the end of the cache). A barrier protocol that assumes one tile then waits forever.
  // The zero-tile probes (tests/mutants/zero_tiles_*.mutant, caught-by: zero-tiles) are steps with
  // their tile count Tc forced to 0; each must finish (the watchdog ends the process if one does not)
  // and write O = 0 for every row, the value of an empty softmax the steps already give a fully masked
  // row.
  FA_REQUIRE_GPU();
  test::Watchdog watchdog(30, "a step deadlocks when a block has no K/V tile");
  int probes = 0;
  for (const test::Mutant& probe : test::all_mutants()) {
    if (probe.caught_by != "zero-tiles") continue;
    ++probes;
    const StepInfo step = probe.as_step();
    if (!test::runs_here(step)) continue;
    for (const DType dtype : probe.launcher.dtypes) {
      for (const int head_dim : probe.launcher.head_dims) {
        for (const bool causal : {false, true}) {
          AttentionProblem p;
          p.batch = 2, p.q_len = 300, p.kv_len = 200, p.q_heads = 4, p.kv_heads = 2;
          p.head_dim = head_dim, p.dtype = dtype, p.causal = causal;
          const std::string what = "step " + probe.step + " with zero tiles, " + p.describe();
          INFO(what);
          watchdog.start(what, 0);
          const HostTensor out = run_step(step, p, random_inputs(p, test::fresh_seed()));
          watchdog.stop();
          std::int64_t nonzero = 0;  // NaN (the poison: an element never written) counts too
          for (std::int64_t i = 0; i < out.numel(); ++i) nonzero += out.get(i) != 0.0;
          CHECK(nonzero == 0);
        }
      }
    }
  }
  CHECK(probes >= 3);  // steps 22, 23, 24 at least: the producer/consumer protocols
}
