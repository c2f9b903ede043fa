// One problem of more than 2^31 elements in each of Q, K, V and O, on every step.
//
// Kernels add a 64-bit offset per (batch, head) and index inside a sequence in 32 bits, so the whole
// problem may be any size as long as one sequence stays below 2^31 elements (validate() refuses
// more). This test holds them to it: f16 Q, K, V and O of 2^31 + 15 * 2^16 elements each (4 GiB
// apiece), made on the device, every output element checked for NaN (O is poisoned first), and
// whole sequences on both sides of the 2^31 boundary compared with the float64 reference.
// It runs alone (ctest RUN_SERIAL): one process needs ~17 GiB of device memory.
#include "device_fill.hpp"
#include "fa/compare.hpp"
#include "fa/registry.hpp"
#include "gpu.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

using namespace fa;

namespace {

/// Copies sequence b of a [batch, seq, heads, d] device tensor into a [1, seq, heads, d] host tensor.
HostTensor download_sequence(const DeviceBuffer& tensor, DType dtype, int b, int seq, int heads, int d) {
  HostTensor out(dtype, {1, seq, heads, d});
  const std::size_t offset = std::size_t(b) * out.byte_size();  // 64-bit on the host too
  FA_CUDA_CHECK(cudaMemcpy(out.bytes.data(), static_cast<const char*>(tensor.get()) + offset, out.byte_size(),
                           cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace

TEST_CASE("a problem of more than 2^31 elements in total runs on every step", "[gpu][large]") {
  FA_REQUIRE_GPU();
  // 32783 sequences of 32 rows x 32 heads x d = 64: 2^16 elements each, 2^31 + 15 * 2^16 in all.
  AttentionProblem p;
  p.batch = 32783, p.q_len = 32, p.kv_len = 32, p.q_heads = 32, p.kv_heads = 32, p.head_dim = 64;
  p.dtype = DType::f16;
  const std::int64_t per_sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  REQUIRE(p.q_elements() > (std::int64_t(1) << 31));
  REQUIRE(p.kv_elements() > (std::int64_t(1) << 31));
  const int first_past_2_31 = int((std::int64_t(1) << 31) / per_sequence);  // 32768: all of it past 2^31

  const std::uint64_t seed = test::fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const std::size_t bytes = std::size_t(p.q_elements()) * size_of(p.dtype);
  std::size_t free_bytes = 0, total_bytes = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t needed = 4 * bytes + (std::size_t(9) << 30);  // Q, K, V, O and the largest workspace
  if (free_bytes < needed) {
    test::skip("needs " + std::to_string(needed >> 30) + " GiB of device memory; " +
               std::to_string(free_bytes >> 30) + " GiB free");
    return;
  }
  DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes);
  test::fill_uniform(q.get(), p.dtype, p.q_elements(), seed * 3 + 1, -1.f, 1.f);
  test::fill_uniform(k.get(), p.dtype, p.kv_elements(), seed * 3 + 2, -1.f, 1.f);
  test::fill_uniform(v.get(), p.dtype, p.kv_elements(), seed * 3 + 3, -1.f, 1.f);

  // Sequences checked in full: the first, the last below 2^31, the first past it, the last, and
  // three more past it at random; their float64 reference, once.
  std::mt19937_64 rng(seed);
  std::vector<int> sequences = {0, first_past_2_31 - 1, first_past_2_31, p.batch - 1};
  for (int r = 0; r < 3; ++r) sequences.push_back(first_past_2_31 + int(rng() % (p.batch - first_past_2_31)));
  AttentionProblem one = p;
  one.batch = 1;
  std::vector<std::vector<double>> reference;
  for (int b : sequences) {
    const HostTensor qs = download_sequence(q, p.dtype, b, p.q_len, p.q_heads, p.head_dim);
    const HostTensor ks = download_sequence(k, p.dtype, b, p.kv_len, p.kv_heads, p.head_dim);
    const HostTensor vs = download_sequence(v, p.dtype, b, p.kv_len, p.kv_heads, p.head_dim);
    reference.push_back(reference_attention(one, qs.to_double(), ks.to_double(), vs.to_double()));
  }

  for (const StepInfo* step : test::steps_under_test(Pass::forward)) {
    if (!step->supports(p) || !test::runs_here(*step)) continue;
    INFO("step " << step->label());
    DeviceBuffer workspace(step->workspace_for(p));
    o.poison();
    step->launch(p, {q.get(), k.get(), v.get(), o.get(), workspace.get()}, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(test::count_non_finite(o.get(), p.dtype, p.q_elements()) == 0);
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      INFO("sequence " << sequences[s] << " (elements from " << std::int64_t(sequences[s]) * per_sequence << ")");
      const HostTensor out = download_sequence(o, p.dtype, sequences[s], p.q_len, p.q_heads, p.head_dim);
      const Verdict verdict = judge(out, reference[s], p.head_dim);
      INFO(verdict.describe());
      CHECK(verdict.passed());
    }
  }
}
