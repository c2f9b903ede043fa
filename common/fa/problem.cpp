/// @file problem.cpp
/// @brief The attention problem: its validation, and the messages that name what is wrong.
#include "fa/problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fa {

float AttentionProblem::softmax_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::int64_t AttentionProblem::q_elements() const { return total_q() * q_heads * head_dim; }

std::int64_t AttentionProblem::kv_elements() const { return total_k() * kv_heads * head_dim; }

std::int64_t AttentionProblem::lse_elements() const { return total_q() * q_heads; }

std::int64_t AttentionProblem::total_k() const {
  return varlen() ? cu_seqlens_k.back() : std::int64_t(batch) * kv_len;
}

int AttentionProblem::sequence_of_q_row(std::int64_t row) const {
  if (!varlen()) return int(row / q_len);
  // The last b with cu_seqlens_q[b] <= row: empty sequences share their offset with the next, which holds the row.
  return int(std::upper_bound(cu_seqlens_q.begin(), cu_seqlens_q.end() - 1, row) - cu_seqlens_q.begin()) - 1;
}

int AttentionProblem::sequence_of_kv_row(std::int64_t row) const {
  if (!varlen()) return int(row / kv_len);
  return int(std::upper_bound(cu_seqlens_k.begin(), cu_seqlens_k.end() - 1, row) - cu_seqlens_k.begin()) - 1;
}

const char* to_string(Pass pass) { return pass == Pass::backward ? "backward" : "forward"; }

const char* to_string(CausalAlign align) { return align == CausalAlign::bottom_right ? "bottom-right" : "top-left"; }

int AttentionProblem::keys_seen(int b, int i) const { return keys_range(b, i).last; }

KeyRange AttentionProblem::keys_range(int b, int i) const {
  return keys_range_in(kv_len_of(b), q_len_of(b), i, causal, causal_align == CausalAlign::bottom_right, window_left,
                       window_right);
}

double AttentionProblem::kv_bytes() const {
  double keys = 0;
  // With a window, the keys its rows see together (both ends of a row's keys grow with the row): the rest of the
  // cache need not be read (step 59 reads none of it).
  for (int b = 0; b < batch; ++b)
    keys += !windowed()         ? kv_len_of(b)
            : q_len_of(b) == 0 ? 0
                               : std::max(0, keys_range(b, q_len_of(b) - 1).last - keys_range(b, 0).first);
  return 2.0 * keys * kv_heads * head_dim * double(size_of(dtype));
}

double AttentionProblem::flops() const {
  if (windowed()) {  // a window: the (row, key) pairs it leaves, counted, as FlashAttention's benchmarks do
    double pairs = 0;
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < q_len_of(b); ++i) pairs += keys_range(b, i).count();
    return 4.0 * q_heads * pairs * head_dim;
  }
  double pairs = 0;  // rows x keys over the batch: batch * q_len * kv_len, or the sum over the sequences
  for (int b = 0; b < batch; ++b) pairs += double(q_len_of(b)) * kv_len_of(b);
  const double full = 4.0 * q_heads * pairs * head_dim;
  return causal ? full / 2 : full;
}

std::string AttentionProblem::describe() const {
  // Strings and snprintf, not an ostream: the Python module's messages call this, and in a process that loaded
  // another C++ runtime first (PyTorch's) the module's ostream number formatting crashed (issue 55).
  using std::to_string;
  std::string out = "B=" + to_string(batch) + " Nq=" + to_string(q_len) + " Nkv=" + to_string(kv_len) +
                    " H=" + to_string(q_heads) + "/" + to_string(kv_heads) + " d=" + to_string(head_dim) + " " +
                    fa::to_string(dtype) + (causal ? " causal" : "");
  if (causal && causal_align == CausalAlign::bottom_right) out += " (bottom-right)";
  if (windowed())
    out += " window=(" + to_string(window_left) + "," + to_string(causal ? 0 : window_right) + ")" +
           (!causal && causal_align == CausalAlign::bottom_right ? " (bottom-right)" : "");
  if (softcap > 0) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", double(softcap));
    out += std::string(" softcap=") + text;
  }
  if (sinks) out += " sinks";
  if (varlen()) {
    int shortest = q_len_of(0), longest = shortest;
    for (int b = 1; b < batch; ++b) shortest = std::min(shortest, q_len_of(b)), longest = std::max(longest, q_len_of(b));
    out += " varlen=" + to_string(shortest) + ".." + to_string(longest) + " (" + to_string(total_q()) + " rows";
    out += total_k() == total_q() ? ")" : ", " + to_string(total_k()) + " keys)";
  }
  if (!kv_lens.empty()) {
    const auto [shortest, longest] = std::minmax_element(kv_lens.begin(), kv_lens.end());
    out += " kv_lens=" + to_string(*shortest) + ".." + to_string(*longest);
  }
  if (paged()) out += " pages of " + to_string(page_size) + " (" + to_string(pages) + ")";
  if (scale) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", double(*scale));  // as an ostream prints a float: 6 significant digits
    out += std::string(" scale=") + text;
  }
  return out;
}

namespace {
/// Throws InvalidProblem unless value >= 1.
void require_positive(const char* field, int value) {
  if (value < 1)
    throw InvalidProblem(std::string("attention problem: ") + field + " = " +
                         std::to_string(value) + " must be >= 1");
}

/// The packed lengths' offsets: both given, batch + 1 each, from 0, never decreasing, no sequence longer than
/// q_len (kv_len), and neither with kv_lens nor a paged cache.
void validate_cu_seqlens(const AttentionProblem& p) {
  const auto check = [&](const char* name, const std::vector<int>& offsets, int longest, const char* limit) {
    if (offsets.size() != std::size_t(p.batch) + 1)
      throw InvalidProblem(std::string("attention problem: ") + name + " has " + std::to_string(offsets.size()) +
                           " entries; batch = " + std::to_string(p.batch) + " needs batch + 1 = " +
                           std::to_string(p.batch + 1) + " offsets (0, then where each sequence ends)");
    if (offsets[0] != 0)
      throw InvalidProblem(std::string("attention problem: ") + name + "[0] = " + std::to_string(offsets[0]) +
                           " must be 0 (the first sequence starts at the packed tensor's first row)");
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      const std::int64_t len = std::int64_t(offsets[b + 1]) - offsets[b];
      if (len < 0 || len > longest)
        throw InvalidProblem(std::string("attention problem: ") + name + "[" + std::to_string(b + 1) + "] - " +
                             name + "[" + std::to_string(b) + "] = " + std::to_string(len) +
                             ": sequence " + std::to_string(b) + "'s length must be 0 .. " + limit + " = " +
                             std::to_string(longest) + " (offsets never decrease; " + limit +
                             " is the longest sequence's length, FlashAttention's max_seqlen)");
    }
  };
  if (p.cu_seqlens_q.empty() || p.cu_seqlens_k.empty())
    throw InvalidProblem(std::string("attention problem: cu_seqlens_") + (p.cu_seqlens_q.empty() ? "k" : "q") +
                         " is given without cu_seqlens_" + (p.cu_seqlens_q.empty() ? "q" : "k") +
                         ": packed variable lengths need both offsets (equal for self-attention)");
  check("cu_seqlens_q", p.cu_seqlens_q, p.q_len, "q_len");
  check("cu_seqlens_k", p.cu_seqlens_k, p.kv_len, "kv_len");
  for (const auto& [name, offsets] : {std::pair<const char*, const std::vector<int>*>{"cu_seqlens_q", &p.cu_seqlens_q},
                                      {"cu_seqlens_k", &p.cu_seqlens_k}})
    if (offsets->back() == 0)
      throw InvalidProblem(std::string("attention problem: ") + name + "[batch] = 0: the pack holds no " +
                           (name[11] == 'q' ? "query rows" : "keys") + " (Q and K each need at least one row; a "
                           "sequence of its own may be empty)");
  if (!p.kv_lens.empty())
    throw InvalidProblem("attention problem: kv_lens with cu_seqlens: packed sequences have their lengths in "
                         "cu_seqlens_k already; give one or the other");
  if (p.page_size != 0)
    throw InvalidProblem("attention problem: page_size = " + std::to_string(p.page_size) +
                         " with cu_seqlens: packed sequences are contiguous rows of K and V (page_size = 0)");
}
}  // namespace

void validate(const AttentionProblem& p) {
  require_positive("batch", p.batch);
  require_positive("q_len", p.q_len);
  require_positive("kv_len", p.kv_len);
  require_positive("q_heads", p.q_heads);
  require_positive("kv_heads", p.kv_heads);
  require_positive("head_dim", p.head_dim);
  if (p.q_heads % p.kv_heads != 0)
    throw InvalidProblem("attention problem: q_heads = " + std::to_string(p.q_heads) +
                         " is not a multiple of kv_heads = " + std::to_string(p.kv_heads));
  if (p.window_left < -1 || p.window_right < -1)
    throw InvalidProblem("attention problem: window = (" + std::to_string(p.window_left) + ", " +
                         std::to_string(p.window_right) + ") needs each side >= 0 keys, or -1 for no bound");
  if (p.causal_align == CausalAlign::bottom_right && !p.causal && !p.windowed())
    throw InvalidProblem("attention problem: causal_align = bottom-right needs causal = true or a window (it says "
                         "where the mask's diagonal sits)");
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap))
    throw InvalidProblem("attention problem: softcap = " + std::to_string(p.softcap) +
                         " must be finite and >= 0 (0: no soft-capping)");
  if (!p.kv_lens.empty()) {
    if (p.kv_lens.size() != std::size_t(p.batch))
      throw InvalidProblem("attention problem: kv_lens has " + std::to_string(p.kv_lens.size()) +
                           " entries; batch = " + std::to_string(p.batch) + " needs one per sequence");
    for (std::size_t b = 0; b < p.kv_lens.size(); ++b)
      if (p.kv_lens[b] < 0 || p.kv_lens[b] > p.kv_len) throw InvalidProblem(kv_len_fault(int(b), p.kv_lens[b], p.kv_len));
  }
  if (p.varlen() || !p.cu_seqlens_k.empty()) validate_cu_seqlens(p);
  if (p.page_size < 0)
    throw InvalidProblem("attention problem: page_size = " + std::to_string(p.page_size) +
                         " must be >= 0 (0: contiguous K and V)");
  if (p.page_size == 0 && p.pages != 0)
    throw InvalidProblem("attention problem: pages = " + std::to_string(p.pages) +
                         " needs page_size > 0 (a paged cache); contiguous K and V have pages = 0");
  if (p.page_size > 0) {
    if (p.kv_len % p.page_size != 0)
      throw InvalidProblem("attention problem: kv_len = " + std::to_string(p.kv_len) +
                           " is not a multiple of page_size = " + std::to_string(p.page_size) +
                           " (a paged cache holds kv_len / page_size whole pages per sequence)");
    require_positive("pages", p.pages);
  }
  if (p.scale && !std::isfinite(*p.scale))
    throw InvalidProblem("attention problem: scale = " + std::to_string(*p.scale) +
                         " must be finite");
  // Kernels add a 64-bit offset per (batch, head) and index inside one sequence with 32-bit offsets
  // (row * heads * head_dim + column): one sequence of Q (or O) and of K (or V) must stay below 2^31
  // elements. The batch, and so the whole problem, may be larger.
  constexpr std::int64_t kMaxElements = std::numeric_limits<std::int32_t>::max();
  const std::int64_t q_sequence = std::int64_t(p.q_len) * p.q_heads * p.head_dim;
  const std::int64_t kv_sequence = std::int64_t(p.kv_len) * p.kv_heads * p.head_dim;
  if (q_sequence > kMaxElements)
    throw InvalidProblem("attention problem: one sequence of Q has q_len * q_heads * head_dim = " +
                         std::to_string(q_sequence) + " elements; at most 2^31-1 are supported " +
                         "(steps index within a sequence with 32-bit offsets; the batch may be any size)");
  if (kv_sequence > kMaxElements)
    throw InvalidProblem("attention problem: one sequence of K/V has kv_len * kv_heads * head_dim = " +
                         std::to_string(kv_sequence) + " elements; at most 2^31-1 are supported " +
                         "(steps index within a sequence with 32-bit offsets; the batch may be any size)");
}

std::string kv_len_fault(int sequence, int value, int kv_len) {
  return "attention problem: kv_lens[" + std::to_string(sequence) + "] = " + std::to_string(value) +
         " is outside 0 .. kv_len = " + std::to_string(kv_len) + " (kv_len is the cache's capacity per sequence)";
}

std::string page_fault(int sequence, int index, int value, int pages) {
  return "attention problem: page_table[" + std::to_string(sequence) + "][" + std::to_string(index) + "] = " +
         std::to_string(value) + " is outside the pool's pages 0 .. " + std::to_string(pages - 1) +
         " (sequence " + std::to_string(sequence) + "'s length reaches that page, so it must be in the pool)";
}

std::string cache_fault_message(const int record[4]) {
  const int sequence = record[0] / 4;
  switch (static_cast<CacheFault>(record[0] % 4)) {
    case CacheFault::none: return "";
    case CacheFault::length: return kv_len_fault(sequence, record[2], record[3]);
    case CacheFault::page: return page_fault(sequence, record[1], record[2], record[3]);
  }
  return "attention problem: an unknown cache fault record {" + std::to_string(record[0]) + ", " +
         std::to_string(record[1]) + ", " + std::to_string(record[2]) + ", " + std::to_string(record[3]) + "}";
}

void validate_page_table(const AttentionProblem& p, const std::vector<int>& table) {
  if (std::int64_t(table.size()) != std::int64_t(p.batch) * p.pages_per_sequence())
    throw InvalidProblem("attention problem: the page table has " + std::to_string(table.size()) + " entries; " +
                         p.describe() + " needs batch x kv_len / page_size = " +
                         std::to_string(std::int64_t(p.batch) * p.pages_per_sequence()));
  for (int b = 0; b < p.batch; ++b) {
    const int reached = (p.kv_len_of(b) + p.page_size - 1) / p.page_size;  // pages holding the sequence's keys
    for (int i = 0; i < reached; ++i) {
      const int entry = table[std::size_t(b) * p.pages_per_sequence() + i];
      if (entry < 0 || entry >= p.pages) throw InvalidProblem(page_fault(b, i, entry, p.pages));
    }
  }
}

bool takes_cache_forms(const AttentionProblem& p, const CacheForms& takes) {
  return (p.kv_lens.empty() || takes.kv_lens) && (!p.paged() || takes.paged) &&
         (!((p.causal || p.windowed()) && p.causal_align == CausalAlign::bottom_right) || takes.bottom_right) &&
         (takes.max_q_len == 0 || p.q_len <= takes.max_q_len);
}

void refuse_cache_forms(const char* step, const AttentionProblem& p, const CacheForms& takes) {
  const std::string others = " (fa-bench --list shows the steps that take a KV cache's forms)";
  if (!p.kv_lens.empty() && !takes.kv_lens)
    throw_unsupported(step, "kv_lens", std::to_string(p.kv_lens.size()) + " per-sequence lengths",
                      "one kv_len for every sequence" + others);
  if (p.paged() && !takes.paged)
    throw_unsupported(step, "page_size", std::to_string(p.page_size),
                      "0 (K and V contiguous, [batch, kv_len, kv_heads, head_dim])" + others);
  // The alignment places the causal diagonal and a window's alike: a step that aligns at the first key would
  // compute a bottom-right window at the wrong keys, so it refuses one as it refuses the bottom-right causal mask.
  if ((p.causal || p.windowed()) && p.causal_align == CausalAlign::bottom_right && !takes.bottom_right)
    throw_unsupported(step, "causal_align", to_string(p.causal_align), "top-left" + others);
  if (takes.max_q_len > 0 && p.q_len > takes.max_q_len)
    throw_unsupported(step, "q_len", std::to_string(p.q_len),
                      "1 .. " + std::to_string(takes.max_q_len) +
                          " new tokens per sequence (a decode step; the forward steps take long query sequences)");
}

bool takes_features(const AttentionProblem& p, const Features& takes) {
  return (!p.windowed() || takes.window) && (p.softcap == 0.f || takes.softcap) && (!p.sinks || takes.sinks) &&
         (!p.varlen() || takes.varlen);
}

void refuse_features(const char* step, const AttentionProblem& p, const Features& takes) {
  const std::string none = " (fa-bench --list shows the steps that take the models' features)";
  if (p.windowed() && !takes.window)
    throw_unsupported(step, "window", "(" + std::to_string(p.window_left) + ", " +
                                          std::to_string(p.causal ? 0 : p.window_right) + ")",
                      "(-1, -1), no window" + none);
  if (p.softcap != 0.f && !takes.softcap)
    throw_unsupported(step, "softcap", std::to_string(p.softcap), "0, no soft-capping" + none);
  if (p.sinks && !takes.sinks) throw_unsupported(step, "sinks", "on", "off" + none);
  if (p.varlen() && !takes.varlen)
    throw_unsupported(step, "cu_seqlens", std::to_string(p.batch) + " packed sequences of their own lengths",
                      "none: every sequence q_len rows and kv_len keys, [batch, seq, heads, head_dim]" + none);
}

void throw_unsupported(const char* step, const char* field, const std::string& value,
                       const std::string& supported) {
  throw InvalidProblem(std::string(step) + ": " + field + " = " + value +
                       " is not supported; supported: " + supported);
}

}  // namespace fa
