/// @file grader.hpp
/// @brief The exercise grader: one exercise file, run through the same harness as the steps.
#pragma once

#include "fa/registry.hpp"

#include <string>
#include <utility>
#include <vector>

namespace fa::test {

/// An exercise as its generated entry point (build/exercises/NN_name/entry.cpp) describes it.
struct Exercise {
  std::string id;     ///< the step it comes from, "04"
  std::string name;   ///< "04_tiled_online_softmax"
  std::string title;  ///< what it asks for
  int minutes;        ///< expected time
  std::vector<std::pair<std::string, Launcher>> launchers;  ///< the launchers it exports, by name
};

/// The exercise this grader binary was built with.
Exercise exercise();

}  // namespace fa::test
