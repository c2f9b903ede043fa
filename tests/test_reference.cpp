// CPU tests of the float64 reference itself: everything else is judged by it.
#include "fa/host_tensor.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <cmath>

using namespace fa;

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
