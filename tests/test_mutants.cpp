// The harness as a grader: every known-wrong kernel (tests/mutants/) must fail it. Each mutant runs
// through the same cases as the steps, in the same order (the shape table, then the stress cases),
// until one fails; the table printed at the end names each mutant and the check that caught it.
// Each mutant runs in a process of its own (this binary again, "[mutant-one]" --mutant NAME, four at a
// time), so one that faults (an illegal address loses the CUDA context) or hangs (its own watchdog ends
// it) is counted and named as rejected, and the mutants after it still run. Mutants that write out of
// bounds are not run here: they run under compute-sanitizer ("[mutant-run]", registered by
// tests/CMakeLists.txt). The lag probes (tests/mutants/lag_probes/, caught-by: lag-probe) are the steps
// unchanged with one role made late at its barriers (common/fa/lag.cuh); they must pass.
#include "fa/cuda_check.hpp"
#include "gpu.hpp"
#include "harness.hpp"
#include "mutants.hpp"
#include "watchdog.hpp"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

using namespace fa;

namespace {

/// How a child's result line starts: "mutant-result<TAB>NAME<TAB>STATUS<TAB>DETAIL".
constexpr char kResultTag[] = "mutant-result\t";
/// Children run at once: the GPU has room for four small processes.
constexpr int kParallelChildren = 4;
/// The lag probes' cases: shapes up to 1100 (1000 x 1000 has 8 K/V tiles a block, 8 Q tiles a key tile).
constexpr int kProbeMaxLen = 1100;

/// What became of one mutant: "caught" (detail: the first failing case and check), "passed", "not-run"
/// (detail: why), "faulted" (a CUDA error, a signal, an exit without a result) or "hung" (its watchdog).
struct Outcome {
  std::string status, detail;
  bool rejected() const { return status == "caught" || status == "faulted" || status == "hung"; }
  std::string describe() const {
    if (status == "caught") return detail;
    if (status == "passed") return "nothing: PASSES THE HARNESS";
    if (status == "not-run") return "not run: " + detail;
    return status + ": " + detail;
  }
};

const test::Mutant* find_mutant(const std::string& name) {
  for (const test::Mutant& m : test::all_mutants())
    if (m.name == name) return &m;
  return nullptr;
}

/// The path of this test binary, which the parent starts again for each mutant.
std::string self_path() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, std::size_t(n));
}

/// `text` in single quotes for sh.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The last `n` non-empty lines of `text`, joined by " | ".
std::string tail_lines(const std::string& text, int n) {
  std::vector<std::string> lines;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    if (end > at) lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  std::string out;
  for (std::size_t i = lines.size() > std::size_t(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

/// Runs `fa_tests "[mutant-one]" --mutant NAME ARGS` for each name, kParallelChildren at a time, and reads
/// each child's result line; a child that ends without one faulted (a signal, or an exit code) or hung.
/// `output` receives each child's whole output (stdout and stderr), for a report.
std::vector<Outcome> run_children(const std::vector<std::string>& names, const std::string& args,
                                  std::vector<std::string>& output) {
  const std::string self = self_path();
  std::vector<Outcome> outcomes(names.size());
  output.assign(names.size(), "");
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < names.size(); i = next++) {
      const std::string command = "exec " + quoted(self) + " '[mutant-one]' --mutant " + quoted(names[i]) + " " +
                                  args + " 2>&1";
      std::FILE* pipe = popen(command.c_str(), "re");
      if (pipe == nullptr) {
        outcomes[i] = {"faulted", "could not start " + self};
        continue;
      }
      char buffer[4096];
      for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output[i].append(buffer, n);
      const int status = pclose(pipe);
      Outcome& o = outcomes[i];
      const std::size_t tag = output[i].find(std::string("\n") + kResultTag);
      if (tag != std::string::npos || output[i].rfind(kResultTag, 0) == 0) {
        const std::size_t from = tag == std::string::npos ? 0 : tag + 1;
        std::string line = output[i].substr(from, output[i].find('\n', from) - from);
        line.erase(0, std::strlen(kResultTag));
        const std::size_t a = line.find('\t'), b = line.find('\t', a + 1);
        o.status = line.substr(a + 1, b - a - 1);
        o.detail = b == std::string::npos ? "" : line.substr(b + 1);
      } else if (output[i].find("[HANG]") != std::string::npos) {
        o = {"hung", "no result within the watchdog's 60 s: " + tail_lines(output[i].substr(output[i].find("[HANG]")), 2)};
      } else if (status != -1 && WIFSIGNALED(status)) {
        o = {"faulted", std::string("signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
                            "): " + tail_lines(output[i], 2)};
      } else {
        o = {"faulted", "exit code " + std::to_string(status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                            " without a result: " + tail_lines(output[i], 2)};
      }
    }
  };
  std::vector<std::thread> workers;
  for (int w = 0; w < kParallelChildren; ++w) workers.emplace_back(worker);
  for (std::thread& w : workers) w.join();
  return outcomes;
}

}  // namespace

TEST_CASE("run one mutant through the harness's cases and print its result line", "[.][mutant-one]") {
  // fa_tests "[mutant-one]" --mutant NAME [--max-len N]: what the mutation table's parent runs once per
  // mutant. Prints one line, "mutant-result<TAB>NAME<TAB>STATUS<TAB>DETAIL" (STATUS caught, passed,
  // not-run or faulted); the parent judges it, not this case. A hung case ends the process (the watchdog).
  FA_REQUIRE_GPU();
  const test::Mutant* mutant = find_mutant(test::mutant_filter());
  INFO("--mutant " << test::mutant_filter());
  REQUIRE(mutant != nullptr);
  auto result = [&](const std::string& status, const std::string& detail) {
    std::printf("%s%s\t%s\t%s\n", kResultTag, mutant->name.c_str(), status.c_str(), detail.c_str());
    std::fflush(stdout);
  };
  const StepInfo step = mutant->as_step();
  if (!test::runs_here(step, /*count_as_skip=*/false)) return result("not-run", "needs " + step.min_gpu());
  const std::vector<DType> dtypes(kAllDTypes, kAllDTypes + 3);
  const std::vector<test::Case> cases = test::graded_cases(dtypes, {32, 64, 128, 256}, test::max_len(), step.pass);
  const std::uint64_t seed = test::fresh_seed();
  // A mutant that deadlocks would hang: the watchdog names it and ends the process instead.
  test::Watchdog watchdog(60, "the mutant hangs (the mutation table counts it as rejected)");
  std::string at = "before the first case";
  try {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (!step.supports(cases[i].problem)) continue;
      at = "at " + cases[i].describe();
      const test::Prepared prepared = test::prepare(cases[i], seed + i, step.pass);
      watchdog.start("mutant " + mutant->name + ", " + cases[i].describe(), 0);
      Verdict verdict;
      try {
        verdict = test::run_case(step, cases[i], prepared);
      } catch (const DeviceLimit&) {  // not on this GPU: the case proves nothing either way
        watchdog.stop();
        continue;
      }
      watchdog.stop();
      if (!verdict.passed())
        return result("caught", cases[i].describe() + " -> " + verdict.tensor + ": " + verdict.failed +
                                    " (seed=" + std::to_string(seed + i) + ")");
    }
  } catch (const CudaError& e) {
    // A fault (illegal or misaligned address, ...) loses the CUDA context: report it and end the process
    // before anything else touches the device.
    result("faulted", std::string(cudaGetErrorName(e.code())) + " " + at);
    std::_Exit(0);
  } catch (const std::exception& e) {
    result("faulted", std::string("threw ") + at + ": " + e.what());
    std::_Exit(0);
  }
  result("passed", "");
}

TEST_CASE("every known-wrong kernel fails the harness", "[gpu][mutants]") {
  FA_REQUIRE_GPU();
  std::vector<const test::Mutant*> mutants, children;
  for (const test::Mutant& m : test::all_mutants()) {
    if (m.caught_by == "zero-tiles" || m.caught_by == "lag-probe") continue;  // probes, not mistakes
    mutants.push_back(&m);
    if (m.caught_by != "sass" && m.caught_by != "memcheck") children.push_back(&m);
  }
  std::vector<std::string> names, output;
  for (const test::Mutant* m : children) names.push_back(m->name);
  const std::string args = test::max_len() > 0 ? "--max-len " + std::to_string(test::max_len()) : "";
  const std::vector<Outcome> outcomes = run_children(names, args, output);

  std::printf("\n%-30s %-5s %-10s %s\n", "mutant", "step", "caught by", "first failing case and check");
  int rejected = 0, faulted = 0, left = 0, passing = 0, not_run = 0;
  std::size_t k = 0;
  for (const test::Mutant* mutant : mutants) {
    if (mutant->caught_by == "sass" || mutant->caught_by == "memcheck") {
      ++left;
      std::printf("%-30s %-5s %-10s %s\n", mutant->name.c_str(), mutant->step.c_str(), mutant->caught_by.c_str(),
                  mutant->caught_by == "sass" ? "not run: the machine code shows it (mutants/sass check catches ...)"
                                              : "not run in-process (writes out of bounds): see mutants/memcheck");
      continue;
    }
    const std::size_t i = k++;
    const Outcome& o = outcomes[i];
    const bool by_harness = o.rejected();
    if (o.status == "not-run") ++not_run;
    else if (by_harness) ++rejected, faulted += o.status != "caught";
    else if (mutant->caught_by == "harness") ++passing;
    else ++left;
    std::printf("%-30s %-5s %-10s %s\n", mutant->name.c_str(), mutant->step.c_str(),
                by_harness ? "harness" : o.status == "not-run" ? "-" : mutant->caught_by.c_str(), o.describe().c_str());
    INFO("mutant " << mutant->name << " (step " << mutant->step << "): " << mutant->mistake);
    INFO("its process's output:\n" << output[i]);
    if (mutant->caught_by == "harness" && o.status != "not-run") CHECK(by_harness);
  }
  // One line for a log reader: every mutant counted once.
  std::printf("mutation table: %zu mutants: %d rejected by the harness%s, %d left to a sanitizer or the SASS check, "
              "%d pass%s\n",
              mutants.size(), rejected,
              faulted > 0 ? (" (" + std::to_string(faulted) + " of them by a fault or a hang)").c_str() : "", left,
              passing, not_run > 0 ? (", " + std::to_string(not_run) + " not run on this GPU").c_str() : "");
  std::fflush(stdout);
}

TEST_CASE("a right kernel with one role made late still passes: the lag probes", "[gpu][mutants]") {
  // The lag probes are the warp-specialized and pipelined steps unchanged, each built with one role (a
  // warpgroup, or a decode step's warp) spinning 20 us at one kind of barrier site (before each arrive,
  // before each wait, after each wait; common/fa/lag.cuh). The dropped-barrier mutants use the same lags
  // to make their races show; a probe that failed would mean the lag, not the barrier, broke the kernel,
  // and the mutant proved nothing. They run the cases up to length 1100 (a subset: the shape table's
  // multi-tile shapes, without the long stress cases), f16 (and d = 64 where the protocol is the same at
  // d = 128), each in a process of its own.
  FA_REQUIRE_GPU();
  std::vector<std::string> names, output;
  for (const test::Mutant& m : test::all_mutants())
    if (m.caught_by == "lag-probe") names.push_back(m.name);
  const int max_len = test::max_len() > 0 ? std::min(test::max_len(), kProbeMaxLen) : kProbeMaxLen;
  const std::vector<Outcome> outcomes = run_children(names, "--max-len " + std::to_string(max_len), output);
  std::printf("\n%-32s %-5s %s\n", "lag probe", "step", "result (every probe must pass)");
  int passed = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const test::Mutant* probe = find_mutant(names[i]);
    std::printf("%-32s %-5s %s\n", names[i].c_str(), probe->step.c_str(),
                outcomes[i].status == "passed" ? "passes" : outcomes[i].describe().c_str());
    INFO("lag probe " << names[i] << " (step " << probe->step << "): " << probe->mistake);
    INFO("its process's output:\n" << output[i]);
    CHECK((outcomes[i].status == "passed" || outcomes[i].status == "not-run"));
    passed += outcomes[i].status == "passed";
  }
  std::printf("lag probes: %zu probes: %d pass, %zu fail or were not run\n", names.size(), passed,
              names.size() - std::size_t(passed));
  std::fflush(stdout);
  CHECK(names.size() >= 11);  // at least one for each of steps 22-25, 38-41, 44-46
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
