/// @file problem.hpp
/// @brief The one attention problem every step solves, and its validation.
///
/// Tensors are contiguous row-major [batch, seq, heads, head_dim]:
/// Q and O are [batch, q_len, q_heads, head_dim], K and V are
/// [batch, kv_len, kv_heads, head_dim]; the backward's dO and dQ are shaped like Q, dK and dV like K.
/// The row log-sum-exp LSE is fp32 [batch, q_heads, q_len]. Query head h reads KV head
/// h / (q_heads / kv_heads) (grouped-query attention; kv_heads == 1 is MQA).
/// Causal masking is top-left aligned like PyTorch's `is_causal`: query row i
/// sees keys j <= i, so every row sees at least key 0.
///
/// The KV-cache forms (the inference steps; a step that does not take one refuses it by name):
/// - per-sequence lengths (`kv_lens`): sequence b has kv_lens[b] valid keys, 0 .. kv_len; K and V keep
///   their kv_len rows (the cache's capacity) and the rows past a sequence's length are never read;
/// - a paged cache (`page_size` > 0): K and V are pools [pages, page_size, kv_heads, head_dim], and
///   sequence b's key j lives in page page_table[b][j / page_size], row j % page_size (as vLLM's and
///   FlashInfer's caches, and FlashAttention's `block_table`);
/// - bottom-right causal alignment (`causal_align`): query row i of q_len new tokens sees keys
///   j <= len - q_len + i, len its sequence's length, so the last row sees every key (decoding q_len
///   tokens at once, as in speculative decoding). A row that sees no key has O = 0 and LSE = -inf.
///
/// The features of the models that run attention (issue 58; a step that does not take one refuses it by name):
/// - a sliding window (`window_left`, `window_right`, FlashAttention's window_size): query row i sees the keys
///   j with i' - left <= j <= i' + right, i' its diagonal (i, or len - q_len + i aligned bottom-right); -1 leaves
///   that side open; with causal the right side is 0 whatever it says, as FlashAttention's causal window;
/// - logit soft-capping (`softcap` > 0, Gemma 2): each score s = scale q.k becomes softcap tanh(s / softcap);
/// - attention sinks (`sinks`, gpt-oss): a logit per query head (AttentionTensors::sinks, float [q_heads]) in
///   every row's softmax denominator and none of its values: LSE_i = ln(sum_j exp(s_ij) + exp(sink_h)),
///   P_ij = exp(s_ij - LSE_i). A row that sees no key then has O = 0 and LSE = sink_h. A backward step that takes
///   them also writes their gradient, dLoss/dsink_h (AttentionTensors::dsinks, float [q_heads]);
/// - packed variable lengths (`cu_seqlens_q`, `cu_seqlens_k`, FlashAttention's varlen): the batch's sequences
///   packed without padding, Q and O [total_q, q_heads, head_dim], K and V [total_k, kv_heads, head_dim], sequence
///   b's rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (and its keys likewise); q_len and kv_len are then the
///   longest sequence's (FlashAttention's max_seqlen_q, max_seqlen_k) and LSE is [q_heads, total_q], as
///   FlashAttention's varlen softmax_lse.
#pragma once

#include "fa/dtype.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa {

/// Thrown before anything is launched when a problem is malformed or not
/// supported by the step asked to run it. The message names the field and value.
class InvalidProblem : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An InvalidProblem that is a limit of this GPU, not of the call: the problem is valid and the step takes it, but
/// the step's kernel for it needs more shared memory a block than this GPU gives, and a larger GPU gives that much
/// (kit::refuse_shared_memory). Thrown before anything is launched; the test harness skips such a case, where any
/// other InvalidProblem from a step it should run fails it.
class DeviceLimit : public InvalidProblem {
 public:
  using InvalidProblem::InvalidProblem;
};

/// Which half of attention a step computes.
enum class Pass {
  forward,   ///< O (and the row log-sum-exp) from Q, K, V
  backward,  ///< dQ, dK, dV from Q, K, V, O, the log-sum-exp and dO
};

/// "forward" or "backward", as fa-bench's CSV writes it.
const char* to_string(Pass pass);

/// Where the causal mask's diagonal sits.
enum class CausalAlign {
  top_left,      ///< query row i sees keys j <= i (PyTorch's is_causal): every step takes it
  bottom_right,  ///< query row i sees keys j <= len - q_len + i: the last row sees all len keys of its sequence
};

/// "top-left" or "bottom-right".
const char* to_string(CausalAlign align);

/// FA_HOST_DEVICE: a function both compilers build, for the host and (under nvcc) the device.
#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif
/// How many keys (0 .. len, keys 0 .. keys_seen - 1) query row i of q_len rows sees in a sequence of len keys:
/// all of them without the mask; with it keys j <= i (top-left) or j <= len - q_len + i (bottom-right). The one
/// rule the reference (AttentionProblem::keys_seen) and the decode kernels (kit::Cache) both follow.
FA_HOST_DEVICE constexpr int keys_seen_in(int len, int q_len, int i, bool causal, bool bottom_right) {
  if (!causal) return len;
  const int seen = (bottom_right ? len - q_len + i : i) + 1;
  return seen < 0 ? 0 : seen > len ? len : seen;
}

/// The keys [first, last) a query row sees; an empty range has first == last (0 when nothing is seen).
struct KeyRange {
  int first = 0;  ///< the first key the row sees
  int last = 0;   ///< one past the last
  /// How many keys the row sees.
  FA_HOST_DEVICE constexpr int count() const { return last - first; }
};
/// The keys query row i of q_len rows sees in a sequence of len keys: as keys_seen_in, then a window of `left`
/// keys before the row's diagonal and `right` after it (-1: open; the right side is the causal mask's where causal).
/// The one rule the reference (AttentionProblem::keys_range) and the kernels that take a window follow.
FA_HOST_DEVICE constexpr KeyRange keys_range_in(int len, int q_len, int i, bool causal, bool bottom_right, int left,
                                                int right) {
  const int diagonal = bottom_right ? len - q_len + i : i;
  int last = causal ? keys_seen_in(len, q_len, i, causal, bottom_right) : len;
  if (!causal && right >= 0) last = diagonal + right + 1 < last ? diagonal + right + 1 : last;
  int first = left >= 0 && diagonal - left > 0 ? diagonal - left : 0;
  if (last < 0) last = 0;
  if (first > last) first = last;
  return {first, last};
}

/// The query rows [first, last) that see a key: rows_range_in's answer (empty: first == last).
using RowRange = KeyRange;
/// The query rows of q_len that see key j of a sequence of len keys: the rows i whose keys_range_in(len, q_len, i,
/// ...) holds j. Both ends of a row's keys grow with the row, so these rows are one run, and both of its ends grow
/// with j. Empty for a key past len or one no row sees. The inverse of the one rule (keys_range_in), not a second
/// rule: a CPU test checks it against keys_range_in row by row. A backward kernel's K/V tile walks these rows.
FA_HOST_DEVICE constexpr RowRange rows_range_in(int len, int q_len, int j, bool causal, bool bottom_right, int left,
                                                int right) {
  if (j < 0 || j >= len) return {0, 0};
  const long long diagonal_of_j = (long long)j - (bottom_right ? len - q_len : 0);  // the row whose diagonal is j
  // j is before the row's last key: the diagonal at or after j (causal), or its right side reaching j.
  long long first = causal ? diagonal_of_j : right >= 0 ? diagonal_of_j - right : 0;
  // The row's first key is at or before j: its window's left side reaches back to j.
  long long last = left >= 0 ? diagonal_of_j + left + 1 : q_len;
  if (first < 0) first = 0;
  if (last > q_len) last = q_len;
  // Never below row 0, even empty: under bottom-right a key before every row's window has its run's end at a
  // negative row, and a K/V tile walks from its first key's first row to its last key's last (step 61).
  if (last < 0) last = 0;
  if (first > last) first = last;
  return {int(first), int(last)};
}

/// Shapes, masking and scale of one attention call.
struct AttentionProblem {
  int batch = 1;               ///< B: independent sequences
  int q_len = 1;               ///< Nq: query rows per sequence
  int kv_len = 1;              ///< Nkv: keys (and values) per sequence
  int q_heads = 1;             ///< query heads, a multiple of kv_heads
  int kv_heads = 1;            ///< KV heads: kv_heads < q_heads is GQA, 1 is MQA
  int head_dim = 64;           ///< d: elements per head
  bool causal = false;         ///< causal mask, aligned as causal_align says
  DType dtype = DType::f32;    ///< element type of Q, K, V and O
  /// Softmax scale; unset means 1/sqrt(head_dim).
  std::optional<float> scale;
  /// With causal: where the diagonal sits (top-left unless a step takes bottom-right; refused without causal).
  CausalAlign causal_align = CausalAlign::top_left;
  /// Per-sequence K/V lengths, each 0 .. kv_len (empty: every sequence has kv_len keys). The host's copy,
  /// which validation and the reference read; kernels read the device copy, AttentionTensors::kv_lens.
  std::vector<int> kv_lens;
  /// 0: K and V contiguous, [batch, kv_len, kv_heads, head_dim]. > 0: a paged cache, K and V pools of
  /// `pages` pages [pages, page_size, kv_heads, head_dim], addressed through AttentionTensors::page_table;
  /// kv_len, a multiple of page_size, is then each sequence's capacity, kv_len / page_size pages.
  int page_size = 0;
  int pages = 0;  ///< pages in the K and V pools (paged only)
  /// A sliding window: keys before the diagonal (window_left) and after it (window_right) a row sees; -1: open.
  /// Both -1 (and either with causal's right side): no window. Aligned as causal_align says.
  int window_left = -1;
  int window_right = -1;  ///< the window's right side (see window_left); with causal, 0 whatever it says
  /// Logit soft-capping: scores become softcap tanh(score / softcap) before the softmax; 0: none.
  float softcap = 0.f;
  /// Attention sinks: a logit per query head (AttentionTensors::sinks) in every row's softmax denominator.
  bool sinks = false;
  /// Packed variable lengths (FlashAttention's cu_seqlens): batch + 1 offsets each, from 0, never decreasing;
  /// sequence b has cu_seqlens_q[b + 1] - cu_seqlens_q[b] query rows (at most q_len) and cu_seqlens_k[b + 1] -
  /// cu_seqlens_k[b] keys (at most kv_len). Both empty: every sequence has q_len rows and kv_len keys. The host's
  /// copies, which validation and the reference read; kernels read AttentionTensors::cu_seqlens_q and _k.
  std::vector<int> cu_seqlens_q;
  std::vector<int> cu_seqlens_k;  ///< the keys' offsets (see cu_seqlens_q)

  /// The scale actually applied to Q·Kᵀ.
  float softmax_scale() const;
  /// q_heads / kv_heads: how many query heads share one KV head.
  int group_size() const { return q_heads / kv_heads; }
  std::int64_t q_elements() const;   ///< elements of Q (and of O)
  std::int64_t kv_elements() const;  ///< elements of K (and of V)
  /// Useful floating-point operations: 4·B·H·Nq·Nkv·d, halved when causal
  /// (the convention of the FlashAttention papers and of PyTorch's benchmarks).
  double flops() const;
  /// Of one pass: flops() for the forward; 2.5 times that for the backward (five products of the
  /// forward's size where the forward has two: S and dP, dV, dK, dQ), as FlashAttention's benchmarks count.
  double flops(Pass pass) const { return pass == Pass::backward ? 2.5 * flops() : flops(); }
  std::int64_t lse_elements() const;  ///< elements of LSE: batch * q_heads * q_len, or q_heads * total_q (varlen)
  /// Whether the sequences are packed with their own lengths (cu_seqlens_q and cu_seqlens_k).
  bool varlen() const { return !cu_seqlens_q.empty(); }
  /// Query rows of sequence b: q_len, or its packed length.
  int q_len_of(int b) const {
    return varlen() ? cu_seqlens_q[std::size_t(b) + 1] - cu_seqlens_q[std::size_t(b)] : q_len;
  }
  /// Keys of sequence b: kv_lens[b], its packed length, or kv_len.
  int kv_len_of(int b) const {
    return varlen()            ? cu_seqlens_k[std::size_t(b) + 1] - cu_seqlens_k[std::size_t(b)]
           : kv_lens.empty() ? kv_len
                             : kv_lens[std::size_t(b)];
  }
  /// Rows of Q (and O) over the batch: batch * q_len, or cu_seqlens_q[batch].
  std::int64_t total_q() const { return varlen() ? cu_seqlens_q.back() : std::int64_t(batch) * q_len; }
  /// Rows of K (and V) over the batch: batch * kv_len, or cu_seqlens_k[batch] (varlen).
  std::int64_t total_k() const;
  /// The row of Q (O, dO, dQ) that holds query row i of sequence b: b * q_len + i, or cu_seqlens_q[b] + i.
  std::int64_t q_row(int b, int i) const {
    return (varlen() ? std::int64_t(cu_seqlens_q[std::size_t(b)]) : std::int64_t(b) * q_len) + i;
  }
  /// The row of K (V, dK, dV) that holds key j of sequence b: b * kv_len + j, or cu_seqlens_k[b] + j (contiguous).
  std::int64_t kv_row(int b, int j) const {
    return (varlen() ? std::int64_t(cu_seqlens_k[std::size_t(b)]) : std::int64_t(b) * kv_len) + j;
  }
  /// Where query row i of sequence b, head h, sits in LSE: [batch, q_heads, q_len], or [q_heads, total_q] (varlen).
  std::int64_t lse_index(int b, int i, int h) const {
    return varlen() ? std::int64_t(h) * total_q() + q_row(b, i) : (std::int64_t(b) * q_heads + h) * q_len + i;
  }
  /// The sequence that holds row `row` of Q (0 .. total_q - 1).
  int sequence_of_q_row(std::int64_t row) const;
  /// The sequence that holds row `row` of K (0 .. total_k - 1; contiguous K and V).
  int sequence_of_kv_row(std::int64_t row) const;
  /// One past the last key query row i of sequence b sees, 0 .. kv_len_of(b) (the mask, the window's right side
  /// and the length); without a window's left side the row sees keys 0 .. keys_seen - 1.
  int keys_seen(int b, int i) const;
  /// The keys [first, last) query row i of sequence b sees: the mask, the window and the sequence's length.
  KeyRange keys_range(int b, int i) const;
  /// Whether a window bounds some row: window_left >= 0, or window_right >= 0 without causal.
  bool windowed() const { return window_left >= 0 || (window_right >= 0 && !causal); }
  bool paged() const { return page_size > 0; }  ///< K and V are page pools
  int pages_per_sequence() const { return paged() ? kv_len / page_size : 0; }  ///< page_table's columns
  /// Bytes of K and V that attention must read once: the keys every sequence holds, times 2 (K and V),
  /// kv_heads, head_dim and the element size (the decode steps' effective bandwidth counts these).
  double kv_bytes() const;
  /// "B=4 Nq=1024 Nkv=1024 H=8/8 d=64 f32 causal", for messages and tables.
  std::string describe() const;
};

/// Throws InvalidProblem naming the first bad field and its value.
/// Every launcher calls this before touching the GPU. Besides positive sizes, kv_heads dividing q_heads
/// and a finite scale, one sequence of Q and of K/V must hold fewer than 2^31 elements: kernels add a
/// 64-bit offset per (batch, head) and index inside a sequence in 32 bits.
void validate(const AttentionProblem& problem);

/// The KV-cache forms a step takes (its Support says which; the registry lists them). A step refuses the
/// others by name before launch.
struct CacheForms {
  bool kv_lens = false;       ///< per-sequence K/V lengths
  bool paged = false;         ///< a paged K/V cache
  bool bottom_right = false;  ///< bottom-right causal alignment
  /// The most query rows (new tokens) per sequence it takes; 0: any. A decode step's kernel holds a few rows of
  /// queries in registers and refuses more (the forward steps take long query sequences).
  int max_q_len = 0;
};

/// The features of the models that run attention a step takes (issue 58). A step refuses the others by name.
struct Features {
  bool window = false;   ///< a sliding window (window_left, window_right)
  bool softcap = false;  ///< logit soft-capping
  bool sinks = false;    ///< attention sinks
  bool varlen = false;   ///< packed variable lengths (cu_seqlens_q, cu_seqlens_k)
};

/// Whether p uses only features that `takes` has.
bool takes_features(const AttentionProblem& p, const Features& takes);

/// Throws InvalidProblem("<step>: <field> = <value> is not supported; supported: <what>") for the first feature p
/// uses that `takes` lacks; returns when there is none.
void refuse_features(const char* step, const AttentionProblem& p, const Features& takes);

/// Whether p uses only forms that `takes` has (contiguous K/V, one length and top-left causal need none) and
/// has no more query rows than it takes.
bool takes_cache_forms(const AttentionProblem& p, const CacheForms& takes);

/// Throws InvalidProblem("<step>: <field> = <value> is not supported; supported: <what>") for the first
/// KV-cache form p uses that `takes` lacks, or for a q_len above its max_q_len; returns when there is none.
void refuse_cache_forms(const char* step, const AttentionProblem& p, const CacheForms& takes);

/// Throws InvalidProblem("<step>: <field> = <value> is not supported; supported: <what>").
[[noreturn]] void throw_unsupported(const char* step, const char* field, const std::string& value,
                                    const std::string& supported);

/// Device pointers of one call. workspace is scratch memory of the size the
/// step's registry entry asks for (nullptr when it asks for none), zero when it
/// is first handed to a step; a step that counts in it (step 25's tile
/// scheduler) leaves it zero again, so one workspace serves one call at a time.
/// A step that needs part of it zero at every call clears that part itself.
///
/// The log-sum-exp of query row i is LSE_i = ln sum_j exp(scale q_i . k_j) over the keys the row
/// sees (natural log, as FlashAttention's softmax_lse): P_ij = exp(scale q_i . k_j - LSE_i) with no
/// running max or sum. A forward step writes it when lse is set; the backward reads it.
struct AttentionTensors {
  const void* q = nullptr;     ///< Q, [batch, q_len, q_heads, head_dim]
  const void* k = nullptr;     ///< K, [batch, kv_len, kv_heads, head_dim] (paged: [pages, page_size, kv_heads, head_dim])
  const void* v = nullptr;     ///< V, [batch, kv_len, kv_heads, head_dim] (paged: [pages, page_size, kv_heads, head_dim], as K)
  void* o = nullptr;           ///< O, [batch, q_len, q_heads, head_dim]: the forward writes it, the backward reads it
  void* workspace = nullptr;   ///< scratch of StepInfo::workspace_for bytes, or nullptr
  float* lse = nullptr;        ///< LSE, fp32 [batch, q_heads, q_len]: forward output when set, backward input
  const void* d_o = nullptr;   ///< dO = dLoss/dO, shaped like O: backward input
  void* dq = nullptr;          ///< dQ, shaped like Q: written by a backward step
  void* dk = nullptr;          ///< dK, shaped like K: written by a backward step (summed over a KV head's group)
  void* dv = nullptr;          ///< dV, shaped like V: written by a backward step (summed over a KV head's group)
  const int* kv_lens = nullptr;     ///< int32 [batch]: the device copy of AttentionProblem::kv_lens, when set
  const int* page_table = nullptr;  ///< int32 [batch, kv_len / page_size]: each sequence's pages, when paged
  const float* sinks = nullptr;     ///< float32 [q_heads]: each query head's sink logit, when AttentionProblem::sinks
  /// float32 [q_heads]: dLoss/dsink_h, written by a backward step when AttentionProblem::sinks (the sinks' gradient).
  float* dsinks = nullptr;
  /// int32 [batch + 1] each: the device copies of AttentionProblem::cu_seqlens_q and cu_seqlens_k, when varlen.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;  ///< see cu_seqlens_q
  /// int32[4], 16-byte aligned, in memory the GPU writes (device memory, or mapped pinned host memory that the host
  /// reads without a sync): where a decode step records a value of kv_lens or page_table it refused (CacheFault).
  /// The values live on the GPU, so the kernel checks them: a length outside 0 .. kv_len reads as 0 keys, a page
  /// entry outside the pool (of a page the sequence's length reaches) as page 0, so nothing outside the cache is
  /// ever read. nullptr: the same guards, nothing recorded.
  int* cache_status = nullptr;
};

/// What a decode step writes into AttentionTensors::cache_status when it refuses a value, in one 16-byte store
/// (the last writer wins; a record is never a mix of two): {sequence * 4 + kind, index, value, limit}.
enum class CacheFault : int {
  none = 0,    ///< the record is all zero: nothing refused
  length = 1,  ///< kv_lens[sequence] = value is outside 0 .. limit (the capacity, kv_len)
  page = 2,    ///< page_table[sequence][index] = value is outside the pool's pages 0 .. limit - 1
};

/// The message of a length outside 0 .. kv_len: the one text validate() (host values), fa-run, the Python module
/// and the harness (a record a kernel wrote) give.
std::string kv_len_fault(int sequence, int value, int kv_len);
/// The message of a page-table entry outside the pool's pages 0 .. pages - 1, of a page sequence's length reaches.
std::string page_fault(int sequence, int index, int value, int pages);
/// The message of a cache_status record ("": no fault).
std::string cache_fault_message(const int record[4]);

/// Throws InvalidProblem (page_fault's words) for the first entry of `table` (int32 [batch, kv_len / page_size])
/// that a sequence's length reaches and that lies outside the pool. Entries past a sequence's length are never read
/// and may hold anything (a server's unused slots). Throws when the table has not batch x kv_len / page_size entries.
void validate_page_table(const AttentionProblem& p, const std::vector<int>& table);

}  // namespace fa
