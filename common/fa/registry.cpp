/// @file registry.cpp
/// @brief The registry: every step of the course, in order.
// The registry: every step of the course in order. A step's .cu file exports a
// Launcher per variant (its launch function and the dtypes, head_dims, minimum
// GPU and alignment of its compile-time Support); the entry below says what the
// step is. The harness tests every entry on every dtype and head_dim it lists,
// and checks that it refuses the ones it does not list.
#include "fa/registry.hpp"

#include "fa/cuda_check.hpp"
#include "fa/kit.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fa {

// What each step's .cu file exports: one Launcher per variant (steps/NN_name/*.cu), made by
// kit::launcher<Support>() from the step's own compile-time list of dtypes and head_dims.
namespace step01 { Launcher launcher(); }
namespace step02 { Launcher launcher(); }
namespace step03 { Launcher launcher(); }
namespace step04 { Launcher launcher(); }
namespace step05 { Launcher launcher_pad1(); Launcher launcher_pad4(); Launcher launcher_pad4_vec4();
                   Launcher launcher_transpose(); }
namespace step06 { Launcher launcher_br8(); Launcher launcher_br16(); Launcher launcher_br32(); }
namespace step07 { Launcher launcher_double(); Launcher launcher_ff(); }
namespace step08 { Launcher launcher(); }
namespace step09 { Launcher launcher_br128(); Launcher launcher_br64(); }
namespace step10 { Launcher launcher(); }
namespace step11 { Launcher launcher(); Launcher launcher_f32(); }
namespace step12 { Launcher launcher(); }
namespace step13 { Launcher launcher(); }
namespace step14 { Launcher launcher(); }
namespace step15 { Launcher launcher(); }
namespace step16 { Launcher launcher(); }
namespace step17 { Launcher launcher(); }
namespace step18 { Launcher launcher(); }
namespace step19 { Launcher launcher(); }
namespace step20 { Launcher launcher(); }
namespace step21 { Launcher launcher(); }
namespace step22 { Launcher launcher(); }
namespace step23 { Launcher launcher(); }
namespace step24 { Launcher launcher(); }
namespace step25 { Launcher launcher(); }
namespace step26 { Launcher launcher(); }
namespace step27 { Launcher launcher(); }
namespace step28 { Launcher launcher(); }
namespace step29 { Launcher launcher(); }
namespace step30 { Launcher launcher(); }
namespace step31 { Launcher launcher(); }
namespace step32 { Launcher launcher(); }
namespace step33 { Launcher launcher(); }
namespace step34 { Launcher launcher(); }
namespace step35 { Launcher launcher(); }
namespace step36 { Launcher launcher(); }
namespace step37 { Launcher launcher(); }
namespace step38 { Launcher launcher(); }
namespace step39 { Launcher launcher(); }
namespace step40 { Launcher launcher(); }
namespace step41 { Launcher launcher(); }
namespace step42 { Launcher launcher(); }
namespace step43 { Launcher launcher(); }
namespace step44 { Launcher launcher(); }
namespace step45 { Launcher launcher(); }
namespace step46 { Launcher launcher(); }
namespace step47 { Launcher launcher(); }
namespace step48 { Launcher launcher(); }
namespace step49 { Launcher launcher(); }
namespace step50 { Launcher launcher(); }
namespace step51 { Launcher launcher(); }
namespace step52 { Launcher launcher(); }
namespace step53 { Launcher launcher(); }
namespace step54 { Launcher launcher(); }
namespace step55 { Launcher launcher(); }
namespace step56 { Launcher launcher(); }
namespace step57 { Launcher launcher(); }
namespace step58 { Launcher launcher(); }
namespace step59 { Launcher launcher(); }
namespace step60 { Launcher launcher(); }
namespace step61 { Launcher launcher(); }
// The baseline (bench/cublas_baseline.cu).
namespace cublas { Launcher launcher(); }

const std::vector<StepInfo>& all_steps() {
  static const std::vector<StepInfo> steps = {
      {"01", "", "naive", "one thread per output element; every score recomputed 3*d times", step01::launcher()},
      {"02", "", "reductions", "one block per row; keys split over threads, m and l joined by block reductions",
       step02::launcher()},
      {"03", "", "minimal_fa1",
       "FlashAttention-1 loop order: block per (batch, head), thread per query row, O/l/m in HBM between K/V tiles",
       step03::launcher()},
      {"04", "", "tiled_online_softmax",
       "FA2 loop order: a block keeps its Q tile and O, l, m on chip and streams K/V tiles past it",
       step04::launcher()},
      {"05", "pad1", "bank_conflicts", "K/V shared rows padded by one word: lane x starts in bank x",
       step05::launcher_pad1()},
      {"05", "pad4", "bank_conflicts", "K/V shared rows padded by four words, scalar reads: still 4-way conflicts",
       step05::launcher_pad4()},
      {"05", "pad4_vec4", "bank_conflicts", "K/V shared rows padded by four words, read as float4: conflict-free",
       step05::launcher_pad4_vec4()},
      {"05", "transpose", "bank_conflicts", "K/V tiles stored transposed: conflict-free reads, 32-way conflicted stores",
       step05::launcher_transpose()},
      {"06", "br8", "sp_reuse", "S and P share one shared tile, O in registers; Br = 8 rows, 256 threads",
       step06::launcher_br8()},
      {"06", "br16", "sp_reuse", "S and P share one shared tile, O in registers; Br = 16 rows, 512 threads",
       step06::launcher_br16()},
      {"06", "br32", "sp_reuse", "S and P share one shared tile, O in registers; Br = 32 rows, 1024 threads",
       step06::launcher_br32()},
      {"07", "double", "double_accumulation",
       "step 06 with S, P, m, l and O accumulated in double (FP64 arithmetic, exp in double)",
       step07::launcher_double(), /*high_precision_accumulation=*/true},
      {"07", "ff", "double_accumulation",
       "step 06 with S, P, m, l and O accumulated in float-float pairs (FP32 error-free transformations)",
       step07::launcher_ff(), /*high_precision_accumulation=*/true},
      {"08", "", "register_tiling",
       "each thread an 8x8 tile of S and 8 x d/8 of O in registers; float4 loads, transposed Q/K/P tiles",
       step08::launcher()},
      {"09", "br128", "tensor_cores",
       "S and O on tensor cores: mma.sync m16n8k16, ldmatrix from swizzled tiles, P in registers, Br = 128",
       step09::launcher_br128()},
      {"09", "br64", "tensor_cores", "step 09 with Br = 64 (4 warps): more, smaller blocks; twice the K/V reads",
       step09::launcher_br64()},
      {"10", "", "async_pipeline",
       "K/V tiles arrive by cp.async while the other product runs: loads hidden behind the tensor cores",
       step10::launcher()},
      {"11", "", "exp2_softmax", "softmax in base 2 with the scale folded in: one FMUL and one ex2.approx per score",
       step11::launcher()},
      {"11", "f32", "exp2_softmax",
       "the same base-2 softmax in step 08's register-tiled FP32 kernel (built for sm_80+ with step 11)",
       step11::launcher_f32()},
      {"12", "", "boundary_masking", "only tiles that cross kv_len or the causal diagonal test each score",
       step12::launcher()},
      {"13", "", "causal_order", "causal: the Q tiles with the most K/V tiles start first (longest job first)",
       step13::launcher()},
      {"14", "", "warp_tiling",
       "FlashAttention-2's warp tiling: 32 rows per warp, so every K/V fragment feeds two mmas; Br = 128",
       step14::launcher()},
      {"15", "", "mask_specialization",
       "tiles that need no mask run a copy of the tile body compiled without mask code; the rest run the masked one",
       step15::launcher()},
      {"16", "", "fma_exp", "the row max over raw scores, so each exponent is one FFMA: 2^(x c - m c)",
       step16::launcher()},
      {"17", "", "two_stage_pipeline",
       "two K/V stages: tile j+1 loads during all of tile j; one barrier per tile instead of two",
       step17::launcher()},
      {"18", "", "conditional_rescale",
       "O is rescaled only when a row max grew (one warp vote), which lets d = 128 take Bc = 64 keys per tile",
       step18::launcher()},
      {"19", "", "fp32_column_split",
       "FP32 at d = 128: 256 threads split O's columns, and the next K/V tile is prefetched into registers",
       step19::launcher()},
      {"20", "", "wgmma",
       "Hopper: wgmma multiplies per warpgroup from shared memory tiles the threads load (cp.async, fence.proxy.async)",
       step20::launcher()},
      {"21", "", "tma_pipeline",
       "the copy engine (TMA) loads each tile for one thread, counted on mbarriers: no cp.async, no fence, no wait per thread",
       step21::launcher()},
      {"22", "", "warp_specialization",
       "a producer warpgroup issues every copy, two consumers compute; full/empty mbarriers, setmaxnreg 24/240",
       step22::launcher()},
      {"23", "", "pingpong",
       "the two consumer warpgroups take turns on the tensor cores (named barriers): one's softmax hides under the other's wgmmas",
       step23::launcher()},
      {"24", "", "intra_warpgroup_overlap",
       "a warpgroup issues S_j and P V_{j-1} together and waits for S_j alone: its softmax runs under its own P V",
       step24::launcher()},
      {"25", "", "persistent_grid",
       "a persistent grid: one block per SM takes work tiles in turn (heads a section at a time, heaviest first), copying the next while it finishes this one",
       step25::launcher()},
      // The backward pass: dQ, dK, dV from Q, K, V, O, the forward's LSE and dO.
      {"26", "", "naive_backward",
       "the backward, one formula per kernel: P recomputed from the forward's LSE, P and dS (Nq x Nkv) in memory",
       step26::launcher()},
      {"27", "", "flash_backward",
       "FlashAttention-2's backward: a block per K/V tile keeps dK, dV on chip while Q, dO tiles stream past; dQ by float atomics",
       step27::launcher()},
      {"28", "", "tensor_core_backward",
       "step 27's loop on mma.sync: S^T, dP^T, dV, dK and dQ as fragments; dS^T through shared memory for dQ",
       step28::launcher()},
      {"29", "", "vector_atomics",
       "dQ added four floats per request (red.global.add.v4.f32, sm_90): a quarter of step 28's L2 atomics",
       step29::launcher()},
      {"30", "", "square_warp_tiles",
       "FlashAttention-2's block: 8 warps, 128 keys, P and dS through shared memory so every product takes a 32 x 32 warp tile",
       step30::launcher()},
      {"31", "", "prefetched_q_tiles",
       "the next Q tile's copies start before this one's products: Q and dO in two stages, one block per SM no longer waits",
       step31::launcher()},
      {"32", "", "lean_loop",
       "the loop issues what the products need: swizzled ldmatrix addresses as one XOR of a base, the tile walk without division",
       step32::launcher()},
      {"33", "", "reordered_k_copy",
       "dQ from a copy of K with each 16 columns' pairs reordered: a lane holds four adjacent dQ columns, no lane swap",
       step33::launcher()},
      {"34", "", "tall_q_tiles",
       "at d = 64, Q tiles of 128 rows as FlashAttention-2 takes them, dP in two key halves to stay in registers",
       step34::launcher()},
      {"35", "", "interleaved_reductions",
       "dQ's product first, its reductions spread between dV's and dK's mmas instead of back to back at the tile's end",
       step35::launcher()},
      {"36", "", "coalesced_side_kernels",
       "D = rowsum(dO o O) and dQ's rounding in 16-byte accesses, each row read whole by consecutive lanes: D 7x faster",
       step36::launcher()},
      {"37", "", "staggered_q_walk",
       "without the causal mask, block x starts its walk over the Q tiles at tile x: the blocks' dQ additions spread",
       step37::launcher()},
      {"38", "", "wgmma_backward",
       "the backward on wgmma: S^T and dP^T per warpgroup of keys, P^T and dS^T as register A operands of dV and dK, Q and dO by TMA",
       step38::launcher()},
      {"39", "", "dq_by_copy_engine",
       "dQ's pieces go through shared memory to the copy engine, which adds them to the float dQ (cp.reduce.async.bulk.tensor)",
       step39::launcher()},
      {"40", "", "warp_specialized_backward",
       "a producer warpgroup loads Q, dO, LSE and D and hands dQ to the copy engine; the consumers meet only at dS^T",
       step40::launcher()},
      {"41", "", "lean_backward_consumer",
       "step 40's consumers with fewer instructions a tile: the mask's test compiled out of tiles that need none, the LSE loaded before the wait for S^T, the wgmma descriptors built once in uniform registers",
       step41::launcher()},
      {"42", "", "split_kv_decode",
       "decode: each sequence's keys split among blocks, each writing a partial O and its LSE; a second kernel merges them",
       step42::launcher()},
      {"43", "", "gqa_packed_decode",
       "decode: the query heads of a GQA group share a block, so each split reads its keys once for all of them",
       step43::launcher()},
      {"44", "", "pipelined_decode",
       "decode: each thread keeps its next tiles of K and V on the way to shared memory (cp.async) while it computes",
       step44::launcher()},
      {"45", "", "paged_decode",
       "decode from a paged KV cache: each key's row found through the sequence's page table (vLLM's layout)",
       step45::launcher()},
      {"46", "", "tensor_core_decode",
       "decode on tensor cores: a block's rows of a GQA group are the 16 rows of mma.sync, for S = QK^T and for PV",
       step46::launcher()},
      {"47", "", "shared_kv_decode",
       "decode with several new tokens: a block's rows are up to two m16 tiles, so a KV head's keys are read once for 32 rows",
       step47::launcher()},
      {"48", "", "page_lookahead_decode",
       "decode from pages: each table entry read two tiles ahead and checked where its copies use it, the page walk without a division",
       step48::launcher()},
      {"49", "", "sliding_window",
       "a sliding window (FlashAttention's window_size) on step 25: each work tile walks only the K/V tiles its rows' windows reach, masked at the window's edges",
       step49::launcher()},
      {"50", "", "softcap",
       "logit soft-capping (Gemma 2): each score capped to c tanh(s / c) on S's fragments, tanh from exp2 to float rounding; with step 49's window",
       step50::launcher()},
      {"51", "", "attention_sinks",
       "attention sinks (gpt-oss): each head's sink logit joins every row's max and sum once, at the row's end; with step 50's window and cap",
       step51::launcher()},
      {"52", "", "varlen",
       "packed variable lengths (FlashAttention's varlen, cu_seqlens): the copies address each sequence in the pack, the scheduler finds a work tile's sequence by a binary search; with step 51's window, cap and sinks",
       step52::launcher()},
      {"53", "", "window_backward",
       "a sliding window in step 41's backward: each K/V tile walks only the Q tiles whose rows see its keys, masked at the window's edges",
       step53::launcher()},
      {"54", "", "softcap_backward",
       "soft-capping in the backward: P from the capped score as step 50 caps it, dS times the cap's slope 1 - tanh^2; with step 53's window",
       step54::launcher()},
      {"55", "", "sinks_backward",
       "attention sinks in the backward: dQ, dK, dV unchanged (the LSE holds the sink), dsinks = -sum e^(sink - LSE) D summed where D is; with step 54's window and cap",
       step55::launcher()},
      {"56", "", "varlen_backward",
       "packed variable lengths in the backward: each K/V tile finds its sequence among virtual tiles by a binary search, addresses its keys and Q tiles from the pack's offsets, walks that sequence's rows alone; with step 55's window, cap and sinks",
       step56::launcher()},
      {"57", "", "head_dim_256",
       "head_dim 256 (Gemma-class models) in step 52's kernel: K/V tiles of 80 keys in two stages beside Q_i's 64 KiB, O's 128 registers a thread; d = 64 and 128 as step 52, every feature at 256",
       step57::launcher()},
      {"58", "", "head_dim_256_backward",
       "the backward at head_dim 256: both warpgroups on the same 64 keys, split by role (S^T, P^T, dV in one; dP^T, dS^T, dK in the other, P^T handed over in shared memory), dQ through the stage Q and dO leave, added by the copy engine; d = 64 and 128 as step 56, every feature at 256",
       step58::launcher()},
      {"59", "", "decode_features",
       "the models' features in decode on step 48's kernel: the splits share the keys a window lets the new tokens see (the cost grows with the window, not the cache), the cap where the scores are scaled, each head's sink once, in the combine",
       step59::launcher()},
      {"60", "", "bottom_right",
       "the causal mask's and the window's diagonal at each sequence's last key (FlashAttention's alignment when q_len != kv_len: a chunk of a prompt over a cached prefix) in step 57's kernel: the one rule takes the alignment, each sequence of a pack its own offset; rows that see no key get O = 0",
       step60::launcher()},
      {"61", "", "bottom_right_backward",
       "the backward with the diagonal at each sequence's last key (bottom-right) in step 58's kernel: the rule and its inverse take the alignment, so each K/V tile walks the rows that see its keys from their first; rows that see no key are visited only in masked tiles, their dQ 0",
       step61::launcher()},
  };
  return steps;
}

const StepInfo& cublas_baseline() {
  static const StepInfo baseline = {
      "cublas", "", "cublas standard attention",
      "S = QK^T with cuBLAS, softmax kernel, O = PV with cuBLAS (N x N scores in memory)", cublas::launcher(),
      /*high_precision_accumulation=*/false, /*reports_resources=*/false};
  return baseline;
}

StepInfo::StepInfo(std::string id_, std::string variant_, std::string name_, std::string summary_,
                   const Launcher& launcher, bool high_precision, bool resources_reported)
    : id(std::move(id_)),
      variant(std::move(variant_)),
      name(std::move(name_)),
      summary(std::move(summary_)),
      launch(launcher.launch),
      dtypes(launcher.dtypes),
      head_dims(launcher.head_dims),
      min_arch(launcher.min_arch),
      arch_specific(launcher.arch_specific),
      pointer_alignment(launcher.pointer_alignment),
      workspace_bytes(launcher.workspace_bytes),
      pass(launcher.pass),
      cache_forms(launcher.cache_forms),
      features(launcher.features),
      high_precision_accumulation(high_precision),
      reports_resources(resources_reported) {}

bool StepInfo::supports(DType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

bool StepInfo::supports_head_dim(int head_dim) const {
  return std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end();
}

std::string StepInfo::label() const { return variant.empty() ? id : id + "-" + variant; }

std::string StepInfo::min_gpu() const {
  return min_arch ? "sm_" + std::to_string(min_arch) + (arch_specific ? "a" : "") : "any";
}

KernelResources StepInfo::resources(const AttentionProblem& p) const {
  if (!reports_resources) throw std::logic_error(label() + " does not report kernel resources");
  return kit::resources(launch, p);
}

std::size_t StepInfo::workspace_for(const AttentionProblem& p) const {
  return workspace_bytes ? workspace_bytes(p) : 0;
}

std::vector<const StepInfo*> select_steps(const std::string& spec) {
  std::vector<const StepInfo*> chosen;
  auto add = [&](const StepInfo& s) {
    if (std::find(chosen.begin(), chosen.end(), &s) == chosen.end()) chosen.push_back(&s);
  };
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    bool found = false;
    if (item == "all") {
      for (const auto& s : all_steps()) add(s);
      found = true;
    }
    if (item == cublas_baseline().id) {
      add(cublas_baseline());
      found = true;
    }
    for (const auto& s : all_steps()) {
      if (s.id == item || s.label() == item) {
        add(s);
        found = true;
      }
    }
    if (!found) throw std::invalid_argument(unknown_step_message(item));
  }
  return chosen;
}

const StepInfo& step_named(const std::string& label, const std::string& listing) {
  if (label == cublas_baseline().label()) return cublas_baseline();
  for (const StepInfo& s : all_steps())
    if (s.label() == label) return s;
  const auto selected = select_steps(label);
  if (selected.empty()) throw std::invalid_argument(unknown_step_message(label));
  if (selected.size() > 1) {
    std::string labels;
    for (const StepInfo* s : selected) labels += (labels.empty() ? "" : ", ") + s->label();
    throw std::invalid_argument("step '" + label + "' names " + std::to_string(selected.size()) +
                                " implementations; name one: " + labels + " (" + listing + " shows them all)");
  }
  return *selected.front();
}

std::string unknown_step_message(const std::string& item) {
  const std::vector<StepInfo>& steps = all_steps();
  auto is_id = [&](const std::string& id) {
    return std::any_of(steps.begin(), steps.end(), [&](const StepInfo& s) { return s.id == id; });
  };
  // What the item may have meant, from the first rule that finds something.
  std::vector<std::string> meant;
  auto mean = [&](const std::string& label) {
    if (std::find(meant.begin(), meant.end(), label) == meant.end()) meant.push_back(label);
  };
  if (item.size() == 1 && std::isdigit(static_cast<unsigned char>(item[0])) && is_id("0" + item))
    mean("0" + item);  // "5" for 05
  for (const StepInfo& s : steps)  // a step's name or folder: "naive", "01_naive"
    if (meant.empty() && (item == s.name || item == s.id + "_" + s.name)) mean(s.id);
  if (meant.empty() && item.size() >= 3)  // the start of labels: "05-pad" for 05-pad1, 05-pad4, 05-pad4_vec4
    for (const StepInfo& s : steps)
      if (s.label().rfind(item, 0) == 0) mean(s.label());
  if (meant.empty()) {  // a label and more: "24x" for 24, "05-pad1x" for 05-pad1
    std::string longest;
    for (const StepInfo& s : steps)
      if (item.rfind(s.label(), 0) == 0 && s.label().size() > longest.size()) longest = s.label();
    if (!longest.empty()) mean(longest);
  }
  std::string message = "no step or baseline called '" + item + "'";
  if (!meant.empty()) {
    message += " (did you mean ";
    for (std::size_t i = 0; i < meant.size(); ++i)
      message += (i == 0 ? "" : i + 1 == meant.size() ? " or " : ", ") + meant[i];
    message += "?)";
  }
  // The known ids, each run of consecutive numbers written "01 to 46" (ids are two digits, in course order).
  std::vector<std::string> ids;
  const StepInfo* variant = nullptr;  // the first step with variants, for the example of a label
  for (const StepInfo& s : steps) {
    if (ids.empty() || ids.back() != s.id) ids.push_back(s.id);
    if (!variant && !s.variant.empty()) variant = &s;
  }
  std::string known;
  for (std::size_t first = 0, last = 0; first < ids.size(); first = ++last) {
    while (last + 1 < ids.size() && std::stoi(ids[last + 1]) == std::stoi(ids[last]) + 1) ++last;
    known += (known.empty() ? "" : ", ") + ids[first] + (last > first ? " to " + ids[last] : "");
  }
  message += "; known: " + known;
  if (variant) message += " (a variant by its label, e.g. " + variant->label() + ")";
  return message + ", " + cublas_baseline().id;
}

DeviceAttention::DeviceAttention(const AttentionProblem& p, const AttentionInputs& inputs,
                                 std::size_t workspace_bytes, const BackwardInputs* backward)
    : q(inputs.q.byte_size()),
      k(inputs.k.byte_size()),
      v(inputs.v.byte_size()),
      o(std::size_t(p.q_elements()) * size_of(p.dtype)),
      lse(std::size_t(p.lse_elements()) * sizeof(float)),
      workspace(workspace_bytes),
      cache_status(4 * sizeof(int)),
      backward_(backward != nullptr) {
  auto check = [&](const HostTensor& t, const char* name, const std::vector<std::int64_t>& shape,
                   DType dtype) {
    if (t.dtype != dtype || t.shape != shape)
      throw InvalidProblem(std::string(name) + " does not have the problem's dtype and shape (" + p.describe() +
                           (dtype == p.dtype ? ")"
                            : shape.size() == 1 ? "; the sinks are f32 [q_heads])"
                            : p.varlen()        ? "; LSE is f32 [q_heads, total_q])"
                                                : "; LSE is f32 [batch, q_heads, q_len])"));
  };
  check(inputs.q, "Q", q_shape(p), p.dtype);
  check(inputs.k, "K", kv_shape(p), p.dtype);
  check(inputs.v, "V", kv_shape(p), p.dtype);
  q.upload(inputs.q.bytes.data(), inputs.q.byte_size());
  if (p.paged()) {
    const std::vector<int> table = shuffled_page_table(p, kPageSeed);
    const HostTensor k_pool = to_pages(p, inputs.k, table), v_pool = to_pages(p, inputs.v, table);
    k = DeviceBuffer(k_pool.byte_size()), v = DeviceBuffer(v_pool.byte_size());
    k.upload(k_pool.bytes.data(), k_pool.byte_size());
    v.upload(v_pool.bytes.data(), v_pool.byte_size());
    page_table = DeviceBuffer(table.size() * sizeof(int));
    page_table.upload(table.data(), table.size() * sizeof(int));
  } else {
    k.upload(inputs.k.bytes.data(), inputs.k.byte_size());
    v.upload(inputs.v.bytes.data(), inputs.v.byte_size());
  }
  if (!p.kv_lens.empty()) {
    kv_lens = DeviceBuffer(p.kv_lens.size() * sizeof(int));
    kv_lens.upload(p.kv_lens.data(), p.kv_lens.size() * sizeof(int));
  }
  if (p.varlen()) {
    cu_seqlens_q = DeviceBuffer(p.cu_seqlens_q.size() * sizeof(int));
    cu_seqlens_q.upload(p.cu_seqlens_q.data(), p.cu_seqlens_q.size() * sizeof(int));
    cu_seqlens_k = DeviceBuffer(p.cu_seqlens_k.size() * sizeof(int));
    cu_seqlens_k.upload(p.cu_seqlens_k.data(), p.cu_seqlens_k.size() * sizeof(int));
  }
  if (p.sinks) {
    check(inputs.sinks, "the sinks", {p.q_heads}, DType::f32);
    sinks = DeviceBuffer(inputs.sinks.byte_size());
    sinks.upload(inputs.sinks.bytes.data(), inputs.sinks.byte_size());
  }
  if (backward) {
    check(backward->o, "O", q_shape(p), p.dtype);
    check(backward->lse, "LSE", lse_shape(p), DType::f32);
    check(backward->d_o, "dO", q_shape(p), p.dtype);
    o.upload(backward->o.bytes.data(), backward->o.byte_size());
    lse.upload(backward->lse.bytes.data(), backward->lse.byte_size());
    d_o = DeviceBuffer(backward->d_o.byte_size());
    d_o.upload(backward->d_o.bytes.data(), backward->d_o.byte_size());
    dq = DeviceBuffer(inputs.q.byte_size());
    dk = DeviceBuffer(inputs.k.byte_size());
    dv = DeviceBuffer(inputs.v.byte_size());
    if (p.sinks) dsinks = DeviceBuffer(std::size_t(p.q_heads) * sizeof(float));
  }
  poison_outputs();
}

void DeviceAttention::poison_outputs() {
  if (backward_) {
    dq.poison(), dk.poison(), dv.poison(), dsinks.poison();
  } else {
    o.poison(), lse.poison();
  }
}

AttentionTensors DeviceAttention::tensors() const {
  AttentionTensors t{q.get(), k.get(), v.get(), o.get(), workspace.get()};
  t.lse = static_cast<float*>(lse.get());
  t.kv_lens = static_cast<const int*>(kv_lens.get());
  t.page_table = static_cast<const int*>(page_table.get());
  t.cache_status = cache_status.as<int>();
  t.sinks = static_cast<const float*>(sinks.get());
  t.cu_seqlens_q = static_cast<const int*>(cu_seqlens_q.get());
  t.cu_seqlens_k = static_cast<const int*>(cu_seqlens_k.get());
  if (backward_) t.d_o = d_o.get(), t.dq = dq.get(), t.dk = dk.get(), t.dv = dv.get();
  t.dsinks = dsinks.as<float>();
  return t;
}

HostTensor DeviceAttention::download_o(const AttentionProblem& p) const {
  HostTensor out(p.dtype, q_shape(p));
  o.download(out.bytes.data(), out.byte_size());
  return out;
}

HostTensor DeviceAttention::download_lse(const AttentionProblem& p) const {
  HostTensor out(DType::f32, lse_shape(p));
  lse.download(out.bytes.data(), out.byte_size());
  return out;
}

Gradients DeviceAttention::download_gradients(const AttentionProblem& p) const {
  Gradients g{HostTensor(p.dtype, q_shape(p)), HostTensor(p.dtype, kv_shape(p)), HostTensor(p.dtype, kv_shape(p))};
  dq.download(g.dq.bytes.data(), g.dq.byte_size());
  dk.download(g.dk.bytes.data(), g.dk.byte_size());
  dv.download(g.dv.bytes.data(), g.dv.byte_size());
  if (p.sinks) {
    g.dsinks = HostTensor(DType::f32, {p.q_heads});
    dsinks.download(g.dsinks.bytes.data(), g.dsinks.byte_size());
  }
  return g;
}

std::string DeviceAttention::cache_fault() const {
  int record[4];
  cache_status.download(record, sizeof(record));
  return cache_fault_message(record);
}

namespace {
/// Throws std::logic_error when `step` computes another pass than `pass` (a caller's mistake).
void require_pass(const StepInfo& step, Pass pass) {
  if (step.pass != pass)
    throw std::logic_error("step " + step.label() + " computes the " + to_string(step.pass) + " pass, not the " +
                           to_string(pass) + " pass");
}
}  // namespace

HostTensor run_step(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& inputs) {
  require_pass(step, Pass::forward);
  validate(p);
  DeviceAttention device(p, inputs, step.workspace_for(p));
  step.launch(p, device.tensors(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return device.download_o(p);
}

const StepInfo* forward_step_for_backward(const AttentionProblem& p, int arch) {
  const StepInfo* forward = nullptr;
  for (const StepInfo& s : all_steps())
    if (s.pass == Pass::forward && s.cache_forms.max_q_len == 0 && s.supports(p) && s.runs_on(arch)) forward = &s;
  return forward;
}

BackwardInputs forward_for_backward(const AttentionProblem& p, const AttentionInputs& inputs, std::uint64_t seed) {
  validate(p);
  const StepInfo* forward = forward_step_for_backward(p, kit::device_arch());
  if (!forward)
    throw InvalidProblem("no forward step takes " + p.describe() + " on this GPU: nothing can make the backward's O and LSE");
  DeviceAttention device(p, inputs, forward->workspace_for(p));
  forward->launch(p, device.tensors(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return {device.download_o(p), device.download_lse(p), random_tensor(p.dtype, q_shape(p), seed * 3 + 4)};
}

Gradients run_backward(const StepInfo& step, const AttentionProblem& p, const AttentionInputs& inputs,
                       const BackwardInputs& backward) {
  require_pass(step, Pass::backward);
  validate(p);
  DeviceAttention device(p, inputs, step.workspace_for(p), &backward);
  step.launch(p, device.tensors(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return device.download_gradients(p);
}

}  // namespace fa
