// The exercise grader (tools/exercise grade NN builds and runs it): the exercise file it was built
// with goes through the same harness as the step (tests/harness.hpp: the shape table and the stress
// cases, every dtype and head_dim the step takes), one line per case. When cases fail, the known-wrong
// kernels of the mutation suite (tests/mutants/) run on the same cases, and the one that fails most
// like the exercise is named as the likely mistake.
//
//   fa-grade-NN [--bench] [--no-hints] [--max-len N] [--seed N]
//     --bench      also time the exercise against the step it comes from and the one before it
//                  (teaching shape, non-causal and causal)
//     --no-hints   do not run the mutants to name a likely mistake
//     --max-len N  leave out cases longer than N (quick runs; the full grade has none)
// A case whose kernel does not finish within FA_GRADE_TIMEOUT seconds (default 60) is reported as
// hung and the grade stops there: in the warp-specialized steps a wrong barrier is a deadlock.
// Exit status: 0 when every case it runs passes, 1 when one fails, hangs or faults, 77 without a GPU (or when this
// GPU can run none of the cases: see DeviceLimit), 2 on bad options.
#include "grader.hpp"
#include "harness.hpp"
#include "mutants.hpp"
#include "watchdog.hpp"

#include "fa/device.hpp"
#include "fa/kit.hpp"
#include "reference.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace fa;

namespace {

struct Options {
  bool bench = false;
  bool hints = true;
  int max_len = 0;
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") o.bench = true;
    else if (a == "--no-hints") o.hints = false;
    else if (a == "--max-len" && i + 1 < argc) o.max_len = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) o.seed = std::strtoull(argv[++i], nullptr, 10);
    else throw std::invalid_argument("unknown option '" + a + "' (see the top of tests/grader.cpp)");
  }
  if (o.seed == 0) o.seed = 0x5eed0000 + std::uint64_t(std::rand());
  return o;
}

/// Median time of `reps` launches of `step` on problem p, in ms.
double median_ms(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& in,
                 const BackwardInputs* backward, int reps = 21) {
  DeviceAttention device(p, in, step.workspace_for(p), step.pass == Pass::backward ? backward : nullptr);
  CudaEventTimer timer;
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    timer.start();
    step.launch(p, device.tensors(), nullptr);
    timer.stop();
    if (r >= 2) ms.push_back(timer.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    const test::Exercise ex = test::exercise();
    std::printf("Exercise %s: %s (about %d minutes)\n", ex.name.c_str(), ex.title.c_str(), ex.minutes);
    if (!gpu_available()) {
      std::printf("no CUDA device: the grader runs the exercise on a GPU; without one here, run the course on a hosted "
                  "GPU with notebooks/hosted_gpu.ipynb (docs/instructors.md, 'A class without local GPUs')\n");
      return 77;
    }
    std::printf("GPU: %s, seed %llu\n\n", gpu_name().c_str(), static_cast<unsigned long long>(options.seed));
    const int arch = kit::device_arch();
    const Launcher& first = ex.launchers.front().second;
    if (first.arch_specific ? arch != first.min_arch : arch < first.min_arch) {
      const std::string needs = "sm_" + std::to_string(first.min_arch) +
                                (first.arch_specific ? " exactly (it is built for sm_" + std::to_string(first.min_arch) + "a)"
                                                     : " or newer");
      std::printf("this exercise needs a GPU of %s; this one is sm_%d: grade it on another GPU\n", needs.c_str(), arch);
      return 77;
    }

    int passed = 0, failed = 0, skipped = 0;
    const char* timeout = std::getenv("FA_GRADE_TIMEOUT");
    test::Watchdog watchdog(timeout ? std::max(1, std::atoi(timeout)) : 60,
                            "the grade stops at a hung case");
    std::vector<test::Case> signature_cases;   // the first launcher's cases, for matching mistakes
    std::set<std::size_t> failing;             // failure_key()s of the failing signature_cases
    // A failure as the hint compares them: the case's index, and whether only a second call on the same
    // workspace failed (a counter left behind) or the first did (a wrong kernel).
    auto failure_key = [](std::size_t i, const Verdict& v) {
      return 2 * i + (v.failed.rfind(test::kSecondCall, 0) == 0 ? 1 : 0);
    };
    std::map<std::string, test::Prepared> prepared;  // by case, shared by the launchers and the mutants
    auto prepare = [&](const test::Case& c, std::uint64_t seed) -> const test::Prepared& {
      auto it = prepared.find(c.describe());
      if (it == prepared.end()) it = prepared.emplace(c.describe(), test::prepare(c, seed, ex.launchers.front().second.pass)).first;
      return it->second;
    };
    for (std::size_t l = 0; l < ex.launchers.size(); ++l) {
      const auto& [export_name, launcher] = ex.launchers[l];
      const StepInfo step{"exercise", ex.id, ex.name, export_name, launcher};
      // The cases of its dtypes and head_dims that use only the KV-cache forms it takes.
      const std::vector<test::Case> cases = test::supported_by(
          step, test::graded_cases(launcher.dtypes, launcher.head_dims, options.max_len, launcher.pass));
      if (l == 0) signature_cases = cases;
      std::printf("== %s (%s)\n", export_name.c_str(), ex.name.c_str());
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const test::Prepared& inputs = prepare(cases[i], options.seed + i);
        watchdog.start(cases[i].describe(), passed);
        Verdict v;
        try {
          v = test::run_case(step, cases[i], inputs);
        } catch (const DeviceLimit& e) {  // this GPU's limit (shared memory a block): not a verdict on the kernel
          watchdog.stop();
          std::printf("[skip] %s\n       %s\n", cases[i].describe().c_str(), e.what());
          ++skipped;
          continue;
        } catch (const CudaError& e) {
          // A faulting kernel (an mbarrier given more arrivals than it counts, an address out of
          // range) leaves the GPU context unusable: no later case could run.
          std::printf("[ERROR] %s\n       %s\n\n%d cases passed before it; the grade stops at a case whose kernel "
                      "failed\n", cases[i].describe().c_str(), e.what(), passed);
          return 1;
        }
        watchdog.stop();
        std::printf("%s %s%s%s\n", v.passed() ? "[pass]" : "[FAIL]", cases[i].describe().c_str(),
                    v.passed() ? "" : "\n       ", v.passed() ? "" : v.describe().c_str());
        (v.passed() ? passed : failed) += 1;
        if (!v.passed() && l == 0) failing.insert(failure_key(i, v));
      }
    }
    // A step whose point is accuracy (step 07) is also held to it, as the test suite holds the step.
    for (const StepInfo* reference : select_steps(ex.id)) {
      if (!reference->high_precision_accumulation) continue;
      AttentionProblem p;
      p.batch = 1, p.q_len = 64, p.kv_len = 16384, p.q_heads = 1, p.kv_heads = 1, p.head_dim = 64;
      const AttentionInputs in = random_inputs(p, options.seed);
      const std::vector<double> ref = reference_attention(p, in.q.to_double(), in.k.to_double(), in.v.to_double());
      const double float_error = compare(run_step(*select_steps("06").front(), p, in), ref).rel_l2;
      const StepInfo mine{"exercise", ex.id, ex.name, ex.launchers.front().first, ex.launchers.front().second};
      const double error = compare(run_step(mine, p, in), ref).rel_l2;
      const bool ok = error <= 2e-7 && 4 * error <= float_error;
      std::printf("%s accuracy at N = 16384: rel_l2 %.3g, needs <= 2e-7 and <= a quarter of step 06's %.3g\n",
                  ok ? "[pass]" : "[FAIL]", error, float_error);
      (ok ? passed : failed) += 1;
      break;
    }
    std::printf("\n%d of %d cases passed\n", passed, passed + failed);
    if (skipped > 0)
      std::printf("%d more case(s) skipped: this GPU cannot run the kernel for them (see [skip] above); grade them on "
                  "a larger GPU\n", skipped);
    if (passed + failed == 0) return 77;  // nothing graded here: not a pass

    if (failed > 0 && options.hints) {
      // The known mistakes, on the same cases: which one fails where this exercise fails?
      std::vector<std::string> best;  // every mutant at the best score: ties are named together
      double best_score = 0;
      for (const test::Mutant& m : test::all_mutants()) {
        if (m.caught_by == "memcheck") continue;  // writes out of bounds: only run under the sanitizer
        if (m.caught_by == "zero-tiles") continue;  // a probe of the zero-tile test, not a mistake
        if (m.caught_by == "lag-probe") continue;   // a right step made late: not a mistake either
        if (m.caught_by == "sass") continue;        // passes every case: nothing to match
        const StepInfo step = m.as_step();
        if (step.pass != ex.launchers.front().second.pass) continue;  // the other pass's mistakes
        std::set<std::size_t> mutant_failing;
        std::size_t compared = 0;
        for (std::size_t i = 0; i < signature_cases.size(); ++i) {
          if (!step.supports(signature_cases[i].problem)) continue;
          Verdict v;
          try {
            v = test::run_case(step, signature_cases[i], prepare(signature_cases[i], 0));
          } catch (const DeviceLimit&) {
            continue;  // skipped for the exercise too
          }
          ++compared;
          if (!v.passed()) mutant_failing.insert(failure_key(i, v));
        }
        if (compared == 0) continue;
        std::size_t both = 0;
        for (std::size_t i : failing) both += mutant_failing.count(i);
        const std::size_t either = failing.size() + mutant_failing.size() - both;
        const double score = either ? double(both) / double(either) : 0;  // Jaccard similarity
        if (score > best_score + 1e-9) best_score = score, best.clear();
        if (score > best_score - 1e-9 && score > 0) best.push_back(m.name + ": " + m.mistake);
      }
      if (best_score >= 0.5) {
        std::printf("Hint: your kernel fails on the cases where %s (similarity %.2f):\n",
                    best.size() == 1 ? "a known-wrong kernel fails" : "each of these known-wrong kernels fails",
                    best_score);
        for (const std::string& mistake : best) std::printf("      %s\n", mistake.c_str());
        std::printf("      Look there first.\n");
      } else
        std::printf("No known mistake fails like this; start from the first failing case above.\n");
    }

    if (options.bench) {
      // The teaching shape, without and with the causal mask, in the exercise's first dtype and
      // head_dim: the exercise against the step it comes from and the step before that one.
      const Launcher& launcher = ex.launchers.front().second;
      const StepInfo mine{"exercise", ex.id, ex.name, ex.launchers.front().first, launcher};
      std::vector<const StepInfo*> references;
      const int id = std::stoi(ex.id);
      if (id > 1) {
        std::string previous = std::to_string(id - 1);
        if (previous.size() < 2) previous.insert(previous.begin(), '0');
        references = select_steps(previous);
      }
      for (const StepInfo* step : select_steps(ex.id)) references.push_back(step);
      std::erase_if(references, [&](const StepInfo* s) { return s->pass != launcher.pass; });  // same pass only
      for (const bool causal : {false, true}) {
        AttentionProblem p;
        p.batch = 4, p.q_len = 1024, p.kv_len = 1024, p.q_heads = 8, p.kv_heads = 8, p.causal = causal;
        p.head_dim = launcher.head_dims.front(), p.dtype = launcher.dtypes.front();
        const AttentionInputs in = random_inputs(p, options.seed);
        BackwardInputs backward;
        if (launcher.pass == Pass::backward) backward = forward_for_backward(p, in, options.seed);
        const double exercise_ms = median_ms(mine, p, in, &backward);
        std::printf("\nbench, %s, median of 21 launches:\n  %-14s %9.4f ms\n", p.describe().c_str(), "exercise",
                    exercise_ms);
        for (const StepInfo* reference : references) {
          if (!reference->supports(p)) continue;
          const double ms = median_ms(*reference, p, in, &backward);
          std::printf("  step %-9s %9.4f ms  (the exercise takes %.2fx its time)\n", reference->label().c_str(), ms,
                      exercise_ms / ms);
        }
      }
    }
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa-grade: %s\n", e.what());
    return 2;
  }
}
