// Every registered step (and the cuBLAS baseline) against the float64 CPU
// reference, on every dtype it accepts, causal off and on, over a table of
// shapes chosen to break tiled kernels: lengths 1, 7, 100, 1000, lengths that
// are multiples of no tile size, q_len != kv_len both ways, GQA 8/2, MQA 8/1,
// every supported head_dim, every dtype a step lists (f32, f16, bf16). The output
// is poisoned with NaN before each launch and every element must be overwritten.
// The last case checks that the steps that accumulate in more than float
// precision (step 07) keep their point.
#include "fa/compare.hpp"
#include "fa/registry.hpp"
#include "gpu.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

using namespace fa;

namespace {

struct Shape {
  int batch, q_len, kv_len, q_heads, kv_heads, head_dim;
  float scale;  // 0: the default 1/sqrt(d)
};

using test::fresh_seed;
std::vector<const StepInfo*> under_test() { return test::steps_under_test(); }

// Shapes at head_dim 64, then two shapes for every other head_dim any step supports.
std::vector<Shape> shapes() {
  std::vector<Shape> list = {
      {1, 1, 1, 1, 1, 64, 0},        // the smallest problem
      {2, 7, 7, 2, 2, 64, 0},        // shorter than any tile
      {1, 100, 100, 8, 2, 64, 0},    // GQA 8/2, not a multiple of 16, 32 or 64
      {1, 1000, 1000, 8, 1, 64, 0},  // MQA 8/1, long enough for many tiles
      {2, 100, 37, 4, 4, 64, 0},     // q_len > kv_len
      {1, 33, 257, 4, 2, 64, 0},     // q_len < kv_len
      {1, 50, 1, 2, 1, 64, 0},       // a single key
      {3, 129, 65, 2, 1, 64, 0.3f},  // custom scale, batch 3
  };
  std::set<int> head_dims;
  for (const StepInfo* s : under_test()) head_dims.insert(s->head_dims.begin(), s->head_dims.end());
  for (int d : head_dims) {
    if (d == 64) continue;
    list.push_back({2, 77, 77, 4, 2, d, 0});
    list.push_back({1, 300, 129, 8, 1, d, 0});
  }
  if (const int limit = test::max_len(); limit > 0)  // sanitizer runs only
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Shape& s) { return s.q_len > limit || s.kv_len > limit; }),
               list.end());
  return list;
}

}  // namespace

TEST_CASE("attention matches the float64 CPU reference", "[gpu][attention]") {
  FA_REQUIRE_GPU();
  const Shape shape = GENERATE(from_range(shapes()));
  const DType dtype = GENERATE(DType::f32, DType::f16, DType::bf16);
  const bool causal = GENERATE(false, true);

  AttentionProblem p;
  p.batch = shape.batch, p.q_len = shape.q_len, p.kv_len = shape.kv_len;
  p.q_heads = shape.q_heads, p.kv_heads = shape.kv_heads, p.head_dim = shape.head_dim;
  p.causal = causal, p.dtype = dtype;
  if (shape.scale != 0) p.scale = shape.scale;

  std::vector<const StepInfo*> steps;
  for (const StepInfo* s : under_test())
    if (s->supports(dtype) && s->supports_head_dim(p.head_dim)) steps.push_back(s);
  if (steps.empty()) return;  // no step under test takes this dtype/head_dim

  const std::uint64_t seed = fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const AttentionInputs inputs = random_inputs(p, seed);
  const std::vector<double> ref =
      reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double());
  const Tolerance tol = tolerance_for(dtype);

  for (const StepInfo* step : steps) {
    INFO("step " << step->label());
    const HostTensor out = run_step(*step, p, inputs);
    const ErrorStats stats = compare(out, ref);
    INFO(stats.describe() << " (tolerance rel_l2 " << tol.rel_l2 << ", max_abs " << tol.max_abs << ")");
    CHECK(stats.non_finite == 0);
    CHECK(stats.rel_l2 <= tol.rel_l2);
    CHECK(stats.max_abs <= tol.max_abs);
  }
}

TEST_CASE("attention is deterministic and uses only its own inputs", "[gpu][attention]") {
  // Two runs on the same inputs agree bit for bit, and changing one key changes
  // the rows that see it and no others (a causal row before it stays put).
  FA_REQUIRE_GPU();
  for (const StepInfo* step : under_test()) {
    for (DType dtype : step->dtypes) {
      AttentionProblem p;
      p.batch = 1, p.q_len = 70, p.kv_len = 70, p.q_heads = 2, p.kv_heads = 1;
      p.head_dim = step->head_dims.front(), p.causal = true, p.dtype = dtype;
      const std::uint64_t seed = fresh_seed();
      INFO("step " << step->label() << " " << p.describe() << " seed=" << seed);
      AttentionInputs inputs = random_inputs(p, seed);
      const HostTensor first = run_step(*step, p, inputs);
      CHECK(run_step(*step, p, inputs).bytes == first.bytes);

      const int changed_key = 40;
      for (int c = 0; c < p.head_dim; ++c) inputs.v.set(changed_key * p.head_dim + c, 5.0);
      const HostTensor second = run_step(*step, p, inputs);
      const std::int64_t row_elems = std::int64_t(p.q_heads) * p.head_dim;
      const std::size_t bytes_before = std::size_t(changed_key * row_elems) * size_of(dtype);
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
    AttentionProblem p;
    p.batch = 70000, p.q_len = 3, p.kv_len = 5, p.q_heads = 1, p.kv_heads = 1;
    p.head_dim = step->head_dims.front(), p.dtype = step->dtypes.back();
    const std::uint64_t seed = fresh_seed();
    INFO("step " << step->label() << " " << p.describe() << " seed=" << seed);
    const AttentionInputs inputs = random_inputs(p, seed);
    try {
      const HostTensor out = run_step(*step, p, inputs);
      const ErrorStats stats =
          compare(out, reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double()));
      INFO("ran it: " << stats.describe());
      CHECK(within(stats, tolerance_for(p.dtype)));
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
