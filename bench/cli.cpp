#include "cli.hpp"

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

std::vector<int> Args::parse_ints(const std::string& text, std::size_t count, const std::string& what) {
  std::vector<int> values;
  for (const auto& item : split(text)) {
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value < 1)
      throw std::invalid_argument(what + ": '" + item + "' is not a positive integer");
    values.push_back(value);
  }
  if (values.size() != count)
    throw std::invalid_argument(what + ": expected " + std::to_string(count) + " comma-separated values, got '" +
                                text + "'");
  return values;
}

}  // namespace fa
