/// @file cli.hpp
/// @brief The small command-line parser shared by fa-bench and fa-run.
#pragma once

#include <iosfwd>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fa {

struct StepInfo;
struct AttentionProblem;

/// Prints every step and variant of the registry with the dtypes, head_dims and minimum GPU it takes and
/// the pass it computes (fa-run --list, fa-bench --list).
void print_step_list(std::ostream& out);

/// A tool's main: runs `run` and turns an escaped exception into "tool: message" on stderr and exit 1.
int main_guarded(const char* tool, int (*run)(int, char**), int argc, char** argv);

/// Throws std::invalid_argument unless `step` takes p's dtype and head_dim, naming what it takes.
void refuse_unsupported(const StepInfo& step, const AttentionProblem& p);

/// The fields of a shape written B,Nq,Nkv,Hq,Hkv,d (fa-run --random, fa-bench --shape), named as in AttentionProblem.
inline const std::vector<std::string> kShapeFields = {"batch", "q_len", "kv_len", "q_heads", "kv_heads", "head_dim"};

/// "--name value" options and "--flag" switches. Unknown names are errors,
/// so a typo never silently falls back to a default.
class Args {
 public:
  /// value_options take a value; flags do not.
  Args(int argc, char** argv, std::set<std::string> value_options, std::set<std::string> flags);
  /// Whether --name was given (as an option with a value or as a flag).
  bool has(const std::string& name) const { return values_.count(name) || flags_set_.count(name); }
  /// The value of --name, or `fallback` when it was not given.
  std::string get(const std::string& name, const std::string& fallback) const;
  /// The value of --name as a number (an error names the option if it is not one), or `fallback`.
  double get_number(const std::string& name, double fallback) const;
  /// Splits "a,b,c" into items.
  static std::vector<std::string> split(const std::string& text, char separator = ',');
  /// Parses "4,1024,1024,8,8,64" into one positive int per name of `names`; an error names the option (`what`)
  /// and the value's field ("--random 1,0,8,2,2,64: q_len = 0 is not a positive integer").
  static std::vector<int> parse_ints(const std::string& text, const std::vector<std::string>& names,
                                     const std::string& what);
  /// `item` as an int when the whole of it is one ("12", "-1"), else nothing ("1.5", "", "9999999999").
  static std::optional<int> whole_number(const std::string& item);
  /// FlashAttention's window_size written LEFT,RIGHT (-1 an open side), as --window gives it: two whole numbers,
  /// else an error that shows `text` (the sides' range is validate()'s to check).
  static std::pair<int, int> window(const std::string& text);

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_set_;
};

}  // namespace fa
