#include "gpu.hpp"

#include "fa/device.hpp"
#include "fa/kit.hpp"

#include <catch2/catch.hpp>

#include <random>
#include <stdexcept>
#include <string>

namespace fa::test {

namespace {
int g_skipped = 0;
std::string g_step_filter;
std::string g_mutant_filter;
int g_max_len = 0;
}  // namespace

bool gpu_or_skip() {
  static const bool available = gpu_available();
  if (!available) {
    ++g_skipped;
    WARN("no CUDA device: skipping this GPU test case");
  }
  return available;
}

int skipped_cases() { return g_skipped; }

void skip(const std::string& reason) {
  ++g_skipped;
  WARN("skipped: " << reason);
}

bool runs_here(const StepInfo& step, bool count_as_skip) {
  static const int arch = kit::device_arch();
  if (step.runs_on(arch)) return true;
  const std::string reason = step.label() + " needs " + step.min_gpu() + "; this GPU is sm_" + std::to_string(arch);
  if (count_as_skip) skip(reason);
  else WARN("not run: " + reason);
  return false;
}

std::vector<const StepInfo*> steps_under_test() {
  return select_steps(g_step_filter.empty() ? "all,cublas" : g_step_filter);
}

std::vector<const StepInfo*> steps_under_test(Pass pass) {
  std::vector<const StepInfo*> steps;
  const std::vector<const StepInfo*> selected = steps_under_test();
  for (const StepInfo* s : selected)
    if (s->pass == pass) steps.push_back(s);
  // --step naming only steps of the other pass would leave this test case nothing to run, and a run that
  // checks nothing must not read as passed: say which tag tests them.
  if (steps.empty() && !selected.empty() && !g_step_filter.empty()) {
    const Pass other = selected.front()->pass;
    throw std::invalid_argument("--step " + g_step_filter + " names " + to_string(other) + " step(s) only; this test case checks the " +
                                to_string(pass) + " pass and would check nothing. Select the " + to_string(other) +
                                " tests with \"[" + (other == Pass::backward ? "backward" : "attention") + "]\"");
  }
  return steps;
}

std::uint64_t fresh_seed() {
  static std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}
const char* step_filter() { return g_step_filter.c_str(); }
void set_step_filter(const char* filter) { g_step_filter = filter; }
int max_len() { return g_max_len; }
const char* mutant_filter() { return g_mutant_filter.c_str(); }
void set_mutant_filter(const char* name) { g_mutant_filter = name; }
void set_max_len(int n) { g_max_len = n; }

}  // namespace fa::test
