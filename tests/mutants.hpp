/// @file mutants.hpp
/// @brief The harness's known-wrong kernels: each one a step with one mistake a student makes, made
/// from the step's own source at build time (tests/mutants/*.mutant, tests/fa_patch.cpp). They are
/// built into the test binary only; fa-bench and fa-run never see them.
#pragma once

#include "fa/registry.hpp"

#include <string>
#include <vector>

namespace fa::test {

/// One deliberately wrong kernel.
struct Mutant {
  std::string name;       ///< "no_max_subtraction" (its spec's file name)
  std::string step;       ///< the step it breaks, "04"
  std::string caught_by;  ///< "harness", or the sanitizer expected to catch it: "racecheck", "memcheck"
  std::string mistake;    ///< the mistake, as a student would make it
  Launcher launcher;      ///< the mutated step's launcher

  /// A registry-style entry, so the harness runs it like any step ("mutant-no_max_subtraction").
  StepInfo as_step() const { return {"mutant", name, "mutant of step " + step, mistake, launcher}; }
};

/// Every mutant, in the order of their spec files.
const std::vector<Mutant>& all_mutants();

}  // namespace fa::test
