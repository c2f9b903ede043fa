// Every registered step (and the cuBLAS baseline) against the float64 CPU
// reference through the harness (harness.hpp): the shape table on every dtype
// and head_dim a step lists, causal off and on, and inputs that stress the
// numerics (wide logits, +1000 on every score, exact answers, long sequences).
// The output is poisoned with NaN before each launch and every element must be
// overwritten; every row is checked on its own as well as the whole output.
// Further cases: determinism and locality, a batch beyond the grid's 65535,
// step 07's point (higher-precision accumulation), and the decode steps' checks
// of the cache's values on the GPU.
#include "fa/compare.hpp"
#include "fa/cuda_check.hpp"
#include "fa/registry.hpp"
#include "gpu.hpp"
#include "harness.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <set>

using namespace fa;

namespace {

using test::fresh_seed;
std::vector<const StepInfo*> under_test(Pass pass = Pass::forward) { return test::steps_under_test(pass); }

/// Every dtype and head_dim some step under test (of `pass`) supports.
std::vector<DType> all_dtypes() { return {kAllDTypes, kAllDTypes + 3}; }
std::vector<int> all_head_dims(Pass pass) {
  std::set<int> dims;
  for (const StepInfo* s : under_test(pass)) dims.insert(s->head_dims.begin(), s->head_dims.end());
  return {dims.begin(), dims.end()};
}

/// A case, and whether it is for the steps without d = 64 only (see planned()).
struct Planned {
  test::Case c;
  bool only_without_64 = false;
};

/// The cases `make` (test::shape_cases or test::stress_cases) writes for every step under test: its
/// table at d = 64, which every step that takes d = 64 runs (other head_dims get a few shapes), and
/// the table again at a step's own head_dims where it lacks 64 (step 19 takes d = 128 only), run by
/// those steps alone. The backward's leave out what test::graded_cases leaves out for it.
template <class Make>
std::vector<Planned> planned(Make make, Pass pass = Pass::forward) {
  auto graded = [&](const std::vector<int>& dims) {
    std::vector<test::Case> cases = make(all_dtypes(), dims, test::max_len());
    const std::vector<test::Case> all = test::graded_cases(all_dtypes(), dims, test::max_len(), pass);
    std::erase_if(cases, [&](const test::Case& c) {
      return std::none_of(all.begin(), all.end(), [&](const test::Case& a) { return a.describe() == c.describe() && a.kind == c.kind; });
    });
    return cases;
  };
  std::vector<Planned> out;
  for (const test::Case& c : graded(all_head_dims(pass))) out.push_back({c, false});
  std::set<std::vector<int>> without_64;
  for (const StepInfo* s : under_test(pass))
    if (!s->supports_head_dim(64)) without_64.insert(s->head_dims);
  for (const std::vector<int>& dims : without_64)
    for (const test::Case& c : graded(dims)) out.push_back({c, true});
  return out;
}

/// Runs every step under test (of `pass`) that supports the case on one fresh draw of its inputs.
void check_case(const test::Case& c, bool only_without_64 = false, Pass pass = Pass::forward) {
  std::vector<const StepInfo*> steps;
  for (const StepInfo* s : under_test(pass))
    if (s->supports(c.problem) && test::runs_here(*s) && !(only_without_64 && s->supports_head_dim(64)))
      steps.push_back(s);
  if (steps.empty()) return;  // no step under test takes this dtype/head_dim
  const test::Prepared prepared = test::prepare(c, fresh_seed(), pass);
  INFO(c.describe() << " seed=" << prepared.seed);
  for (const StepInfo* step : steps) {
    INFO("step " << step->label());
    Verdict verdict;
    try {
      verdict = test::run_case(*step, c, prepared);
    } catch (const DeviceLimit& e) {  // e.g. step 08 at d = 128 on a GPU of 64 KiB of shared memory a block (T4)
      test::skip(std::string("step ") + step->label() + ", " + c.describe() + ": " + e.what());
      continue;
    }
    INFO(verdict.describe());
    CHECK(verdict.passed());
  }
}

}  // namespace

TEST_CASE("attention matches the float64 CPU reference", "[gpu][attention]") {
  FA_REQUIRE_GPU();
  const std::vector<Planned> cases = planned(test::shape_cases);
  if (cases.empty()) {
    WARN("no shape case is within --max-len " << test::max_len() << ": none run");
    return;
  }
  const Planned p = GENERATE_COPY(from_range(cases));
  check_case(p.c, p.only_without_64);
}

TEST_CASE("attention stays right on inputs that stress the numerics", "[gpu][attention]") {
  // Every stress case is longer than a quick run's --max-len (e.g. the sanitizers' 130): then none run, said so.
  FA_REQUIRE_GPU();
  const std::vector<Planned> cases = planned(test::stress_cases);
  if (cases.empty()) {
    WARN("no stress case is within --max-len " << test::max_len() << ": none run");
    return;
  }
  const Planned p = GENERATE_COPY(from_range(cases));
  check_case(p.c, p.only_without_64);
}

TEST_CASE("attention is deterministic and uses only its own inputs", "[gpu][attention]") {
  // Two runs on the same inputs agree bit for bit, and changing one key changes
  // the rows that see it and no others (a causal row before it stays put). A decode step (a few new
  // tokens, max_q_len) meets its own form: its q_len rows at the end of 70 keys, the mask bottom-right.
  FA_REQUIRE_GPU();
  for (const StepInfo* step : under_test()) {
    if (!test::runs_here(*step)) continue;
    for (DType dtype : step->dtypes) {
      AttentionProblem p;
      p.batch = 1, p.q_len = 70, p.kv_len = 70, p.q_heads = 2, p.kv_heads = 1;
      p.head_dim = step->head_dims.front(), p.causal = true, p.dtype = dtype;
      if (step->cache_forms.max_q_len > 0 && step->cache_forms.bottom_right)
        p.q_len = step->cache_forms.max_q_len, p.causal_align = CausalAlign::bottom_right;
      REQUIRE(step->supports(p));
      const std::uint64_t seed = fresh_seed();
      INFO("step " << step->label() << " " << p.describe() << " seed=" << seed);
      AttentionInputs inputs = random_inputs(p, seed);
      const HostTensor first = run_step(*step, p, inputs);
      CHECK(run_step(*step, p, inputs).bytes == first.bytes);

      // Query row i sees keys up to kv_len - q_len + i (up to i when q_len = kv_len): the rows from
      // first_row on see the changed key, those before it do not.
      const int first_row = p.q_len * 4 / 7, changed_key = p.kv_len - p.q_len + first_row;
      for (int c = 0; c < p.head_dim; ++c) inputs.v.set(changed_key * p.head_dim + c, 5.0);
      const HostTensor second = run_step(*step, p, inputs);
      const std::int64_t row_elems = std::int64_t(p.q_heads) * p.head_dim;
      const std::size_t bytes_before = std::size_t(first_row * row_elems) * size_of(dtype);
      CHECK(std::equal(first.bytes.begin(), first.bytes.begin() + bytes_before, second.bytes.begin()));
      CHECK_FALSE(std::equal(first.bytes.begin() + bytes_before, first.bytes.end(), second.bytes.begin() + bytes_before));
    }
  }
}

TEST_CASE("a batch beyond the grid's 65535 is refused with a clear message or computed right", "[gpu][attention]") {
  // Most steps put the batch on grid y or z, which CUDA caps at 65535 blocks: kit::launch must refuse
  // such a problem by name before launching. A step that maps it elsewhere must get it right.
  FA_REQUIRE_GPU();
  for (const StepInfo* step : under_test()) {
    if (!test::runs_here(*step)) continue;
    AttentionProblem p;
    p.batch = 70000, p.q_len = 3, p.kv_len = 5, p.q_heads = 1, p.kv_heads = 1;
    p.head_dim = step->head_dims.front(), p.dtype = step->dtypes.back();
    const std::uint64_t seed = fresh_seed();
    INFO("step " << step->label() << " " << p.describe() << " seed=" << seed);
    const AttentionInputs inputs = random_inputs(p, seed);
    try {
      const HostTensor out = run_step(*step, p, inputs);
      const Verdict verdict = judge(
          out, reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double()), p.head_dim);
      INFO("ran it: " << verdict.describe());
      CHECK(verdict.passed());
    } catch (const InvalidProblem& refusal) {
      INFO("refused: " << refusal.what());
      CHECK_THAT(refusal.what(), Catch::Matchers::Contains("grid") && Catch::Matchers::Contains("70000"));
    }
  }
}

TEST_CASE("higher-precision accumulation is well below float accumulation's error", "[gpu][accuracy]") {
  // Step 07's point, kept from regressing: on one long row set every step
  // marked high_precision_accumulation must be much closer to the float64
  // reference than step 06 (float accumulation, same loop order) on the same
  // inputs. All of step 06's Br variants do a row's arithmetic in the same
  // order, so their errors are identical and the first one stands for them.
  //
  // Thresholds, from reasoning (INFO names both errors; `-s` prints them on success):
  // - Step 06 adds 16384 exponentials into l and 16384 products into each O
  //   column in float, 512 tile sums of 32 each, plus 512 rescalings: a
  //   random walk of roundings, of order sqrt(512) * 2^-24 ~ 1e-6 relative.
  //   (A CPU emulation of the kernels' arithmetic gave 1.1e-6 to 1.3e-6.)
  // - Double or float-float sums leave two errors of order float's unit
  //   roundoff, neither of which grows with N: the final rounding of O to f32
  //   (rms ~2.5e-8 relative), and for float-float the <= 2 ulp of expf in each
  //   P, independent from key to key, so they average in O rather than add
  //   up (emulation: 2.5e-8 for double, ~4e-8 for float-float).
  // A factor of 4 and a bound of 2e-7 each leave a margin of about 5x on the
  // emulated errors, and sit well below what the float sums of step 06 make.
  FA_REQUIRE_GPU();
  constexpr double kFactor = 4.0;   // at least this many times smaller than step 06
  constexpr double kBound = 2e-7;   // and below this relative L2 error
  AttentionProblem p;
  p.batch = 1, p.q_len = 64, p.kv_len = 16384, p.q_heads = 1, p.kv_heads = 1, p.head_dim = 64;
  p.causal = false, p.dtype = DType::f32;

  std::vector<const StepInfo*> accurate;
  for (const StepInfo& s : all_steps())
    if (s.high_precision_accumulation) accurate.push_back(&s);
  REQUIRE_FALSE(accurate.empty());  // step 07 is registered and marked
  const StepInfo& float_step = *select_steps("06").front();

  const std::uint64_t seed = fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const AttentionInputs inputs = random_inputs(p, seed);
  const std::vector<double> ref =
      reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double());
  const ErrorStats float_error = compare(run_step(float_step, p, inputs), ref);
  INFO("step " << float_step.label() << " (float accumulation): " << float_error.describe());
  REQUIRE(float_error.non_finite == 0);

  for (const StepInfo* step : accurate) {
    const ErrorStats error = compare(run_step(*step, p, inputs), ref);
    INFO("step " << step->label() << ": " << error.describe() << "; needs rel_l2 <= " << kBound << " and <= "
                 << float_error.rel_l2 / kFactor << " (step " << float_step.label() << "'s / " << kFactor << ")");
    CHECK(error.non_finite == 0);
    CHECK(error.rel_l2 <= kBound);
    CHECK(error.rel_l2 * kFactor <= float_error.rel_l2);
  }
}

TEST_CASE("the backward's gradients match the float64 CPU reference", "[gpu][backward]") {
  // dQ, dK and dV of every backward step under test on the shape table, given O and LSE as a forward
  // step stores them (rounded from the reference) and a random dO; every element of each gradient is
  // poisoned first and checked.
  FA_REQUIRE_GPU();
  const std::vector<Planned> cases = planned(test::shape_cases, Pass::backward);
  if (cases.empty()) {
    WARN("no shape case is within --max-len " << test::max_len() << ": none run");
    return;
  }
  const Planned p = GENERATE_COPY(from_range(cases));
  check_case(p.c, p.only_without_64, Pass::backward);
}

TEST_CASE("the backward stays right on inputs that stress the numerics", "[gpu][backward]") {
  FA_REQUIRE_GPU();
  const std::vector<Planned> cases = planned(test::stress_cases, Pass::backward);
  if (cases.empty()) {
    WARN("no stress case is within --max-len " << test::max_len() << ": none run");
    return;
  }
  const Planned p = GENERATE_COPY(from_range(cases));
  check_case(p.c, p.only_without_64, Pass::backward);
}

TEST_CASE("a decode step refuses a bad length or page entry on the GPU, records it, and reads nothing outside",
          "[gpu][cache-values]") {
  // The lengths and the page table are values on the GPU that no host check sees (a server's bookkeeping writes
  // them there). Written there wrong, a decode step must not read outside the cache (it reads such a length as 0
  // keys and such a page as page 0) and must record the value in cache_status, in validate()'s words; entries of
  // the table past a sequence's length are never read, may hold anything, and are no fault.
  FA_REQUIRE_GPU();
  for (const StepInfo* step : under_test()) {
    if (!step->cache_forms.kv_lens || !test::runs_here(*step)) continue;
    for (const bool paged : {false, true}) {
      if (paged && !step->cache_forms.paged) continue;
      test::Case c{"cache values", {}, test::InputKind::uniform};
      AttentionProblem& p = c.problem;
      p.batch = 3, p.q_len = 1, p.kv_len = 512, p.q_heads = 8, p.kv_heads = 2, p.head_dim = 64;
      p.dtype = step->dtypes.front(), p.kv_lens = {512, 100, 300};
      if (paged) p.page_size = 16, p.pages = 3 * 32 + 5;
      INFO("step " << step->label() << ", " << p.describe());
      const test::Prepared prepared = test::prepare(c, fresh_seed());
      DeviceAttention device(p, prepared.inputs, step->workspace_for(p));
      auto run = [&] {
        device.cache_status.upload(std::array<int, 4>{}.data(), 4 * sizeof(int));
        device.poison_outputs();
        step->launch(p, device.tensors(), nullptr);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        return device.cache_fault();
      };
      auto set = [](DeviceBuffer& buffer, std::size_t index, int value) {
        FA_CUDA_CHECK(cudaMemcpy(buffer.as<int>() + index, &value, sizeof(int), cudaMemcpyHostToDevice));
      };
      for (const int bad : {513, -1, 1 << 30}) {
        set(device.kv_lens, 1, bad);
        CHECK(run() == kv_len_fault(1, bad, p.kv_len));
      }
      set(device.kv_lens, 1, 100);
      if (paged) {
        // Sequence 2's 300 keys reach pages 0 .. 18 of its 32: page 5 out of the pool, then page 18.
        const std::size_t row = 2 * 32;
        std::vector<int> table(3 * 32);
        device.page_table.download(table.data(), table.size() * sizeof(int));
        for (const auto& [page, bad] : {std::pair{5, p.pages + 1000}, std::pair{18, -2}}) {
          set(device.page_table, row + page, bad);
          CHECK(run() == page_fault(2, page, bad, p.pages));
          set(device.page_table, row + page, table[row + page]);
        }
        // Past each length: anything.
        for (int b = 0; b < 3; ++b)
          for (int page = (p.kv_lens[std::size_t(b)] + 15) / 16; page < 32; ++page)
            set(device.page_table, std::size_t(b) * 32 + page, page % 2 ? -1 : 0x7fffffff);
      }
      CHECK(run().empty());
      const Verdict verdict = judge(device.download_o(p), prepared.expected, p.head_dim, prepared.max_abs_score);
      INFO(verdict.describe());
      CHECK(verdict.passed());
    }
  }
}
