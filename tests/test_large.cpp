// One problem of more than 2^31 elements in each of Q, K, V and O, on every forward step; a KV cache of more
// than 2^31 elements (contiguous and paged) on every decode step; and a backward problem of more than 2^31
// elements in each of its eight tensors, on every backward step.
//
// Kernels add a 64-bit offset per (batch, head) and index inside a sequence in 32 bits, so the whole
// problem may be any size as long as one sequence stays below 2^31 elements (validate() refuses
// more). This test holds them to it: f16 Q, K, V and O of 2^31 + 15 * 2^16 elements each (4 GiB
// apiece), made on the device, every output element checked for NaN (O is poisoned first), and
// whole sequences on both sides of the 2^31 boundary compared with the float64 reference.
// They run alone (ctest RUN_SERIAL): the backward case needs ~50 GiB of device memory, each skips (saying so)
// where the GPU has less free.
#include "device_fill.hpp"
#include "fa/compare.hpp"
#include "fa/kit.hpp"
#include "fa/registry.hpp"
#include "gpu.hpp"
#include "reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
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

/// Whether the device has `needed` bytes free; if not, records the case as skipped, naming both.
bool device_memory_for(std::size_t needed) {
  std::size_t free_bytes = 0, total_bytes = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes >= needed) return true;
  test::skip("needs " + std::to_string(needed >> 30) + " GiB of device memory; " + std::to_string(free_bytes >> 30) +
             " GiB free");
  return false;
}

/// 32783 sequences of 32 rows x 32 heads x d = 64, f16: 2^16 elements each, 2^31 + 15 x 2^16 in each of Q, K, V
/// and O (and, in the backward, dO, dQ, dK and dV).
AttentionProblem past_2_31() {
  AttentionProblem p;
  p.batch = 32783, p.q_len = 32, p.kv_len = 32, p.q_heads = 32, p.kv_heads = 32, p.head_dim = 64;
  p.dtype = DType::f16;
  return p;
}

}  // namespace

TEST_CASE("a problem of more than 2^31 elements in total runs on every step", "[gpu][large]") {
  FA_REQUIRE_GPU();
  const AttentionProblem p = past_2_31();
  const std::int64_t per_sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  REQUIRE(p.q_elements() > (std::int64_t(1) << 31));
  REQUIRE(p.kv_elements() > (std::int64_t(1) << 31));
  const int first_past_2_31 = int((std::int64_t(1) << 31) / per_sequence);  // 32768: all of it past 2^31

  const std::uint64_t seed = test::fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const std::size_t bytes = std::size_t(p.q_elements()) * size_of(p.dtype);
  if (!device_memory_for(4 * bytes + (std::size_t(9) << 30))) return;  // Q, K, V, O and the largest workspace
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

TEST_CASE("decode over a cache of more than 2^31 elements, contiguous and paged, on every decode step",
          "[gpu][large]") {
  FA_REQUIRE_GPU();
  // 17 sequences of 131072 keys x 8 KV heads x d = 128: 2^27 elements each, 17 x 2^27 > 2^31 in K and in V
  // (4.3 GiB apiece), the capacity of every sequence; per-sequence lengths below it for some.
  AttentionProblem p;
  p.batch = 17, p.q_len = 1, p.kv_len = 131072, p.q_heads = 16, p.kv_heads = 8, p.head_dim = 128;
  p.dtype = DType::f16;
  p.kv_lens.assign(17, 131072);
  p.kv_lens[1] = 131072 - 5, p.kv_lens[16] = 100003;
  const std::int64_t per_sequence = std::int64_t(p.kv_len) * p.kv_heads * p.head_dim;
  REQUIRE(p.kv_elements() > (std::int64_t(1) << 31));
  const std::uint64_t seed = test::fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const std::size_t kv_bytes = std::size_t(p.kv_elements()) * size_of(p.dtype);
  if (!device_memory_for(2 * kv_bytes + (std::size_t(2) << 30))) return;
  const std::size_t q_bytes = std::size_t(p.q_elements()) * size_of(p.dtype);
  DeviceBuffer q(q_bytes), k(kv_bytes), v(kv_bytes), o(q_bytes), lens(17 * sizeof(int));
  test::fill_uniform(q.get(), p.dtype, p.q_elements(), seed * 3 + 1, -1.f, 1.f);
  test::fill_uniform(k.get(), p.dtype, p.kv_elements(), seed * 3 + 2, -1.f, 1.f);
  test::fill_uniform(v.get(), p.dtype, p.kv_elements(), seed * 3 + 3, -1.f, 1.f);
  lens.upload(p.kv_lens.data(), 17 * sizeof(int));

  // Paged (pages of 16): the same memory read as a pool of 17 x 8192 pages, sequence b's pages those of
  // sequence 16 - b in reverse order, so sequence 0 reads only past 2^31 and every page walk goes backwards.
  AttentionProblem paged = p;
  paged.page_size = 16, paged.pages = 17 * 8192;
  const int per_table = 8192;
  std::vector<int> table(std::size_t(17) * per_table);
  for (int b = 0; b < 17; ++b)
    for (int i = 0; i < per_table; ++i) table[std::size_t(b) * per_table + i] = (16 - b) * per_table + (per_table - 1 - i);
  DeviceBuffer page_table(table.size() * sizeof(int));
  page_table.upload(table.data(), table.size() * sizeof(int));

  // The reference of sequence b: its keys, gathered as the kernel must read them (physical sequence `from`, its
  // pages reversed when paged).
  auto expected = [&](int b, bool is_paged) {
    const int from = is_paged ? 16 - b : b;
    AttentionProblem one = p;
    one.batch = 1, one.kv_lens = {p.kv_lens[std::size_t(b)]};
    HostTensor qs = download_sequence(q, p.dtype, b, p.q_len, p.q_heads, p.head_dim);
    HostTensor ks = download_sequence(k, p.dtype, from, p.kv_len, p.kv_heads, p.head_dim);
    HostTensor vs = download_sequence(v, p.dtype, from, p.kv_len, p.kv_heads, p.head_dim);
    if (is_paged) {  // logical page i is physical page 8191 - i of the sequence
      const std::size_t page_bytes = std::size_t(16) * p.kv_heads * p.head_dim * size_of(p.dtype);
      for (HostTensor* t : {&ks, &vs}) {
        const HostTensor physical = *t;
        for (int i = 0; i < per_table; ++i)
          std::memcpy(t->bytes.data() + std::size_t(i) * page_bytes,
                      physical.bytes.data() + std::size_t(per_table - 1 - i) * page_bytes, page_bytes);
      }
    }
    return reference_attention(one, qs.to_double(), ks.to_double(), vs.to_double());
  };
  const std::vector<int> sequences = {0, 1, 15, 16};  // 15 ends at 2^31; 16 lies past it
  std::map<std::pair<int, bool>, std::vector<double>> reference;

  for (const StepInfo* step : test::steps_under_test(Pass::forward)) {
    if (!step->cache_forms.kv_lens || !step->supports(p) || !test::runs_here(*step)) continue;
    for (const bool is_paged : {false, true}) {
      const AttentionProblem& run = is_paged ? paged : p;
      if (is_paged && !step->supports(run)) continue;
      INFO("step " << step->label() << (is_paged ? ", paged (16)" : ", contiguous"));
      DeviceBuffer workspace(step->workspace_for(run)), status(4 * sizeof(int));
      AttentionTensors t{q.get(), k.get(), v.get(), o.get(), workspace.get()};
      t.kv_lens = lens.as<int>(), t.cache_status = status.as<int>();
      if (is_paged) t.page_table = page_table.as<int>();
      o.poison();
      step->launch(run, t, nullptr);
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(test::count_non_finite(o.get(), p.dtype, p.q_elements()) == 0);
      int record[4];
      status.download(record, sizeof(record));
      CHECK(cache_fault_message(record).empty());
      for (int b : sequences) {
        INFO("sequence " << b << " (keys from element " << std::int64_t(is_paged ? 16 - b : b) * per_sequence << ")");
        auto it = reference.find({b, is_paged});
        if (it == reference.end()) it = reference.emplace(std::pair{b, is_paged}, expected(b, is_paged)).first;
        const HostTensor out = download_sequence(o, p.dtype, b, p.q_len, p.q_heads, p.head_dim);
        const Verdict verdict = judge(out, it->second, p.head_dim);
        INFO(verdict.describe());
        CHECK(verdict.passed());
      }
    }
  }
}

TEST_CASE("a backward problem of more than 2^31 elements runs on every backward step", "[gpu][large]") {
  FA_REQUIRE_GPU();
  // The forward's problem above, in each of the backward's eight tensors. O and LSE from the course's fastest
  // forward step that takes it.
  const AttentionProblem p = past_2_31();
  const std::int64_t per_sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  REQUIRE(p.q_elements() > (std::int64_t(1) << 31));
  const int first_past_2_31 = int((std::int64_t(1) << 31) / per_sequence);
  const std::uint64_t seed = test::fresh_seed();
  INFO(p.describe() << " seed=" << seed);
  const std::size_t bytes = std::size_t(p.q_elements()) * size_of(p.dtype);
  if (!device_memory_for(8 * bytes + (std::size_t(20) << 30))) return;  // and LSE, D, a float dQ workspace
  const StepInfo* forward = forward_step_for_backward(p, kit::device_arch());
  REQUIRE(forward != nullptr);
  DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes), d_o(bytes), dq(bytes), dk(bytes), dv(bytes);
  DeviceBuffer lse(std::size_t(p.lse_elements()) * sizeof(float));
  test::fill_uniform(q.get(), p.dtype, p.q_elements(), seed * 3 + 1, -1.f, 1.f);
  test::fill_uniform(k.get(), p.dtype, p.kv_elements(), seed * 3 + 2, -1.f, 1.f);
  test::fill_uniform(v.get(), p.dtype, p.kv_elements(), seed * 3 + 3, -1.f, 1.f);
  test::fill_uniform(d_o.get(), p.dtype, p.q_elements(), seed * 3 + 4, -1.f, 1.f);
  {
    DeviceBuffer workspace(forward->workspace_for(p));
    AttentionTensors t{q.get(), k.get(), v.get(), o.get(), workspace.get()};
    t.lse = lse.as<float>();
    forward->launch(p, t, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::mt19937_64 rng(seed);
  std::vector<int> sequences = {0, first_past_2_31 - 1, first_past_2_31, p.batch - 1};
  sequences.push_back(first_past_2_31 + int(rng() % (p.batch - first_past_2_31)));
  AttentionProblem one = p;
  one.batch = 1;
  std::vector<ReferenceGradients> reference;
  std::vector<double> max_abs_score;
  for (int b : sequences) {
    const std::vector<double> qs = download_sequence(q, p.dtype, b, p.q_len, p.q_heads, p.head_dim).to_double();
    const std::vector<double> ks = download_sequence(k, p.dtype, b, p.kv_len, p.kv_heads, p.head_dim).to_double();
    const std::vector<double> vs = download_sequence(v, p.dtype, b, p.kv_len, p.kv_heads, p.head_dim).to_double();
    const std::vector<double> dos = download_sequence(d_o, p.dtype, b, p.q_len, p.q_heads, p.head_dim).to_double();
    double score = 0;
    reference_attention(one, qs, ks, vs, &score);
    max_abs_score.push_back(score);
    reference.push_back(reference_attention_backward(one, qs, ks, vs, dos));
  }

  for (const StepInfo* step : test::steps_under_test(Pass::backward)) {
    if (!step->supports(p) || !test::runs_here(*step)) continue;
    INFO("step " << step->label() << " (O and LSE from step " << forward->label() << ")");
    DeviceBuffer workspace(step->workspace_for(p));
    dq.poison(), dk.poison(), dv.poison();
    AttentionTensors t{q.get(), k.get(), v.get(), o.get(), workspace.get()};
    t.lse = lse.as<float>(), t.d_o = d_o.get(), t.dq = dq.get(), t.dk = dk.get(), t.dv = dv.get();
    step->launch(p, t, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(test::count_non_finite(dq.get(), p.dtype, p.q_elements()) == 0);
    CHECK(test::count_non_finite(dk.get(), p.dtype, p.kv_elements()) == 0);
    CHECK(test::count_non_finite(dv.get(), p.dtype, p.kv_elements()) == 0);
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      INFO("sequence " << sequences[s] << " (elements from " << std::int64_t(sequences[s]) * per_sequence << ")");
      const Gradients g{download_sequence(dq, p.dtype, sequences[s], p.q_len, p.q_heads, p.head_dim),
                        download_sequence(dk, p.dtype, sequences[s], p.kv_len, p.kv_heads, p.head_dim),
                        download_sequence(dv, p.dtype, sequences[s], p.kv_len, p.kv_heads, p.head_dim)};
      for (const Verdict& verdict : judge_gradients(g, reference[s].dq, reference[s].dk, reference[s].dv, p.head_dim,
                                                    max_abs_score[s])) {
        INFO(verdict.describe());
        CHECK(verdict.passed());
      }
    }
  }
}
