/// @file cli.cpp
/// @brief What fa-bench and fa-run share: option parsing, the step list, refusals.
#include "cli.hpp"

#include "fa/registry.hpp"

#include <cstdio>
#include <exception>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace fa {

Args::Args(int argc, char** argv, std::set<std::string> value_options, std::set<std::string> flags) {
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + arg + "'");
    const std::string name = arg.substr(2);
    if (flags.count(name)) {
      flags_set_.insert(name);
    } else if (value_options.count(name)) {
      if (a + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      values_[name] = argv[++a];
    } else {
      throw std::invalid_argument("unknown option '" + arg + "' (see --help)");
    }
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

double Args::get_number(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    std::size_t used = 0;
    const double value = std::stod(it->second, &used);
    if (used == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument("--" + name + " expects a number, got '" + it->second + "'");
}

std::vector<std::string> Args::split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);)
    if (!item.empty()) items.push_back(item);
  return items;
}

std::vector<int> Args::parse_ints(const std::string& text, const std::vector<std::string>& names,
                                  const std::string& what) {
  const std::vector<std::string> items = split(text);
  if (items.size() != names.size()) {
    std::string fields;
    for (const auto& name : names) fields += (fields.empty() ? "" : ", ") + name;
    throw std::invalid_argument(what + ": expected " + std::to_string(names.size()) + " comma-separated values (" +
                                fields + "), got '" + text + "'");
  }
  std::vector<int> values;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<int> value = whole_number(items[i]);
    if (!value || *value < 1)
      throw std::invalid_argument(what + " " + text + ": " + names[i] + " = " + items[i] + " is not a positive integer");
    values.push_back(*value);
  }
  return values;
}

std::optional<int> Args::whole_number(const std::string& item) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(item, &used);
  } catch (const std::exception&) {  // not a number, or out of int's range
    return std::nullopt;
  }
  if (used != item.size()) return std::nullopt;
  return value;
}

std::pair<int, int> Args::window(const std::string& text) {
  const std::vector<std::string> sides = split(text);
  const std::optional<int> left = sides.size() == 2 ? whole_number(sides[0]) : std::nullopt;
  const std::optional<int> right = sides.size() == 2 ? whole_number(sides[1]) : std::nullopt;
  if (!left || !right)  // each side's range is the problem's to check (validate: -1, or >= 0 keys)
    throw std::invalid_argument("--window must be LEFT,RIGHT, two whole numbers of keys, -1 for an open side; got '" +
                                text + "'");
  return {*left, *right};
}

namespace {
/// "a, b, c": the items as text, joined.
template <class Items, class Text>
std::string join(const Items& items, Text text) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + text(item);
  return out;
}
/// "f32, f16": the dtypes a step takes.
std::string dtype_list(const StepInfo& s) {
  return join(s.dtypes, [](DType d) { return std::string(to_string(d)); });
}
/// "32, 64, 128": the head_dims a step takes.
std::string head_dim_list(const StepInfo& s) {
  return join(s.head_dims, [](int d) { return std::to_string(d); });
}
/// " [KV cache: per-sequence lengths, pages, q_len <= 8]": the KV-cache forms a step takes, then " [features:
/// sliding window, soft-cap, sinks, packed variable lengths]": the models' features it takes; "" for none.
std::string cache_note(const StepInfo& s) {
  std::vector<std::string> forms;
  if (s.cache_forms.kv_lens) forms.push_back("per-sequence lengths");
  if (s.cache_forms.paged) forms.push_back("pages");
  if (s.cache_forms.bottom_right) forms.push_back("bottom-right causal");
  if (s.cache_forms.max_q_len > 0) forms.push_back("q_len <= " + std::to_string(s.cache_forms.max_q_len));
  std::vector<std::string> features;
  if (s.features.window) features.push_back("sliding window");
  if (s.features.softcap) features.push_back("soft-cap");
  if (s.features.sinks) features.push_back("sinks");
  if (s.features.varlen) features.push_back("packed variable lengths");
  const auto listed = [](const std::string& f) { return f; };
  return (forms.empty() ? "" : " [KV cache: " + join(forms, listed) + "]") +
         (features.empty() ? "" : " [features: " + join(features, listed) + "]");
}
}  // namespace

void print_step_list(std::ostream& out) {
  out << std::left << std::setw(14) << "step" << std::setw(15) << "dtypes" << std::setw(14) << "head_dims"
      << std::setw(8) << "GPU" << std::setw(10) << "pass" << "what it changes\n";
  std::vector<const StepInfo*> rows;
  for (const StepInfo& s : all_steps()) rows.push_back(&s);
  rows.push_back(&cublas_baseline());
  for (const StepInfo* s : rows)
    out << std::setw(14) << s->label() << std::setw(15) << dtype_list(*s) << std::setw(14) << head_dim_list(*s)
        << std::setw(8) << s->min_gpu() << std::setw(10) << to_string(s->pass) << s->summary << cache_note(*s) << "\n";
  out << "GPU: the lowest compute capability a step needs (sm_80: Ampere or newer); any: every CUDA GPU.\n"
         "pass: forward steps compute O (and LSE) from Q, K, V; backward steps dQ, dK, dV from Q, K, V, O, LSE, dO.\n"
         "A step id selects all its variants (fa-bench --steps 05, 11: 11 and 11-f32); a label selects one\n"
         "(fa-run --step 05-pad1, --step 11).\n"
         "KV cache: the forms a step takes beyond contiguous K/V of one length and a top-left causal mask\n"
         "(per-sequence lengths, pages, a bottom-right causal mask) follow its summary; the others refuse them.\n";
}

void refuse_unsupported(const StepInfo& step, const AttentionProblem& p) {
  if (!step.supports(p.dtype))
    throw std::invalid_argument("step " + step.label() + " takes dtype " + dtype_list(step) + ", not " +
                                to_string(p.dtype) + " (" + p.describe() + ")");
  if (!step.supports_head_dim(p.head_dim))
    throw std::invalid_argument("step " + step.label() + " takes head_dim " + head_dim_list(step) + ", not " +
                                std::to_string(p.head_dim) + " (" + p.describe() + ")");
  refuse_cache_forms(("step " + step.label()).c_str(), p, step.cache_forms);
  refuse_features(("step " + step.label()).c_str(), p, step.features);
}

int main_guarded(const char* tool, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace fa
