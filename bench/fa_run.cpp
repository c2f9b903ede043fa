// fa-run: run one step on tensors you supply, or on random ones it writes out.
//
//   fa-run --step 04 --q q.npy --k k.npy --v v.npy --out o.npy [--causal] [--scale S] [--check]
//   fa-run --step 01 --random 2,128,128,8,2,64 --dtype f16 --dump DIR [--causal] [--seed N] [--check]
//
// Tensors are .npy files of float32 or float16, shaped [B, N, H, d]; K and V
// may have fewer heads than Q (grouped-query attention). --check compares the
// output with the float64 CPU reference and prints the errors.
// NumPy has no bfloat16: with --dtype bf16, --dump writes the bf16 inputs and
// output as float32 (exactly), and float32 files given with --dtype bf16 are
// rounded to bf16 before the run (so a dumped bf16 run replays bit for bit).
#include "cli.hpp"
#include "fa/compare.hpp"
#include "fa/device.hpp"
#include "fa/npy.hpp"
#include "fa/registry.hpp"
#include "reference.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>

namespace {

using namespace fa;

const char* kHelp = R"(usage: fa-run --step ID (--q Q.npy --k K.npy --v V.npy --out O.npy | --random B,Nq,Nkv,Hq,Hkv,d --dump DIR)
       [--dtype f32|f16|bf16] [--causal] [--scale S] [--seed N] [--check]
       fa-run --list     every step and variant, with the dtypes, head_dims and GPU it needs
       bf16 .npy files do not exist: bf16 tensors are written as float32, and
       float32 files with --dtype bf16 are rounded to bf16
exit status: 0 done (and within tolerance with --check), 1 bad input, 2 no CUDA device, 3 out of tolerance
)";

std::string shape_text(const HostTensor& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

// Reads the problem off the tensors' shapes, refusing anything inconsistent. `files` names Q, K, V.
AttentionProblem problem_from(const AttentionInputs& in, const std::string (&files)[3]) {
  const HostTensor* tensors[3] = {&in.q, &in.k, &in.v};
  for (int i = 0; i < 3; ++i)
    if (tensors[i]->shape.size() != 4)
      throw std::invalid_argument(files[i] + ": " + "QKV"[i] + " must have 4 dimensions [B, N, H, d]; got " +
                                  shape_text(*tensors[i]));
  if (in.k.shape != in.v.shape)
    throw std::invalid_argument("K " + shape_text(in.k) + " (" + files[1] + ") and V " + shape_text(in.v) + " (" +
                                files[2] + ") must have the same shape");
  if (in.q.dtype != in.k.dtype || in.q.dtype != in.v.dtype)
    throw std::invalid_argument(std::string("Q, K and V must have one dtype; got Q ") + to_string(in.q.dtype) +
                                ", K " + to_string(in.k.dtype) + ", V " + to_string(in.v.dtype) +
                                " (f32, f16 or bf16 as float32 with --dtype bf16)");
  if (in.q.shape[0] != in.k.shape[0] || in.q.shape[3] != in.k.shape[3])
    throw std::invalid_argument("Q " + shape_text(in.q) + " and K " + shape_text(in.k) +
                                " must agree on batch (dim 0) and head_dim (dim 3)");
  for (auto extent : {in.q.shape[1], in.q.shape[2], in.k.shape[1], in.k.shape[2], in.q.shape[0], in.q.shape[3]})
    if (extent < 1 || extent > (1 << 30)) throw std::invalid_argument("every dimension must be between 1 and 2^30");
  AttentionProblem p;
  p.batch = int(in.q.shape[0]);
  p.q_len = int(in.q.shape[1]);
  p.q_heads = int(in.q.shape[2]);
  p.head_dim = int(in.q.shape[3]);
  p.kv_len = int(in.k.shape[1]);
  p.kv_heads = int(in.k.shape[2]);
  p.dtype = in.q.dtype;
  return p;
}

int run(int argc, char** argv) {
  const Args args(argc, argv, {"step", "q", "k", "v", "out", "random", "dtype", "dump", "scale", "seed"},
                  {"help", "causal", "check", "list"});
  if (args.has("list")) {
    print_step_list(std::cout);
    return 0;
  }
  if (args.has("help") || !args.has("step")) {
    std::cout << kHelp;
    return args.has("help") ? 0 : 1;
  }
  const auto selected = select_steps(args.get("step", ""));
  if (selected.size() != 1) {
    std::string labels;
    for (const StepInfo* s : selected) labels += (labels.empty() ? "" : ", ") + s->label();
    throw std::invalid_argument("--step " + args.get("step", "") + " names " + std::to_string(selected.size()) +
                                " implementations; name one: " + labels + " (fa-run --list shows them all)");
  }
  const StepInfo& step = *selected.front();

  AttentionInputs inputs;
  AttentionProblem p;
  std::string out_path;
  if (args.has("random")) {
    if (!args.has("dump")) throw std::invalid_argument("--random needs --dump DIR");
    const auto v = Args::parse_ints(args.get("random", ""), 6, "--random");
    p.batch = v[0], p.q_len = v[1], p.kv_len = v[2], p.q_heads = v[3], p.kv_heads = v[4], p.head_dim = v[5];
    p.dtype = parse_dtype(args.get("dtype", "f32"));
    validate(p);
    inputs = random_inputs(p, std::uint64_t(args.get_number("seed", 1)));
    out_path = (std::filesystem::path(args.get("dump", "")) / "o.npy").string();
  } else {
    for (const char* name : {"q", "k", "v", "out"})
      if (!args.has(name)) throw std::invalid_argument(std::string("missing --") + name + " (or use --random)");
    inputs = {read_npy(args.get("q", "")), read_npy(args.get("k", "")), read_npy(args.get("v", ""))};
    p = problem_from(inputs, {args.get("q", ""), args.get("k", ""), args.get("v", "")});
    if (args.has("dtype") && parse_dtype(args.get("dtype", "")) != p.dtype) {
      if (parse_dtype(args.get("dtype", "")) != DType::bf16 || p.dtype != DType::f32)
        throw std::invalid_argument("--dtype does not match the files' dtype " + std::string(to_string(p.dtype)) +
                                    " (only float32 files may be rounded, to --dtype bf16)");
      inputs = {converted(inputs.q, DType::bf16), converted(inputs.k, DType::bf16), converted(inputs.v, DType::bf16)};
      p.dtype = DType::bf16;
    }
    out_path = args.get("out", "");
  }
  p.causal = args.has("causal");
  if (args.has("scale")) p.scale = float(args.get_number("scale", 0));
  validate(p);
  refuse_unsupported(step, p);
  if (!gpu_available()) {
    std::fprintf(stderr, "fa-run: no CUDA device found; fa-run needs a GPU (%s needs %s)\n", step.label().c_str(),
                 step.min_gpu() == "any" ? "any CUDA GPU" : step.min_gpu().c_str());
    return 2;
  }
  if (args.has("random")) {  // write the inputs only once everything is known to be runnable
    const std::filesystem::path dir = args.get("dump", "");
    std::filesystem::create_directories(dir);
    write_npy((dir / "q.npy").string(), inputs.q);
    write_npy((dir / "k.npy").string(), inputs.k);
    write_npy((dir / "v.npy").string(), inputs.v);
  }

  const HostTensor out = run_step(step, p, inputs);
  write_npy(out_path, out);
  std::printf("step %s: %s -> %s\n", step.label().c_str(), p.describe().c_str(), out_path.c_str());
  if (args.has("check")) {
    const auto ref = reference_attention(p, inputs.q.to_double(), inputs.k.to_double(), inputs.v.to_double());
    const ErrorStats stats = compare(out, ref);
    const bool ok = within(stats, tolerance_for(p.dtype));
    std::printf("vs float64 CPU reference: %s (%s)\n", stats.describe().c_str(), ok ? "within tolerance" : "OUT OF TOLERANCE");
    return ok ? 0 : 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fa::main_guarded("fa-run", run, argc, argv); }
