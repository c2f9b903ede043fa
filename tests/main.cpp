// The harness's main: Catch2's session plus two things of ours.
//  --step ID   restricts the attention tests to one step (CTest passes it).
//  --max-len N leaves out attention shapes longer than N (sanitizer runs).
//  --mutant NAME names the known-wrong kernel "[mutant-run]" runs (under a sanitizer).
//  exit 77     when GPU test cases were skipped (no device, a step this GPU cannot run, a problem
//              larger than its memory) and nothing failed, so CTest shows them as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpu.hpp"

#include <cstdio>
#include <string>

int main(int argc, char* argv[]) {
  Catch::Session session;
  std::string step, mutant;
  int max_len = 0;
  using namespace Catch::clara;
  session.cli(session.cli() |
              Opt(step, "id")["--step"]("only test this step (e.g. 04) or baseline (cublas)") |
              Opt(max_len, "n")["--max-len"]("leave out attention shapes with q_len or kv_len above n") |
              Opt(mutant, "name")["--mutant"]("the mutant [mutant-run] runs (tests/mutants/NAME.mutant)"));
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  if (max_len < 0) {
    std::fprintf(stderr, "--max-len must be >= 0, got %d\n", max_len);
    return 2;
  }
  fa::test::set_step_filter(step.c_str());
  fa::test::set_max_len(max_len);
  fa::test::set_mutant_filter(mutant.c_str());

  const int result = session.run();
  const int skipped = fa::test::skipped_cases();
  if (result == 0 && skipped > 0) {
    std::printf("%d GPU test case(s) or part(s) skipped: no CUDA device, or a step this GPU cannot run\n",
                skipped);
    return 77;
  }
  return result;
}
