// CPU tests of the float64 reference itself: everything else is judged by it.
#include "fa/host_tensor.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
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
}  // namespace

TEST_CASE("reference: a case computed by hand", "[cpu][reference]") {
  // One query, two keys, d = 1, scale 1: scores (0, 1), weights (1, e)/(1+e).
  auto p = make(1, 1, 2, 1, 1, 1, false);
  p.scale = 1.0f;
  const auto out = reference_attention(p, {1.0}, {0.0, 1.0}, {1.0, 3.0});
  const double e = std::exp(1.0);
  CHECK(out[0] == Approx((1 + 3 * e) / (1 + e)).epsilon(1e-15));

  // Two queries, causal: row 0 sees only key 0; row 1 averages both equally (equal scores).
  auto c = make(1, 2, 2, 1, 1, 2, true);
  const auto out2 = reference_attention(c, {1, 0, 0, 0}, {1, 1, 1, 1}, {2, 4, 6, 8});
  CHECK(out2 == std::vector<double>{2, 4, 4, 6});
}

TEST_CASE("reference: softmax rows sum to one", "[cpu][reference]") {
  for (bool causal : {false, true}) {
    const auto p = make(2, 37, 53, 4, 2, 16, causal);
    const auto out = reference_attention(p, random_doubles(p.q_elements(), 1), random_doubles(p.kv_elements(), 2),
                                         std::vector<double>(p.kv_elements(), 1.0));  // V = 1: O = sum of weights
    for (double x : out) CHECK(x == Approx(1.0).epsilon(1e-14));
  }
}

TEST_CASE("reference: causal row 0 equals v[0] of its KV head", "[cpu][reference]") {
  const auto p = make(2, 5, 7, 4, 2, 8, true);
  const auto v = random_doubles(p.kv_elements(), 3);
  const auto out = reference_attention(p, random_doubles(p.q_elements(), 4), random_doubles(p.kv_elements(), 5), v);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.q_heads; ++h)
      for (int c = 0; c < p.head_dim; ++c) {
        const double expected = v[((std::int64_t(b) * p.kv_len + 0) * p.kv_heads + h / 2) * p.head_dim + c];
        CHECK(out[((std::int64_t(b) * p.q_len + 0) * p.q_heads + h) * p.head_dim + c] == expected);
      }
}

TEST_CASE("reference: GQA equals attention over explicitly repeated KV heads", "[cpu][reference]") {
  for (int kv_heads : {1, 2}) {  // MQA and GQA against 8 query heads
    for (bool causal : {false, true}) {
      const auto gqa = make(2, 9, 11, 8, kv_heads, 8, causal);
      auto mha = gqa;
      mha.kv_heads = 8;
      const auto q = random_doubles(gqa.q_elements(), 6), k = random_doubles(gqa.kv_elements(), 7),
                 v = random_doubles(gqa.kv_elements(), 8);
      std::vector<double> k_rep(mha.kv_elements()), v_rep(mha.kv_elements());
      const int group = 8 / kv_heads;
      for (int b = 0; b < 2; ++b)
        for (int j = 0; j < 11; ++j)
          for (int h = 0; h < 8; ++h)
            for (int c = 0; c < 8; ++c) {
              const auto dst = ((std::int64_t(b) * 11 + j) * 8 + h) * 8 + c;
              const auto src = ((std::int64_t(b) * 11 + j) * kv_heads + h / group) * 8 + c;
              k_rep[dst] = k[src], v_rep[dst] = v[src];
            }
      CHECK(reference_attention(gqa, q, k, v) == reference_attention(mha, q, k_rep, v_rep));
    }
  }
}

TEST_CASE("reference: adding a constant to every score of a row changes nothing", "[cpu][reference]") {
  // With K[:, last] = 1, raising q[last] by delta adds scale*delta to every score of
  // that row. A shift of 1000 would overflow exp() without the max subtraction.
  auto p = make(1, 4, 6, 1, 1, 4, false);
  p.scale = 1.0f;
  auto q = random_doubles(p.q_elements(), 9), k = random_doubles(p.kv_elements(), 10);
  const auto v = random_doubles(p.kv_elements(), 11);
  for (int j = 0; j < p.kv_len; ++j) k[j * 4 + 3] = 1.0;
  const auto base = reference_attention(p, q, k, v);
  for (double delta : {-5.0, 3.0, 1000.0}) {
    auto shifted = q;
    for (int i = 0; i < p.q_len; ++i) shifted[i * 4 + 3] += delta;
    const auto out = reference_attention(p, shifted, k, v);
    for (std::size_t x = 0; x < out.size(); ++x) CHECK(out[x] == Approx(base[x]).epsilon(1e-10));  // a 1000 shift costs ~10 bits
  }
}

TEST_CASE("reference: scale 0 averages V; causal with q_len > kv_len sees every key past the end",
          "[cpu][reference]") {
  auto p = make(1, 6, 3, 1, 1, 2, false);
  p.scale = 0.0f;
  const auto q = random_doubles(p.q_elements(), 12), k = random_doubles(p.kv_elements(), 13),
             v = random_doubles(p.kv_elements(), 14);
  const auto mean = reference_attention(p, q, k, v);
  for (int c = 0; c < 2; ++c) CHECK(mean[c] == Approx((v[c] + v[2 + c] + v[4 + c]) / 3).epsilon(1e-14));

  p.scale.reset();
  const auto full = reference_attention(p, q, k, v);
  p.causal = true;
  const auto causal = reference_attention(p, q, k, v);
  for (int i = 2; i < 6; ++i)  // rows 2.. see keys 0..2: all of them
    for (int c = 0; c < 2; ++c) CHECK(causal[i * 2 + c] == full[i * 2 + c]);
  CHECK(causal[0] == v[0]);
  CHECK(causal[1] == v[1]);
}

// ---- The row log-sum-exp and the backward ----

namespace {
/// Row (b, i, h)'s scores scale * q_i·k_j over every key (mask not applied), straight from the definition.
std::vector<double> scores_of(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                              int b, int i, int h) {
  std::vector<double> s(p.kv_len);
  for (int j = 0; j < p.kv_len; ++j) {
    double dot = 0;
    for (int c = 0; c < p.head_dim; ++c)
      dot += q[((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim + c] *
             k[((std::int64_t(b) * p.kv_len + j) * p.kv_heads + h / p.group_size()) * p.head_dim + c];
    s[j] = p.softmax_scale() * dot;
  }
  return s;
}
int keys_of(const AttentionProblem& p, int i) { return p.causal ? std::min(i + 1, p.kv_len) : p.kv_len; }

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

/// L = sum(O * dO), O from the reference's rows (with the sinks' values, where the problem has sinks), one thread
/// (the finite differences call it thousands of times).
double loss(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& d_o, const std::vector<double>* sinks = nullptr) {
  std::vector<double> o(p.head_dim);
  double sum = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.q_len; ++i)
      for (int h = 0; h < p.q_heads; ++h) {
        reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h, o.data(), nullptr, sinks);
        const auto base = ((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim;
        for (int c = 0; c < p.head_dim; ++c) sum += o[c] * d_o[base + c];
      }
  return sum;
}
}  // namespace

TEST_CASE("reference: LSE is ln sum exp of the visible scores, and O = sum_j exp(s_ij - LSE_i) V_j",
          "[cpu][reference]") {
  for (bool causal : {false, true})
    for (auto [q_len, kv_len] : {std::pair{5, 7}, std::pair{7, 5}, std::pair{1, 1}}) {
      auto p = make(2, q_len, kv_len, 4, 2, 8, causal);
      p.scale = 0.9f;
      const auto q = random_doubles(p.q_elements(), 20), k = random_doubles(p.kv_elements(), 21),
                 v = random_doubles(p.kv_elements(), 22);
      std::vector<double> lse;
      const auto out = reference_attention(p, q, k, v, nullptr, &lse);
      REQUIRE(std::int64_t(lse.size()) == p.lse_elements());
      const auto alone = reference_lse(p, q, k);
      for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < p.q_heads; ++h)
          for (int i = 0; i < p.q_len; ++i) {
            const auto s = scores_of(p, q, k, b, i, h);
            double direct = 0;  // scores of order 1: the plain formula is exact enough
            for (int j = 0; j < keys_of(p, i); ++j) direct += std::exp(s[j]);
            const double row_lse = lse[(std::int64_t(b) * p.q_heads + h) * p.q_len + i];  // [batch, q_heads, q_len]
            CHECK(row_lse == Approx(std::log(direct)).epsilon(1e-14).margin(1e-15));
            CHECK(alone[(std::int64_t(b) * p.q_heads + h) * p.q_len + i] == row_lse);
            for (int c = 0; c < p.head_dim; ++c) {
              double o = 0;
              for (int j = 0; j < keys_of(p, i); ++j)
                o += std::exp(s[j] - row_lse) * v[((std::int64_t(b) * kv_len + j) * 2 + h / 2) * 8 + c];
              CHECK(out[((std::int64_t(b) * q_len + i) * 4 + h) * 8 + c] == Approx(o).epsilon(1e-13).margin(1e-15));
            }
          }
    }
}

TEST_CASE("reference: LSE takes the maximum first, so a shift of 1000 in every score does not overflow",
          "[cpu][reference]") {
  auto p = make(1, 4, 6, 1, 1, 4, false);  // as the shift test above: K[:, last] = 1, q[last] += delta
  p.scale = 1.0f;
  auto q = random_doubles(p.q_elements(), 23), k = random_doubles(p.kv_elements(), 24);
  for (int j = 0; j < p.kv_len; ++j) k[j * 4 + 3] = 1.0;
  const auto base = reference_lse(p, q, k);
  for (double delta : {-1000.0, 1000.0}) {
    auto shifted = q;
    for (int i = 0; i < p.q_len; ++i) shifted[i * 4 + 3] += delta;
    const auto lse = reference_lse(p, shifted, k);
    for (int i = 0; i < p.q_len; ++i) CHECK(lse[i] == Approx(base[i] + delta).epsilon(1e-13));
  }
}

TEST_CASE("reference backward: dQ, dK and dV match central differences of sum(O * dO)", "[cpu][reference]") {
  // Every component of every input is moved by +-h; (L(x+h) - L(x-h)) / 2h is off by h^2 L''' / 6 ~ 1e-11
  // and by the rounding of L over 2h ~ 1e-10. The worst element reaches ~4% of the bound 1e-8 + 1e-7 |g|;
  // a wrong formula exceeds it 1e7-fold (D, the scale, the GQA sum or the scale's sign left out, the causal
  // edge off by one: each checked by breaking the code), and D off by 1e-6 already 600-fold.
  struct Shape { int batch, q_len, kv_len, q_heads, kv_heads, head_dim; };
  std::vector<std::pair<Shape, bool>> shapes;  // (shape, causal)
  for (bool causal : {false, true})
    for (Shape s : {Shape{2, 5, 7, 4, 2, 8}, Shape{2, 7, 5, 4, 2, 8}, Shape{1, 1, 1, 2, 1, 4}, Shape{1, 1, 6, 3, 1, 4},
                    Shape{1, 6, 1, 2, 2, 4}, Shape{1, 4, 4, 3, 3, 4}})
      shapes.push_back({s, causal});
  const double h = 1e-5;
  struct { double ratio = 0; std::string where; } worst;
  int failures = 0;
  for (const auto& [s, causal] : shapes)
    for (std::optional<float> scale : {std::optional<float>{}, std::optional<float>{0.7f}, std::optional<float>{-0.9f}}) {
      auto p = make(s.batch, s.q_len, s.kv_len, s.q_heads, s.kv_heads, s.head_dim, causal);
      p.scale = scale;
      auto q = random_doubles(p.q_elements(), 30), k = random_doubles(p.kv_elements(), 31),
           v = random_doubles(p.kv_elements(), 32);
      for (double& x : q) x *= 3;  // scores of order 1: a softmax far from uniform
      const auto d_o = random_doubles(p.q_elements(), 33);
      const ReferenceGradients g = reference_attention_backward(p, q, k, v, d_o);
      for (auto [name, x, grad] : {std::tuple{"dQ", &q, &g.dq}, std::tuple{"dK", &k, &g.dk}, std::tuple{"dV", &v, &g.dv}}) {
        REQUIRE(grad->size() == x->size());
        for (std::size_t e = 0; e < x->size(); ++e) {
          const double saved = (*x)[e];
          (*x)[e] = saved + h;
          const double up = loss(p, q, k, v, d_o);
          (*x)[e] = saved - h;
          const double down = loss(p, q, k, v, d_o);
          (*x)[e] = saved;
          const double numeric = (up - down) / (2 * h), analytic = (*grad)[e];
          const double ratio = std::abs(numeric - analytic) / (1e-8 + 1e-7 * std::abs(analytic));
          failures += ratio > 1;
          if (ratio > worst.ratio)
            worst = {ratio, p.describe() + ": " + name + "[" + std::to_string(e) + "] = " + std::to_string(analytic) +
                                ", central difference " + std::to_string(numeric)};
        }
      }
    }
  INFO("worst, at " << worst.ratio << " of the bound: " << worst.where);
  CHECK(failures == 0);
  CHECK(worst.ratio < 1);
}

TEST_CASE("reference backward: GQA's dK and dV are the sums over its group of the repeated heads' gradients",
          "[cpu][reference]") {
  for (int kv_heads : {1, 2}) {  // MQA and GQA against 4 query heads
    for (bool causal : {false, true}) {
      const auto gqa = make(2, 6, 9, 4, kv_heads, 8, causal);
      auto mha = gqa;
      mha.kv_heads = 4;
      const int group = 4 / kv_heads;
      const auto q = random_doubles(gqa.q_elements(), 40), k = random_doubles(gqa.kv_elements(), 41),
                 v = random_doubles(gqa.kv_elements(), 42), d_o = random_doubles(gqa.q_elements(), 43);
      std::vector<double> k_rep(mha.kv_elements()), v_rep(mha.kv_elements());
      auto rep_at = [](int b, int j, int h, int c) { return ((std::int64_t(b) * 9 + j) * 4 + h) * 8 + c; };
      auto kv_at = [&](int b, int j, int h, int c) { return ((std::int64_t(b) * 9 + j) * kv_heads + h) * 8 + c; };
      for (int b = 0; b < 2; ++b)
        for (int j = 0; j < 9; ++j)
          for (int h = 0; h < 4; ++h)
            for (int c = 0; c < 8; ++c) k_rep[rep_at(b, j, h, c)] = k[kv_at(b, j, h / group, c)],
                                        v_rep[rep_at(b, j, h, c)] = v[kv_at(b, j, h / group, c)];
      const auto g = reference_attention_backward(gqa, q, k, v, d_o);
      const auto r = reference_attention_backward(mha, q, k_rep, v_rep, d_o);
      CHECK(g.dq == r.dq);  // the same rows, computed the same way
      for (int b = 0; b < 2; ++b)
        for (int j = 0; j < 9; ++j)
          for (int kvh = 0; kvh < kv_heads; ++kvh)
            for (int c = 0; c < 8; ++c) {
              double dk = 0, dv = 0;
              for (int h = kvh * group; h < (kvh + 1) * group; ++h) dk += r.dk[rep_at(b, j, h, c)], dv += r.dv[rep_at(b, j, h, c)];
              CHECK(g.dk[kv_at(b, j, kvh, c)] == Approx(dk).epsilon(1e-12).margin(1e-14));
              CHECK(g.dv[kv_at(b, j, kvh, c)] == Approx(dv).epsilon(1e-12).margin(1e-14));
            }
    }
  }
}

TEST_CASE("reference backward: scale 0 gives dQ = dK = 0 and dV_j = sum of dO_i / (keys row i sees)",
          "[cpu][reference]") {
  for (bool causal : {false, true})
    for (auto [q_len, kv_len] : {std::pair{5, 7}, std::pair{7, 5}}) {
      auto p = make(2, q_len, kv_len, 4, 2, 8, causal);
      p.scale = 0.0f;
      INFO(p.describe());
      const auto q = random_doubles(p.q_elements(), 50), k = random_doubles(p.kv_elements(), 51),
                 v = random_doubles(p.kv_elements(), 52), d_o = random_doubles(p.q_elements(), 53);
      const auto g = reference_attention_backward(p, q, k, v, d_o);
      for (double x : g.dq) CHECK(x == 0.0);
      for (double x : g.dk) CHECK(x == 0.0);
      for (int b = 0; b < 2; ++b)
        for (int j = 0; j < kv_len; ++j)
          for (int kvh = 0; kvh < 2; ++kvh)
            for (int c = 0; c < 8; ++c) {
              double expected = 0;  // rows i >= j when causal (none when j >= q_len), of both heads of the group
              for (int h = 2 * kvh; h < 2 * kvh + 2; ++h)
                for (int i = causal ? j : 0; i < q_len; ++i)
                  expected += d_o[((std::int64_t(b) * q_len + i) * 4 + h) * 8 + c] / keys_of(p, i);
              CHECK(g.dv[((std::int64_t(b) * kv_len + j) * 2 + kvh) * 8 + c] == Approx(expected).epsilon(1e-13).margin(1e-15));
            }
    }
}

TEST_CASE("reference backward: a tensor of the wrong size is named", "[cpu][reference]") {
  const auto p = make(1, 3, 4, 2, 1, 4, false);
  const std::vector<double> q(p.q_elements()), kv(p.kv_elements()), d_o(p.q_elements());
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(reference_attention_backward(p, q, kv, kv, std::vector<double>(5)), Contains("d_o has 5 elements"));
  CHECK_THROWS_WITH(reference_attention_backward(p, q, std::vector<double>(3), kv, d_o), Contains("k has 3 elements"));
  CHECK_THROWS_WITH(reference_attention_backward(p, q, kv, std::vector<double>(3), d_o), Contains("v has 3"));
  CHECK_THROWS_WITH(reference_attention_backward(p, kv, kv, kv, d_o), Contains("q has 16 elements"));
  CHECK_THROWS_WITH(reference_lse(p, q, std::vector<double>(2)), Contains("reference_lse: k has 2"));
  CHECK_THROWS_WITH(reference_attention(p, q, kv, std::vector<double>(2)), Contains("reference_attention: v has 2"));
  CHECK_THROWS_AS(reference_attention_backward(p, q, kv, kv, std::vector<double>(5)), std::invalid_argument);
}

namespace {
/// Keys 0 .. len - 1 of sequence b of a [batch, kv_len, kv_heads, d] tensor, as a one-sequence tensor.
std::vector<double> keys_of(const AttentionProblem& p, const std::vector<double>& t, int b, int len) {
  const std::int64_t row = std::int64_t(p.kv_heads) * p.head_dim;
  const auto first = t.begin() + std::int64_t(b) * p.kv_len * row;
  return std::vector<double>(first, first + len * row);
}
/// Sequence b of a [batch, q_len, q_heads, d] tensor.
std::vector<double> rows_of(const AttentionProblem& p, const std::vector<double>& t, int b) {
  const std::int64_t sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  return std::vector<double>(t.begin() + b * sequence, t.begin() + (b + 1) * sequence);
}
}  // namespace

TEST_CASE("reference: per-sequence lengths are each sequence alone over its own keys", "[cpu][reference]") {
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    auto p = make(3, 6, 9, 4, 2, 8, causal);
    p.kv_lens = {9, 4, 1};
    const auto q = random_doubles(p.q_elements(), 11), k = random_doubles(p.kv_elements(), 12),
               v = random_doubles(p.kv_elements(), 13), d_o = random_doubles(p.q_elements(), 14);
    std::vector<double> lse;
    const auto out = reference_attention(p, q, k, v, nullptr, &lse);
    const auto grads = reference_attention_backward(p, q, k, v, d_o);
    for (int b = 0; b < p.batch; ++b) {
      INFO("sequence " << b << ", " << p.kv_lens[b] << " keys");
      auto one = make(1, p.q_len, p.kv_lens[b], p.q_heads, p.kv_heads, p.head_dim, causal);
      std::vector<double> one_lse;
      const auto qb = rows_of(p, q, b), kb = keys_of(p, k, b, p.kv_lens[b]), vb = keys_of(p, v, b, p.kv_lens[b]);
      CHECK(rows_of(p, out, b) == reference_attention(one, qb, kb, vb, nullptr, &one_lse));
      CHECK(std::vector<double>(lse.begin() + b * p.q_heads * p.q_len, lse.begin() + (b + 1) * p.q_heads * p.q_len) ==
            one_lse);
      const auto one_grads = reference_attention_backward(one, qb, kb, vb, rows_of(p, d_o, b));
      CHECK(rows_of(p, grads.dq, b) == one_grads.dq);
      CHECK(keys_of(p, grads.dk, b, p.kv_lens[b]) == one_grads.dk);
      CHECK(keys_of(p, grads.dv, b, p.kv_lens[b]) == one_grads.dv);
      // The cache's rows past the sequence's length get no gradient.
      const auto past = keys_of(p, grads.dk, b, p.kv_len);
      CHECK(std::all_of(past.begin() + p.kv_lens[b] * p.kv_heads * p.head_dim, past.end(),
                        [](double x) { return x == 0; }));
    }
  }
}

TEST_CASE("reference: bottom-right causal rows see keys up to len - q_len + i; rows that see none give O = 0",
          "[cpu][reference]") {
  auto p = make(2, 3, 10, 2, 1, 8, true);
  p.causal_align = CausalAlign::bottom_right;
  p.kv_lens = {10, 2};  // sequence 1: fewer keys than query rows, so its row 0 sees none
  const auto q = random_doubles(p.q_elements(), 21), k = random_doubles(p.kv_elements(), 22),
             v = random_doubles(p.kv_elements(), 23);
  std::vector<double> lse;
  const auto out = reference_attention(p, q, k, v, nullptr, &lse);
  CHECK(p.keys_seen(0, 0) == 8);
  CHECK(p.keys_seen(0, 2) == 10);
  CHECK(p.keys_seen(1, 0) == 0);
  CHECK(p.keys_seen(1, 2) == 2);
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.q_len; ++i)
      for (int h = 0; h < p.q_heads; ++h) {
        INFO("sequence " << b << ", row " << i << ", head " << h);
        // The row alone: one query over exactly the keys it sees, without a mask.
        const int keys = p.keys_seen(b, i);
        const std::int64_t at = ((std::int64_t(b) * p.q_len + i) * p.q_heads + h) * p.head_dim;
        const std::vector<double> got(out.begin() + at, out.begin() + at + p.head_dim);
        const double got_lse = lse[(std::int64_t(b) * p.q_heads + h) * p.q_len + i];
        if (keys == 0) {
          CHECK(std::all_of(got.begin(), got.end(), [](double x) { return x == 0; }));
          CHECK(got_lse == -INFINITY);
          continue;
        }
        auto one = make(1, 1, keys, 1, 1, p.head_dim, false);
        one.scale = p.softmax_scale();
        std::vector<double> qi(q.begin() + at, q.begin() + at + p.head_dim), kk, vv;
        for (int j = 0; j < keys; ++j) {
          const std::int64_t row = (std::int64_t(b) * p.kv_len + j) * p.kv_heads * p.head_dim;  // kv head 0
          kk.insert(kk.end(), k.begin() + row, k.begin() + row + p.head_dim);
          vv.insert(vv.end(), v.begin() + row, v.begin() + row + p.head_dim);
        }
        std::vector<double> one_lse;
        CHECK(got == reference_attention(one, qi, kk, vv, nullptr, &one_lse));
        CHECK(got_lse == one_lse[0]);
      }
  // With as many keys as query rows, bottom-right is top-left.
  auto square = make(1, 5, 5, 1, 1, 8, true);
  const auto qs = random_doubles(square.q_elements(), 31), ks = random_doubles(square.kv_elements(), 32),
             vs = random_doubles(square.kv_elements(), 33);
  auto square_br = square;
  square_br.causal_align = CausalAlign::bottom_right;
  CHECK(reference_attention(square, qs, ks, vs) == reference_attention(square_br, qs, ks, vs));
}

TEST_CASE("reference backward: a row that sees no key adds nothing, and gets dQ = 0", "[cpu][reference]") {
  auto p = make(1, 4, 6, 1, 1, 8, true);
  p.causal_align = CausalAlign::bottom_right;
  p.kv_lens = {2};  // rows 0 and 1 see no key; row 2 sees key 0, row 3 keys 0 and 1
  const auto q = random_doubles(p.q_elements(), 41), k = random_doubles(p.kv_elements(), 42),
             v = random_doubles(p.kv_elements(), 43), d_o = random_doubles(p.q_elements(), 44);
  const auto grads = reference_attention_backward(p, q, k, v, d_o);
  CHECK(std::all_of(grads.dq.begin(), grads.dq.begin() + 2 * p.head_dim, [](double x) { return x == 0; }));
  CHECK(std::any_of(grads.dq.begin() + 2 * p.head_dim, grads.dq.end(), [](double x) { return x != 0; }));
  // Keys 2 .. 5 are past the length: no gradient.
  CHECK(std::all_of(grads.dk.begin() + 2 * p.head_dim, grads.dk.end(), [](double x) { return x == 0; }));
  CHECK(std::all_of(grads.dv.begin() + 2 * p.head_dim, grads.dv.end(), [](double x) { return x == 0; }));
}

TEST_CASE("a paged cache: the pool holds each sequence's pages where the shuffled table says", "[cpu][reference]") {
  auto p = make(3, 1, 256, 2, 2, 8, false);
  p.page_size = 64, p.pages = 3 * 4 + 3, p.dtype = DType::f16;
  const std::vector<int> table = shuffled_page_table(p, 7);
  REQUIRE(table.size() == 12);
  std::vector<int> sorted = table;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // distinct pages
  CHECK(sorted.back() < p.pages);
  CHECK(table != std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});   // not in order
  const HostTensor k = random_tensor(DType::f16, kv_shape(p), 3);
  const HostTensor pool = to_pages(p, k, table);
  CHECK(pool.shape == std::vector<std::int64_t>{15, 64, 2, 8});
  CHECK(from_pages(p, pool, table).bytes == k.bytes);
  // Key 70 of sequence 1 (its page 1, row 6), element 5 of KV head 1.
  const int page = table[1 * 4 + 70 / 64];
  CHECK(pool.get(((std::int64_t(page) * 64 + 6) * 2 + 1) * 8 + 5) ==
        k.get(((std::int64_t(1) * 256 + 70) * 2 + 1) * 8 + 5));
  // A page no sequence uses is NaN.
  int unused = 0;
  while (std::find(table.begin(), table.end(), unused) != table.end()) ++unused;
  CHECK(std::isnan(pool.get(std::int64_t(unused) * 64 * 2 * 8)));
  CHECK_THROWS_WITH(to_pages(p, random_tensor(DType::f32, kv_shape(p), 3), table),
                    Catch::Matchers::Contains("to_pages: K/V is not"));
  auto small = p;
  small.pages = 11;
  CHECK_THROWS_WITH(shuffled_page_table(small, 7), Catch::Matchers::Contains("cannot hold"));
}

// The models' features (issue 58): sliding windows, logit soft-capping and attention sinks, forward and backward.

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

TEST_CASE("features: rows_range_in gives the rows whose keys_range_in holds the key for every window", "[cpu][features]") {
  // A backward kernel walks, for a K/V tile, the rows that see its keys: rows_range_in, the inverse of the one rule.
  // Brute force over small sequences, both alignments, causal or not, every window side from open to past the
  // sequence: row i is in rows_range_in(j) exactly when j is in keys_range_in(i), and those rows are one run.
  int checked = 0;
  for (int len : {1, 3, 7, 12})
    for (int q_len : {1, 4, 7, 13})
      for (bool causal : {false, true})
        for (bool bottom_right : {false, true}) {
          for (int left = -1; left <= 14; ++left)
            for (int right = -1; right <= 14; ++right)
              for (int j = -1; j <= len; ++j) {
                const RowRange rows = rows_range_in(len, q_len, j, causal, bottom_right, left, right);
                INFO("len=" << len << " q_len=" << q_len << " causal=" << causal << " bottom_right=" << bottom_right
                            << " window=(" << left << ", " << right << ") key " << j << ": rows [" << rows.first
                            << ", " << rows.last << ")");
                REQUIRE(rows.first <= rows.last);
                // Inside the sequence's rows even when empty: a K/V tile's walk spans its first key's first row to its
                // last key's last, so one empty range below row 0 (a key before every bottom-right window) would
                // walk rows that do not exist.
                REQUIRE((rows.first >= 0 && rows.last <= q_len));
                for (int i = 0; i < q_len; ++i) {
                  const KeyRange keys = keys_range_in(len, q_len, i, causal, bottom_right, left, right);
                  const bool sees = j >= keys.first && j < keys.last;
                  const bool listed = i >= rows.first && i < rows.last;
                  if (sees != listed) {
                    INFO("row " << i << " sees keys [" << keys.first << ", " << keys.last << ")");
                    REQUIRE(sees == listed);
                  }
                }
                ++checked;
              }
        }
  CHECK(checked > 10000);
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

TEST_CASE("features backward: D from the stored O the backward is given", "[cpu][features]") {
  // The exact O given as stored_o changes nothing; a stored O moved on one row (b, i, h) by delta moves that row's
  // D_i by dO_i . delta: dV, the other rows' dQ stay, dQ_i moves, and dsinks_h by -exp(sink_h - LSE_i) (dO_i . delta).
  auto p = make(2, 5, 7, 4, 2, 4, true);
  p.softcap = 1.5f, p.sinks = true, p.window_left = 3;
  p.causal_align = CausalAlign::bottom_right;
  auto q = random_doubles(p.q_elements(), 70);
  const auto k = random_doubles(p.kv_elements(), 71), v = random_doubles(p.kv_elements(), 72),
             d_o = random_doubles(p.q_elements(), 73);
  for (double& x : q) x *= 3;
  const std::vector<double> sinks = {0.3, -0.8, 1.1, -0.2};
  std::vector<double> lse;
  const std::vector<double> o = reference_attention(p, q, k, v, nullptr, &lse, &sinks);
  const ReferenceGradients exact = reference_attention_backward(p, q, k, v, d_o, &sinks);
  const ReferenceGradients same = reference_attention_backward(p, q, k, v, d_o, &sinks, &o);
  for (std::size_t e = 0; e < exact.dq.size(); ++e) CHECK(same.dq[e] == Approx(exact.dq[e]).margin(1e-13));
  for (std::size_t e = 0; e < exact.dk.size(); ++e) CHECK(same.dk[e] == Approx(exact.dk[e]).margin(1e-13));
  for (std::size_t e = 0; e < 4; ++e) CHECK(same.dsinks[e] == Approx(exact.dsinks[e]).margin(1e-13));

  const int b = 1, i = 3, h = 2, d = p.head_dim;
  const std::int64_t row = (std::int64_t(b) * p.q_len + i) * p.q_heads + h;  // [batch, q_len, q_heads, d]
  std::vector<double> moved = o;
  double delta_d = 0;
  for (int c = 0; c < d; ++c) moved[row * d + c] += 0.01 * (c + 1), delta_d += d_o[row * d + c] * 0.01 * (c + 1);
  const ReferenceGradients g = reference_attention_backward(p, q, k, v, d_o, &sinks, &moved);
  CHECK(g.dv == exact.dv);
  double row_change = 0;
  for (std::int64_t e = 0; e < std::int64_t(g.dq.size()); ++e) {
    if (e / d == row) row_change += std::abs(g.dq[e] - exact.dq[e]);
    else CHECK(g.dq[e] == exact.dq[e]);
  }
  CHECK(row_change > 1e-6);
  const double lse_i = lse[(std::size_t(b) * p.q_heads + h) * p.q_len + i];
  for (int x = 0; x < 4; ++x)
    CHECK(g.dsinks[x] == Approx(exact.dsinks[x] - (x == h ? std::exp(sinks[x] - lse_i) * delta_d : 0.0)).margin(1e-13));
  CHECK_THROWS_WITH(reference_attention_backward(p, q, k, v, d_o, &sinks, &k), Contains("stored_o has"));
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

namespace {
/// Rows first .. first + count - 1 of a packed [total, heads, d] tensor, as a one-sequence tensor.
std::vector<double> packed_rows(const std::vector<double>& t, std::int64_t first, int count, int heads, int d) {
  const std::int64_t row = std::int64_t(heads) * d;
  return std::vector<double>(t.begin() + first * row, t.begin() + (first + count) * row);
}
}  // namespace

TEST_CASE("varlen: each packed sequence is itself alone, forward, LSE and backward, with the features",
          "[cpu][features]") {
  // Lengths 0 and 1, a long one among short ones, more keys than rows and fewer, GQA; the features each on.
  struct Case {
    bool causal;
    int left, right;
    float softcap;
    bool sinks;
  };
  for (const Case c : {Case{false, -1, -1, 0.f, false}, Case{true, -1, -1, 0.f, false}, Case{true, 3, 0, 0.f, true},
                       Case{false, 2, 1, 5.f, false}, Case{true, -1, -1, 2.f, true}}) {
    INFO("causal " << c.causal << " window (" << c.left << ", " << c.right << ") softcap " << c.softcap << " sinks "
                   << c.sinks);
    auto p = make(5, 9, 11, 4, 2, 8, c.causal);
    p.cu_seqlens_q = {0, 3, 3, 4, 13, 20};  // lengths 3, 0, 1, 9, 7
    p.cu_seqlens_k = {0, 5, 7, 8, 19, 19};  // lengths 5, 2, 1, 11, 0
    p.window_left = c.left, p.window_right = c.right, p.softcap = c.softcap, p.sinks = c.sinks;
    REQUIRE(p.total_q() == 20);
    REQUIRE(p.total_k() == 19);
    REQUIRE(p.q_elements() == 20 * 4 * 8);
    REQUIRE(p.lse_elements() == 20 * 4);
    const auto q = random_doubles(p.q_elements(), 21), k = random_doubles(p.kv_elements(), 22),
               v = random_doubles(p.kv_elements(), 23), d_o = random_doubles(p.q_elements(), 24);
    const std::vector<double> sink_values = {0.5, -1.0, 2.0, 0.0};
    const auto* sinks = c.sinks ? &sink_values : nullptr;
    std::vector<double> lse;
    const auto out = reference_attention(p, q, k, v, nullptr, &lse, sinks);
    const auto lse_alone = reference_lse(p, q, k, sinks);
    CHECK(lse_alone == lse);
    const auto grads = reference_attention_backward(p, q, k, v, d_o, sinks);
    std::vector<double> dsinks(4, 0.0);
    for (int b = 0; b < p.batch; ++b) {
      const int rows = p.q_len_of(b), keys = p.kv_len_of(b);
      INFO("sequence " << b << ": " << rows << " rows, " << keys << " keys");
      if (rows == 0) continue;
      auto one = p;
      one.cu_seqlens_q.clear(), one.cu_seqlens_k.clear();
      one.batch = 1, one.q_len = rows, one.kv_len = std::max(keys, 1);
      // A sequence without keys: one key of the one-sequence problem, none seen (a window past it); compared on O.
      const auto qb = packed_rows(q, p.q_row(b, 0), rows, p.q_heads, p.head_dim);
      const auto dob = packed_rows(d_o, p.q_row(b, 0), rows, p.q_heads, p.head_dim);
      if (keys == 0) {
        const auto ob = packed_rows(out, p.q_row(b, 0), rows, p.q_heads, p.head_dim);
        CHECK(std::all_of(ob.begin(), ob.end(), [](double x) { return x == 0; }));
        for (int h = 0; h < p.q_heads; ++h)
          for (int i = 0; i < rows; ++i)
            CHECK(lse[std::size_t(p.lse_index(b, i, h))] == (c.sinks ? sink_values[std::size_t(h)] : -INFINITY));
        continue;
      }
      const auto kb = packed_rows(k, p.kv_row(b, 0), keys, p.kv_heads, p.head_dim);
      const auto vb = packed_rows(v, p.kv_row(b, 0), keys, p.kv_heads, p.head_dim);
      std::vector<double> one_lse;
      CHECK(packed_rows(out, p.q_row(b, 0), rows, p.q_heads, p.head_dim) ==
            reference_attention(one, qb, kb, vb, nullptr, &one_lse, sinks));
      for (int h = 0; h < p.q_heads; ++h)
        for (int i = 0; i < rows; ++i) CHECK(lse[std::size_t(p.lse_index(b, i, h))] == one_lse[std::size_t(h * rows + i)]);
      const auto g = reference_attention_backward(one, qb, kb, vb, dob, sinks);
      CHECK(packed_rows(grads.dq, p.q_row(b, 0), rows, p.q_heads, p.head_dim) == g.dq);
      CHECK(packed_rows(grads.dk, p.kv_row(b, 0), keys, p.kv_heads, p.head_dim) == g.dk);
      CHECK(packed_rows(grads.dv, p.kv_row(b, 0), keys, p.kv_heads, p.head_dim) == g.dv);
      for (std::size_t h = 0; h < g.dsinks.size(); ++h) dsinks[h] += g.dsinks[h];
    }
    if (c.sinks)
      for (std::size_t h = 0; h < 4; ++h) CHECK(grads.dsinks[h] == Approx(dsinks[h]).epsilon(1e-12));
  }
}

TEST_CASE("varlen: the problem names bad offsets and what it takes instead", "[cpu][features]") {
  auto p = make(2, 4, 5, 2, 1, 8, true);
  p.cu_seqlens_q = {0, 4, 6};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_q is given without cu_seqlens_k"));
  p.cu_seqlens_k = {0, 5};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_k has 2 entries") && Contains("batch + 1 = 3"));
  p.cu_seqlens_k = {1, 5, 8};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_k[0] = 1 must be 0"));
  p.cu_seqlens_k = {0, 5, 4};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_k[2] - cu_seqlens_k[1] = -1") && Contains("0 .. kv_len = 5"));
  p.cu_seqlens_k = {0, 5, 8};
  p.cu_seqlens_q = {0, 5, 6};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_q[1] - cu_seqlens_q[0] = 5") && Contains("max_seqlen"));
  p.cu_seqlens_q = {0, 0, 0};
  CHECK_THROWS_WITH(validate(p), Contains("cu_seqlens_q[batch] = 0: the pack holds no query rows"));
  p.cu_seqlens_q = {0, 4, 6};
  CHECK_NOTHROW(validate(p));
  CHECK_THAT(p.describe(), Contains("varlen=2..4 (6 rows, 8 keys)"));
  CHECK(p.sequence_of_q_row(3) == 0);
  CHECK(p.sequence_of_q_row(4) == 1);
  CHECK(p.sequence_of_kv_row(7) == 1);
  CHECK(p.flops() == Approx(4.0 * 2 * (4 * 5 + 2 * 3) * 8 / 2));
  p.kv_lens = {5, 3};
  CHECK_THROWS_WITH(validate(p), Contains("kv_lens with cu_seqlens"));
  p.kv_lens.clear();
  p.page_size = 1, p.pages = 8;
  CHECK_THROWS_WITH(validate(p), Contains("page_size = 1 with cu_seqlens"));
  p.page_size = 0, p.pages = 0;
  // A step that does not take packed lengths refuses them by name.
  CHECK_THROWS_WITH(refuse_features("step 25", p, Features{}),
                    Contains("step 25: cu_seqlens = 2 packed sequences") && Contains("is not supported"));
  CHECK_NOTHROW(refuse_features("step 25", p, Features{.varlen = true}));
}
