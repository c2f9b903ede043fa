// CPU tests of the shared pieces: validation, comparison, tensors, .npy, registry.
#include "fa/call_shapes.hpp"
#include "fa/compare.hpp"
#include "fa/host_tensor.hpp"
#include "fa/npy.hpp"
#include "fa/registry.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

using namespace fa;
using Catch::Matchers::Contains;

TEST_CASE("validate names the bad field and its value", "[cpu][problem]") {
  AttentionProblem p;
  p.q_heads = 8, p.kv_heads = 2;
  REQUIRE_NOTHROW(validate(p));
  SECTION("batch") { p.batch = 0; CHECK_THROWS_WITH(validate(p), Contains("batch = 0")); }
  SECTION("q_len") { p.q_len = -3; CHECK_THROWS_WITH(validate(p), Contains("q_len = -3")); }
  SECTION("kv_len") { p.kv_len = 0; CHECK_THROWS_WITH(validate(p), Contains("kv_len = 0")); }
  SECTION("head_dim") { p.head_dim = 0; CHECK_THROWS_WITH(validate(p), Contains("head_dim = 0")); }
  SECTION("kv_heads must divide q_heads") {
    p.kv_heads = 3;
    CHECK_THROWS_WITH(validate(p), Contains("q_heads = 8") && Contains("kv_heads = 3"));
  }
  SECTION("scale must be finite") { p.scale = NAN; CHECK_THROWS_WITH(validate(p), Contains("scale")); }
  SECTION("one sequence of Q must stay below 2^31 elements (32-bit offsets inside a sequence)") {
    p.q_len = 1 << 21, p.head_dim = 128;  // 2^21 * 8 heads * 128 = 2^31 elements in one sequence
    CHECK_THROWS_WITH(validate(p), Contains("one sequence of Q") && Contains("2^31-1"));
  }
  SECTION("one sequence of K/V must stay below 2^31 elements") {
    p.kv_len = 1 << 23, p.head_dim = 128;  // 2^23 * 2 KV heads * 128 = 2^31
    CHECK_THROWS_WITH(validate(p), Contains("one sequence of K/V") && Contains("2^31-1"));
  }
  SECTION("the whole problem may exceed 2^31 elements (64-bit offsets per batch and head)") {
    p.batch = 1 << 12, p.q_len = 1 << 12, p.head_dim = 128;  // Q: 2^12 * 2^12 * 8 * 128 = 2^34 elements
    CHECK(p.q_elements() > (std::int64_t(1) << 31));
    CHECK_NOTHROW(validate(p));
  }
  SECTION("the exception type") { p.batch = 0; CHECK_THROWS_AS(validate(p), InvalidProblem); }
}

TEST_CASE("a zero-length dimension of a call's tensors is named by its field and its tensor", "[cpu][problem]") {
  // Issue 34: the message named neither ("every dimension must be between 1 and 2^30").
  const TensorShape q{"q.npy", {1, 4, 2, 32}, DType::f32}, k{"k.npy", {1, 4, 2, 32}, DType::f32};
  CHECK(problem_from(q, k, k).q_len == 4);
  CHECK_THROWS_WITH(problem_from({"q.npy", {1, 0, 2, 32}, DType::f32}, k, k),
                    Contains("q.npy: Q [1, 0, 2, 32] has q_len (dim 1) = 0"));
  CHECK_THROWS_WITH(problem_from({"q.npy", {0, 4, 2, 32}, DType::f32}, {"k.npy", {0, 4, 2, 32}, DType::f32},
                                 {"v.npy", {0, 4, 2, 32}, DType::f32}),
                    Contains("q.npy: Q [0, 4, 2, 32] has batch (dim 0) = 0"));
  const TensorShape no_heads{"k.npy", {1, 4, 0, 32}, DType::f32};
  CHECK_THROWS_WITH(problem_from(q, no_heads, no_heads), Contains("k.npy: K [1, 4, 0, 32] has kv_heads (dim 2) = 0"));
}

TEST_CASE("flops follow 4*B*H*Nq*Nkv*d, halved when causal", "[cpu][problem]") {
  AttentionProblem p;
  p.batch = 2, p.q_heads = 4, p.kv_heads = 2, p.q_len = 8, p.kv_len = 16, p.head_dim = 32;
  CHECK(p.flops() == 4.0 * 2 * 4 * 8 * 16 * 32);
  p.causal = true;
  CHECK(p.flops() == 2.0 * 2 * 4 * 8 * 16 * 32);
  CHECK(p.softmax_scale() == Approx(1 / std::sqrt(32.0)));
  p.scale = 0.25f;
  CHECK(p.softmax_scale() == 0.25f);
}

TEST_CASE("poisoning with 0xFF bytes gives NaN in every element type", "[cpu][compare]") {
  std::uint32_t f32_bits = 0xFFFFFFFFu;
  float f;
  std::memcpy(&f, &f32_bits, 4);
  CHECK(std::isnan(f));
  CHECK(std::isnan(half_bits_to_float(0xFFFF)));
  CHECK(std::isnan(bf16_bits_to_float(0xFFFF)));
}

TEST_CASE("compare catches NaN, small and large errors", "[cpu][compare]") {
  for (DType dtype : kAllDTypes) {
    INFO("dtype " << to_string(dtype));
    const HostTensor t = random_tensor(dtype, {4, 33}, 7);
    const std::vector<double> ref = t.to_double();
    const Tolerance tol = tolerance_for(dtype);
    CHECK(within(compare(t, ref), tol));
    CHECK(compare(t, ref).rel_l2 == 0);

    HostTensor nan_one = t;
    nan_one.set(17, NAN);
    const ErrorStats stats = compare(nan_one, ref);
    CHECK(stats.non_finite == 1);
    CHECK_FALSE(within(stats, tol));

    HostTensor off = t;
    off.set(5, t.get(5) + 0.1);  // one wrong element
    CHECK_FALSE(within(compare(off, ref), tol));
  }
  CHECK_THROWS(compare(random_tensor(DType::f32, {3}, 1), std::vector<double>(4)));
}

TEST_CASE("the LSE of a row that sees no key is -inf, wherever the row is: only -inf passes", "[cpu][compare]") {
  // A sequence of no keys last in the batch puts -inf in the last rows (a row-by-row check once took its NaN
  // error for the worst row only when that row came last).
  for (const std::size_t empty : {std::size_t(0), std::size_t(3), std::size_t(5)}) {
    INFO("row " << empty << " sees no key");
    std::vector<double> ref = {-1.5, 2.0, 7.25, 0.5, 3.0, 1.0};
    ref[empty] = -INFINITY;
    HostTensor out(DType::f32, {6});
    for (std::size_t i = 0; i < ref.size(); ++i) out.set(std::int64_t(i), ref[i]);
    CHECK(judge_lse(out, ref, 4.0).passed());
    out.set(std::int64_t(empty), 0.0);  // a finite LSE where no key was seen
    CHECK_FALSE(judge_lse(out, ref, 4.0).passed());
    out.set(std::int64_t(empty), -INFINITY);
    out.set(std::int64_t((empty + 1) % ref.size()), -INFINITY);  // -inf where a key was seen
    CHECK_FALSE(judge_lse(out, ref, 4.0).passed());
  }
}

TEST_CASE("random tensors are seeded, in range and rounded to their dtype", "[cpu][tensor]") {
  const HostTensor a = random_tensor(DType::f32, {1000}, 42), b = random_tensor(DType::f32, {1000}, 42),
                   c = random_tensor(DType::f32, {1000}, 43);
  CHECK(a.bytes == b.bytes);
  CHECK(a.bytes != c.bytes);
  double lo = 1, hi = -1;
  for (std::int64_t i = 0; i < a.numel(); ++i) lo = std::min(lo, a.get(i)), hi = std::max(hi, a.get(i));
  CHECK(lo >= -1.0);
  CHECK(hi < 1.0);
  CHECK(hi - lo > 1.9);  // actually spread over the range

  HostTensor h(DType::f16, {1});
  h.set(0, 1.0 + 1e-4);  // not representable in half: rounds to 1
  CHECK(h.get(0) == 1.0);
  h.set(0, 0.333333);
  CHECK(h.get(0) == Approx(0.333333).epsilon(1e-3));

  HostTensor bf(DType::bf16, {1});
  bf.set(0, 1.0 + 2e-3);  // below half a bf16 ulp at 1 (2^-7 / 2 = 3.9e-3): rounds to 1
  CHECK(bf.get(0) == 1.0);
  bf.set(0, 0.333333);
  CHECK(bf.get(0) != 0.333333);
  CHECK(bf.get(0) == Approx(0.333333).epsilon(4e-3));
  bf.set(0, 1e30);  // float's exponent range: no overflow where half would give inf
  CHECK(bf.get(0) == Approx(1e30).epsilon(4e-3));
  CHECK(std::string(to_string(parse_dtype("bfloat16"))) == "bf16");
}

TEST_CASE(".npy files round-trip and bad files are refused clearly", "[cpu][npy]") {
  const std::string path = "fa_test_roundtrip.npy";
  for (DType dtype : {DType::f32, DType::f16}) {
    const HostTensor t = random_tensor(dtype, {2, 3, 4, 5}, 3);
    write_npy(path, t);
    const HostTensor back = read_npy(path);
    CHECK(back.dtype == dtype);
    CHECK(back.shape == t.shape);
    CHECK(back.bytes == t.bytes);
  }
  {  // numpy has no bfloat16: bf16 is written as float32, exactly, and rounds back bit for bit
    const HostTensor t = random_tensor(DType::bf16, {2, 3, 4, 5}, 3);
    write_npy(path, t);
    const HostTensor back = read_npy(path);
    CHECK(back.dtype == DType::f32);
    CHECK(back.shape == t.shape);
    CHECK(back.to_double() == t.to_double());
    CHECK(converted(back, DType::bf16).bytes == t.bytes);
  }
  {
    const std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n";
    std::ofstream bad(path, std::ios::binary);
    bad << "\x93NUMPY\x01" << char(0) << char(header.size()) << char(0) << header << std::string(16, '\0');
  }
  CHECK_THROWS_WITH(read_npy(path), Contains("<f8") && Contains("not supported"));
  {
    const std::string header = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n";
    std::ofstream bad(path, std::ios::binary);
    bad << "\x93NUMPY\x01" << char(0) << char(header.size()) << char(0) << header << std::string(4, '\0');
  }
  CHECK_THROWS_WITH(read_npy(path), Contains("bfloat16") && Contains("float32"));
  CHECK_THROWS_WITH(read_npy("does_not_exist.npy"), Contains("cannot open"));
  std::remove(path.c_str());
}

TEST_CASE("integer .npy files (a KV cache's lengths, a page table) round-trip; int64 within int32 reads too",
          "[cpu][npy]") {
  const std::string path = "fa_test_ints.npy";
  write_npy_ints(path, {2, 3}, {0, 1, -2, 70000, 5, 2147483647});
  const NpyInts back = read_npy_ints(path);
  CHECK(back.shape == std::vector<std::int64_t>{2, 3});
  CHECK(back.values == std::vector<int>{0, 1, -2, 70000, 5, 2147483647});
  for (long long big : {5LL, 1LL << 40}) {  // numpy's default int64
    const std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }\n";
    std::ofstream file(path, std::ios::binary);
    file << "\x93NUMPY\x01" << char(0) << char(header.size()) << char(0) << header;
    file.write(reinterpret_cast<const char*>(&big), 8);
    file.close();
    if (big == 5) CHECK(read_npy_ints(path).values == std::vector<int>{5});
    else CHECK_THROWS_WITH(read_npy_ints(path), Contains("does not fit in int32"));
  }
  write_npy(path, random_tensor(DType::f32, {2}, 1));
  CHECK_THROWS_WITH(read_npy_ints(path), Contains("'<f4' is not supported (need int32"));
  std::remove(path.c_str());
}

TEST_CASE("the registry lists every step once, in course order", "[cpu][registry]") {
  const auto& steps = all_steps();
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.front().id == "01");
  std::set<std::string> labels;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const StepInfo& step = steps[s];
    INFO("step " << step.label());
    CHECK(labels.insert(step.label()).second);
    CHECK(step.id.size() == 2);
    if (s > 0) CHECK(steps[s - 1].id <= step.id);
    CHECK_FALSE(step.name.empty());
    CHECK_FALSE(step.summary.empty());
    CHECK_FALSE(step.dtypes.empty());
    CHECK_FALSE(step.head_dims.empty());
    CHECK(step.launch != nullptr);
  }
  CHECK(select_steps("all").size() == steps.size());
  CHECK(select_steps("01").front()->id == "01");
  CHECK(select_steps("cublas").front() == &cublas_baseline());
  CHECK_THROWS_WITH(select_steps("99"), Contains("'99'"));
}

TEST_CASE("a tool that runs one step takes an exact label, and refuses an id of variants or nothing by name",
          "[cpu][registry]") {
  // Issue 34: "11" is step 11's own label, though 11-f32 shares its id; "05" only an id of four variants.
  CHECK(step_named("11", "fa-run --list").label() == "11");
  CHECK(step_named("11-f32", "fa-run --list").label() == "11-f32");
  CHECK(step_named("05-pad4", "fa-run --list").label() == "05-pad4");
  CHECK(&step_named("cublas", "fa-run --list") == &cublas_baseline());
  CHECK_THROWS_WITH(step_named("05", "fa-run --list"),
                    Contains("step '05' names 4 implementations; name one: 05-pad1, 05-pad4, 05-pad4_vec4, 05-transpose "
                             "(fa-run --list shows them all)"));
  // fa-bench --steps and the tests' --step keep selecting every variant of an id.
  CHECK(select_steps("11").size() == 2);
  // A refusal lists what is known, from the first id to the last, and the baseline.
  const std::string known = "known: " + all_steps().front().id;
  CHECK_THROWS_WITH(step_named("99", "fa-run --list"),
                    Contains("no step or baseline called '99'; " + known) && Contains(all_steps().back().id) &&
                        Contains("05-pad1") && Contains(", cublas"));
  CHECK_THROWS_WITH(select_steps("01,zz"), Contains("no step or baseline called 'zz'; " + known));
  // ...and what the item may have meant.
  CHECK_THAT(unknown_step_message("5"), Contains("called '5' (did you mean 05?)"));
  CHECK_THAT(unknown_step_message("naive"), Contains("(did you mean 01?)"));
  CHECK_THAT(unknown_step_message("01_naive"), Contains("(did you mean 01?)"));
  CHECK_THAT(unknown_step_message("24x"), Contains("(did you mean 24?)"));
  CHECK_THAT(unknown_step_message("05-pad"), Contains("(did you mean 05-pad1, 05-pad4 or 05-pad4_vec4?)"));
  CHECK_THAT(unknown_step_message("zz"), !Contains("did you mean"));
}

TEST_CASE("a backward's O and LSE come from a forward step for whole query sequences, never a decode step",
          "[cpu][registry]") {
  // The decode steps are forward steps too, and the last in the registry; they take at most a few new tokens.
  AttentionProblem p;
  p.batch = 4, p.q_len = 1024, p.kv_len = 1024, p.q_heads = 8, p.kv_heads = 8, p.head_dim = 128;
  p.dtype = DType::f16;
  for (const int arch : {80, 90})  // every dtype has a forward step from sm_80 on
    for (const int q_len : {1, 8, 1024})
      for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        p.q_len = q_len, p.dtype = dtype;
        INFO("sm_" << arch << ", " << p.describe());
        const StepInfo* forward = forward_step_for_backward(p, arch);
        REQUIRE(forward != nullptr);
        CHECK(forward->pass == Pass::forward);
        CHECK(forward->cache_forms.max_q_len == 0);
        CHECK(forward->supports(p));
        CHECK(forward->runs_on(arch));
      }
  p.q_len = 1024, p.dtype = DType::f16;
  CHECK(forward_step_for_backward(p, 90)->id >= "20");  // on an H100, a Hopper forward step
  p.head_dim = 96;  // no step takes it
  CHECK(forward_step_for_backward(p, 90) == nullptr);
}
