// CPU tests of the harness (harness.hpp): the exact answers it expects are right, the offset case
// really is a row-constant shift, and its judge fails one wrong row among many.
#include "harness.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

using namespace fa;

namespace {
/// The first stress case of `kind` at f32 (or f16 where asked).
test::Case stress_case(test::InputKind kind, DType dtype = DType::f32, bool causal = false) {
  for (const test::Case& c : test::stress_cases({dtype}, {64}))
    if (c.kind == kind && c.problem.causal == causal) return c;
  FAIL("no such stress case");
  return {};
}
}  // namespace

TEST_CASE("the harness's exact answers agree with the float64 reference", "[cpu][harness]") {
  for (auto kind : {test::InputKind::zero_scale, test::InputKind::dominant_key})
    for (bool causal : {false, true}) {
      const test::Case c = stress_case(kind, DType::f32, causal);
      INFO(c.describe());
      const test::Prepared prep = test::prepare(c, 7);
      AttentionProblem p = c.problem;
      if (kind == test::InputKind::zero_scale) p.scale = 0.f;
      const std::vector<double> ref =
          reference_attention(p, prep.inputs.q.to_double(), prep.inputs.k.to_double(), prep.inputs.v.to_double());
      double worst = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - prep.expected[i]));
      CHECK(worst < 1e-12);
    }
}

TEST_CASE("+1000 on every score of a row does not move the softmax", "[cpu][harness]") {
  const test::Case c = stress_case(test::InputKind::offset_1000);
  const test::Prepared prep = test::prepare(c, 11);
  CHECK(prep.max_abs_score > 900);
  // The same inputs without the shared last dimension: the scores without the shift.
  AttentionInputs plain = prep.inputs;
  const AttentionProblem& p = c.problem;
  for (std::int64_t e = p.head_dim - 1; e < plain.q.numel(); e += p.head_dim) plain.q.set(e, 0.0);
  const std::vector<double> unshifted =
      reference_attention(p, plain.q.to_double(), plain.k.to_double(), plain.v.to_double());
  double worst = 0;
  for (std::size_t i = 0; i < unshifted.size(); ++i) worst = std::max(worst, std::abs(unshifted[i] - prep.expected[i]));
  CHECK(worst < 1e-9);
}

TEST_CASE("every score shifted by -1000 puts every row's LSE near -1000, graded on every pass", "[cpu][harness]") {
  const test::Case c = stress_case(test::InputKind::offset_minus_1000);
  // kv_len past a whole tile of every size the steps use: the case's lesson is the tail tile's mask.
  for (int tile : {16, 32, 64, 80, 128, 176, 192}) CHECK(c.problem.kv_len % tile != 0);
  // With the causal mask as well: a whole Q tile of 128 rows starts past the last K tile of 128 keys, so the mask
  // of that tile cannot come from the causal diagonal.
  CHECK(c.problem.q_len > (c.problem.kv_len + 127) / 128 * 128);
  const test::Prepared prep = test::prepare(c, 13);
  double highest = -INFINITY;
  for (double lse : prep.expected_lse) highest = std::max(highest, lse);
  CHECK(highest < -900);  // 2^(-LSE log2 e) overflows float: an unmasked key's P is inf
  // Graded on the backward, the forward and decode (q_len = 1, contiguous and with the cache's forms).
  for (Pass pass : {Pass::forward, Pass::backward}) {
    bool graded = false, decode = false, cache = false;
    for (const test::Case& g : test::graded_cases({DType::f32}, {64}, 0, pass)) {
      if (g.kind != c.kind) continue;
      graded = true;
      decode |= g.problem.q_len == 1;
      cache |= g.problem.q_len == 1 && !g.problem.kv_lens.empty();
    }
    CHECK(graded);
    if (pass == Pass::forward) {  // the backward steps take no decode problem
      CHECK(decode);
      CHECK(cache);
    }
  }
}

TEST_CASE("the decode cases: every count of new tokens, empty sequences, short pages, NaN past every length",
          "[cpu][harness]") {
  const std::vector<test::Case> cases = test::graded_cases({DType::f16}, {64, 128}, 0, Pass::forward);
  // Every count of new tokens 1 .. 8 with the cache's forms, with one query head a KV head (rows = tokens) and with
  // GQA, contiguous and paged, without the mask and bottom-right.
  for (int n = 1; n <= 8; ++n)
    for (bool masked : {false, true}) {
      bool mha = false, paged = false;
      for (const test::Case& c : cases) {
        const AttentionProblem& p = c.problem;
        if (p.q_len != n || p.kv_lens.empty() || p.causal != masked) continue;
        if (masked) CHECK(p.causal_align == CausalAlign::bottom_right);
        mha |= p.q_heads == p.kv_heads && !p.paged();
        paged |= p.paged() && p.q_heads > p.kv_heads;
      }
      INFO(n << " new tokens" << (masked ? ", masked" : ""));
      CHECK(mha);
      CHECK(paged);
    }
  // A sequence of no keys beside one long enough for several splits (256 keys a split at least), contiguous and
  // paged; pages of 1, 4, 12 and 48 keys.
  bool empty_contiguous = false, empty_paged = false;
  std::set<int> page_sizes;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (p.kv_lens.empty()) continue;
    const int longest = *std::max_element(p.kv_lens.begin(), p.kv_lens.end());
    const bool has_empty = std::find(p.kv_lens.begin(), p.kv_lens.end(), 0) != p.kv_lens.end();
    if (has_empty && longest >= 8 * 256) (p.paged() ? empty_paged : empty_contiguous) = true;
    if (p.paged()) page_sizes.insert(p.page_size);
  }
  CHECK(empty_contiguous);
  CHECK(empty_paged);
  for (int size : {1, 4, 12, 48}) CHECK(page_sizes.count(size) == 1);
  // Every K and V row past a sequence's length is NaN, and with a window every row before the first key its rows
  // see, and only those.
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (p.kv_lens.empty() || p.kv_len > 1000) continue;
    INFO(c.describe());
    const test::Prepared prep = test::prepare(c, 19);
    const std::int64_t row = std::int64_t(p.kv_heads) * p.head_dim;
    std::int64_t wrong = 0;
    for (int b = 0; b < p.batch; ++b)
      for (int j = 0; j < p.kv_len; ++j)
        for (std::int64_t e = 0; e < row; ++e) {
          const std::int64_t at = (std::int64_t(b) * p.kv_len + j) * row + e;
          const bool past = j >= p.kv_len_of(b) || (p.windowed() && j < p.keys_range(b, 0).first);
          wrong += std::isnan(prep.inputs.k.get(at)) != past || std::isnan(prep.inputs.v.get(at)) != past;
        }
    CHECK(wrong == 0);
  }
}

TEST_CASE("the decode feature cases: windows about a page, caps of 5, sinks over several splits, run by decode steps "
          "that take the feature", "[cpu][harness]") {
  const std::vector<test::Case> cases = test::graded_cases({DType::f16}, {64, 128}, 0, Pass::forward);
  bool small_window = false, mid_page = false, own_key = false, two_row_tiles = false, shorter_than_window = false,
       cap_5 = false, dominant_sinks_split = false, sink_no_key = false, all_three = false, unmasked_window = false;
  std::set<int> page_sizes;
  int count = 0;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (c.name.rfind("decode features: ", 0) != 0) continue;
    ++count;
    INFO(c.describe());
    CHECK_NOTHROW(validate(p));
    CHECK(!p.kv_lens.empty());  // a cache's form: no forward step without one takes it
    CHECK((p.windowed() || p.softcap > 0 || p.sinks));
    if (p.windowed()) CHECK(p.causal_align == CausalAlign::bottom_right);
    // A window without the mask over several new tokens: the kernel's diagonal must be bottom-right without it too.
    unmasked_window |= p.windowed() && !p.causal && p.window_right >= 0 && p.q_len > 1;
    // Taken by the decode steps that take the features, and by no other step of the registry.
    for (const StepInfo& step : all_steps())
      if (step.supports(p))
        CHECK((step.cache_forms.max_q_len > 0 && (!p.windowed() || step.features.window) &&
               (p.softcap == 0 || step.features.softcap) && (!p.sinks || step.features.sinks)));
    const int longest = *std::max_element(p.kv_lens.begin(), p.kv_lens.end());
    const int shortest = *std::min_element(p.kv_lens.begin(), p.kv_lens.end());
    if (p.paged()) page_sizes.insert(p.page_size);
    if (p.window_left >= 0) {
      small_window |= p.paged() && p.window_left + 1 < p.page_size;
      mid_page |= p.paged() && (longest - p.q_len - p.window_left) % p.page_size != 0 && p.window_left > p.page_size;
      own_key |= p.window_left == 0 && p.q_len > 1;
      two_row_tiles |= p.group_size() * p.q_len > 16;
      shorter_than_window |= shortest > 0 && shortest < p.window_left;
    }
    cap_5 |= p.softcap == 5.f && c.kind == test::InputKind::wide_10;
    dominant_sinks_split |= p.sinks && c.kind == test::InputKind::dominant_sink && longest >= 8 * 256;
    sink_no_key |= p.sinks && shortest == 0;
    all_three |= p.windowed() && p.softcap > 0 && p.sinks;
    // Prepared: rows before the window's first key and past the length NaN, the reference finite everywhere (a row
    // that sees no key: O = 0; its LSE the sink's logit, or -inf without sinks).
    const test::Prepared prep = test::prepare(c, 59);
    CHECK(std::all_of(prep.expected.begin(), prep.expected.end(), [](double x) { return std::isfinite(x); }));
    if (p.windowed()) {
      const std::int64_t row = std::int64_t(p.kv_heads) * p.head_dim;
      for (int b = 0; b < p.batch; ++b) {
        const int first = p.keys_range(b, 0).first;
        for (int j : {first - 1, first, p.kv_len_of(b) - 1}) {
          if (j < 0 || j >= p.kv_len_of(b)) continue;
          CHECK(std::isnan(prep.inputs.k.get((std::int64_t(b) * p.kv_len + j) * row)) == (j < first));
          CHECK(std::isnan(prep.inputs.v.get((std::int64_t(b) * p.kv_len + j) * row)) == (j < first));
        }
      }
    }
  }
  CHECK(count > 0);
  CHECK(small_window);
  CHECK(mid_page);
  CHECK(own_key);
  CHECK(two_row_tiles);
  CHECK(shorter_than_window);
  CHECK(cap_5);
  CHECK(dominant_sinks_split);
  CHECK(sink_no_key);
  CHECK(all_three);
  CHECK(unmasked_window);
  CHECK(page_sizes.count(16) == 1);
  CHECK(page_sizes.count(64) == 1);
}

TEST_CASE("the packed cases: lengths around a tile, a long one among short, no rows, no keys, the features",
          "[cpu][harness]") {
  const std::vector<test::Case> cases = test::graded_cases({DType::f16}, {64}, 0, Pass::backward);
  std::set<int> lengths;
  bool no_rows = false, no_keys = false, more_keys = false, window = false, cap_and_sinks = false, causal = false;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (!p.varlen()) continue;
    INFO(c.describe());
    CHECK_NOTHROW(validate(p));
    for (int b = 0; b < p.batch; ++b) {
      lengths.insert(p.q_len_of(b));
      no_rows |= p.q_len_of(b) == 0;
      no_keys |= p.kv_len_of(b) == 0 && p.q_len_of(b) > 0;
      more_keys |= p.kv_len_of(b) > p.q_len_of(b) && p.q_len_of(b) > 0;
    }
    window |= p.windowed();
    cap_and_sinks |= p.softcap > 0 && p.sinks;
    causal |= p.causal;
    if (p.total_q() > 1000) continue;
    // The float64 answers the GPU is judged against: packed shapes, and a row with no key has O = 0, LSE = -inf.
    const test::Prepared prep = test::prepare(c, 23, Pass::backward);
    CHECK(std::int64_t(prep.expected.size()) == p.q_elements());
    CHECK(std::int64_t(prep.expected_lse.size()) == p.lse_elements());
    CHECK(std::int64_t(prep.expected_dk.size()) == p.kv_elements());
    // What the backward reads and is judged on, packed as the forward writes it (step 56): O and dO [total_q, Hq, d],
    // LSE [Hq, total_q]; dQ [total_q, Hq, d], dK and dV [total_k, Hkv, d].
    CHECK(prep.backward_inputs.o.shape == q_shape(p));
    CHECK(prep.backward_inputs.d_o.shape == q_shape(p));
    CHECK(prep.backward_inputs.lse.shape == lse_shape(p));
    CHECK(std::int64_t(prep.expected_dq.size()) == p.q_elements());
    CHECK(std::int64_t(prep.expected_dv.size()) == p.kv_elements());
    for (int b = 0; b < p.batch; ++b)
      if (p.kv_len_of(b) == 0)
        for (int i = 0; i < p.q_len_of(b); ++i) CHECK(prep.expected_lse[std::size_t(p.lse_index(b, i, 0))] == -INFINITY);
    // A sequence with no rows has keys no row sees (dK = dV = 0), one with no keys rows that see none (dQ = 0): a
    // backward must still write both.
    const std::int64_t kv_row = std::int64_t(p.kv_heads) * p.head_dim, q_row = std::int64_t(p.q_heads) * p.head_dim;
    for (int b = 0; b < p.batch; ++b) {
      if (p.q_len_of(b) == 0)
        for (std::int64_t e = p.kv_row(b, 0) * kv_row; e < p.kv_row(b, p.kv_len_of(b)) * kv_row; ++e)
          CHECK((prep.expected_dk[std::size_t(e)] == 0 && prep.expected_dv[std::size_t(e)] == 0));
      if (p.kv_len_of(b) == 0)
        for (std::int64_t e = p.q_row(b, 0) * q_row; e < p.q_row(b, p.q_len_of(b)) * q_row; ++e)
          CHECK(prep.expected_dq[std::size_t(e)] == 0);
    }
  }
  for (int len : {1, 127, 128, 129, 3000}) CHECK(lengths.count(len) == 1);
  CHECK(no_rows);
  CHECK(no_keys);
  CHECK(more_keys);
  CHECK(window);
  CHECK(cap_and_sinks);
  CHECK(causal);
}

TEST_CASE("head_dim 256's cases: odd lengths, q_len != kv_len, GQA, causal, each feature, packs about an 80-key tile",
          "[cpu][harness]") {
  // Asked for only by a step that takes d = 256 (step 57): none where the head_dims stop at 128.
  for (const test::Case& c : test::graded_cases({DType::bf16}, {64, 128}, 0, Pass::forward))
    CHECK(c.problem.head_dim != 256);
  const std::vector<test::Case> cases = test::graded_cases({DType::bf16}, {64, 128, 256}, 0, Pass::forward);
  std::set<int> lengths;
  bool smallest = false, q_not_kv = false, gqa = false, causal = false, small_window = false, saturating_cap = false,
       sinks = false, pack = false, all_features_packed = false;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (p.head_dim != 256) continue;
    INFO(c.describe());
    CHECK_NOTHROW(validate(p));
    smallest |= p.q_len == 1 && p.kv_len == 1 && !p.varlen();
    q_not_kv |= p.q_len != p.kv_len && !p.varlen() && p.kv_lens.empty();
    gqa |= p.q_heads > p.kv_heads;
    causal |= p.causal;
    small_window |= p.windowed() && p.window_left >= 0 && p.window_left < 80;
    saturating_cap |= p.softcap > 0 && p.softcap <= 5 && c.kind == test::InputKind::wide_10;
    sinks |= p.sinks;
    pack |= p.varlen();
    all_features_packed |= p.varlen() && p.windowed() && p.softcap > 0 && p.sinks;
    if (p.varlen())
      for (int b = 0; b < p.batch; ++b) lengths.insert(p.q_len_of(b));
    if (p.q_elements() > 300 * 8 * 256 || p.kv_len > 1000) continue;
    // The float64 answers at d = 256: the reference takes any head_dim; O finite everywhere (O = 0 with no key).
    const test::Prepared prep = test::prepare(c, 57, Pass::forward);
    REQUIRE(std::int64_t(prep.expected.size()) == p.q_elements());
    CHECK(std::all_of(prep.expected.begin(), prep.expected.end(), [](double x) { return std::isfinite(x); }));
  }
  for (int len : {1, 77, 79, 80, 81, 161, 300}) CHECK(lengths.count(len) == 1);
  for (int len : {63, 64, 65, 128, 129}) CHECK(lengths.count(len) == 1);  // about step 58's 64-key tiles
  CHECK(smallest);
  CHECK(q_not_kv);
  CHECK(gqa);
  CHECK(causal);
  CHECK(small_window);
  CHECK(saturating_cap);
  CHECK(sinks);
  CHECK(pack);
  CHECK(all_features_packed);
}

TEST_CASE("head_dim 256's cases reach the backward (step 58): packs about 64-key tiles, gradients finite in float64",
          "[cpu][harness]") {
  const std::vector<test::Case> cases = test::graded_cases({DType::bf16}, {64, 128, 256}, 0, Pass::backward);
  int at_256 = 0;
  bool pack = false, all_features_packed = false;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (p.head_dim != 256) continue;
    INFO(c.describe());
    ++at_256;
    pack |= p.varlen();
    all_features_packed |= p.varlen() && p.windowed() && p.softcap > 0 && p.sinks;
    if (p.q_elements() > 300 * 8 * 256 || p.kv_len > 1000 || !p.kv_lens.empty()) continue;
    const test::Prepared prep = test::prepare(c, 58, Pass::backward);
    REQUIRE(prep.backward);
    REQUIRE(std::int64_t(prep.expected_dq.size()) == p.q_elements());
    for (const std::vector<double>* g : {&prep.expected_dq, &prep.expected_dk, &prep.expected_dv})
      CHECK(std::all_of(g->begin(), g->end(), [](double x) { return std::isfinite(x); }));
  }
  CHECK(at_256 > 0);
  CHECK(pack);
  CHECK(all_features_packed);
}

TEST_CASE("the bottom-right prefill cases: a chunk over a prefix, rows that see no key, windows, packs with their own "
          "offsets, taken only by the prefill steps that declare bottom-right", "[cpu][harness]") {
  const std::vector<test::Case> cases = test::graded_cases({DType::f16}, {64, 128, 256}, 0, Pass::backward);
  bool chunk = false, no_key_rows = false, empty_tile = false, equal = false, gqa = false, mqa = false, window = false,
       sinks = false, own_offsets = false, no_rows = false, no_keys = false, unmasked_window = false;
  std::set<int> head_dims;
  int count = 0;
  for (const test::Case& c : cases) {
    const AttentionProblem& p = c.problem;
    if (c.name.rfind("bottom-right causal: ", 0) != 0 && c.name.rfind("bottom-right window: ", 0) != 0) continue;
    ++count;
    INFO(c.describe());
    CHECK_NOTHROW(validate(p));
    CHECK(((p.causal || p.windowed()) && p.causal_align == CausalAlign::bottom_right && p.kv_lens.empty() &&
           !p.paged()));
    unmasked_window |= !p.causal && p.window_right >= 0;
    CHECK(p.q_len > 8);  // no decode step (8 new tokens at most) takes them: prefill's own cases
    head_dims.insert(p.head_dim);
    gqa |= p.q_heads > p.kv_heads && p.kv_heads > 1;
    mqa |= p.kv_heads == 1 && p.q_heads > 1;
    window |= p.windowed();
    sinks |= p.sinks;
    for (int b = 0; b < p.batch; ++b) {
      const int q = p.q_len_of(b), k = p.kv_len_of(b);
      chunk |= q > 0 && q < k && !p.varlen();
      no_key_rows |= q > k && p.keys_range(b, 0).count() == 0;
      empty_tile |= q - k >= 128 && !p.varlen();  // a whole work tile of rows that see no key: no K/V tile
      equal |= q == k && !p.varlen() && !p.windowed();
      // A sequence whose own offset kv_len - q_len is not the pack's longest lengths': a kernel that takes the
      // offset from the pack's q_len and kv_len misplaces its diagonal.
      own_offsets |= p.varlen() && q > 0 && k > 0 && k - q != p.kv_len - p.q_len;
      no_rows |= p.varlen() && q == 0;
      no_keys |= p.varlen() && k == 0 && q > 0;
    }
    // Taken by the prefill steps that declare bottom-right (steps 60 and 61), and by no other step of the registry.
    for (const StepInfo& step : all_steps())
      if (step.supports(p)) CHECK((step.cache_forms.bottom_right && step.cache_forms.max_q_len == 0));
    if (p.q_elements() > 300 * 8 * 128 || p.kv_len > 1000) continue;
    // The float64 answers: the first rows of a sequence with q_len > kv_len see no key: O = 0, LSE = -inf (the
    // sink's logit with sinks), dQ = 0; every other value finite.
    const test::Prepared prep = test::prepare(c, 60, Pass::backward);
    REQUIRE(prep.backward);
    for (const std::vector<double>* g : {&prep.expected, &prep.expected_dq, &prep.expected_dk, &prep.expected_dv})
      CHECK(std::all_of(g->begin(), g->end(), [](double x) { return std::isfinite(x); }));
    const std::int64_t q_row = std::int64_t(p.q_heads) * p.head_dim;
    for (int b = 0; b < p.batch; ++b)
      for (int i = 0; i < p.q_len_of(b); ++i) {
        const bool sees_none = p.keys_range(b, i).count() == 0;
        // Before any key: the diagonal (causal) or the window's right side past it (without the mask).
        const int last_seen = p.kv_len_of(b) - p.q_len_of(b) + i + (p.causal ? 0 : p.window_right);
        CHECK(sees_none == (last_seen < 0 || p.keys_range(b, i).first >= p.kv_len_of(b)));
        if (!sees_none) continue;
        for (int h = 0; h < p.q_heads; ++h)
          CHECK(prep.expected_lse[std::size_t(p.lse_index(b, i, h))] == (p.sinks ? prep.inputs.sinks.get(h) : -INFINITY));
        for (std::int64_t e = p.q_row(b, i) * q_row; e < p.q_row(b, i + 1) * q_row; ++e)
          CHECK((prep.expected[std::size_t(e)] == 0 && prep.expected_dq[std::size_t(e)] == 0));
      }
    // With q_len = kv_len bottom-right is top-left: the same answers.
    if (p.q_len == p.kv_len && !p.varlen()) {
      test::Case top_left = c;
      top_left.problem.causal_align = CausalAlign::top_left;
      const test::Prepared same = test::prepare(top_left, 60, Pass::backward);
      CHECK(same.expected == prep.expected);
      CHECK(same.expected_dk == prep.expected_dk);
    }
  }
  CHECK(count > 0);
  CHECK(head_dims == std::set<int>{64, 128, 256});
  CHECK(chunk);
  CHECK(no_key_rows);
  CHECK(empty_tile);
  CHECK(equal);
  CHECK(gqa);
  CHECK(mqa);
  CHECK(window);
  CHECK(sinks);
  CHECK(unmasked_window);
  CHECK(own_offsets);
  CHECK(no_rows);
  CHECK(no_keys);
}

TEST_CASE("only the backward's -1000 case has a row that reaches past kv_len with an LSE below -11", "[cpu][harness]") {
  // Below about -11, a key past kv_len left unmasked gets P = exp(0 - LSE) and dS = -P D beyond f16's 65504: the
  // overflow that makes that mistake visible (tests/harness.cpp). Only rows the causal mask lets reach past kv_len
  // count (all rows without it; rows i >= kv_len with it, top-left). Every other case must stay above, or the -1000
  // case would not be the one that catches the mistake; it must go below.
  for (const test::Case& c : test::graded_cases({DType::f32}, {64, 128}, 0, Pass::backward)) {
    if (!c.problem.kv_lens.empty() || c.problem.page_size > 0) continue;  // the KV-cache forms: decode steps only
    const test::Prepared prep = test::prepare(c, 17);
    const AttentionProblem& p = c.problem;
    double lowest = INFINITY;
    // A row whose window holds no key has the empty sum's LSE, -inf, and no key to leave unmasked: not counted.
    for (std::size_t e = 0; e < prep.expected_lse.size(); ++e)
      if ((!p.causal || int(e % p.q_len) >= p.kv_len) && prep.expected_lse[e] != -INFINITY)
        lowest = std::min(lowest, prep.expected_lse[e]);
    if (lowest == INFINITY) {  // causal with q_len <= kv_len: no row reaches past kv_len
      CHECK(c.kind != test::InputKind::offset_minus_1000);  // the -1000 case reaches past it with the mask too
      continue;
    }
    INFO(c.describe() << ": lowest LSE of a row that reaches past kv_len " << lowest);
    CHECK((lowest < -11) == (c.kind == test::InputKind::offset_minus_1000));
  }
}

TEST_CASE("the judge fails one wrong row that the whole-output error hides", "[cpu][harness]") {
  // 2000 rows of bf16 output, exactly the reference rounded; then one row 10 % off.
  AttentionProblem p;
  p.batch = 1, p.q_len = 500, p.kv_len = 1, p.q_heads = 4, p.kv_heads = 4, p.head_dim = 32, p.dtype = DType::bf16;
  const HostTensor values = random_tensor(DType::bf16, q_shape(p), 5);
  const std::vector<double> ref = values.to_double();
  HostTensor out = values;
  CHECK(judge(out, ref, p.head_dim).passed());
  for (int c = 0; c < p.head_dim; ++c) out.set(777 * p.head_dim + c, ref[777 * p.head_dim + c] * 1.1);
  const Verdict verdict = judge(out, ref, p.head_dim);
  INFO(verdict.describe());
  CHECK(verdict.global.rel_l2 < verdict.tolerance.rel_l2);  // the whole output hides it...
  CHECK_THAT(verdict.failed, Catch::Matchers::Contains("row 777"));  // ...its row does not
}

TEST_CASE("the bounds widen with the size of the scores, as derived", "[cpu][harness]") {
  const Tolerance plain = tolerance_for(DType::f32), wide = tolerance_for(DType::f32, 1024);
  CHECK(plain.rel_l2 == 1e-5);
  CHECK(plain.row_rel == 2e-5);
  CHECK(wide.rel_l2 == Approx(1e-5 + 8 * 1024 * std::ldexp(1.0, -24)));
}

TEST_CASE("the backward's sink cases carry the reference's dsinks and are judged in the inputs' dtype", "[cpu][harness]") {
  // dsinks_h = -sum_i e^(sink_h - LSE_i) D_i, computed as a kernel computes it (D_i from O rounded to the dtype, LSE
  // rounded to f32, in float-like precision) passes the judge; its sign flipped, D left out or the sum taken by KV
  // head fails it. Every sink case of the shape table, f16 and bf16, both masks.
  int cases = 0;
  for (const test::Case& c : test::graded_cases({DType::f16, DType::bf16}, {64}, 0, Pass::backward)) {
    if (!c.problem.sinks) continue;
    ++cases;
    const AttentionProblem& p = c.problem;
    INFO(c.describe());
    const test::Prepared prep = test::prepare(c, 23, Pass::backward);
    REQUIRE(prep.expected_dsinks.size() == std::size_t(p.q_heads));
    const BackwardInputs& in = prep.backward_inputs;
    const std::vector<double> sinks = prep.inputs.sinks.to_double();
    // What the kernel has: O and dO in the dtype, LSE in f32.
    std::vector<double> kernel(std::size_t(p.q_heads)), without_d(kernel.size()), by_kv_head(kernel.size());
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.q_heads; ++h)
        for (int i = 0; i < p.q_len_of(b); ++i) {  // a pack's sequences each over their own rows
          double D = 0;
          for (int e = 0; e < p.head_dim; ++e) {
            const std::int64_t at = (p.q_row(b, i) * p.q_heads + h) * p.head_dim + e;
            D += float(in.o.get(at)) * float(in.d_o.get(at));
          }
          const double lse = in.lse.get(p.lse_index(b, i, h));
          const int kv_h = h / p.group_size();
          kernel[std::size_t(h)] -= std::exp(sinks[std::size_t(h)] - lse) * float(D);
          without_d[std::size_t(h)] -= std::exp(sinks[std::size_t(h)] - lse);
          by_kv_head[std::size_t(kv_h)] -= std::exp(sinks[std::size_t(kv_h)] - lse) * float(D);
        }
    auto as_f32 = [&](const std::vector<double>& values) {
      HostTensor t(DType::f32, {p.q_heads});
      for (int h = 0; h < p.q_heads; ++h) t.set(h, values[std::size_t(h)]);
      return t;
    };
    std::vector<double> flipped = kernel;
    for (double& x : flipped) x = -x;
    const Verdict right = judge_dsinks(as_f32(kernel), prep.expected_dsinks, p.dtype, prep.max_abs_score);
    INFO(right.describe());
    CHECK(right.passed());
    CHECK(right.tensor == "dsinks");
    CHECK_FALSE(judge_dsinks(as_f32(flipped), prep.expected_dsinks, p.dtype, prep.max_abs_score).passed());
    CHECK_FALSE(judge_dsinks(as_f32(without_d), prep.expected_dsinks, p.dtype, prep.max_abs_score).passed());
    if (p.group_size() > 1)
      CHECK_FALSE(judge_dsinks(as_f32(by_kv_head), prep.expected_dsinks, p.dtype, prep.max_abs_score).passed());
    // Poisoned (a kernel that never wrote it): non-finite.
    HostTensor nan(DType::f32, {p.q_heads});
    for (int h = 0; h < p.q_heads; ++h) nan.set(h, NAN);
    CHECK_THAT(judge_dsinks(nan, prep.expected_dsinks, p.dtype, prep.max_abs_score).failed,
               Catch::Matchers::Contains("non-finite"));
  }
  // 4 sink cases (one of them a pack) x 2 dtypes x 2 masks, and the bottom-right one (rows that see only the sink) x 2
  // dtypes, causal alone
  CHECK(cases == 18);
}
