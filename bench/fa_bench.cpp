// fa-bench: times every registered step (and the cuBLAS baseline) with CUDA
// events and prints one table; the same rows go to a CSV that the plots read.
// A forward step is timed computing O; a backward step (steps 26 on) computing dQ, dK and dV.
//
//   fa-bench                         teaching shape, every step, every dtype a step takes, causal off and on
//   fa-bench --suite all --csv r.csv teaching + headline + sequence sweep
//   fa-bench --suite backward --steps 26,27  the backward's shapes
//   fa-bench --steps 03,04 --dtypes f16 --causal no --shape 2,512,512,8,2,64
//   fa-bench --suite trace           step 02's matrix trace lesson (trace_bench.cpp)
//   fa-bench --resources --steps 05,06  shared memory, registers, occupancy per kernel (no launch)
//
// Method: inputs are uploaded once per shape into enough copies to overflow the
// L2 cache, and the launches rotate through them; each step runs once for the
// correctness sample (output poisoned with NaN first), twice to warm up, then
// `reps` timed launches back to back, each bracketed by its own pair of CUDA events, queued
// while a hold kernel keeps the GPU busy (hold_stream.hpp), so that the events bracket the GPU's
// work and not the host's; the table shows the median. bench/sdpa_peers.py times the peers so.
// A backward step's inputs O, LSE and dO come from forward_for_backward (the course's last forward
// step that takes the problem, and a random dO), made once per shape, dtype and causal.
#include "cli.hpp"
#include "fa/compare.hpp"
#include "fa/device.hpp"
#include "fa/kit.hpp"
#include "fa/parallel.hpp"
#include "fa/registry.hpp"
#include "hold_stream.hpp"
#include "reference.hpp"
#include "trace_bench.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

namespace {

using namespace fa;

// The suites --suite takes, in the help's order: the help and the refusal of another name read them here.
constexpr std::array<const char*, 9> kSuites = {"teaching", "headline", "sweep",         "all",  "backward",
                                                "decode",   "accuracy", "accuracy-wide", "trace"};

/// "teaching|headline|...|trace": every suite.
std::string suite_names() {
  std::string names;
  for (const char* suite : kSuites) {
    if (!names.empty()) names += '|';
    names += suite;
  }
  return names;
}

/// `suite`, when --suite takes it; otherwise a refusal that lists the suites.
std::string known_suite(const std::string& suite) {
  for (const char* known : kSuites)
    if (suite == known) return suite;
  throw std::invalid_argument("unknown suite '" + suite + "'; --suite takes " + suite_names());
}

// The help after "--suite ": suite_names() comes first.
const char* kHelpAfterSuites = R"(
                                        shapes to time (default teaching)
                                        teaching: B=4 H=8 N=1024 d=64, for forward and backward steps;
                                        headline: B=4 H=16 N=4096 d=64; sweep: B=1 H=16 d=64,
                                        N = 256 ... 16384 (headline and sweep: forward steps only)
                                        backward: backward steps only (not part of "all"): the teaching
                                        shape in f32 and f16 (the CUDA-core steps 26, 27), then in f16
                                        and bf16 B=4 H=16 N=4096 d=64 and d=128, B=1 H=16 N=16384 d=128
                                        decode: forward steps, one query per sequence over a KV cache,
                                        f16 and bf16, no mask: B=8 Nkv=8192, B=1 Nkv=131072 and B=64
                                        Nkv=2048 with heads 32/8 at d=128; B=8 Nkv=8192 heads 16/16 d=64
                                        (not part of "all"); rows say pass "decode" and give GB/s, the
                                        bytes of K and V read once over the time (CSV column gbps)
                                        accuracy: B=1 H=4 d=64, N = 1024 ... 32768, inputs in [-1, 1)
                                        accuracy-wide: the same with Q in [-30, 30): logits of standard
                                        deviation 10, a wide dynamic range for the softmax sums
                                        (the accuracy suites are not part of "all")
                                        trace: step 02's matrix trace, whole matrix vs diagonal only over
                                        PCIe, end to end, n x n for n = 1024 ... 16384; its own table and
                                        CSV (--csv, default fa-bench-trace.csv); other options do not apply
  --shape B,Nq,Nkv,Hq,Hkv,d             time this shape instead of a suite (forward and backward steps);
                                        several: separated by spaces, in one argument
  --decode                              time --shape as a decode shape (Nq new tokens a sequence over a
                                        KV cache of Nkv keys; forward steps only): its rows say pass
                                        "decode" and give GB/s, the suite column "decode"; with --causal
                                        yes the mask is aligned bottom-right (new token i sees the keys up
                                        to Nkv - Nq + i), timed when Nq > 1. Without --shape: the decode
                                        suite
  --page-size N                         K and V as a paged cache, pages of N tokens in a shuffled order (as
                                        fa-run --random --page-size): only the steps that take pages are
                                        timed (--list); the suite column says decode-pages<N>. kv_len must
                                        be a multiple of N
  --window LEFT,RIGHT                   a sliding window, FlashAttention's window_size (-1: an open side;
                                        with --causal yes the right side is 0): only the steps that take a
                                        window are timed (--list); the suite column says
                                        <suite>-window<LEFT>_<RIGHT>, the TFLOPS count the window's pairs
  --softcap C                           logit soft-capping at C (Gemma 2's 50, for one): only the steps that
                                        take it are timed; the suite column says <suite>-softcap<C>
  --sinks                               attention sinks, one random logit a query head (gpt-oss): only the
                                        steps that take them are timed; the suite column says <suite>-sinks
  --varlen L1,L2,...                    packed variable lengths (FlashAttention's varlen): the pack's
                                        sequences, each Li query rows and keys; B, Nq and Nkv of every shape
                                        become the count and the longest. Only the steps that take a pack
                                        are timed; the suite column says <suite>-varlen<count>_<total>
                                        (bench/pack_lengths.py draws a mixed pack's lengths)
  --steps LIST                          step ids or labels, e.g. 01,03 (default all)
  --dtypes LIST                         f32,f16,bf16 (default: each of them that a selected step takes)
  --causal no|yes|both                  (default both)
  --csv FILE                            CSV output (default fa-bench.csv)
  --max-ms MS                           skip a step whose predicted time per call exceeds MS (default 2000)
  --reps N                              timed launches per measurement (default: about 1 s worth, 5..100)
  --sample-rows N                       output rows checked against the CPU reference (default 64)
                                        A backward step's dQ, dK and dV are checked whole against the
                                        float64 reference (judge_gradient) when B*Hq*Nq*Nkv <= 2^26 (the
                                        teaching shape), and reported "-" on larger problems;
                                        rel_err and max_err are the largest of the three tensors'
  --seed N                              input seed (default 1)
  --no-baseline                         skip the cuBLAS baseline (forward only)
  --list                                every step and variant, with the dtypes, head_dims and GPU it needs
                                        and its pass (forward or backward)
  --resources                           instead of timing: threads, shared memory, registers and
                                        occupancy of each selected step's kernel for every dtype and
                                        head_dim it supports (steps whose registry entry reports them);
                                        nothing is launched; CSV to --csv (default fa-bench-resources.csv)
exit status: 0 done, 1 bad option or error, 2 no CUDA device
)";

struct Shape {
  std::string suite;
  int batch, q_len, kv_len, q_heads, kv_heads, head_dim;
  double q_range = 1.0;  ///< Q is drawn from [-q_range, q_range); K and V from [-1, 1)
  bool forward = true;   ///< forward steps (and the cuBLAS baseline) are timed on it
  bool backward = false; ///< backward steps are timed on it
  std::vector<DType> only_dtypes = {};  ///< the dtypes it is timed in; empty: every dtype of --dtypes
  /// Decode: one new query per sequence over a KV cache, timed without the mask; its rows say pass "decode"
  /// and give the effective K/V bandwidth (gbps: the bytes of K and V, read once, over the time).
  bool decode = false;

  /// Whether steps of `pass` are timed on this shape.
  bool has(Pass pass) const { return pass == Pass::backward ? backward : forward; }
  /// Whether this shape is timed in `dtype`.
  bool takes(DType dtype) const {
    return only_dtypes.empty() || std::find(only_dtypes.begin(), only_dtypes.end(), dtype) != only_dtypes.end();
  }
};

std::vector<Shape> suite_shapes(const std::string& suite) {
  std::vector<Shape> shapes;
  // The teaching shape serves both passes: backward steps run on it too.
  if (suite == "teaching" || suite == "all")
    shapes.push_back({"teaching", 4, 1024, 1024, 8, 8, 64, 1.0, /*forward=*/true, /*backward=*/true});
  if (suite == "headline" || suite == "all") shapes.push_back({"headline", 4, 4096, 4096, 16, 16, 64});
  if (suite == "sweep" || suite == "all")
    for (int n = 256; n <= 16384; n *= 2) shapes.push_back({"sweep", 1, n, n, 16, 16, 64});
  // The backward's shapes: the teaching shape for the CUDA-core steps (f32 and f16), first, so that
  // their times there predict (--max-ms) their times on the tensor-core shapes that follow.
  // Decode: issue 32's four shapes, one query per sequence against a KV cache of 2,048 to 131,072 keys.
  if (suite == "decode") {
    const std::vector<DType> tensor_cores = {DType::f16, DType::bf16};
    for (const auto& [batch, kv_len, q_heads, kv_heads, head_dim] :
         std::vector<std::array<int, 5>>{{8, 8192, 32, 8, 128}, {1, 131072, 32, 8, 128}, {64, 2048, 32, 8, 128},
                                         {8, 8192, 16, 16, 64}})
      shapes.push_back({"decode", batch, 1, kv_len, q_heads, kv_heads, head_dim, 1.0, true, false, tensor_cores, true});
  }
  if (suite == "backward") {
    const std::vector<DType> cuda_cores = {DType::f32, DType::f16}, tensor_cores = {DType::f16, DType::bf16};
    shapes.push_back({"teaching", 4, 1024, 1024, 8, 8, 64, 1.0, false, true, cuda_cores});
    for (int head_dim : {64, 128})
      shapes.push_back({"backward", 4, 4096, 4096, 16, 16, head_dim, 1.0, false, true, tensor_cores});
    shapes.push_back({"backward", 1, 16384, 16384, 16, 16, 128, 1.0, false, true, tensor_cores});
  }
  // Error against the float64 reference as N grows: the softmax sums and the
  // P.V accumulation have N terms. "wide" scales Q so scores spread over ~+-30.
  if (suite == "accuracy" || suite == "accuracy-wide")
    for (int n = 1024; n <= 32768; n *= 2)
      shapes.push_back({suite, 1, n, n, 4, 4, 64, suite == "accuracy" ? 1.0 : 30.0});
  if (shapes.empty()) throw std::logic_error("suite '" + suite + "' has no shapes (kSuites lists it; add them here)");
  return shapes;
}

// One measurement: a row of the table and of the CSV.
struct Row {
  std::string suite;
  const StepInfo* step;
  AttentionProblem problem;
  double ms, ms_min, ms_max, tflops, rel_err, max_err;
  std::size_t extra_bytes;
  int reps;
  double speedup_prev = NAN, speedup_01 = NAN, vs_cublas = NAN;
  bool decode = false;  ///< a decode shape's row: pass "decode", and gbps
  double gbps = NAN;    ///< decode: bytes of K and V read once (AttentionProblem::kv_bytes) / time, in GB/s
  /// "forward", "backward" or "decode": the CSV's pass column.
  const char* pass() const { return decode ? "decode" : to_string(step->pass); }
};

// Device copies of the inputs and outputs, enough of them to leave the L2 cache: Q, K, V and the
// forward's O in every set; the backward's O, LSE and dO (inputs) and dQ, dK, dV (outputs) in the first
// sets, as many as its larger sets need (add_backward).
struct InputSets {
  std::vector<DeviceBuffer> q, k, v, o;
  std::vector<DeviceBuffer> o_in, lse, d_o, dq, dk, dv;  ///< the backward's, empty until add_backward
  DeviceBuffer workspace;
  DeviceBuffer page_table;  ///< a paged problem's page table (every set's pools share its order)
  DeviceBuffer sinks;       ///< the sinks' logits, f32 [q_heads] (every set shares them)
  DeviceBuffer dsinks;      ///< the backward's gradient of them, f32 [q_heads] (every set writes the same values)
  DeviceBuffer cu_seqlens_q, cu_seqlens_k;  ///< a pack's offsets, int32 [batch + 1] (every set shares them)
  /// A paged problem's K and V go up as page pools, each sequence's pages in DeviceAttention's shuffled order.
  InputSets(const AttentionProblem& p, const AttentionInputs& in, int copies) {
    if (p.sinks) {
      sinks = DeviceBuffer(in.sinks.byte_size());
      sinks.upload(in.sinks.bytes.data(), in.sinks.byte_size());
      dsinks = DeviceBuffer(in.sinks.byte_size());
    }
    if (p.varlen()) {
      cu_seqlens_q = DeviceBuffer(p.cu_seqlens_q.size() * sizeof(int));
      cu_seqlens_q.upload(p.cu_seqlens_q.data(), p.cu_seqlens_q.size() * sizeof(int));
      cu_seqlens_k = DeviceBuffer(p.cu_seqlens_k.size() * sizeof(int));
      cu_seqlens_k.upload(p.cu_seqlens_k.data(), p.cu_seqlens_k.size() * sizeof(int));
    }
    std::vector<int> table;
    HostTensor k_pool, v_pool;
    if (p.paged()) {
      table = shuffled_page_table(p, DeviceAttention::kPageSeed);
      k_pool = to_pages(p, in.k, table), v_pool = to_pages(p, in.v, table);
      page_table = DeviceBuffer(table.size() * sizeof(int));
      page_table.upload(table.data(), table.size() * sizeof(int));
    }
    const HostTensor& k_in = p.paged() ? k_pool : in.k;
    const HostTensor& v_in = p.paged() ? v_pool : in.v;
    for (int c = 0; c < copies; ++c) {
      q.emplace_back(in.q.byte_size());
      k.emplace_back(k_in.byte_size());
      v.emplace_back(v_in.byte_size());
      o.emplace_back(std::size_t(p.q_elements()) * size_of(p.dtype));
      q.back().upload(in.q.bytes.data(), in.q.byte_size());
      k.back().upload(k_in.bytes.data(), k_in.byte_size());
      v.back().upload(v_in.bytes.data(), v_in.byte_size());
    }
  }
  /// Uploads a backward call's inputs into the first `copies` sets (at most as many as there are) and
  /// allocates its outputs there.
  void add_backward(const BackwardInputs& in, int copies) {
    copies = std::min(copies, int(q.size()));
    for (int c = 0; c < copies; ++c) {
      o_in.emplace_back(in.o.byte_size());
      lse.emplace_back(in.lse.byte_size());
      d_o.emplace_back(in.d_o.byte_size());
      dq.emplace_back(q[c].bytes());
      dk.emplace_back(k[c].bytes());
      dv.emplace_back(v[c].bytes());
      o_in.back().upload(in.o.bytes.data(), in.o.byte_size());
      lse.back().upload(in.lse.bytes.data(), in.lse.byte_size());
      d_o.back().upload(in.d_o.bytes.data(), in.d_o.byte_size());
    }
  }
  /// How many sets a step of `pass` rotates through.
  int copies(Pass pass) const { return int(pass == Pass::backward ? dq.size() : q.size()); }
  /// The pointers of set c for a step of `pass`.
  AttentionTensors tensors(int c, Pass pass) const {
    if (pass == Pass::forward) {
      AttentionTensors t{q[c].get(), k[c].get(), v[c].get(), o[c].get(), workspace.get()};
      t.page_table = page_table.as<int>();
      t.sinks = sinks.as<float>();
      t.cu_seqlens_q = cu_seqlens_q.as<int>(), t.cu_seqlens_k = cu_seqlens_k.as<int>();
      return t;
    }
    AttentionTensors t{q[c].get(), k[c].get(), v[c].get(), o_in[c].get(), workspace.get()};
    t.lse = lse[c].as<float>();
    t.sinks = sinks.as<float>();
    t.cu_seqlens_q = cu_seqlens_q.as<int>(), t.cu_seqlens_k = cu_seqlens_k.as<int>();
    t.d_o = d_o[c].get(), t.dq = dq[c].get(), t.dk = dk[c].get(), t.dv = dv[c].get();
    t.dsinks = dsinks.as<float>();
    return t;
  }
  /// Fills set c's outputs of `pass` with NaN.
  void poison_outputs(int c, Pass pass) {
    if (pass == Pass::forward) {
      o[c].poison();
    } else {
      dq[c].poison(), dk[c].poison(), dv[c].poison(), dsinks.poison();
    }
  }
};

int copies_to_leave_l2(std::size_t bytes_per_set) {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  int l2 = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const std::size_t want = 3 * std::size_t(l2);
  return int(std::clamp<std::size_t>((want + bytes_per_set - 1) / bytes_per_set, 1, 8));
}

// Reference rows sampled at random: (b, i, h) and their float64 outputs.
struct SampledReference {
  std::vector<std::array<int, 3>> rows;
  std::vector<double> values;
};

SampledReference sample_reference(const AttentionProblem& p, const AttentionInputs& in, int count,
                                  std::uint64_t seed) {
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  const std::vector<double> sinks = p.sinks ? in.sinks.to_double() : std::vector<double>();
  SampledReference ref;
  std::mt19937_64 rng(seed);
  for (int r = 0; r < count; ++r) {
    if (p.varlen()) {  // a row of the pack, each as likely
      const std::int64_t row = std::int64_t(rng() % std::uint64_t(p.total_q()));
      const int b = p.sequence_of_q_row(row);
      ref.rows.push_back({b, int(row - p.q_row(b, 0)), int(rng() % p.q_heads)});
    } else {
      ref.rows.push_back({int(rng() % p.batch), int(rng() % p.q_len), int(rng() % p.q_heads)});
    }
  }
  // The rows drawn, each row's float64 output on a core of its own: a decode row reads its whole cache (131,072 keys
  // at B = 1), and one core took seconds a configuration for the 64 rows.
  ref.values.resize(std::size_t(count) * p.head_dim);
  parallel_for(count, [&](int, std::int64_t r) {
    const auto& [b, i, h] = ref.rows[r];
    reference_attention_row(p, q.data(), k.data(), v.data(), b, i, h, ref.values.data() + r * p.head_dim, nullptr,
                            p.sinks ? &sinks : nullptr);
  });
  return ref;
}

/// Relative L2 and max abs error of the sampled rows (NaN when any output is not finite).
ErrorStats sampled_error(const AttentionProblem& p, const DeviceBuffer& o, const SampledReference& ref) {
  HostTensor out(p.dtype, q_shape(p));
  o.download(out.bytes.data(), out.byte_size());
  std::vector<double> got;
  for (const auto& [b, i, h] : ref.rows) {
    const std::int64_t base = (p.q_row(b, i) * p.q_heads + h) * p.head_dim;
    for (int c = 0; c < p.head_dim; ++c) got.push_back(out.get(base + c));
  }
  ErrorStats stats = compare(got.data(), ref.values.data(), std::int64_t(got.size()));
  if (stats.non_finite) stats.rel_l2 = stats.max_abs = NAN;
  return stats;
}

/// A backward step's gradients are checked whole against the float64 reference up to this many
/// scores (B * Hq * Nq * Nkv: the teaching shape has 2^25); beyond it the CPU reference's five
/// products of that size take too long, and the errors are reported "-".
constexpr double kMaxCheckedScores = double(1 << 26);

/// What a backward step's gradients are judged against: the float64 reference's dQ, dK and dV at
/// the backward's inputs, and the problem's largest |score| (the tolerances grow with it).
struct BackwardReference {
  bool checked = false;  ///< false: the problem is over kMaxCheckedScores, nothing to judge against
  double max_abs_score = 0;
  ReferenceGradients gradients;
};

BackwardReference backward_reference(const AttentionProblem& p, const AttentionInputs& in,
                                     const BackwardInputs& backward) {
  BackwardReference ref;
  if (double(p.batch) * p.q_heads * p.q_len * p.kv_len > kMaxCheckedScores) return ref;
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  const std::vector<double> sinks = p.sinks ? in.sinks.to_double() : std::vector<double>();
  reference_attention(p, q, k, v, &ref.max_abs_score, nullptr, p.sinks ? &sinks : nullptr);
  const std::vector<double> stored_o = backward.o.to_double();  // D from the O the step reads (reference.hpp)
  ref.gradients =
      reference_attention_backward(p, q, k, v, backward.d_o.to_double(), p.sinks ? &sinks : nullptr, &stored_o);
  ref.checked = true;
  return ref;
}

/// The largest relative L2 and max abs error of dQ, dK and dV (and with sinks dsinks) in set 0, judged with judge_gradient
/// (NaN when any output is not finite, or when nothing is checked). A gradient out of tolerance is
/// named on stderr.
ErrorStats gradient_error(const StepInfo& step, const AttentionProblem& p, const InputSets& sets,
                          const BackwardReference& ref) {
  ErrorStats worst;
  if (!ref.checked) {
    worst.rel_l2 = worst.max_abs = NAN;
    return worst;
  }
  Gradients g{HostTensor(p.dtype, q_shape(p)), HostTensor(p.dtype, kv_shape(p)), HostTensor(p.dtype, kv_shape(p))};
  sets.dq[0].download(g.dq.bytes.data(), g.dq.byte_size());
  sets.dk[0].download(g.dk.bytes.data(), g.dk.byte_size());
  sets.dv[0].download(g.dv.bytes.data(), g.dv.byte_size());
  std::vector<Verdict> verdicts = judge_gradients(g, ref.gradients.dq, ref.gradients.dk, ref.gradients.dv,
                                                  p.head_dim, ref.max_abs_score);
  if (p.sinks) {
    g.dsinks = HostTensor(DType::f32, {p.q_heads});
    sets.dsinks.download(g.dsinks.bytes.data(), g.dsinks.byte_size());
    verdicts.push_back(judge_dsinks(g.dsinks, ref.gradients.dsinks, p.dtype, ref.max_abs_score));
  }
  for (const Verdict& v : verdicts) {
    if (!v.passed()) std::fprintf(stderr, "  %s: %s\n", step.label().c_str(), v.describe().c_str());
    worst.rel_l2 = std::max(worst.rel_l2, v.global.rel_l2);
    worst.max_abs = std::max(worst.max_abs, v.global.max_abs);
    worst.non_finite += v.global.non_finite;
    worst.count += v.global.count;
  }
  if (worst.non_finite) worst.rel_l2 = worst.max_abs = NAN;
  return worst;
}

struct Timing {
  double median, min, max;
  int reps;
};

Timing time_step(const StepInfo& step, const AttentionProblem& p, InputSets& sets, int reps_wanted) {
  const int copies = sets.copies(step.pass);
  int next = 0;
  auto launch = [&] { step.launch(p, sets.tensors(next++ % copies, step.pass), nullptr); };
  CudaEventTimer timer;
  for (int w = 0; w < 2; ++w) launch();  // warm-up: module load, handles, clocks
  timer.start();
  launch();
  timer.stop();
  const float first = timer.elapsed_ms();
  const int reps = reps_wanted > 0 ? reps_wanted : std::clamp(int(1000.0 / std::max(first, 0.001f)), 5, 100);
  // The host's time to queue one call (checks, tensor maps, launches), on an idle GPU.
  const auto queued = std::chrono::steady_clock::now();
  launch();
  const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - queued).count();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  // Every call queued behind a hold long enough for the host to queue them all: then the GPU runs them back to
  // back, as a training loop does, and call r's events bracket call r's kernels alone.
  std::vector<CudaEventTimer> timers(reps);
  bench::hold_stream(1000.0 + 1.5 * reps * host_us);
  for (auto& t : timers) {
    t.start();
    launch();
    t.stop();
  }
  std::vector<double> ms;
  for (auto& t : timers) ms.push_back(t.elapsed_ms());
  std::sort(ms.begin(), ms.end());
  const double median = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
  return {median, ms.front(), ms.back(), reps};
}

std::string fmt(double value, int precision) {
  if (std::isnan(value)) return "-";
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(precision);
  out << value;
  return out.str();
}

std::string fmt_sci(double value) {
  if (std::isnan(value)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", value);
  return buf;
}

void print_header() {
  std::printf("%-9s %-8s %-4s %-4s %2s %6s %6s %3s %3s %4s %-6s %11s %8s %7s %8s %8s %9s %8s %8s\n", "step",
              "suite", "pass", "type", "B", "Nq", "Nkv", "Hq", "Hkv", "d", "causal", "ms", "TFLOPS", "x prev", "x 01",
              "x cuBLAS", "extra MiB", "rel_err", "max_err");
  // Decode rows end with their K/V bandwidth: "  2706.1 GB/s".
}

void print_row(const Row& r) {
  const auto& p = r.problem;
  std::printf("%-9s %-8s %-4s %-4s %2d %6d %6d %3d %3d %4d %-6s %11s %8s %7s %8s %8s %9s %8s %8s",
              r.step->label().c_str(), r.suite.c_str(), r.decode ? "dec" : r.step->pass == Pass::backward ? "bwd" : "fwd",
              to_string(p.dtype), p.batch, p.q_len, p.kv_len,
              p.q_heads, p.kv_heads, p.head_dim, p.causal ? "yes" : "no", fmt(r.ms, 4).c_str(),
              fmt(r.tflops, 3).c_str(), fmt(r.speedup_prev, 2).c_str(), fmt(r.speedup_01, 1).c_str(),
              fmt(r.vs_cublas, 3).c_str(), fmt(r.extra_bytes / 1048576.0, 1).c_str(), fmt_sci(r.rel_err).c_str(),
              fmt_sci(r.max_err).c_str());
  if (r.decode) std::printf(" %8.1f GB/s", r.gbps);
  std::printf("\n");
  std::fflush(stdout);
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& gpu) {
  std::ofstream csv(path);
  if (!csv) throw std::runtime_error("cannot write " + path);
  csv << "step,variant,dtype,batch,q_len,kv_len,q_heads,kv_heads,head_dim,causal,ms,tflops,extra_bytes,"
         "rel_err,gpu,suite,ms_min,ms_max,reps,speedup_prev,speedup_01,vs_cublas,max_err,pass,gbps\n";
  csv.precision(6);
  for (const auto& r : rows) {
    const auto& p = r.problem;
    csv << r.step->id << ',' << r.step->variant << ',' << to_string(p.dtype) << ',' << p.batch << ','
        << p.q_len << ',' << p.kv_len << ',' << p.q_heads << ',' << p.kv_heads << ',' << p.head_dim << ','
        << (p.causal ? 1 : 0) << ',' << r.ms << ',' << r.tflops << ',' << r.extra_bytes << ',' << r.rel_err
        << ",\"" << gpu << "\"," << r.suite << ',' << r.ms_min << ',' << r.ms_max << ',' << r.reps << ','
        << r.speedup_prev << ',' << r.speedup_01 << ',' << r.vs_cublas << ',' << r.max_err << ',' << r.pass() << ','
        << r.gbps << '\n';
  }
}

// --resources: what the compiler (registers, static shared memory) and the
// occupancy calculator (resident blocks per SM) say about the kernel each step
// would launch, for every dtype and head_dim it supports. Nothing is launched.
int run_resources(const std::vector<const StepInfo*>& steps, const std::vector<DType>& dtypes,
                  const std::string& csv_path) {
  if (!gpu_available()) {
    std::fprintf(stderr, "fa-bench: no CUDA device found; --resources asks the device's occupancy calculator\n");
    return 2;
  }
  int device = 0, max_threads_per_sm = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const int max_warps_per_sm = max_threads_per_sm / 32;
  const std::string gpu = gpu_name();
  std::ofstream csv(csv_path);
  if (!csv) throw std::runtime_error("cannot write " + csv_path);
  csv << "step,variant,dtype,head_dim,threads_per_block,shared_bytes,registers,blocks_per_sm,warps_per_sm,"
         "occupancy_pct,gpu\n";
  std::printf("kernel resources on %s (%d warps per SM at most): shared = dynamic + static per block\n",
              gpu.c_str(), max_warps_per_sm);
  std::printf("%-13s %-4s %4s %8s %13s %9s %9s %9s %10s\n", "step", "type", "d", "threads", "shared B/blk",
              "regs/thr", "blocks/SM", "warps/SM", "occupancy");
  int rows = 0;
  for (const StepInfo* step : steps) {
    if (!step->runs_on(kit::device_arch())) {
      std::fprintf(stderr, "  skip %s: needs %s\n", step->label().c_str(), step->min_gpu().c_str());
      continue;
    }
    if (!step->reports_resources) {
      std::fprintf(stderr, "  skip %s: it launches more than its own kernels (no resources reported)\n",
                   step->label().c_str());
      continue;
    }
    for (DType dtype : dtypes) {
      if (!step->supports(dtype)) continue;
      for (int head_dim : step->head_dims) {
        AttentionProblem p;
        p.head_dim = head_dim, p.dtype = dtype;
        const KernelResources r = step->resources(p);
        const int warps = r.blocks_per_sm * ((r.threads_per_block + 31) / 32);
        const double occupancy = 100.0 * warps / max_warps_per_sm;
        std::printf("%-13s %-4s %4d %8d %13d %9d %9d %9d %9s%%\n", step->label().c_str(), to_string(dtype),
                    head_dim, r.threads_per_block, r.shared_bytes, r.registers, r.blocks_per_sm, warps,
                    fmt(occupancy, 1).c_str());
        csv << step->id << ',' << step->variant << ',' << to_string(dtype) << ',' << head_dim << ','
            << r.threads_per_block << ',' << r.shared_bytes << ',' << r.registers << ',' << r.blocks_per_sm << ','
            << warps << ',' << occupancy << ",\"" << gpu << "\"\n";
        ++rows;
      }
    }
  }
  std::printf("wrote %d rows to %s\n", rows, csv_path.c_str());
  return 0;
}

int run(int argc, char** argv) {
  const Args args(argc, argv,
                  {"suite", "shape", "steps", "dtypes", "causal", "csv", "max-ms", "reps", "sample-rows", "seed",
                   "page-size", "window", "softcap", "varlen"},
                  {"help", "no-baseline", "resources", "list", "decode", "sinks"});
  if (args.has("help")) {
    std::cout << "usage: fa-bench [options]\n  --suite " << suite_names() << kHelpAfterSuites;
    return 0;
  }
  if (args.has("list")) {
    print_step_list(std::cout);
    return 0;
  }
  // Everything the options say is checked before the GPU is touched.
  const bool decode = args.has("decode");
  if (decode && args.has("suite") && args.get("suite", "") != "decode")
    throw std::invalid_argument("--decode times decode shapes: --suite " + args.get("suite", "") +
                                " is not one (give --shape B,Nq,Nkv,Hq,Hkv,d, or --suite decode)");
  const std::string suite = known_suite(args.get("suite", decode ? "decode" : "teaching"));
  if (suite == "trace") return run_trace_suite(args.get("csv", "fa-bench-trace.csv"));
  std::vector<Shape> shapes;
  if (args.has("shape")) {
    std::istringstream list(args.get("shape", ""));
    for (std::string text; list >> text;) {
      const auto v = Args::parse_ints(text, kShapeFields, "--shape");
      if (decode)  // forward steps only
        shapes.push_back({"decode", v[0], v[1], v[2], v[3], v[4], v[5], 1.0, true, false, {}, /*decode=*/true});
      else
        shapes.push_back({"custom", v[0], v[1], v[2], v[3], v[4], v[5], 1.0, /*forward=*/true, /*backward=*/true});
    }
    if (shapes.empty()) throw std::invalid_argument("--shape: expected B,Nq,Nkv,Hq,Hkv,d, got nothing");
  } else {
    shapes = suite_shapes(suite);
  }
  const auto steps = select_steps(args.get("steps", "all"));
  std::vector<DType> dtypes;
  if (args.has("dtypes")) {
    for (const auto& d : Args::split(args.get("dtypes", ""))) dtypes.push_back(parse_dtype(d));
  } else {  // bf16 rows only when a selected step (not just the baseline) takes bf16
    for (DType d : kAllDTypes)
      if (std::any_of(steps.begin(), steps.end(), [&](const StepInfo* s) { return s->supports(d); }))
        dtypes.push_back(d);
  }
  if (args.has("resources")) return run_resources(steps, dtypes, args.get("csv", "fa-bench-resources.csv"));
  const std::string causal_opt = args.get("causal", "both");
  std::vector<bool> causals;
  if (causal_opt == "no" || causal_opt == "both") causals.push_back(false);
  if (causal_opt == "yes" || causal_opt == "both") causals.push_back(true);
  if (causals.empty()) throw std::invalid_argument("--causal must be no, yes or both");
  const double max_ms = args.get_number("max-ms", 2000);
  const int reps = int(args.get_number("reps", 0));
  const int sample_rows = int(args.get_number("sample-rows", 64));
  const auto seed = std::uint64_t(args.get_number("seed", 1));
  const int page_size = int(args.get_number("page-size", 0));
  if (page_size < 0) throw std::invalid_argument("--page-size must be a number of tokens, 1 or more");
  if (page_size > 0)
    for (Shape& shape : shapes) {
      if (shape.kv_len % page_size != 0)
        throw std::invalid_argument("--page-size " + std::to_string(page_size) + " does not divide kv_len " +
                                    std::to_string(shape.kv_len) + " of a " + shape.suite + " shape");
      shape.suite += "-pages" + std::to_string(page_size);
    }
  // A sliding window, FlashAttention's window_size (LEFT,RIGHT; -1 an open side): only the steps that take one are
  // timed, and the suite column says so (until the CSV has the features' columns).
  int window_left = -1, window_right = -1;
  if (args.has("window")) {
    std::tie(window_left, window_right) = Args::window(args.get("window", ""));
    for (Shape& shape : shapes) shape.suite += "-window" + std::to_string(window_left) + "_" + std::to_string(window_right);
  }
  // Soft-capping (a cap c > 0) and sinks (random logits, one a query head): the same, in the suite column.
  const double softcap = args.get_number("softcap", 0);
  if (!(softcap >= 0) || !std::isfinite(softcap))
    throw std::invalid_argument("--softcap must be a cap c > 0 (0: none); got '" + args.get("softcap", "") + "'");
  const bool sinks = args.has("sinks");
  for (Shape& shape : shapes) {
    if (softcap > 0) shape.suite += "-softcap" + args.get("softcap", "");
    if (sinks) shape.suite += "-sinks";
  }
  // Packed variable lengths (FlashAttention's varlen): the lengths of the pack's sequences, each its query rows and
  // its keys; they replace every shape's B, Nq and Nkv (B the count, Nq = Nkv the longest), and the suite column
  // says <suite>-varlen<count>_<total>.
  std::vector<int> cu_seqlens;
  if (args.has("varlen")) {
    if (decode || page_size > 0)
      throw std::invalid_argument("--varlen packs whole sequences for the forward and backward steps: not with "
                                  "--decode or --page-size");
    cu_seqlens = {0};
    int longest = 0;
    for (const std::string& text : Args::split(args.get("varlen", ""))) {
      const int len = Args::whole_number(text).value_or(-1);
      if (len < 0 || cu_seqlens.back() > std::numeric_limits<int>::max() - len)
        throw std::invalid_argument("--varlen must be the pack's sequence lengths, whole numbers >= 0 separated by "
                                    "commas (e.g. 100,1,4096), in all below 2^31; got '" + args.get("varlen", "") + "'");
      cu_seqlens.push_back(cu_seqlens.back() + len);
      longest = std::max(longest, len);
    }
    if (cu_seqlens.back() == 0)
      throw std::invalid_argument("--varlen: the pack holds no token; give at least one length above 0");
    for (Shape& shape : shapes) {
      shape.batch = int(cu_seqlens.size()) - 1, shape.q_len = shape.kv_len = longest;
      shape.suite += "-varlen" + std::to_string(shape.batch) + "_" + std::to_string(cu_seqlens.back());
    }
  }
  const std::string csv_path = args.get("csv", "fa-bench.csv");
  auto of_pass = [](Pass pass) { return [pass](const StepInfo* s) { return s->pass == pass; }; };
  // The cuBLAS baseline is a forward: it is timed where forward steps are.
  const bool baseline = !args.has("no-baseline") && std::any_of(steps.begin(), steps.end(), of_pass(Pass::forward));
  for (Pass pass : {Pass::forward, Pass::backward})
    if (std::any_of(steps.begin(), steps.end(), of_pass(pass)) &&
        std::none_of(shapes.begin(), shapes.end(), [&](const Shape& s) { return s.has(pass); }))
      std::fprintf(stderr, "fa-bench: suite %s has no shape for %s steps; they are not timed%s\n", suite.c_str(),
                   to_string(pass), pass == Pass::backward ? " (--suite teaching or backward has)" : "");

  if (!gpu_available()) {
    std::fprintf(stderr, "fa-bench: no CUDA device found; the benchmark needs a GPU\n");
    return 2;
  }
  const std::string gpu = gpu_name();
  const int device_arch = kit::device_arch();
  std::printf("fa-bench on %s: median of timed launches (CUDA events), TFLOPS = 4*B*Hq*Nq*Nkv*d/t "
              "(halved when causal; 2.5 times that for a backward call)\n", gpu.c_str());
  print_header();

  // The configurations to time: shape x dtype x causal where a selected step of the shape's passes
  // is timed. `index` numbers every combination of the suite, so the input seed of a configuration
  // does not depend on which steps are selected.
  struct Config {
    const Shape* shape;
    DType dtype;
    bool causal;
    std::size_t index;
  };
  std::vector<Config> plan;
  std::size_t index = 0;
  for (const Shape& shape : shapes)
    for (DType dtype : dtypes)
      for (bool causal : causals) {
        ++index;
        // A decode shape's mask is aligned bottom-right: with one new token it is no mask at all. A window in decode
        // is aligned to the new tokens (the mask's bottom-right diagonal), as FlashAttention's decode: masked only.
        const bool decode_window = shape.decode && window_left >= 0;
        const bool timed = (decode_window ? causal : !(shape.decode && causal && shape.q_len == 1)) &&
                           shape.takes(dtype) && ((baseline && shape.forward) ||
            std::any_of(steps.begin(), steps.end(), [&](const StepInfo* s) { return shape.has(s->pass); }));
        if (timed) plan.push_back({&shape, dtype, causal, index});
      }

  std::vector<Row> rows;
  // The last measured (ms, flops) of each step: predicts its time on bigger shapes.
  std::map<const StepInfo*, std::pair<double, double>> last_measured;
  std::size_t config = 0;
  const std::size_t configs = plan.size();
  for (const Config& planned : plan) {
    const Shape& shape = *planned.shape;
    ++config;
    AttentionProblem p;
    p.batch = shape.batch, p.q_len = shape.q_len, p.kv_len = shape.kv_len;
    p.q_heads = shape.q_heads, p.kv_heads = shape.kv_heads, p.head_dim = shape.head_dim;
    p.causal = planned.causal, p.dtype = planned.dtype;
    if (shape.decode && p.causal) p.causal_align = CausalAlign::bottom_right;
    if (page_size > 0) p.page_size = page_size, p.pages = p.batch * (p.kv_len / page_size);
    p.window_left = window_left, p.window_right = window_right;
    p.softcap = float(softcap), p.sinks = sinks;
    if (!cu_seqlens.empty()) p.cu_seqlens_q = p.cu_seqlens_k = cu_seqlens;
    validate(p);
    const std::uint64_t config_seed = seed + planned.index;

    std::vector<const StepInfo*> todo;
    if (baseline && shape.forward) todo.push_back(&cublas_baseline());
    for (const StepInfo* step : steps)
      if (shape.has(step->pass)) todo.push_back(step);
    // Whether a backward step will run here: only then are O, LSE, dO and the gradients made.
    const bool backward = std::any_of(todo.begin(), todo.end(), [&](const StepInfo* s) {
      return s->pass == Pass::backward && s->runs_on(device_arch) && s->supports(p.dtype) &&
             s->supports_head_dim(p.head_dim);
    });
    const bool forward = std::any_of(todo.begin(), todo.end(), of_pass(Pass::forward));
    const bool check_gradients = double(p.batch) * p.q_heads * p.q_len * p.kv_len <= kMaxCheckedScores;
    std::fprintf(stderr, "[%zu/%zu] %s: preparing inputs", config, configs, p.describe().c_str());
    if (forward) std::fprintf(stderr, " and %d reference rows", sample_rows);
    if (backward)
      std::fprintf(stderr, "%s the backward's O, LSE and dO%s", forward ? ";" : ",",
                   check_gradients ? " and float64 gradients" : " (gradients too large to check: errors \"-\")");
    std::fprintf(stderr, "\n");
    const AttentionInputs inputs = random_inputs(p, config_seed, shape.q_range);
    const SampledReference ref = forward ? sample_reference(p, inputs, sample_rows, config_seed) : SampledReference{};
    const std::size_t set_bytes = inputs.q.byte_size() * 2 + inputs.k.byte_size() * 2;
    InputSets sets(p, inputs, copies_to_leave_l2(set_bytes));
    BackwardReference backward_ref;
    std::string no_backward;  // why the backward steps cannot run here ("" when they can)
    if (backward) {
      try {
        const BackwardInputs backward_inputs = forward_for_backward(p, inputs, config_seed);
        // Q, K, V, O and dO read, dQ, dK, dV written, and LSE.
        const std::size_t backward_bytes =
            inputs.q.byte_size() * 4 + inputs.k.byte_size() * 4 + backward_inputs.lse.byte_size();
        sets.add_backward(backward_inputs, copies_to_leave_l2(backward_bytes));
        backward_ref = backward_reference(p, inputs, backward_inputs);
      } catch (const InvalidProblem& e) {
        no_backward = std::string("no O and LSE to start from: ") + e.what();
      }
    }

    // Fastest variant of each step id, per pass: a step is compared with the steps of its own pass.
    std::map<Pass, std::map<std::string, double>> best_ms_of_pass;
    for (const StepInfo* step : todo) {
      auto skip = [&](const std::string& why) {
        std::fprintf(stderr, "  skip %s: %s\n", step->label().c_str(), why.c_str());
      };
      const Pass pass = step->pass;
      if (!step->runs_on(device_arch)) { skip("needs " + step->min_gpu() + ", this GPU is sm_" + std::to_string(device_arch)); continue; }
      if (!step->supports(p.dtype)) { skip(std::string("does not support ") + to_string(p.dtype)); continue; }
      if (!step->supports_head_dim(p.head_dim)) { skip("does not support head_dim " + std::to_string(p.head_dim)); continue; }
      if (!step->supports(p)) {  // the KV cache's forms (problem.hpp): pages, the bottom-right mask, few new tokens
        try {
          refuse_cache_forms(step->label().c_str(), p, step->cache_forms);
          refuse_features(step->label().c_str(), p, step->features);
          skip("does not take this problem");
        } catch (const InvalidProblem& refused) {  // "<label>: <field> = <value> is not supported; ..."
          const std::string why = refused.what(), label = step->label() + ": ";
          skip(why.rfind(label, 0) == 0 ? why.substr(label.size()) : why);
        }
        continue;
      }
      if (pass == Pass::backward && !no_backward.empty()) { skip(no_backward); continue; }
      if (auto it = last_measured.find(step); it != last_measured.end()) {
        const double predicted = it->second.first * p.flops(pass) / it->second.second;
        if (predicted > max_ms) {
          skip("predicted " + fmt(predicted, 0) + " ms per call from its last measurement, over --max-ms " +
               fmt(max_ms, 0));
          continue;
        }
      }
      const std::size_t extra = step->workspace_for(p);
      std::size_t free_bytes = 0, total_bytes = 0;
      FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      if (extra + (std::size_t(256) << 20) > free_bytes) {
        skip("needs " + fmt(extra / 1073741824.0, 1) + " GiB of workspace, " + fmt(free_bytes / 1073741824.0, 1) + " GiB free");
        continue;
      }
      sets.workspace = DeviceBuffer(extra);  // zero, as a step may expect it

      // Correctness sample first, on poisoned outputs; one call that is
      // already too slow ends this step's measurement here.
      sets.poison_outputs(0, pass);
      CudaEventTimer first_call;
      first_call.start();
      step->launch(p, sets.tensors(0, pass), nullptr);
      first_call.stop();
      double first_ms = first_call.elapsed_ms();
      // A first call also pays one-time costs (module load, library handles:
      // cuBLAS's first call took 120 ms at N = 256): time a second one before
      // judging a step too slow.
      if (first_ms > max_ms) {
        first_call.start();
        step->launch(p, sets.tensors(0, pass), nullptr);
        first_call.stop();
        first_ms = first_call.elapsed_ms();
      }
      const ErrorStats error = pass == Pass::forward ? sampled_error(p, sets.o[0], ref)
                                                     : gradient_error(*step, p, sets, backward_ref);
      if (first_ms > max_ms) {
        skip("one call took " + fmt(first_ms, 0) + " ms, over --max-ms " + fmt(max_ms, 0));
        sets.workspace = DeviceBuffer();
        continue;
      }
      const Timing t = time_step(*step, p, sets, reps);
      sets.workspace = DeviceBuffer();

      Row row{shape.suite, step, p, t.median, t.min, t.max, p.flops(pass) / (t.median * 1e9),
              error.rel_l2, error.max_abs, extra, t.reps};
      row.decode = shape.decode;
      if (shape.decode) row.gbps = p.kv_bytes() / (t.median * 1e6);
      last_measured[step] = {t.median, p.flops(pass)};
      // Speedups against what was measured on this same configuration, in the same pass.
      auto& best_ms_by_id = best_ms_of_pass[pass];
      const bool is_step = step != &cublas_baseline();
      if (is_step) {
        std::string prev_id;
        for (const auto& [id, ms] : best_ms_by_id)
          if (id != "cublas" && id < step->id) prev_id = id;  // ids sort in course order
        if (!prev_id.empty()) row.speedup_prev = best_ms_by_id[prev_id] / t.median;
        if (best_ms_by_id.count("01")) row.speedup_01 = best_ms_by_id["01"] / t.median;
      }
      if (best_ms_by_id.count("cublas")) row.vs_cublas = best_ms_by_id["cublas"] / t.median;
      auto& best = best_ms_by_id[step->id];
      best = best > 0 ? std::min(best, t.median) : t.median;
      print_row(row);
      rows.push_back(row);
    }
  }
  write_csv(csv_path, rows, gpu);
  std::printf("wrote %zu rows to %s\n", rows.size(), csv_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fa::main_guarded("fa-bench", run, argc, argv); }
