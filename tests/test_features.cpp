// CPU tests of the models' features in the problem and the float64 reference (issue 58): sliding windows,
// logit soft-capping and attention sinks, forward and backward, and the refusals of the steps that take none.
#include "fa/host_tensor.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

using namespace fa;
using Catch::Matchers::Contains;

namespace {
AttentionProblem make(int batch, int q_len, int kv_len, int q_heads, int kv_heads, int head_dim, bool causal) {
  AttentionProblem p;
  p.batch = batch, p.q_len = q_len, p.kv_len = kv_len, p.q_heads = q_heads, p.kv_heads = kv_heads;
  p.head_dim = head_dim, p.causal = causal;
  return p;
}
std::vector<double> random_doubles(std::int64_t n, std::uint64_t seed) {
  return random_tensor(DType::f32, {n}, seed).to_double();
}

/// Row (b, i, h) computed the plain way, written here apart from the reference: the scores of the keys j the
/// problem's rule lets it see (`sees`), capped, the sink in the sum; O and LSE (natural log).
template <class Sees>
std::pair<std::vector<double>, double> plain_row(const AttentionProblem& p, const std::vector<double>& q,
                                                 const std::vector<double>& k, const std::vector<double>& v,
                                                 const std::vector<double>* sinks, int b, int i, int h, Sees sees) {
  const int d = p.head_dim, kv_head = h / p.group_size();
  std::vector<double> weights(std::size_t(p.kv_len), 0.0);
  double sum = p.sinks ? std::exp((*sinks)[std::size_t(h)]) : 0.0;
  for (int j = 0; j < p.kv_len; ++j) {
    if (!sees(j)) continue;
    double s = 0;
    for (int c = 0; c < d; ++c)
      s += q[((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * d + c] *
           k[((std::int64_t(b) * p.kv_len + j) * p.kv_heads + kv_head) * d + c];
    s *= p.softmax_scale();
    if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
    weights[std::size_t(j)] = std::exp(s);  // scores of order 1 here: no maximum needed
    sum += weights[std::size_t(j)];
  }
  std::vector<double> o(std::size_t(d), 0.0);
  for (int j = 0; j < p.kv_len; ++j)
    for (int c = 0; c < d; ++c)
      o[std::size_t(c)] += weights[std::size_t(j)] / (sum > 0 ? sum : 1) *
                           v[((std::int64_t(b) * p.kv_len + j) * p.kv_heads + kv_head) * d + c];
  return {o, std::log(sum)};
}

/// L = sum(O * dO) from the reference's rows (one thread: the central differences call it many times).
double loss(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& d_o, const std::vector<double>* sinks) {
  std::vector<double> o(std::size_t(p.head_dim));
  double sum = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.q_len; ++i)
      for (int h = 0; h < p.q_heads; ++h) {
        reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h, o.data(), nullptr, sinks);
        const auto base = ((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim;
        for (int c = 0; c < p.head_dim; ++c) sum += o[std::size_t(c)] * d_o[base + c];
      }
  return sum;
}
}  // namespace

TEST_CASE("features: a window's keys are FlashAttention's, aligned as the causal mask", "[cpu][features]") {
  // FlashAttention's rule, bottom-right: row i sees j with i + Nkv - Nq - left <= j <= i + Nkv - Nq + right; causal
  // sets right = 0. Here Nq = 4, Nkv = 10: the diagonal of row i is key i + 6.
  auto p = make(1, 4, 10, 1, 1, 8, false);
  p.causal_align = CausalAlign::bottom_right;
  p.window_left = 2, p.window_right = 1;
  CHECK(p.windowed());
  CHECK(p.keys_range(0, 0).first == 4);
  CHECK(p.keys_range(0, 0).last == 8);
  CHECK(p.keys_range(0, 3).first == 7);
  CHECK(p.keys_range(0, 3).last == 10);  // diagonal 9 + 1 would be 11: the sequence ends first
  p.causal = true;                        // causal: the right side is the diagonal
  CHECK(p.keys_range(0, 0).last == 7);
  CHECK(p.keys_range(0, 0).first == 4);
  // Top-left (the course's causal): the diagonal of row i is key i; a window of 0 keys left sees the diagonal only.
  auto t = make(1, 6, 6, 1, 1, 8, true);
  t.window_left = 0;
  for (int i = 0; i < 6; ++i) CHECK((t.keys_range(0, i).first == i && t.keys_range(0, i).last == i + 1));
  // Larger than the sequence: the whole causal row; right side only, non-causal: keys up to the diagonal + right.
  t.window_left = 100;
  CHECK(t.keys_range(0, 5).first == 0);
  auto r = make(1, 3, 8, 1, 1, 8, false);
  r.window_right = 0;
  CHECK(r.windowed());
  CHECK(r.keys_range(0, 1).first == 0);
  CHECK(r.keys_range(0, 1).last == 2);
  // A window before the sequence (top-left, q_len > kv_len): rows past the end see the last left + 1 keys, or none.
  auto past = make(1, 8, 3, 1, 1, 8, true);
  past.window_left = 1;
  CHECK(past.keys_range(0, 7).count() == 0);
  CHECK(past.keys_range(0, 3).first == 2);
  CHECK(past.keys_range(0, 3).last == 3);
  // (-1, -1) and causal's (-1, 0) are no window at all.
  auto none = make(1, 4, 4, 1, 1, 8, true);
  none.window_right = 0;
  CHECK_FALSE(none.windowed());
}

TEST_CASE("features: the reference's windowed, capped and sunk rows are the plain formula's", "[cpu][features]") {
  for (bool causal : {false, true})
    for (auto [left, right] : {std::pair{-1, -1}, std::pair{0, 0}, std::pair{2, 1}, std::pair{3, -1}, std::pair{-1, 2},
                               std::pair{50, 50}})
      for (float cap : {0.f, 0.7f, 30.f})
        for (bool with_sinks : {false, true}) {
          auto p = make(2, 5, 9, 4, 2, 8, causal);
          p.window_left = left, p.window_right = right, p.softcap = cap, p.sinks = with_sinks;
          if (p.windowed()) p.causal_align = CausalAlign::bottom_right;
          else if (causal) p.causal_align = CausalAlign::bottom_right;
          const auto q = random_doubles(p.q_elements(), 40), k = random_doubles(p.kv_elements(), 41),
                     v = random_doubles(p.kv_elements(), 42);
          std::vector<double> sink_values = {0.5, -1.0, 2.0, -3.0};
          const std::vector<double>* sinks = with_sinks ? &sink_values : nullptr;
          std::vector<double> lse;
          const auto out = reference_attention(p, q, k, v, nullptr, &lse, sinks);
          const auto alone = reference_lse(p, q, k, sinks);
          INFO(p.describe());
          for (int b = 0; b < p.batch; ++b)
            for (int i = 0; i < p.q_len; ++i)
              for (int h = 0; h < p.q_heads; ++h) {
                const int diagonal = i + p.kv_len - p.q_len;  // bottom-right
                auto sees = [&](int j) {
                  const bool right_ok = causal ? j <= diagonal : right < 0 || j <= diagonal + right;
                  return right_ok && (left < 0 || j >= diagonal - left);
                };
                const auto [o, row_lse] = plain_row(p, q, k, v, sinks, b, i, h, sees);
                const auto at = (std::int64_t(b) * p.q_heads + h) * p.q_len + i;
                if (std::isinf(row_lse)) CHECK(std::isinf(lse[at]));
                else CHECK(lse[at] == Approx(row_lse).epsilon(1e-13).margin(1e-14));
                CHECK((alone[at] == lse[at] || (std::isinf(alone[at]) && std::isinf(lse[at]))));
                for (int c = 0; c < p.head_dim; ++c)
                  CHECK(out[((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim + c] ==
                        Approx(o[std::size_t(c)]).epsilon(1e-12).margin(1e-14));
              }
        }
}

TEST_CASE("features: a sink takes its share of every row, a cap bounds every score", "[cpu][features]") {
  auto p = make(1, 4, 6, 2, 1, 8, false);
  const auto q = random_doubles(p.q_elements(), 50), k = random_doubles(p.kv_elements(), 51),
             v = random_doubles(p.kv_elements(), 52);
  std::vector<double> plain_lse, sunk_lse;
  const auto plain = reference_attention(p, q, k, v, nullptr, &plain_lse);
  auto s = p;
  s.sinks = true;
  const std::vector<double> sinks = {1.5, -2.0};
  const auto sunk = reference_attention(s, q, k, v, nullptr, &sunk_lse, &sinks);
  for (int i = 0; i < p.q_len; ++i)
    for (int h = 0; h < p.q_heads; ++h) {
      const auto at = std::int64_t(h) * p.q_len + i;
      // LSE with the sink = ln(e^LSE + e^sink); O shrinks by the row's share left to its keys.
      CHECK(sunk_lse[at] == Approx(std::log(std::exp(plain_lse[at]) + std::exp(sinks[std::size_t(h)]))).epsilon(1e-14));
      const double kept = std::exp(plain_lse[at] - sunk_lse[at]);
      for (int c = 0; c < p.head_dim; ++c) {
        const auto e = (std::int64_t(i) * p.q_heads + h) * p.head_dim + c;
        CHECK(sunk[e] == Approx(plain[e] * kept).epsilon(1e-13).margin(1e-15));
      }
    }
  // A row that sees no key (bottom-right, a sequence shorter than the new tokens) keeps O = 0 and LSE = its sink.
  auto empty = make(1, 4, 6, 2, 1, 8, true);
  empty.causal_align = CausalAlign::bottom_right, empty.kv_lens = {2}, empty.sinks = true;
  std::vector<double> lse;
  const auto out = reference_attention(empty, q, k, v, nullptr, &lse, &sinks);
  CHECK(empty.keys_range(0, 0).count() == 0);
  CHECK(lse[0] == sinks[0]);
  for (int c = 0; c < 8; ++c) CHECK(out[std::size_t(c)] == 0.0);
  // Soft-capping: a cap of 1e9 is none; scores of 50 under a cap of 5 all weigh about alike.
  auto loose = p;
  loose.softcap = 1e9f;
  const auto uncapped = reference_attention(loose, q, k, v);
  for (std::size_t e = 0; e < plain.size(); ++e) CHECK(uncapped[e] == Approx(plain[e]).epsilon(1e-12).margin(1e-15));
  auto tight = p;
  tight.scale = 100.f, tight.softcap = 0.01f;  // every score within +-0.01: nearly the mean of V
  const auto capped = reference_attention(tight, q, k, v);
  for (int c = 0; c < 8; ++c) {
    double mean = 0;
    for (int j = 0; j < 6; ++j) mean += v[std::size_t(j * 8 + c)] / 6;
    CHECK(capped[std::size_t(c)] == Approx(mean).margin(0.02));
  }
}

TEST_CASE("features backward: dQ, dK, dV and dsinks match central differences of sum(O * dO)", "[cpu][features]") {
  // As the reference's own check (test_reference.cpp): every component moved by +-h, the bound 1e-8 + 1e-7 |g|.
  // A cap's slope left out, the sink left out of LSE or its gradient's sign flipped, a window off by one key:
  // each is many times over it.
  struct Case { int q_len, kv_len; bool causal; int left, right; float cap; bool sinks; };
  const std::vector<Case> cases = {
      {5, 7, false, 2, 1, 0.f, false}, {5, 7, true, 2, -1, 0.f, false}, {6, 6, true, 0, -1, 0.f, false},
      {5, 7, false, -1, -1, 0.8f, false}, {5, 7, true, -1, -1, 2.f, false}, {5, 7, false, -1, -1, 0.f, true},
      {4, 6, true, -1, -1, 0.f, true}, {5, 9, true, 3, -1, 1.5f, true}, {7, 5, false, 1, 2, 0.6f, true}};
  const double h = 1e-5;
  int failures = 0;
  double worst = 0;
  std::string where;
  for (const Case& c : cases) {
    auto p = make(2, c.q_len, c.kv_len, 4, 2, 4, c.causal);
    p.window_left = c.left, p.window_right = c.right, p.softcap = c.cap, p.sinks = c.sinks;
    if (p.windowed() || p.causal) p.causal_align = CausalAlign::bottom_right;
    auto q = random_doubles(p.q_elements(), 60), k = random_doubles(p.kv_elements(), 61),
         v = random_doubles(p.kv_elements(), 62);
    for (double& x : q) x *= 3;  // scores of order 1, and caps that bend them
    const auto d_o = random_doubles(p.q_elements(), 63);
    std::vector<double> sink_values = {0.3, -0.8, 1.1, -0.2};
    const std::vector<double>* sinks = c.sinks ? &sink_values : nullptr;
    const ReferenceGradients g = reference_attention_backward(p, q, k, v, d_o, sinks);
    CHECK(g.dsinks.size() == (c.sinks ? 4u : 0u));
    std::vector<std::tuple<const char*, std::vector<double>*, const std::vector<double>*>> inputs = {
        {"dQ", &q, &g.dq}, {"dK", &k, &g.dk}, {"dV", &v, &g.dv}};
    if (c.sinks) inputs.push_back({"dsinks", &sink_values, &g.dsinks});
    for (auto [name, x, grad] : inputs)
      for (std::size_t e = 0; e < x->size(); ++e) {
        const double saved = (*x)[e];
        (*x)[e] = saved + h;
        const double up = loss(p, q, k, v, d_o, sinks);
        (*x)[e] = saved - h;
        const double down = loss(p, q, k, v, d_o, sinks);
        (*x)[e] = saved;
        const double numeric = (up - down) / (2 * h), analytic = (*grad)[e];
        const double ratio = std::abs(numeric - analytic) / (1e-8 + 1e-7 * std::abs(analytic));
        failures += ratio > 1;
        if (ratio > worst)
          worst = ratio, where = p.describe() + ": " + name + "[" + std::to_string(e) + "] = " +
                                 std::to_string(analytic) + ", central difference " + std::to_string(numeric);
      }
  }
  INFO("worst, at " << worst << " of the bound: " << where);
  CHECK(failures == 0);
}

TEST_CASE("features: the problem names a bad window or cap, and the reference its missing sinks", "[cpu][features]") {
  auto p = make(1, 4, 4, 1, 1, 8, true);
  p.window_left = -2;
  CHECK_THROWS_WITH(validate(p), Contains("window = (-2, -1)") && Contains("-1 for no bound"));
  p.window_left = 3;
  CHECK_NOTHROW(validate(p));
  CHECK_THAT(p.describe(), Contains("window=(3,0)"));
  p.softcap = -1.f;
  CHECK_THROWS_WITH(validate(p), Contains("softcap = -1") && Contains(">= 0"));
  p.softcap = INFINITY;
  CHECK_THROWS_WITH(validate(p), Contains("softcap") && Contains("finite"));
  p.softcap = 30.f;
  p.sinks = true;
  CHECK_THAT(p.describe(), Contains("softcap=30") && Contains("sinks"));
  const auto q = random_doubles(p.q_elements(), 1), k = random_doubles(p.kv_elements(), 2);
  CHECK_THROWS_WITH(reference_attention(p, q, k, k), Contains("has sinks; pass their values"));
  const std::vector<double> two = {0.0, 1.0};
  CHECK_THROWS_WITH(reference_attention(p, q, k, k, nullptr, nullptr, &two), Contains("sinks has 2 elements"));
  // Bottom-right needs a diagonal to place: causal, or a window.
  auto a = make(1, 4, 4, 1, 1, 8, false);
  a.causal_align = CausalAlign::bottom_right;
  CHECK_THROWS_WITH(validate(a), Contains("needs causal = true or a window"));
  a.window_left = 1;
  CHECK_NOTHROW(validate(a));
}
