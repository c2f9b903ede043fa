#include "harness.hpp"

#include "fa/cuda_check.hpp"
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fa::test {
namespace {

/// A problem of the given sizes (scale: 0 means the default 1/sqrt(d)).
AttentionProblem problem(int batch, int q_len, int kv_len, int q_heads, int kv_heads, int head_dim, float scale = 0) {
  AttentionProblem p;
  p.batch = batch, p.q_len = q_len, p.kv_len = kv_len, p.q_heads = q_heads, p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  if (scale != 0) p.scale = scale;
  return p;
}

/// Every dtype in `dtypes`, causal off and on (or off only), of one case.
void add(std::vector<Case>& out, const std::string& name, AttentionProblem p, InputKind kind,
         const std::vector<DType>& dtypes, bool both_masks, int max_len) {
  if (max_len > 0 && (p.q_len > max_len || p.kv_len > max_len)) return;
  for (DType dtype : dtypes)
    for (bool causal : {false, true}) {
      if (causal && !both_masks) continue;
      p.dtype = dtype, p.causal = causal;
      out.push_back({name, p, kind});
    }
}

/// Index of element (b, s, head, c) of a [batch, seq, heads, d] tensor.
std::int64_t at(const AttentionProblem& p, int b, int s, int len, int heads, int head, int c) {
  return ((std::int64_t(b) * len + s) * heads + head) * p.head_dim + c;
}

}  // namespace

std::string Case::describe() const { return name + ": " + problem.describe(); }

std::vector<Case> shape_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len) {
  std::vector<Case> out;
  if (head_dims.empty()) return out;
  // The table's head_dim: 64 where it is asked for, else the first one asked for (a step without d = 64).
  const int d0 = std::find(head_dims.begin(), head_dims.end(), 64) != head_dims.end() ? 64 : head_dims.front();
  auto shape = [&](const char* name, AttentionProblem p) { add(out, name, p, InputKind::uniform, dtypes, true, max_len); };
  shape("the smallest problem", problem(1, 1, 1, 1, 1, d0));
  shape("shorter than any tile", problem(2, 7, 7, 2, 2, d0));
  shape("GQA 8/2, a length no tile divides", problem(1, 100, 100, 8, 2, d0));
  shape("MQA 8/1, many tiles", problem(1, 1000, 1000, 8, 1, d0));
  shape("q_len > kv_len", problem(2, 100, 37, 4, 4, d0));
  shape("q_len < kv_len", problem(1, 33, 257, 4, 2, d0));
  shape("a single key", problem(1, 50, 1, 2, 1, d0));
  shape("custom scale, batch 3", problem(3, 129, 65, 2, 1, d0, 0.3f));
  // A negative scale is valid: the smallest q.k weigh most, and max(scale x) is scale times min(x).
  shape("negative scale: the smallest scores weigh most", problem(1, 129, 200, 2, 1, d0, -0.25f));
  // 160 query tiles of 128 rows, more than an H100's 132 SMs: a persistent grid's blocks take several
  // work tiles each, of five K/V tiles of 128 keys, and must start each afresh.
  shape("more query tiles than SMs, GQA 40/8", problem(2, 129, 600, 40, 8, d0));
  // A few query rows over many keys: the size of a decode step (which takes at most a few new tokens).
  shape("a few query rows over many keys", problem(2, 5, 700, 8, 2, d0));
  // The KV-cache forms (problem.hpp), run only by the steps that take them (supported_by): one query per sequence
  // over per-sequence lengths, a paged cache with its pages in a shuffled order, lengths no page or tile divides,
  // and q_len > 1 new tokens under the bottom-right causal mask, one sequence shorter than them (its first rows
  // see no key: O = 0, LSE = -inf).
  auto cache = [&](const std::string& name, AttentionProblem p, std::vector<int> lens, int page_size, bool speculative,
                   InputKind kind = InputKind::uniform) {
    if (max_len > 0 && (p.q_len > max_len || p.kv_len > max_len)) return;
    p.kv_lens = std::move(lens);
    if (page_size > 0) p.page_size = page_size, p.pages = p.batch * (p.kv_len / page_size) + 3;  // 3 never used
    p.causal = speculative;
    p.causal_align = speculative ? CausalAlign::bottom_right : CausalAlign::top_left;
    for (DType dtype : dtypes) {
      p.dtype = dtype;
      out.push_back({name, p, kind});
    }
  };
  cache("decode: per-sequence lengths, one a single key, GQA 32/8", problem(4, 1, 300, 32, 8, d0), {300, 1, 77, 255},
        0, false);
  cache("decode: a paged cache (pages of 64, shuffled), lengths no page divides", problem(3, 1, 256, 8, 2, d0),
        {256, 65, 1}, 64, false);
  cache("decode: a paged cache of one page a sequence, MQA", problem(2, 1, 64, 4, 1, d0), {64, 13}, 64, false);
  cache("speculative: 4 new tokens, bottom-right causal, paged (16), one sequence shorter than them",
        problem(2, 4, 208, 8, 2, d0), {200, 3}, 16, true);
  cache("decode: 16411 keys and 9000 in one batch, GQA 8/2", problem(2, 1, 16411, 8, 2, d0), {16411, 9000}, 0,
        false);
  cache("decode: MQA 16/1, per-sequence lengths", problem(3, 1, 700, 16, 1, d0), {700, 3, 350}, 0, false);
  cache("speculative: 3 new tokens, bottom-right causal, contiguous, one sequence of 2 keys",
        problem(3, 3, 500, 8, 2, d0), {500, 2, 129}, 0, true);
  // Every count of new tokens a decode step takes (kMaxQueries = 8), without the mask and bottom-right: a kernel
  // chosen by the count of rows (1, 2, 4, 8 at a time) meets each of its choices, and with one query head a KV head
  // (4/4) the rows are the tokens alone. One sequence has n / 2 keys (none for one token): rows that see nothing.
  for (int n = 1; n <= 8; ++n) {
    for (bool masked : {false, true}) {
      const std::string what = std::to_string(n) + (n == 1 ? " new token" : " new tokens") +
                               (masked ? ", bottom-right causal" : ", no mask");
      cache("decode: " + what + ", MHA 4/4, per-sequence lengths", problem(3, n, 300, 4, 4, d0), {300, n / 2, 77}, 0,
            masked);
      cache("decode: " + what + ", GQA 8/2, paged (16)", problem(2, n, 320, 8, 2, d0), {320, 129}, 16, masked);
    }
  }
  // More (query head, new token) pairs a KV head than 16: GQA 32/8 with 8 new tokens (32 rows, both of a block's row
  // tiles full in step 47), and MQA 8/1 with 5 and 8 (40 and 64 rows: a second block of 32, partly filled).
  cache("speculative: 8 new tokens, GQA 32/8 (32 rows a KV head), bottom-right causal, paged (16)",
        problem(2, 8, 304, 32, 8, d0), {300, 5}, 16, true);
  cache("speculative: 5 new tokens, MQA 8/1 (40 rows a KV head), no mask", problem(2, 5, 500, 8, 1, d0), {500, 77}, 0,
        false);
  cache("speculative: 8 new tokens, MQA 8/1 (64 rows a KV head), bottom-right causal", problem(2, 8, 400, 8, 1, d0),
        {400, 3}, 0, true);
  // Many short paged sequences: more (sequence, KV head) units than any GPU has SMs, where step 48 keeps two 4-warp
  // blocks an SM at d = 64 (fewer units take its wide block of 8 warps); one new token and 8 (two row tiles), lengths
  // from 0 to 96 that pages of 16 mostly do not divide.
  std::vector<int> short_lens(36);
  for (int i = 0; i < 36; ++i) short_lens[i] = i * 37 % 97;
  cache("decode: many short paged sequences (36 x 8 KV heads), pages of 16", problem(36, 1, 96, 16, 8, d0), short_lens,
        16, false);
  cache("speculative: 8 new tokens, many short paged sequences (36 x 8 KV heads), bottom-right causal, pages of 16",
        problem(36, 8, 96, 32, 8, d0), short_lens, 16, true);
  // Sequences of no keys among long ones: every split of theirs is empty, and the long ones need several splits
  // (contiguous and paged).
  cache("decode: zero-length sequences among long ones (several splits)", problem(4, 1, 20000, 8, 2, d0),
        {20000, 0, 9000, 0}, 0, false);
  cache("decode: zero-length sequences among long ones, paged (64)", problem(4, 1, 20480, 8, 2, d0),
        {0, 20480, 0, 9001}, 64, false);
  // Pages shorter than a lane group's walk step and of sizes no power of two (1, 4, 12, 48), over enough keys that
  // several splits run, each starting mid-page.
  for (int page : {1, 4, 12, 48})
    cache("decode: pages of " + std::to_string(page) + ", splits starting mid-page", problem(2, 1, 4800, 8, 2, d0),
          {4800, 1237}, page, false);
  // Every score about -1000 (the LSE too): a running maximum that starts at 0 instead of -inf underflows every
  // weight to 0. Contiguous and paged, over several splits.
  cache("decode: -1000 on every score, over several splits", problem(3, 1, 5000, 8, 2, d0), {5000, 3001, 1}, 0, false,
        InputKind::offset_minus_1000);
  cache("decode: -1000 on every score, 4 new tokens, bottom-right, paged (16)", problem(2, 4, 2048, 8, 2, d0),
        {2048, 700}, 16, true, InputKind::offset_minus_1000);
  // Sliding windows (FlashAttention's window_size = (left, right), top-left aligned; with the causal mask the
  // right side is 0), run only by the steps that take them: a window smaller than a tile, one larger than the
  // sequence, asymmetric ones, one key (the row's own), the left side alone where late rows see no key (O = 0,
  // LSE = -inf), and a window over many tiles with more query tiles than SMs.
  auto window = [&](const std::string& name, AttentionProblem p, int left, int right) {
    p.window_left = left, p.window_right = right;
    add(out, "window (" + std::to_string(left) + ", " + std::to_string(right) + "): " + name, p, InputKind::uniform,
        dtypes, true, max_len);
  };
  window("smaller than a tile", problem(1, 300, 300, 4, 2, d0), 16, 16);
  window("larger than the sequence", problem(2, 100, 100, 4, 4, d0), 500, 500);
  window("asymmetric, q_len < kv_len", problem(1, 200, 700, 8, 2, d0), 100, 3);
  window("the row's own key", problem(1, 130, 130, 2, 2, d0), 0, 0);
  window("the right side alone", problem(1, 257, 257, 2, 1, d0), -1, 5);
  window("the left side alone, q_len > kv_len: late rows see no key", problem(1, 300, 100, 2, 1, d0), 50, -1);
  window("many tiles, more query tiles than SMs, GQA 16/4", problem(2, 1100, 1100, 16, 4, d0), 257, 129);
  // Logit soft-capping (Gemma 2), run only by the steps that take it: a cap the scores never reach, one wide scores
  // saturate (scores of tens against a cap of 5: the tanh's flat ends), and a cap with a window (Gemma 2's local
  // layers).
  auto softcap = [&](const std::string& name, AttentionProblem p, float cap, InputKind kind, int left = -1) {
    p.softcap = cap, p.window_left = left;
    add(out, "softcap " + std::to_string(int(cap)) + ": " + name, p, kind, dtypes, true, max_len);
  };
  softcap("scores far below it", problem(2, 129, 129, 4, 4, d0), 30.f, InputKind::uniform);
  softcap("wide scores saturate it", problem(1, 200, 300, 4, 2, d0), 5.f, InputKind::wide_10);
  softcap("with a window of 64", problem(1, 300, 300, 4, 2, d0), 20.f, InputKind::wide_10, 64);
  // Attention sinks (gpt-oss), run only by the steps that take them: random sink logits, sinks that outweigh every
  // row's keys (O some 50 times smaller than without: a sink of 6 + ln(kv_len) would make early causal rows' O f16
  // subnormals, which no f16 kernel rounds within the row bound; notebook 51), and sinks with a window whose late
  // rows see no key (O = 0, and the LSE is the sink's logit).
  auto sink = [&](const std::string& name, AttentionProblem p, InputKind kind, int left = -1) {
    p.sinks = true, p.window_left = left;
    add(out, "sinks: " + name, p, kind, dtypes, true, max_len);
  };
  sink("random logits", problem(2, 129, 200, 4, 2, d0), InputKind::uniform);
  sink("a sink that outweighs every row's keys", problem(1, 100, 300, 4, 4, d0), InputKind::dominant_sink);
  sink("with a window of 32, q_len > kv_len: late rows see only the sink", problem(1, 300, 100, 2, 1, d0),
       InputKind::uniform, 32);
  // Packed variable lengths (FlashAttention's varlen: cu_seqlens_q and cu_seqlens_k), run only by the steps that take
  // them: lengths 1 and a tile of 128 keys' worth minus one, exactly and plus one; one long sequence among short
  // ones; a sequence of no rows, one of no keys (its rows: O = 0, LSE = -inf) and more keys than rows; and packs
  // with a window, a cap and sinks. q_len and kv_len are the longest sequence's, as FlashAttention's max_seqlen.
  auto packed = [](AttentionProblem p, const std::vector<int>& q_lens, const std::vector<int>& k_lens) {
    p.batch = int(q_lens.size());
    p.cu_seqlens_q = {0}, p.cu_seqlens_k = {0};
    for (std::size_t b = 0; b < q_lens.size(); ++b) {
      p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + q_lens[b]);
      p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + k_lens[b]);
    }
    p.q_len = std::max(1, *std::max_element(q_lens.begin(), q_lens.end()));
    p.kv_len = std::max(1, *std::max_element(k_lens.begin(), k_lens.end()));
    return p;
  };
  auto pack = [&](const std::string& name, AttentionProblem p, const std::vector<int>& q_lens,
                  const std::vector<int>& k_lens) {
    add(out, "varlen: " + name, packed(p, q_lens, k_lens), InputKind::uniform, dtypes, true, max_len);
  };
  pack("lengths 1, 127, 128, 129, 300, GQA 8/2", problem(1, 1, 1, 8, 2, d0), {1, 127, 128, 129, 300},
       {1, 127, 128, 129, 300});
  pack("one long sequence among short ones, MQA 8/1", problem(1, 1, 1, 8, 1, d0), {5, 1, 3000, 2, 17},
       {5, 1, 3000, 2, 17});
  pack("no rows, no keys, more keys than rows", problem(1, 1, 1, 4, 2, d0), {100, 0, 37, 64}, {257, 5, 0, 64});
  {
    AttentionProblem windowed = problem(1, 1, 1, 4, 2, d0);
    windowed.window_left = 64;
    pack("with a window (64, 0)", windowed, {300, 1, 200}, {300, 1, 200});
    AttentionProblem capped = problem(1, 1, 1, 4, 2, d0);
    capped.softcap = 30.f, capped.sinks = true;
    pack("with a cap of 30 and sinks", capped, {129, 77, 1}, {129, 77, 1});
  }
  // The causal mask's diagonal at the last key (FlashAttention's alignment when q_len != kv_len: row i of a sequence
  // sees keys j <= kv_len - q_len + i), run only by the steps that take it and any q_len (steps 60, 61; the decode
  // steps take at most 8 rows): a chunk of a prompt over a cached prefix (q_len < kv_len), a chunk of one work tile
  // over many K/V tiles, q_len > kv_len (the first q_len - kv_len rows see no key: O = 0, LSE = -inf, dQ = 0; a
  // work tile of such rows alone has no K/V tile), q_len = kv_len (the same as top-left), GQA and MQA, a window
  // aligned bottom-right, sinks beside rows that see no key (LSE = the sink), and packs where each sequence has its
  // own offset kv_len - q_len, the longest ones' (the pack's q_len and kv_len) none of theirs: sequences of no rows and
  // no keys, q_len > kv_len, equal, fewer rows than keys.
  // right >= 0: a window (left, right) without the mask (FlashAttention's causal=False, window_size=(left, right)),
  // its diagonal at the last key all the same.
  auto bottom_right = [&](const std::string& name, AttentionProblem p, int left = -1, bool sinks = false,
                          int right = -1) {
    if (max_len > 0 && (p.q_len > max_len || p.kv_len > max_len)) return;
    p.causal = right < 0, p.causal_align = CausalAlign::bottom_right, p.window_left = left, p.sinks = sinks;
    p.window_right = right;
    for (DType dtype : dtypes) {
      p.dtype = dtype;
      out.push_back({(p.causal ? "bottom-right causal: " : "bottom-right window: ") + name, p, InputKind::uniform});
    }
  };
  auto bottom_right_pack = [&](const std::string& name, AttentionProblem p, const std::vector<int>& q_lens,
                               const std::vector<int>& k_lens, int left = -1) {
    bottom_right("varlen: " + name, packed(p, q_lens, k_lens), left);
  };
  bottom_right("a chunk of 300 rows over 1000 keys (a prompt over its cached prefix), GQA 8/2",
               problem(2, 300, 1000, 8, 2, d0));
  bottom_right("one work tile of 128 rows over 4099 keys, MHA 4/4", problem(1, 128, 4099, 4, 4, d0));
  bottom_right("q_len > kv_len: the first 200 of 300 rows see no key, MQA 8/1", problem(1, 300, 100, 8, 1, d0));
  // Keys in whole K/V tiles (of 64 or 128 keys) under more rows: a tile's test for its unmasked copy must be made under
  // the same alignment, or a Q tile whose first rows see no key (LSE = -inf) takes it and P = exp(S - LSE) is inf.
  bottom_right("q_len > kv_len over whole K/V tiles: 400 rows over 256 keys, GQA 4/2", problem(1, 400, 256, 4, 2, d0));
  bottom_right("q_len = kv_len: the same as top-left", problem(1, 257, 257, 4, 2, d0));
  bottom_right("a window (64, 0) at the last key, 200 rows over 700 keys", problem(1, 200, 700, 8, 2, d0), 64);
  bottom_right("a window (50, 0), q_len > kv_len: the first 200 rows see no key", problem(1, 300, 100, 2, 1, d0), 50);
  bottom_right("sinks, q_len > kv_len: the rows that see no key have the sink's LSE", problem(1, 300, 100, 4, 2, d0),
               -1, true);
  bottom_right("(40, 17) without the mask, 200 rows over 700 keys, GQA 8/2", problem(1, 200, 700, 8, 2, d0), 40, false,
               17);
  bottom_right("(30, 50) without the mask, q_len > kv_len: its right side reaches past the last key, and the first 150 "
               "rows see no key", problem(1, 300, 100, 4, 2, d0), 30, false, 50);
  bottom_right_pack("no rows, no keys, q_len > kv_len, equal, fewer rows than keys, GQA 8/2",
                    problem(1, 1, 1, 8, 2, d0), {300, 1, 0, 100, 129, 64, 5}, {1000, 5, 7, 37, 129, 0, 300});
  bottom_right_pack("a window (32, 0), each sequence's own diagonal", problem(1, 1, 1, 4, 2, d0), {200, 50, 300, 1},
                    {700, 50, 100, 1}, 32);
  // The models' features in decode (step 59), run only by the steps that take a KV cache's forms and the feature:
  // windows smaller than a page, starting mid-page, covering only the new tokens, with several new tokens (two row
  // tiles), larger than the sequence; sequences shorter than the window or of no keys; caps of 5 saturated by wide
  // scores; sinks that outweigh the keys over several splits (a sink counted per split shows) and beside rows that
  // see no key; all three at once. A window is aligned bottom-right, as FlashAttention's decode (new token i sits at
  // key kv_len - q_len + i). K and V rows before the first key a sequence's rows see are NaN (prepare()): a kernel
  // that reads a tile, page or split outside the window fails, not only one that weighs it.
  // right >= 0: a window (left, right) without the mask, its diagonal at the last key all the same.
  auto decode_feature = [&](const std::string& name, AttentionProblem p, std::vector<int> lens, int page_size,
                            int left, float cap, bool sinks, InputKind kind = InputKind::uniform, int right = -1) {
    p.window_left = left, p.window_right = right, p.softcap = cap, p.sinks = sinks;
    const std::size_t before = out.size();
    cache("decode features: " + name, p, std::move(lens), page_size, left >= 0 || p.q_len > 1, kind);
    for (std::size_t i = before; i < out.size(); ++i) {
      out[i].forward_only = true;  // inference has no backward
      if (right >= 0) out[i].problem.causal = false;
    }
  };
  decode_feature("window (5, 0) smaller than a page, paged (16), a sequence shorter than the window",
                 problem(3, 1, 4800, 8, 2, d0), {4800, 1237, 3}, 16, 5, 0.f, false);
  decode_feature("window (100, 0) starting mid-page, paged (64), several splits", problem(2, 1, 4800, 8, 2, d0),
                 {4800, 4700}, 64, 100, 0.f, false);
  decode_feature("window (1000, 0) over several splits, contiguous, sequences of no keys and shorter than it",
                 problem(4, 1, 6000, 8, 2, d0), {6000, 0, 999, 5000}, 0, 1000, 0.f, false);
  decode_feature("window (0, 0): each of 4 new tokens sees its own key alone, paged (16)",
                 problem(2, 4, 320, 8, 2, d0), {320, 130}, 16, 0, 0.f, false);
  decode_feature("window (3, 0): the last of 4 new tokens sees the new tokens alone, contiguous",
                 problem(2, 4, 500, 8, 2, d0), {500, 2}, 0, 3, 0.f, false);
  decode_feature("window (37, 0), 8 new tokens, GQA 32/8 (two row tiles), paged (16)", problem(2, 8, 1024, 32, 8, d0),
                 {1024, 41}, 16, 37, 0.f, false);
  decode_feature("window (300, 0) larger than the sequences, 5 new tokens, MQA 8/1, paged (64)",
                 problem(3, 5, 256, 8, 1, d0), {256, 100, 4}, 64, 300, 0.f, false);
  decode_feature("window (50, 10) without the mask, 3 new tokens: its right side past the last key, paged (16)",
                 problem(2, 3, 704, 8, 2, d0), {700, 40}, 16, 50, 0.f, false, InputKind::uniform, 10);
  decode_feature("cap of 5 saturated by wide scores, several splits, contiguous", problem(3, 1, 3000, 8, 2, d0),
                 {3000, 1500, 1}, 0, -1, 5.f, false, InputKind::wide_10);
  decode_feature("cap of 5 with a window (200, 0), 3 new tokens, paged (64)", problem(2, 3, 2048, 8, 2, d0),
                 {2048, 777}, 64, 200, 5.f, false, InputKind::wide_10);
  decode_feature("sinks that outweigh the keys, several splits, contiguous", problem(2, 1, 5000, 8, 2, d0),
                 {5000, 4000}, 0, -1, 0.f, true, InputKind::dominant_sink);
  decode_feature("sinks that outweigh the keys, 4 new tokens, several splits, paged (16)",
                 problem(2, 4, 4096, 8, 2, d0), {4096, 3000}, 16, -1, 0.f, true, InputKind::dominant_sink);
  decode_feature("sinks, random logits, a sequence of no keys (O = 0, LSE = the sink), several splits",
                 problem(3, 1, 5000, 8, 2, d0), {5000, 0, 3001}, 0, -1, 0.f, true);
  decode_feature("sinks with a window (64, 0), one split, paged (16)", problem(2, 2, 1024, 8, 2, d0), {1024, 10}, 16,
                 64, 0.f, true);
  decode_feature("window (1024, 0), cap of 50 and sinks, GQA 32/8, paged (16)", problem(2, 1, 8192, 32, 8, d0),
                 {8192, 3000}, 16, 1024, 50.f, true);
  decode_feature("window (1024, 0), cap of 50 and sinks, 4 new tokens, contiguous", problem(2, 4, 8192, 32, 8, d0),
                 {8192, 1100}, 0, 1024, 50.f, true);
  for (int d : std::set<int>(head_dims.begin(), head_dims.end())) {
    if (d == d0) continue;
    shape("another head_dim", problem(2, 77, 77, 4, 2, d));
    shape("another head_dim, MQA, q_len > kv_len", problem(1, 300, 129, 8, 1, d));
    shape("another head_dim, more query tiles than SMs", problem(2, 129, 300, 40, 8, d));
    cache("another head_dim: decode over per-sequence lengths, GQA 32/8", problem(4, 1, 1000, 32, 8, d),
          {1000, 1, 333, 517}, 0, false);
    cache("another head_dim: speculative, 5 new tokens, bottom-right causal, paged (64)", problem(2, 5, 1024, 8, 2, d),
          {1000, 4}, 64, true);
    bottom_right("another head_dim: a chunk of 300 rows over 1000 keys, GQA 8/2", problem(1, 300, 1000, 8, 2, d));
    bottom_right("another head_dim: q_len > kv_len, MQA 8/1", problem(1, 300, 129, 8, 1, d));
  }
  // A head_dim above 128 (step 57's 256) takes K/V tiles of its own width (80 keys) in its own count of stages (2),
  // and is asked for by the steps with every model feature: the features and packs at it too, a window smaller than
  // a tile, a cap that saturates, sinks, lengths 1 and 77 and about a tile of 80 keys (79, 80, 81, 161) and 300.
  for (int d : std::set<int>(head_dims.begin(), head_dims.end())) {
    if (d <= 128) continue;
    shape("another head_dim: the smallest problem", problem(1, 1, 1, 1, 1, d));
    window("another head_dim: smaller than a tile", problem(1, 300, 300, 4, 2, d), 16, 16);
    window("another head_dim: asymmetric, q_len < kv_len", problem(1, 200, 700, 8, 2, d), 100, 3);
    softcap("another head_dim: wide scores saturate it", problem(1, 200, 300, 4, 2, d), 5.f, InputKind::wide_10);
    sink("another head_dim: random logits", problem(2, 129, 200, 4, 2, d), InputKind::uniform);
    pack("another head_dim: lengths 1, 77, 79, 80, 81, 161, 300, GQA 8/2", problem(1, 1, 1, 8, 2, d),
         {1, 77, 79, 80, 81, 161, 300}, {1, 77, 79, 80, 81, 161, 300});
    AttentionProblem all = problem(1, 1, 1, 4, 2, d);
    all.window_left = 64, all.softcap = 30.f, all.sinks = true;
    pack("another head_dim: a window (64, 0), a cap of 30 and sinks, more keys than rows", all, {300, 1, 129},
         {300, 1, 200});
    // Step 58's backward at 256 takes K/V tiles of 64 keys: lengths about one and two of them.
    pack("another head_dim: lengths 63, 64, 65, 128, 129, GQA 8/2", problem(1, 1, 1, 8, 2, d), {63, 64, 65, 128, 129},
         {65, 63, 129, 64, 128});
    // Bottom-right about step 57's 80-key tiles and step 58's 64: each sequence's own diagonal.
    bottom_right_pack("another head_dim: lengths about a K/V tile, no keys, q_len > kv_len", problem(1, 1, 1, 8, 2, d),
                      {1, 81, 200, 64, 0, 65}, {80, 161, 79, 0, 3, 129});
  }
  // Only the head_dims asked for.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [&](const Case& c) {
                             return std::find(head_dims.begin(), head_dims.end(), c.problem.head_dim) ==
                                    head_dims.end();
                           }),
            out.end());
  return out;
}

std::vector<Case> stress_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len) {
  std::vector<Case> out;
  if (head_dims.empty()) return out;
  const int d = std::find(head_dims.begin(), head_dims.end(), 64) != head_dims.end() ? 64 : head_dims.front();
  auto stress = [&](const char* name, AttentionProblem p, InputKind kind, bool both_masks = true) {
    add(out, name, p, kind, dtypes, both_masks, max_len);
  };
  stress("logits of standard deviation 10", problem(2, 300, 300, 4, 2, d), InputKind::wide_10);
  stress("logits of standard deviation 30", problem(2, 300, 300, 4, 2, d), InputKind::wide_30);
  stress("+1000 on every score of a row (softmax is shift-invariant)", problem(2, 200, 203, 4, 2, d),
         InputKind::offset_1000);
  // The same shift downward. Its LSE is about -1000: a running maximum that starts at 0 instead of -inf (the
  // forward's, decode's) underflows every weight to 0. In the backward, P = exp(S - LSE), recomputed for a
  // key past kv_len that a kernel forgets to mask (its K row is zero: S = 0), overflows to inf, and inf times that
  // key's zero K row is NaN in dQ. While the LSE of every row that can reach past kv_len is above about -11, as in
  // every other case (a CPU test checks it), that P and its dS = -P D stay finite even packed to f16 (65504), reach
  // dQ only through the zero K row, and the gradients stay right: no other case sees the mistake.
  // 410 query rows over 203 keys, so that with the (top-left) causal mask too rows reach past kv_len, and whole Q
  // tiles (rows 256 and on) lie past the last K tile of every size up to 128: a kernel that trusts the causal
  // diagonal to mask the tail tile fails here too, not only one that forgets kv_len altogether.
  stress("-1000 on every score of a row, over a kv_len no tile divides", problem(2, 410, 203, 4, 2, d),
         InputKind::offset_minus_1000);
  stress("scale = 0: the mean of V's visible rows", problem(2, 100, 131, 4, 2, d, 0), InputKind::zero_scale);
  stress("one key dominates: its V row is the output", problem(2, 100, 131, 4, 2, d), InputKind::dominant_key);
  // At every other head_dim, wide logits (the max grows often: rescales) and a long key sequence (it
  // rarely does: step 18 skips them), so a head_dim's own tile code meets both.
  for (int d2 : std::set<int>(head_dims.begin(), head_dims.end())) {
    if (d2 == d) continue;
    stress("another head_dim: logits of standard deviation 10", problem(2, 300, 300, 4, 2, d2), InputKind::wide_10);
    stress("another head_dim: kv_len = 4099", problem(1, 130, 4099, 2, 1, d2), InputKind::uniform, false);
    stress("another head_dim: decode over 16411 keys", problem(2, 1, 16411, 4, 2, d2), InputKind::uniform, false);
  }
  // Long sequences, asserted. Under top-left causal masking a row i sees i + 1 keys, so a long key
  // sequence with few query rows is tested without the mask, and the mask on a long square.
  stress("kv_len = 16411", problem(1, 130, 16411, 2, 1, d), InputKind::uniform, false);
  stress("decode: q_len = 1 over 16411 keys", problem(2, 1, 16411, 4, 2, d), InputKind::uniform, false);
  // Decode's splits each see their own maximum: wide logits and one dominant key across many splits.
  const std::size_t before_decode = out.size();
  stress("decode: logits of standard deviation 30 over 5000 keys", problem(3, 1, 5000, 8, 2, d), InputKind::wide_30,
         false);
  stress("decode: one key of 3000 dominates", problem(2, 1, 3000, 4, 2, d), InputKind::dominant_key, false);
  stress("decode: -1000 on every score, over 5000 keys", problem(3, 1, 5000, 8, 2, d), InputKind::offset_minus_1000,
         false);
  for (std::size_t i = before_decode; i < out.size(); ++i) out[i].forward_only = true;
  for (DType dtype : dtypes) {  // the causal square, once per dtype
    AttentionProblem p = problem(1, 4099, 4099, 2, 1, d);
    p.causal = true, p.dtype = dtype;
    if (max_len <= 0 || max_len >= 4099) out.push_back({"causal, 4099 x 4099", p, InputKind::uniform});
  }
  return out;
}

std::vector<Case> graded_cases(const std::vector<DType>& dtypes, const std::vector<int>& head_dims, int max_len,
                               Pass pass) {
  std::vector<Case> cases;
  for (const Case& c : shape_cases(dtypes, head_dims, max_len))
    if (pass == Pass::forward || !c.forward_only) cases.push_back(c);
  for (const Case& c : stress_cases(dtypes, head_dims, max_len))
    if (pass == Pass::forward || !(c.kind == InputKind::dominant_key || c.forward_only))
      cases.push_back(c);
  return cases;
}

std::vector<Case> supported_by(const StepInfo& step, const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (const Case& c : cases)
    if (step.supports(c.problem)) out.push_back(c);
  return out;
}

Prepared prepare(const Case& c, std::uint64_t seed, Pass pass) {
  Prepared prep;
  prep.seed = seed;
  AttentionProblem p = c.problem;
  if (c.kind == InputKind::zero_scale) p.scale = 0.f;
  const double q_range = c.kind == InputKind::wide_10 ? 30.0 : c.kind == InputKind::wide_30 ? 90.0 : 1.0;
  prep.inputs = random_inputs(p, seed, q_range);
  AttentionInputs& in = prep.inputs;
  const int d = p.head_dim, g = p.group_size();
  if (p.varlen() && !(c.kind == InputKind::uniform || c.kind == InputKind::wide_10 || c.kind == InputKind::wide_30))
    throw std::logic_error("prepare: " + c.describe() + ": a packed case takes random inputs only (the other kinds "
                           "are written for [batch, seq, heads, d] tensors)");

  if (c.kind == InputKind::offset_1000 || c.kind == InputKind::offset_minus_1000) {
    // The last dimension adds q * k = +-1024 * 8 = +-8192 to every score of every row (times the scale):
    // a row-constant shift, exact in every dtype. The other dimensions keep their random values.
    const double q_last = c.kind == InputKind::offset_1000 ? 1024.0 : -1024.0;
    for (int b = 0; b < p.batch; ++b) {
      for (int i = 0; i < p.q_len; ++i)
        for (int h = 0; h < p.q_heads; ++h) in.q.set(at(p, b, i, p.q_len, p.q_heads, h, d - 1), q_last);
      for (int j = 0; j < p.kv_len; ++j)
        for (int h = 0; h < p.kv_heads; ++h) in.k.set(at(p, b, j, p.kv_len, p.kv_heads, h, d - 1), 8.0);
    }
  }
  if (c.kind == InputKind::dominant_key) {
    // Every query row of KV group (b, kv_h) is the same vector u; key 0 of that group is 16 u, exact
    // in every dtype. Its score, scale * 16 |u|^2 ~ 16 sqrt(d) / 3, beats every other (of order 1) by
    // about 40 at d = 64: the other keys together weigh less than 1e-13.
    for (int b = 0; b < p.batch; ++b)
      for (int kvh = 0; kvh < p.kv_heads; ++kvh)
        for (int c2 = 0; c2 < d; ++c2) {
          const double u = in.q.get(at(p, b, 0, p.q_len, p.q_heads, kvh * g, c2));
          for (int i = 0; i < p.q_len; ++i)
            for (int h = kvh * g; h < (kvh + 1) * g; ++h) in.q.set(at(p, b, i, p.q_len, p.q_heads, h, c2), u);
          in.k.set(at(p, b, 0, p.kv_len, p.kv_heads, kvh, c2), 16 * u);
        }
  }

  // K and V rows past each sequence's length are NaN: a kernel must never read them (problem.hpp), and one that
  // loads them and weighs them by P = 0 gives 0 x NaN = NaN. (A paged upload also leaves every page past a length,
  // and every unused page, NaN.)
  if (!p.kv_lens.empty())
    for (int b = 0; b < p.batch; ++b)
      for (std::int64_t e = at(p, b, p.kv_len_of(b), p.kv_len, p.kv_heads, 0, 0); e < at(p, b + 1, 0, p.kv_len, p.kv_heads, 0, 0); ++e)
        in.k.set(e, NAN), in.v.set(e, NAN);

  // With a window, decode (a KV cache's form: per-sequence lengths or pages) must not read the keys before the
  // first one its sequence's rows see either (step 59: the splits share the window's keys, not the cache's): NaN.
  if (p.windowed() && (!p.kv_lens.empty() || p.paged()))
    for (int b = 0; b < p.batch; ++b) {
      int first = p.kv_len_of(b);
      for (int i = 0; i < p.q_len; ++i) first = std::min(first, p.keys_range(b, i).first);
      for (std::int64_t e = at(p, b, 0, p.kv_len, p.kv_heads, 0, 0); e < at(p, b, first, p.kv_len, p.kv_heads, 0, 0); ++e)
        in.k.set(e, NAN), in.v.set(e, NAN);
    }

  if (c.kind == InputKind::dominant_sink)
    for (int h = 0; h < p.q_heads; ++h) in.sinks.set(h, 4.0 + std::log(double(p.kv_len)));

  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  const std::vector<double> sinks = p.sinks ? in.sinks.to_double() : std::vector<double>();
  const std::vector<double>* sinks_in = p.sinks ? &sinks : nullptr;
  prep.expected = reference_attention(p, q, k, v, &prep.max_abs_score, &prep.expected_lse, sinks_in);
  if (pass == Pass::backward) {
    // What the forward hands the backward, as a forward step would store it: O in the dtype, LSE in
    // f32; and the gradient flowing in, dO, of order 1 like O. The gradients are the exact function's at these
    // inputs with D_i = dO_i . O_i taken from the stored O, as every backward takes it (reference.hpp: no backward
    // undoes O's rounding, and with a saturated cap that rounding alone reaches the dtype's bound); the LSE's
    // rounding is part of the error.
    prep.backward = true;
    BackwardInputs& b = prep.backward_inputs;
    b.o = HostTensor(p.dtype, q_shape(p));
    for (std::int64_t e = 0; e < b.o.numel(); ++e) b.o.set(e, prep.expected[e]);
    b.lse = HostTensor(DType::f32, lse_shape(p));
    for (std::int64_t e = 0; e < b.lse.numel(); ++e) b.lse.set(e, prep.expected_lse[e]);
    b.d_o = random_tensor(p.dtype, q_shape(p), seed * 3 + 4);
    const std::vector<double> stored_o = b.o.to_double();
    ReferenceGradients g = reference_attention_backward(p, q, k, v, b.d_o.to_double(), sinks_in, &stored_o);
    prep.expected_dq = std::move(g.dq), prep.expected_dk = std::move(g.dk), prep.expected_dv = std::move(g.dv);
    prep.expected_dsinks = std::move(g.dsinks);
  }
  if (c.kind == InputKind::zero_scale || c.kind == InputKind::dominant_key) {
    // The exact answer, independent of the reference: the mean of V's visible rows, or V's row 0.
    for (int b = 0; b < p.batch; ++b)
      for (int i = 0; i < p.q_len; ++i)
        for (int h = 0; h < p.q_heads; ++h) {
          const int kvh = h / g;
          const int keys = p.keys_seen(b, i);
          for (int c2 = 0; c2 < d; ++c2) {
            double value = 0;
            if (c.kind == InputKind::dominant_key) {
              value = v[at(p, b, 0, p.kv_len, p.kv_heads, kvh, c2)];
            } else {
              for (int j = 0; j < keys; ++j) value += v[at(p, b, j, p.kv_len, p.kv_heads, kvh, c2)];
              value /= keys;
            }
            prep.expected[at(p, b, i, p.q_len, p.q_heads, h, c2)] = value;
          }
        }
  }
  return prep;
}

namespace {
/// The first failing verdict of O and LSE (or of dQ, dK and dV) the call left in `device`; when all
/// pass, the one closest to its bound.
Verdict judge_call(const StepInfo& step, const AttentionProblem& p, const DeviceAttention& device,
                   const Prepared& prepared) {
  std::vector<Verdict> verdicts;
  if (step.pass == Pass::forward) {
    verdicts.push_back(judge(device.download_o(p), prepared.expected, p.head_dim, prepared.max_abs_score));
    verdicts.push_back(judge_lse(device.download_lse(p), prepared.expected_lse, prepared.max_abs_score));
  } else {
    const Gradients g = device.download_gradients(p);
    verdicts = judge_gradients(g, prepared.expected_dq, prepared.expected_dk, prepared.expected_dv, p.head_dim,
                               prepared.max_abs_score);
    if (p.sinks) verdicts.push_back(judge_dsinks(g.dsinks, prepared.expected_dsinks, p.dtype, prepared.max_abs_score));
  }
  for (const Verdict& v : verdicts)
    if (!v.passed()) return v;
  auto closeness = [](const Verdict& v) { return v.global.rel_l2 / v.tolerance.rel_l2; };
  return *std::max_element(verdicts.begin(), verdicts.end(),
                           [&](const Verdict& a, const Verdict& b) { return closeness(a) < closeness(b); });
}
}  // namespace

Verdict run_case(const StepInfo& step, const Case& c, const Prepared& prepared) {
  AttentionProblem p = c.problem;
  if (c.kind == InputKind::zero_scale) p.scale = 0.f;
  if (step.pass == Pass::backward && !prepared.backward)
    throw std::logic_error("run_case: step " + step.label() + " is a backward step; prepare its case for Pass::backward");
  try {
    validate(p);
    DeviceAttention device(p, prepared.inputs, step.workspace_for(p),
                           step.pass == Pass::backward ? &prepared.backward_inputs : nullptr);
    // A step that counts in its workspace (step 25's tile scheduler) must leave it as it found it: every
    // caller (fa-bench, a framework) launches again on the same buffers. It runs twice here, each call
    // onto poisoned outputs, and both are judged.
    const int calls = step.workspace_for(p) == 0 ? 1 : 2;
    Verdict verdict;
    for (int call = 0; call < calls && verdict.passed(); ++call) {
      device.poison_outputs();
      step.launch(p, device.tensors(), nullptr);
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      verdict = judge_call(step, p, device, prepared);
      if (const std::string fault = device.cache_fault(); verdict.passed() && !fault.empty())
        verdict.failed = "refused a valid value of the cache: " + fault;  // a right kernel refuses none
      if (call == 1 && !verdict.passed()) verdict.failed = kSecondCall + verdict.failed;
    }
    return verdict;
  } catch (const DeviceLimit&) {
    throw;  // this GPU's limit, not the step's mistake: the caller skips the case
  } catch (const InvalidProblem& e) {
    Verdict v;
    v.failed = std::string("threw: ") + e.what();
    return v;
  }
}

}  // namespace fa::test
