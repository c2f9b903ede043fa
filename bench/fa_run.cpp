// fa-run: run one step on tensors you supply, or on random ones it writes out.
//
//   fa-run --step 04 --q q.npy --k k.npy --v v.npy --out o.npy [--lse-out lse.npy] [--causal] [--scale S]
//          [--check]
//   fa-run --step 01 --random 2,128,128,8,2,64 --dtype f16 --dump DIR [--causal] [--seed N] [--check]
//   fa-run --step 27 --q q.npy --k k.npy --v v.npy --o o.npy --lse lse.npy --do do.npy
//          (--dq dq.npy --dk dk.npy --dv dv.npy | --dump DIR) [--causal] [--scale S] [--check]
//   fa-run --step 26 --random 2,128,128,8,2,64 --dump DIR [--causal] [--seed N] [--check]
//
// Tensors are .npy files of float32 or float16, shaped [B, N, H, d]; K and V
// may have fewer heads than Q (grouped-query attention). --check compares the
// output with the float64 CPU reference and prints the errors.
// A forward step writes O (and, with --lse-out or --random, the row log-sum-exp LSE, float32
// [B, Hq, Nq]). A backward step reads O, LSE and dO besides Q, K, V and writes dQ, dK and dV; with
// --random, O and LSE come from the course's last forward step that takes the problem
// (forward_for_backward) and dO is random, and all of them go to the --dump folder with the gradients.
// A KV cache's forms, for the steps that take them (fa-run --list): --kv-lens gives each sequence's length
// (a comma list or an int32 .npy [B]); --page-table T.npy [B, kv_len / page_size] makes --k and --v page pools
// [pages, page_size, Hkv, d]; with --random, --page-size N stores K and V so (pages in a shuffled order) and
// --dump writes the pools, page_table.npy and kv_lens.npy; --causal-align bottom-right aligns the causal mask
// to the end of each sequence (speculative decoding). The models' features: --window LEFT,RIGHT, --softcap C,
// --sinks SINKS.npy (float32 [Hq]; with --random, --sinks random), for the steps that take them; a backward step
// with sinks also writes their gradient (--dsinks DSINKS.npy, or dsinks.npy in the --dump folder); with a pack
// (--cu-seqlens-q/-k, step 56) it reads O and dO [total_q, Hq, d] and LSE [Hq, total_q] and writes dQ [total_q, Hq, d],
// dK and dV [total_k, Hkv, d].
// NumPy has no bfloat16: with --dtype bf16, --dump writes the bf16 inputs and
// output as float32 (exactly), and float32 files given with --dtype bf16 are
// rounded to bf16 before the run (so a dumped bf16 run replays bit for bit).
#include "cli.hpp"
#include "fa/call_shapes.hpp"
#include "fa/compare.hpp"
#include "fa/device.hpp"
#include "fa/npy.hpp"
#include "fa/registry.hpp"
#include "reference.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <tuple>

namespace {

using namespace fa;

const char* kHelp = R"(usage: fa-run --step ID (--q Q.npy --k K.npy --v V.npy --out O.npy | --random B,Nq,Nkv,Hq,Hkv,d --dump DIR)
       [--lse-out LSE.npy] [--dtype f32|f16|bf16] [--causal] [--scale S] [--seed N] [--check]
         a forward step: writes O (--out, or DIR/o.npy) and the row log-sum-exp LSE, float32 [B, Hq, Nq]
         (--lse-out, or DIR/lse.npy with --random)
       fa-run --step ID (--q Q.npy --k K.npy --v V.npy --o O.npy --lse LSE.npy --do DO.npy
                         (--dq DQ.npy --dk DK.npy --dv DV.npy [--dsinks DSINKS.npy] | --dump DIR)
                         | --random B,Nq,Nkv,Hq,Hkv,d --dump DIR)
       [--dtype f32|f16|bf16] [--causal] [--scale S] [--seed N] [--check]
         a backward step (pass backward in --list): reads O, LSE (float32 [B, Hq, Nq]) and dO besides Q, K, V;
         writes dQ, dK, dV (--dq --dk --dv, or DIR/dq.npy, dk.npy, dv.npy). --random makes O and LSE with the
         last forward step that takes the problem and draws dO, and dumps them as o.npy, lse.npy, do.npy next
         to q.npy, k.npy, v.npy; --check judges each gradient against the float64 reference; with --sinks,
         also the sinks' gradient, float32 [Hq] (--dsinks DSINKS.npy, or DIR/dsinks.npy); with a pack
         (--cu-seqlens-q/-k, below) O and dO are [total_q, Hq, d], LSE [Hq, total_q], and dQ, dK, dV packed too
       a KV cache (steps that take one; others refuse it): [--kv-lens L1,L2,..|LENS.npy] each sequence's keys
         (int32 [B]); [--page-table TABLE.npy] K and V are page pools [pages, page_size, Hkv, d] and TABLE,
         int32 [B, kv_len / page_size], lists each sequence's pages; with --random, [--page-size N] pages them
         (in a shuffled order; --dump writes k.npy and v.npy as pools, page_table.npy, kv_lens.npy);
         [--causal-align top-left|bottom-right] with --causal: bottom-right, the last query row sees every key
       the models' features (steps that take them; others refuse them): [--window LEFT,RIGHT] a sliding window
         (FlashAttention's window_size, -1 an open side); [--softcap C] logit soft-capping; [--sinks SINKS.npy]
         one float32 logit a query head ([Hq]), or with --random, --sinks random (--dump writes sinks.npy);
         [--cu-seqlens-q A --cu-seqlens-k B] a pack of sequences of their own lengths (FlashAttention's varlen):
         offsets 0, len_0, len_0 + len_1, .. as a comma list or an int32 .npy of B + 1 values; Q, K, V, O and
         dO are then [total, H, d] and LSE [Hq, total_q]; with --random B,Nq,Nkv,.. B is the count and Nq, Nkv
         at least each length (FlashAttention's max_seqlen); --dump writes cu_seqlens_q.npy, cu_seqlens_k.npy
       fa-run --list     every step and variant, with the dtypes, head_dims, GPU and pass
       bf16 .npy files do not exist: bf16 tensors are written as float32, and
       float32 files with --dtype bf16 are rounded to bf16
exit status: 0 done (and within tolerance with --check), 1 bad input, 2 no CUDA device, 3 out of tolerance
)";

using fa::shape_text;
std::string shape_text(const HostTensor& t) { return shape_text(t.shape); }
TensorShape shape_of(const HostTensor& t, const std::string& file) { return {file, t.shape, t.dtype}; }

// Reads the problem off the tensors' shapes, refusing anything inconsistent. `files` names Q, K, V.
AttentionProblem problem_from(const AttentionInputs& in, const std::string (&files)[3]) {
  return fa::problem_from(shape_of(in.q, files[0]), shape_of(in.k, files[1]), shape_of(in.v, files[2]),
                          "(f32, f16 or bf16 as float32 with --dtype bf16)");
}

// Refuses files of dtype `held` for --dtype `asked` (other than float32 files for bf16, which are rounded): names
// what the files hold, what --dtype reads, and how to save them so. `files` names Q, K, V.
[[noreturn]] void refuse_file_dtype(const std::string (&files)[3], DType held, DType asked) {
  // NumPy has no bfloat16: --dtype bf16 reads float32 files, so a file is float32 or float16.
  auto numpy_type = [](DType d) { return d == DType::f16 ? std::string("float16") : std::string("float32"); };
  auto descr = [](DType d) { return d == DType::f16 ? std::string("'<f2'") : std::string("'<f4'"); };
  const DType reads = asked == DType::bf16 ? DType::f32 : asked;
  std::vector<std::string> distinct;  // each file once
  for (const std::string& file : files)
    if (std::find(distinct.begin(), distinct.end(), file) == distinct.end()) distinct.push_back(file);
  std::string names;
  for (std::size_t i = 0; i < distinct.size(); ++i)
    names += (i == 0 ? "" : i + 1 == distinct.size() ? " and " : ", ") + distinct[i];
  throw std::invalid_argument(names + (distinct.size() == 1 ? " holds " : " hold ") + numpy_type(held) + " (" +
                              descr(held) + "); --dtype " + to_string(asked) + " reads " + numpy_type(reads) + " (" +
                              descr(reads) + ") files" +
                              (asked == DType::bf16 ? ", rounded to bf16 (numpy has no bfloat16)" : "") +
                              ": save them with numpy's .astype(np." + numpy_type(reads) + "), or pass --dtype " +
                              to_string(held) + " for a step that takes " + to_string(held) + " (fa-run --list)");
}

// Whole numbers given on the command line as a comma list, or as an int32 .npy of one dimension: --kv-lens (the KV
// cache's per-sequence lengths, B values) and a pack's --cu-seqlens-q/-k (its offsets, B + 1 values). `form` says
// what they are, for the errors.
std::vector<int> ints_from(const std::string& text, const char* option, const char* form) {
  if (text.size() > 4 && text.substr(text.size() - 4) == ".npy") {
    const NpyInts values = read_npy_ints(text);
    if (values.shape.size() != 1)
      throw std::invalid_argument(text + ": --" + option + " must be one dimension, " + form + "; got " +
                                  shape_text(values.shape));
    return values.values;
  }
  std::vector<int> values;
  for (const std::string& item : Args::split(text)) {
    const std::optional<int> value = Args::whole_number(item);
    if (!value)
      throw std::invalid_argument(std::string("--") + option + " must be " + form + ", whole numbers separated by "
                                  "commas, or an int32 .npy; got '" + text + "'");
    values.push_back(*value);
  }
  return values;
}
std::vector<int> kv_lens_from(const std::string& text) { return ints_from(text, "kv-lens", "[B] lengths"); }
std::vector<int> offsets_from(const std::string& text, const char* option) {
  return ints_from(text, option, "[B + 1] offsets 0, len_0, ..");
}

// The models' features (issue 58), FlashAttention's names: --window LEFT,RIGHT (-1: an open side), --softcap C,
// --sinks (a float32 .npy of Hq logits, or "random" with --random). Sets them on p; validate() checks the values.
void set_features(AttentionProblem& p, const Args& args) {
  if (args.has("window")) std::tie(p.window_left, p.window_right) = Args::window(args.get("window", ""));
  if (args.has("softcap")) p.softcap = float(args.get_number("softcap", 0));
  p.sinks = args.has("sinks");
}

// The sinks' logits from --sinks FILE.npy: float32 [Hq].
HostTensor sinks_from(const std::string& path, const AttentionProblem& p) {
  HostTensor sinks = read_npy(path);
  if (sinks.dtype != DType::f32 || sinks.shape != std::vector<std::int64_t>{p.q_heads})
    throw std::invalid_argument(path + ": the sinks are one float32 logit a query head, float32 [" +
                                std::to_string(p.q_heads) + "]; got " + to_string(sinks.dtype) + " " +
                                shape_text(sinks.shape));
  return sinks;
}

// Refuses a backward call's O, LSE and dO that do not fit the problem read off Q, K, V. `files` names
// O, LSE and dO.
void check_backward_inputs(const AttentionProblem& p, const BackwardInputs& in, const std::string (&files)[3]) {
  check_backward_shapes(p, shape_of(in.o, files[0]), shape_of(in.lse, files[1]), shape_of(in.d_o, files[2]));
}

// What a step of the other pass is given by mistake: a backward step's arguments for a forward step,
// and the reverse. Names what is missing for the step's own pass.
void refuse_other_pass(const StepInfo& step, const Args& args) {
  const bool backward = step.pass == Pass::backward;
  const std::vector<std::string> forward_only = {"out", "lse-out"};
  const std::vector<std::string> backward_only = {"o", "lse", "do", "dq", "dk", "dv", "dsinks"};
  const std::vector<std::string>& others = backward ? forward_only : backward_only;
  std::string given;
  for (const auto& name : others)
    if (args.has(name)) given += (given.empty() ? "--" : ", --") + name;
  if (given.empty()) return;
  if (!backward)
    throw std::invalid_argument("step " + step.label() + " is a forward step: it reads --q, --k, --v and writes --out "
                                "(and --lse-out), not " + given + " (a backward step's arguments)");
  std::string missing;
  if (!args.has("random"))
    for (const char* name : {"q", "k", "v", "o", "lse", "do"})
      if (!args.has(name)) missing += (missing.empty() ? "--" : ", --") + std::string(name);
  throw std::invalid_argument("step " + step.label() + " is a backward step: it reads --o, --lse and --do besides --q, "
                              "--k, --v and writes --dq, --dk, --dv (or into --dump DIR), not " + given +
                              (missing.empty() ? "" : "; missing " + missing +
                                                          " (or use --random B,Nq,Nkv,Hq,Hkv,d --dump DIR)"));
}

// Prints each gradient's verdict against the float64 reference; true when all passed.
bool check_gradients(const AttentionProblem& p, const AttentionInputs& inputs, const BackwardInputs& backward,
                     const Gradients& g) {
  const std::vector<double> q = inputs.q.to_double(), k = inputs.k.to_double(), v = inputs.v.to_double();
  const std::vector<double> sinks = p.sinks ? inputs.sinks.to_double() : std::vector<double>();
  double max_abs_score = 0;
  reference_attention(p, q, k, v, &max_abs_score, nullptr, p.sinks ? &sinks : nullptr);
  const std::vector<double> stored_o = backward.o.to_double();  // D from the O the step read (reference.hpp)
  const ReferenceGradients ref =
      reference_attention_backward(p, q, k, v, backward.d_o.to_double(), p.sinks ? &sinks : nullptr, &stored_o);
  std::vector<Verdict> verdicts = judge_gradients(g, ref.dq, ref.dk, ref.dv, p.head_dim, max_abs_score);
  if (p.sinks) verdicts.push_back(judge_dsinks(g.dsinks, ref.dsinks, p.dtype, max_abs_score));
  bool ok = true;
  for (const Verdict& verdict : verdicts) {
    std::printf("%s vs float64 CPU reference: %s (%s)\n", verdict.tensor.c_str(), verdict.global.describe().c_str(),
                verdict.passed() ? "within tolerance" : ("OUT OF TOLERANCE: " + verdict.failed).c_str());
    ok = ok && verdict.passed();
  }
  return ok;
}

int run(int argc, char** argv) {
  const Args args(argc, argv,
                  {"step", "q", "k", "v", "out", "random", "dtype", "dump", "scale", "seed", "lse-out", "o", "lse",
                   "do", "dq", "dk", "dv", "dsinks", "kv-lens", "page-size", "page-table", "causal-align", "window",
                   "softcap", "sinks", "cu-seqlens-q", "cu-seqlens-k"},
                  {"help", "causal", "check", "list"});
  if (args.has("list")) {
    print_step_list(std::cout);
    return 0;
  }
  if (args.has("help") || !args.has("step")) {
    std::cout << kHelp;
    return args.has("help") ? 0 : 1;
  }
  const StepInfo& step = step_named(args.get("step", ""), "fa-run --list");
  const bool backward = step.pass == Pass::backward;
  refuse_other_pass(step, args);

  AttentionInputs inputs;
  BackwardInputs backward_inputs;  // a backward step's O, LSE and dO (from files, or made below with --random)
  AttentionProblem p;
  std::string out_path, lse_path;  // a forward step's O and LSE ("": LSE not written)
  std::string grad_paths[3];       // a backward step's dQ, dK, dV
  std::string dsinks_path = args.get("dsinks", "");  // and with sinks, their gradient
  const std::filesystem::path dump = args.get("dump", "");
  auto dump_gradients = [&] {
    grad_paths[0] = (dump / "dq.npy").string(), grad_paths[1] = (dump / "dk.npy").string();
    grad_paths[2] = (dump / "dv.npy").string();
    if (dsinks_path.empty()) dsinks_path = (dump / "dsinks.npy").string();
  };
  if (args.has("random")) {
    if (!args.has("dump")) throw std::invalid_argument("--random needs --dump DIR");
    const auto v = Args::parse_ints(args.get("random", ""), kShapeFields, "--random");
    p.batch = v[0], p.q_len = v[1], p.kv_len = v[2], p.q_heads = v[3], p.kv_heads = v[4], p.head_dim = v[5];
    p.dtype = parse_dtype(args.get("dtype", "f32"));
    if (args.has("page-size")) {  // every sequence's pages distinct: a pool of batch * kv_len / page_size pages
      p.page_size = int(args.get_number("page-size", 0));
      if (p.page_size > 0) p.pages = p.batch * (p.kv_len / p.page_size);
    }
    set_features(p, args);
    if (args.has("cu-seqlens-q") != args.has("cu-seqlens-k"))
      throw std::invalid_argument("a pack needs both --cu-seqlens-q and --cu-seqlens-k (equal for self-attention)");
    if (args.has("cu-seqlens-q")) {
      p.cu_seqlens_q = offsets_from(args.get("cu-seqlens-q", ""), "cu-seqlens-q");
      p.cu_seqlens_k = offsets_from(args.get("cu-seqlens-k", ""), "cu-seqlens-k");
    }
    if (args.has("sinks") && args.get("sinks", "") != "random")
      throw std::invalid_argument("with --random, --sinks random draws the sinks (uniform in [-2, 2)); got '" +
                                  args.get("sinks", "") + "'");
    validate(p);
    inputs = random_inputs(p, std::uint64_t(args.get_number("seed", 1)));
    out_path = (dump / "o.npy").string();
    lse_path = args.get("lse-out", (dump / "lse.npy").string());
    dump_gradients();
  } else {
    if (!backward) {
      for (const char* name : {"q", "k", "v", "out"})
        if (!args.has(name)) throw std::invalid_argument(std::string("missing --") + name + " (or use --random)");
    } else {
      std::string missing;
      for (const char* name : {"q", "k", "v", "o", "lse", "do"})
        if (!args.has(name)) missing += (missing.empty() ? "--" : ", --") + std::string(name);
      if (!missing.empty())
        throw std::invalid_argument("step " + step.label() + " is a backward step: missing " + missing +
                                    " (it reads Q, K, V, the forward's O and row log-sum-exp LSE, and dO; "
                                    "or use --random B,Nq,Nkv,Hq,Hkv,d --dump DIR)");
    }
    if (backward) {  // where the gradients go: --dq, --dk, --dv, or the --dump folder
      if (args.has("dq") || args.has("dk") || args.has("dv") || !args.has("dump")) {
        std::string missing;
        for (const char* name : {"dq", "dk", "dv"})
          if (!args.has(name)) missing += (missing.empty() ? "--" : ", --") + std::string(name);
        if (!missing.empty())
          throw std::invalid_argument("missing " + missing + " (or --dump DIR for dq.npy, dk.npy, dv.npy)");
        grad_paths[0] = args.get("dq", ""), grad_paths[1] = args.get("dk", ""), grad_paths[2] = args.get("dv", "");
      } else {
        dump_gradients();
      }
    }
    inputs = {read_npy(args.get("q", "")), read_npy(args.get("k", "")), read_npy(args.get("v", ""))};
    if (args.has("page-size") && !args.has("page-table"))
      throw std::invalid_argument("--page-size with --k and --v needs --page-table (with --random, fa-run pages K and V)");
    NpyInts table;  // a paged cache: K and V are pools [pages, page_size, Hkv, d]; read back into [B, N, Hkv, d]
    HostTensor k_pool, v_pool;
    if (args.has("page-table")) {
      table = read_npy_ints(args.get("page-table", ""));
      if (table.shape.size() != 2 || table.shape[0] != inputs.q.shape.at(0) || inputs.k.shape.size() != 4)
        throw std::invalid_argument(args.get("page-table", "") + ": the page table must be int32 [B, pages per "
                                    "sequence] with Q's batch, and K and V pools [pages, page_size, Hkv, d]; got " +
                                    shape_text(table.shape) + " and K " + shape_text(inputs.k));
      k_pool = std::move(inputs.k), v_pool = std::move(inputs.v);
      const std::int64_t pages_per_sequence = table.shape[1], page_size = k_pool.shape[1];
      inputs.k = HostTensor(k_pool.dtype, {inputs.q.shape[0], pages_per_sequence * page_size, k_pool.shape[2],
                                           k_pool.shape[3]});
      inputs.v = HostTensor(v_pool.dtype, inputs.k.shape);  // filled once the problem is known, below
    }
    if (args.has("cu-seqlens-q") != args.has("cu-seqlens-k"))
      throw std::invalid_argument("a pack needs both --cu-seqlens-q and --cu-seqlens-k (equal for self-attention)");
    if (args.has("cu-seqlens-q")) {
      if (args.has("page-table")) throw std::invalid_argument("a pack (--cu-seqlens-q) takes no --page-table");
      p = problem_from_packed(shape_of(inputs.q, args.get("q", "")), shape_of(inputs.k, args.get("k", "")),
                              shape_of(inputs.v, args.get("v", "")),
                              offsets_from(args.get("cu-seqlens-q", ""), "cu-seqlens-q"),
                              offsets_from(args.get("cu-seqlens-k", ""), "cu-seqlens-k"),
                              "(f32, f16 or bf16 as float32 with --dtype bf16)");
    } else {
      p = problem_from(inputs, {args.get("q", ""), args.get("k", ""), args.get("v", "")});
    }
    if (args.has("page-table")) {
      if (v_pool.shape != k_pool.shape)
        throw std::invalid_argument("the K pool " + shape_text(k_pool) + " and the V pool " + shape_text(v_pool) +
                                    " must have the same shape");
      p.page_size = int(k_pool.shape[1]), p.pages = int(k_pool.shape[0]);
      // The lengths first: the table's entries past a sequence's length are never read (a server's unused slots).
      if (args.has("kv-lens")) p.kv_lens = kv_lens_from(args.get("kv-lens", ""));
      validate(p);
      inputs.k = from_pages(p, k_pool, table.values), inputs.v = from_pages(p, v_pool, table.values);
    }
    if (backward) {
      backward_inputs = {read_npy(args.get("o", "")), read_npy(args.get("lse", "")), read_npy(args.get("do", ""))};
      check_backward_inputs(p, backward_inputs, {args.get("o", ""), args.get("lse", ""), args.get("do", "")});
    }
    if (args.has("dtype") && parse_dtype(args.get("dtype", "")) != p.dtype) {
      if (parse_dtype(args.get("dtype", "")) != DType::bf16 || p.dtype != DType::f32)
        refuse_file_dtype({args.get("q", ""), args.get("k", ""), args.get("v", "")}, p.dtype,
                          parse_dtype(args.get("dtype", "")));
      inputs = {converted(inputs.q, DType::bf16), converted(inputs.k, DType::bf16), converted(inputs.v, DType::bf16)};
      if (backward) {  // LSE stays float32
        backward_inputs.o = converted(backward_inputs.o, DType::bf16);
        backward_inputs.d_o = converted(backward_inputs.d_o, DType::bf16);
      }
      p.dtype = DType::bf16;
    }
    if (!backward) {
      out_path = args.get("out", "");
      lse_path = args.get("lse-out", "");
    }
  }
  p.causal = args.has("causal");
  if (!args.has("random")) {
    set_features(p, args);
    if (p.sinks) inputs.sinks = sinks_from(args.get("sinks", ""), p);
  }
  if (args.has("scale")) p.scale = float(args.get_number("scale", 0));
  if (args.has("kv-lens")) p.kv_lens = kv_lens_from(args.get("kv-lens", ""));
  if (args.has("causal-align")) {
    const std::string align = args.get("causal-align", "");
    if (align != "top-left" && align != "bottom-right")
      throw std::invalid_argument("--causal-align must be top-left or bottom-right; got '" + align + "'");
    p.causal_align = align == "bottom-right" ? CausalAlign::bottom_right : CausalAlign::top_left;
  }
  validate(p);
  refuse_unsupported(step, p);
  if (backward && p.sinks && dsinks_path.empty())
    throw std::invalid_argument("missing --dsinks DSINKS.npy: the backward with sinks writes their gradient there, "
                                "float32 [Hq] (or --dump DIR for dsinks.npy)");
  if (args.has("dsinks") && !p.sinks)
    throw std::invalid_argument("--dsinks is the sinks' gradient, written by the backward with --sinks; there are no "
                                "sinks here");
  if (!gpu_available()) {
    std::fprintf(stderr, "fa-run: no CUDA device found; fa-run needs a GPU (%s needs %s)\n", step.label().c_str(),
                 step.min_gpu() == "any" ? "any CUDA GPU" : step.min_gpu().c_str());
    return 2;
  }
  // The backward's O and LSE from the course's fastest forward step that takes p, and a random dO.
  if (backward && args.has("random"))
    backward_inputs = forward_for_backward(p, inputs, std::uint64_t(args.get_number("seed", 1)));
  if (args.has("random")) {  // write the inputs only once everything is known to be runnable
    std::filesystem::create_directories(dump);
    write_npy((dump / "q.npy").string(), inputs.q);
    if (p.paged()) {  // K and V as the kernel reads them: page pools, and the table that orders their pages
      const std::vector<int> table = shuffled_page_table(p, DeviceAttention::kPageSeed);
      write_npy((dump / "k.npy").string(), to_pages(p, inputs.k, table));
      write_npy((dump / "v.npy").string(), to_pages(p, inputs.v, table));
      write_npy_ints((dump / "page_table.npy").string(), {p.batch, p.pages_per_sequence()}, table);
    } else {
      write_npy((dump / "k.npy").string(), inputs.k);
      write_npy((dump / "v.npy").string(), inputs.v);
    }
    if (!p.kv_lens.empty()) write_npy_ints((dump / "kv_lens.npy").string(), {p.batch}, p.kv_lens);
    if (p.sinks) write_npy((dump / "sinks.npy").string(), inputs.sinks);
    if (p.varlen()) {
      write_npy_ints((dump / "cu_seqlens_q.npy").string(), {p.batch + 1}, p.cu_seqlens_q);
      write_npy_ints((dump / "cu_seqlens_k.npy").string(), {p.batch + 1}, p.cu_seqlens_k);
    }
    if (backward) {
      write_npy((dump / "o.npy").string(), backward_inputs.o);
      write_npy((dump / "lse.npy").string(), backward_inputs.lse);
      write_npy((dump / "do.npy").string(), backward_inputs.d_o);
    }
  } else if (backward && args.has("dump")) {
    std::filesystem::create_directories(dump);
  }

  if (backward) {
    const Gradients g = run_backward(step, p, inputs, backward_inputs);
    write_npy(grad_paths[0], g.dq);
    write_npy(grad_paths[1], g.dk);
    write_npy(grad_paths[2], g.dv);
    std::printf("step %s: %s -> %s, %s, %s\n", step.label().c_str(), p.describe().c_str(), grad_paths[0].c_str(),
                grad_paths[1].c_str(), grad_paths[2].c_str());
    if (p.sinks) {
      write_npy(dsinks_path, g.dsinks);
      std::printf("the sinks' gradient (float32 [Hq]) -> %s\n", dsinks_path.c_str());
    }
    if (args.has("check")) return check_gradients(p, inputs, backward_inputs, g) ? 0 : 3;
    return 0;
  }

  // As run_step, keeping LSE too.
  DeviceAttention device(p, inputs, step.workspace_for(p));
  step.launch(p, device.tensors(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const HostTensor out = device.download_o(p);
  write_npy(out_path, out);
  std::printf("step %s: %s -> %s\n", step.label().c_str(), p.describe().c_str(), out_path.c_str());
  if (!lse_path.empty()) {
    write_npy(lse_path, device.download_lse(p));
    std::printf("row log-sum-exp (float32 %s) -> %s\n", p.varlen() ? "[Hq, total_q]" : "[B, Hq, Nq]", lse_path.c_str());
  }
  if (args.has("check")) {
    const std::vector<double> sinks = p.sinks ? inputs.sinks.to_double() : std::vector<double>();
    const auto ref = reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double(), nullptr,
                                         nullptr, p.sinks ? &sinks : nullptr);
    const ErrorStats stats = compare(out, ref);
    const bool ok = within(stats, tolerance_for(p.dtype));
    std::printf("vs float64 CPU reference: %s (%s)\n", stats.describe().c_str(), ok ? "within tolerance" : "OUT OF TOLERANCE");
    return ok ? 0 : 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fa::main_guarded("fa-run", run, argc, argv); }
