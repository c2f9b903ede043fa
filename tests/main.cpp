// The harness's main: Catch2's session plus two things of ours.
//  --step ID   restricts the attention tests to one step (CTest passes it).
//  exit 77     when GPU test cases were skipped for want of a device and
//              nothing failed, so CTest shows them as skipped, not passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpu.hpp"

#include <cstdio>
#include <string>

int main(int argc, char* argv[]) {
  Catch::Session session;
  std::string step;
  using namespace Catch::clara;
  session.cli(session.cli() | Opt(step, "id")["--step"]("only test this step (e.g. 04) or baseline (cublas)"));
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  fa::test::set_step_filter(step.c_str());

  const int result = session.run();
  const int skipped = fa::test::skipped_cases();
  if (result == 0 && skipped > 0) {
    std::printf("%d GPU test case(s) skipped: no CUDA device\n", skipped);
    return 77;
  }
  return result;
}
