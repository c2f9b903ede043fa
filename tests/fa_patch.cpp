// fa-patch: makes code from the steps' own source at build time, so that it can never drift from
// the step: every text it cuts or replaces must occur in the step exactly once, or the build stops
// and says which. Two kinds of file come out of it:
//  - the harness's known-wrong kernels (tests/mutants/*.mutant), each a step with one mistake;
//  - the exercises (exercises/NN_name/exercise.spec), each a step with its lesson lines cut out and
//    replaced by numbered TODO holes with a hint and a stub that compiles (but is wrong).
//
//   fa-patch mutant SPEC STEPS_DIR OUT.cu     the step file SPEC names, with SPEC's replacements, in
//                                             namespace fa::stepNN::mutant_<spec name> (nested, so the
//                                             step's unqualified names still resolve)
//   fa-patch mutant-list OUT.cpp SPEC...      the C++ table of every mutant (tests/mutants.hpp)
//   fa-patch skeleton SPEC STEPS_DIR OUT.cu ENTRY.cpp
//                                             the exercise skeleton, and the grader's entry point (a Python
//                                             step's: OUT.py alone; its grader is the step's CPU test)
//   fa-patch fill SPEC SKELETON.cu OUT.cu [--as-exercise]
//                                             the skeleton with every hole filled with the step's lines
//                                             (and every redaction undone) and the step's namespace back:
//                                             the step file itself (or, --as-exercise, a completed
//                                             exercise a student could hand in)
//   fa-patch check-skeleton SPEC STEPS_DIR    fails (exit 1, naming each finding) when a stub is its hole's
//                                             solution, or when the skeleton SPEC makes still holds a line
//                                             of a hole's solution or of a redacted text
//
// A mutant spec is a few "key: value" lines (step, export, caught-by, mistake), then pairs of blocks
// "--- find" / "--- replace", each block the exact lines to find and what replaces them. An optional line
//   lag: warpgroup=N at=SITE[+SITE...] ns=NS        (or warp=N)
// builds the mutant with a schedule perturbation (common/fa/lag.cuh): role N of every block, threads
// threadIdx.x / 128 == N (warpgroup) or threadIdx.x / 32 == N (warp), spins NS nanoseconds at each SITE of
// the barrier helpers: before-arrive, before-wait, after-wait, or here (the FA_LAG(FA_LAG_HERE) calls the
// mutant's own replacement lines add, at a barrier that is a plain __syncthreads). fa-patch writes it as
// FA_LAG_* macro definitions at the top of the generated file; without the line the file has none, and the
// helpers compile to what the steps do. A spec with a lag line may have no blocks (the step unchanged: a
// lag probe, caught-by: lag-probe, which must pass the harness). Lines of other keys (e.g. "why: ...",
// the reason a lag makes a race show) are notes and ignored. An exercise
// spec has "key: value" lines (step, export, title, minutes), then per hole a block
// "--- hole N: <hint>" (the step's exact lesson lines) and a block "--- stub" (what the skeleton has).
// Where a comment outside a hole states the hole's answer, a block "--- redact: <why>" (the step's exact
// lines) and a block "--- with" (neutral lines) replace it in the skeleton without making it a hole; fill
// puts the step's lines back, so the neutral lines must occur exactly once in the skeleton.
//
// A Python step (steps/python_steps.tsv: a lesson file NN_name/file.py) is cut the same way, with the same specs:
// its comments start with '#', and it has no namespace to rename (a mutant or a skeleton is a drop-in copy of the
// lesson file, which tests/python/python_step_check.py runs the step's CPU test on). Its mutants are no kernels, so
// mutant-list refuses them: tests/CMakeLists.txt hands it the kernel steps' specs alone.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Writes `text` to `path` unless the file already holds exactly that (keeps the build incremental).
void write_file(const fs::path& path, const std::string& text) {
  if (fs::exists(path) && read_file(path) == text) return;
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error(path.string() + ": cannot write");
}

/// Replaces the one occurrence of `find` in `text`; throws naming `what` if there are none or several.
void replace_once(std::string& text, const std::string& find, const std::string& replace, const std::string& what) {
  const auto first = text.find(find);
  if (first == std::string::npos)
    throw std::runtime_error(what + ": the text to replace is not in the step any more:\n" + find);
  if (text.find(find, first + 1) != std::string::npos)
    throw std::runtime_error(what + ": the text to replace occurs more than once in the step:\n" + find);
  text.replace(first, find.size(), replace);
}

/// One cut or replacement: the step's exact lines, what goes in their place, and (exercises) a hint.
struct Edit {
  std::string find;     ///< the step's lines (a hole's lesson lines)
  std::string replace;  ///< what replaces them (a hole's stub)
  std::string hint;     ///< exercises: what the hole asks for
  bool redact = false;  ///< exercises: a redaction (no TODO, no hint), not a hole
};

/// A parsed spec (mutant or exercise).
struct Spec {
  std::string name;                           ///< the file's stem, or the exercise folder's name
  std::map<std::string, std::string> fields;  ///< step, export, caught-by, mistake / title, minutes
  std::vector<Edit> edits;                    ///< in spec order: holes and redactions
};

/// The number of holes among `edits` (redactions are not numbered).
std::size_t hole_count(const std::vector<Edit>& edits) {
  std::size_t n = 0;
  for (const Edit& e : edits) n += !e.redact;
  return n;
}

Spec parse_spec(const fs::path& path, const std::vector<const char*>& required, bool blocks_optional = false) {
  Spec spec;
  spec.name = path.stem().string();
  std::istringstream in(read_file(path));
  std::string line, *block = nullptr;
  while (std::getline(in, line)) {
    if (line == "--- find" || line.rfind("--- hole ", 0) == 0 || line == "--- redact" ||
        line.rfind("--- redact: ", 0) == 0) {
      spec.edits.emplace_back();
      spec.edits.back().redact = line[4] == 'r';
      block = &spec.edits.back().find;
      if (const auto colon = line.find(": "); line[4] == 'h' && colon != std::string::npos)
        spec.edits.back().hint = line.substr(colon + 2);
      if (line[4] == 'h' && line.substr(9, line.find(':') - 9) != std::to_string(hole_count(spec.edits)))
        throw std::runtime_error(path.string() + ": holes must be numbered 1, 2, ... in order: " + line);
    } else if (line == "--- replace" || line == "--- stub" || line == "--- with") {
      if (spec.edits.empty()) throw std::runtime_error(path.string() + ": '" + line + "' before its '--- find'");
      if ((line == "--- with") != spec.edits.back().redact)
        throw std::runtime_error(path.string() + ": '" + line + "' does not go with the block before it");
      block = &spec.edits.back().replace;
    } else if (block) {
      *block += line + "\n";
    } else if (const auto colon = line.find(": "); colon != std::string::npos) {
      spec.fields[line.substr(0, colon)] = line.substr(colon + 2);
    }
  }
  for (const char* key : required)
    if (!spec.fields.count(key)) throw std::runtime_error(path.string() + ": no '" + key + ":' line");
  if (spec.edits.empty() && !blocks_optional)
    throw std::runtime_error(path.string() + ": no '--- find' or '--- hole' block");
  return spec;
}

/// The FA_LAG_* definitions (common/fa/lag.cuh) of a spec's "lag: warpgroup=N at=SITE[+SITE] ns=NS" line.
std::string lag_macros(const std::string& line, const std::string& where) {
  const std::map<std::string, std::string> sites = {{"before-arrive", "FA_LAG_BEFORE_ARRIVE"},
                                                    {"before-wait", "FA_LAG_BEFORE_WAIT"},
                                                    {"after-wait", "FA_LAG_AFTER_WAIT"},
                                                    {"here", "FA_LAG_HERE"}};
  auto bad = [&](const std::string& why) {
    return std::runtime_error(where + ": lag: " + why + " (expected 'lag: warpgroup=N at=SITE[+SITE] ns=NS' or "
                              "warp=N; SITE before-arrive, before-wait, after-wait or here)");
  };
  auto number = [&](const std::string& text) {
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) throw bad("'" + text + "' is not a count");
    return text;
  };
  std::string threads, role, at, ns;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
    if (key == "warpgroup" || key == "warp") {
      if (!threads.empty()) throw bad("one role only");
      threads = key == "warp" ? "32" : "128", role = number(value);
    } else if (key == "at") {
      std::istringstream list(value);
      for (std::string site; std::getline(list, site, '+');) {
        if (!sites.count(site)) throw bad("no site '" + site + "'");
        at += (at.empty() ? "" : " | ") + sites.at(site);
      }
    } else if (key == "ns") {
      ns = number(value);
    } else {
      throw bad("unknown '" + word + "'");
    }
  }
  if (threads.empty() || at.empty() || ns.empty()) throw bad("needs a role, at= and ns=");
  return "// lag: " + line + "\n#define FA_LAG_ROLE_THREADS " + threads + "\n#define FA_LAG_ROLE " + role +
         "\n#define FA_LAG_SITES (" + at + ")\n#define FA_LAG_NS " + ns + "\n";
}

Spec parse_mutant(const fs::path& path) {
  Spec spec = parse_spec(path, {"step", "export", "caught-by", "mistake"}, /*blocks_optional=*/true);
  if (spec.fields.count("lag")) lag_macros(spec.fields.at("lag"), path.string());  // checked here, used below
  else if (spec.edits.empty()) throw std::runtime_error(path.string() + ": no '--- find' block (only a spec with a "
                                                        "'lag:' line, a lag probe, may leave the step unchanged)");
  for (const Edit& e : spec.edits)
    if (e.redact) throw std::runtime_error(path.string() + ": a mutant has no '--- redact' blocks");
  return spec;
}

Spec parse_exercise(const fs::path& path) {
  Spec spec = parse_spec(path, {"step", "export", "title", "minutes"});
  spec.name = path.parent_path().filename().string();
  if (hole_count(spec.edits) == 0) throw std::runtime_error(path.string() + ": no '--- hole' block");
  for (const Edit& e : spec.edits) {
    if (!e.redact && e.hint.empty())
      throw std::runtime_error(path.string() + ": every hole needs a hint after its number");
    if (e.redact && e.replace.empty())
      throw std::runtime_error(path.string() + ": a '--- redact' block needs '--- with' lines (fill finds them)");
  }
  return spec;
}

/// "04" from "04_tiled_online_softmax/tiled_online_softmax.cu".
std::string step_id(const Spec& spec) { return spec.fields.at("step").substr(0, 2); }

/// What differs between a CUDA step and a Python step's lesson file: how a comment starts, and whether the
/// step's code sits in a namespace fa::stepNN that a mutant or skeleton renames.
struct Language {
  std::string comment;  ///< "//" or "#"
  bool namespaces;      ///< a .cu step's namespace fa::stepNN
};
Language language_of(const Spec& spec) {
  const std::string& file = spec.fields.at("step");
  const bool python = file.size() > 3 && file.compare(file.size() - 3, 3, ".py") == 0;
  return python ? Language{"#", false} : Language{"//", true};
}

/// A C++ string literal of `text`.
std::string literal(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

int make_mutant(const fs::path& spec_path, const fs::path& steps_dir, const fs::path& out) {
  const Spec spec = parse_mutant(spec_path);
  std::string text = read_file(steps_dir / spec.fields.at("step"));
  const std::string what = "mutant " + spec.name + " (" + spec_path.string() + ")";
  for (const Edit& e : spec.edits) replace_once(text, e.find, e.replace, what);
  const Language lang = language_of(spec);
  if (!lang.namespaces) {  // a Python step's lesson file: a drop-in copy, one mistake in it
    if (spec.fields.count("lag")) throw std::runtime_error(what + ": a Python step's mutant has no 'lag:' line");
    write_file(out, "# Generated by fa-patch from " + spec_path.filename().string() + " and steps/" +
                        spec.fields.at("step") + ": the lesson file with one mistake. Do not edit.\n" + text);
    return 0;
  }
  const std::string ns = "namespace fa::step" + step_id(spec);
  replace_once(text, ns + " {", ns + "::mutant_" + spec.name + " {", what);
  replace_once(text, "}  // " + ns + "\n", "}  // " + ns + "::mutant_" + spec.name + "\n", what);
  const bool probe = spec.fields.at("caught-by") == "lag-probe";
  const std::string lag = spec.fields.count("lag") ? lag_macros(spec.fields.at("lag"), what) : "";
  write_file(out, "// Generated by fa-patch from " + spec_path.filename().string() + " and steps/" +
                      spec.fields.at("step") +
                      (probe ? ": the step with one role made late, which must still pass. Do not edit.\n"
                             : ": a deliberately wrong kernel. Do not edit.\n") +
                      lag + text);
  return 0;
}

int make_list(const fs::path& out, const std::vector<fs::path>& spec_paths) {
  std::ostringstream code;
  code << "// Generated by fa-patch from tests/mutants/*.mutant. Do not edit.\n"
          "#include \"mutants.hpp\"\n\nnamespace fa {\n";
  std::vector<Spec> specs;
  for (const auto& path : spec_paths) {
    specs.push_back(parse_mutant(path));
    if (!language_of(specs.back()).namespaces)
      throw std::runtime_error(path.string() + ": a Python step's mutant is no kernel: the table is the kernels' "
                               "(tests/python/python_step_check.py runs it)");
  }
  for (const Spec& s : specs)
    code << "namespace step" << step_id(s) << "::mutant_" << s.name << " { Launcher " << s.fields.at("export")
         << "(); }\n";
  code << "\nnamespace test {\n\nconst std::vector<Mutant>& all_mutants() {\n  static const std::vector<Mutant> list = {\n";
  for (const Spec& s : specs)
    code << "      {" << literal(s.name) << ", " << literal(step_id(s)) << ", " << literal(s.fields.at("caught-by"))
         << ", " << literal(s.fields.at("mistake")) << ", step" << step_id(s) << "::mutant_" << s.name << "::"
         << s.fields.at("export")
         << "()},\n";
  code << "  };\n  return list;\n}\n\n}  // namespace test\n}  // namespace fa\n";
  write_file(out, code.str());
  return 0;
}

/// The indentation of the first line of `code` that is not a #pragma (the hole's indentation).
std::string indentation(const std::string& code) {
  std::istringstream lines(code);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#", 0) != 0) return line.substr(0, line.find_first_not_of(' '));
  return "  ";
}

/// The comment that opens hole n in a skeleton: "// TODO(n): <hint>", wrapped at 100 columns.
std::string hole_begin(std::size_t n, const Edit& edit, const Language& lang) {
  const std::string indent = indentation(edit.find), first = indent + lang.comment + " TODO(" + std::to_string(n) + "): ";
  const std::string next = indent + lang.comment + std::string(first.size() - indent.size() - lang.comment.size(), ' ');
  std::string out = first, line = first;
  std::istringstream words(edit.hint);
  for (std::string word; words >> word;) {
    if (line.size() + word.size() > 100 && line.size() > first.size()) {
      out.back() = '\n';
      out += next;
      line = next;
    }
    out += word + " ";
    line += word + " ";
  }
  out.back() = '\n';
  return out;
}
/// The comment that closes a hole.
std::string hole_end(const Edit& edit, const Language& lang) {
  return indentation(edit.find) + lang.comment + " (end of TODO)\n";
}
/// The skeleton's first lines.
std::string skeleton_header(const Language& lang) {
  const std::string& c = lang.comment;
  return c + " EXERCISE (generated by fa-patch from the step below and its exercise.spec): fill every TODO.\n" + c +
         " Each TODO(n) comment says what the lines up to '(end of TODO)' must do; the stub lines there\n" + c +
         (lang.namespaces ? " compile" : " run") + " but give wrong answers. Grade with: tools/exercise grade NN\n";
}

/// How many times `part` occurs in `text`.
std::size_t occurrences(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

/// The skeleton of exercise `spec`: the step with its holes cut out and its redactions made.
std::string skeleton_text(const Spec& spec, const fs::path& spec_path, const fs::path& steps_dir) {
  std::string text = read_file(steps_dir / spec.fields.at("step"));
  const std::string what = "exercise " + spec.name + " (" + spec_path.string() + ")";
  const Language lang = language_of(spec);
  std::size_t hole = 0;
  for (const Edit& e : spec.edits)
    replace_once(text, e.find, e.redact ? e.replace : hole_begin(++hole, e, lang) + e.replace + hole_end(e, lang), what);
  if (lang.namespaces) {
    const std::string ns = "namespace fa::step" + spec.name.substr(0, 2);
    replace_once(text, ns + " {", ns + "::exercise {", what);
    replace_once(text, "}  // " + ns + "\n", "}  // " + ns + "::exercise\n", what);
  }
  text = skeleton_header(lang) + text;
  // fill undoes a redaction by finding its neutral lines: they must be in the skeleton exactly once.
  for (const Edit& e : spec.edits)
    if (e.redact && occurrences(text, e.replace) != 1)
      throw std::runtime_error(what + ": a redaction's '--- with' lines occur " +
                               std::to_string(occurrences(text, e.replace)) +
                               " times in the skeleton, not once, so fill could not undo it:\n" + e.replace);
  return text;
}

int make_skeleton(const fs::path& spec_path, const fs::path& steps_dir, const fs::path& out, const fs::path& entry) {
  const Spec spec = parse_exercise(spec_path);
  write_file(out, skeleton_text(spec, spec_path, steps_dir));
  if (!language_of(spec).namespaces) {  // a Python step: its grader is the step's CPU test, no entry point
    if (!entry.empty()) throw std::runtime_error(spec_path.string() + ": a Python step's skeleton takes no ENTRY.cpp");
    return 0;
  }
  if (entry.empty()) throw std::runtime_error(spec_path.string() + ": a CUDA step's skeleton needs ENTRY.cpp");
  // The grader's entry point: which step, and the launchers the exercise exports.
  std::ostringstream code;
  code << "// Generated by fa-patch from " << spec_path.filename().string() << ". Do not edit.\n"
       << "#include \"grader.hpp\"\n\nnamespace fa {\nnamespace step" << spec.name.substr(0, 2) << "::exercise {";
  std::vector<std::string> exports;
  std::stringstream list(spec.fields.at("export"));
  for (std::string name; std::getline(list, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    exports.push_back(name);
    code << " Launcher " << name << "();";
  }
  code << " }\n\nnamespace test {\nExercise exercise() {\n  return {" << literal(spec.name.substr(0, 2)) << ", "
       << literal(spec.name) << ", " << literal(spec.fields.at("title")) << ", " << spec.fields.at("minutes") << ", {";
  for (const auto& name : exports)
    code << "{" << literal(name) << ", step" << spec.name.substr(0, 2) << "::exercise::" << name << "()}, ";
  code << "}};\n}\n}  // namespace test\n}  // namespace fa\n";
  write_file(entry, code.str());
  return 0;
}

int fill_holes(const fs::path& spec_path, const fs::path& skeleton, const fs::path& out, bool as_exercise) {
  const Spec spec = parse_exercise(spec_path);
  std::string text = read_file(skeleton);
  const std::string what = "filling " + skeleton.string();
  const Language lang = language_of(spec);
  if (!as_exercise) replace_once(text, skeleton_header(lang), "", what);
  // The redactions first (their neutral lines are unique in the skeleton, not in the filled file).
  for (const Edit& e : spec.edits)
    if (e.redact) replace_once(text, e.replace, e.find, what + " (undoing a redaction)");
  std::size_t n = 0;
  for (const Edit& e : spec.edits) {
    if (e.redact) continue;
    ++n;
    // Everything from the TODO(n) line to its end marker, whatever the student wrote in between.
    const std::string begin = hole_begin(n, e, lang), end = hole_end(e, lang);
    const auto first = text.find(begin);
    if (first == std::string::npos) throw std::runtime_error(what + ": no TODO(" + std::to_string(n) + ") comment");
    const auto last = text.find(end, first);
    if (last == std::string::npos) throw std::runtime_error(what + ": TODO(" + std::to_string(n) + ") has no end");
    text.replace(first, last + end.size() - first, e.find);
  }
  const std::string ns = "namespace fa::step" + spec.name.substr(0, 2);
  if (!as_exercise && lang.namespaces) {
    replace_once(text, ns + "::exercise {", ns + " {", what);
    replace_once(text, "}  // " + ns + "::exercise\n", "}  // " + ns + "\n", what);
  }
  write_file(out, text);
  return 0;
}

/// The lines of `text`, without their newlines.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// `line` with its leading and trailing blanks removed and every inner run of blanks made one space.
std::string normalized(const std::string& line) {
  std::istringstream words(line);
  std::string out;
  for (std::string word; words >> word;) out += (out.empty() ? "" : " ") + word;
  return out;
}

/// A normalized line's code, without its comment ("" for a comment line; `comment` is "//" or "#").
std::string code_of(const std::string& line, const std::string& comment) {
  const auto slash = line.find(comment);
  return normalized(line.substr(0, slash));
}

/// A normalized line's comment ("" for none).
std::string comment_of(const std::string& line, const std::string& comment) {
  const auto slash = line.find(comment);
  return slash == std::string::npos ? "" : line.substr(slash);
}

/// Whether a normalized line says too little to give an answer away: blank, only brackets and
/// punctuation, a #pragma, or fewer than `least` characters that are not blanks.
bool trivial(const std::string& line, std::size_t least) {
  if (line.rfind("#pragma", 0) == 0) return true;
  std::size_t chars = 0;
  bool only_punctuation = true;
  for (char c : line) {
    if (c == ' ') continue;
    ++chars;
    if (std::string("{}();,").find(c) == std::string::npos) only_punctuation = false;
  }
  return only_punctuation || chars < least;
}

/// The lines of `text` that hold code (blanks normalized, comments dropped), or with `comments`, every
/// line that is not blank.
std::vector<std::string> said(const std::string& text, bool comments, const Language& lang) {
  std::vector<std::string> out;
  for (const auto& raw : lines_of(text))
    if (const std::string line = comments ? normalized(raw) : code_of(normalized(raw), lang.comment); !line.empty())
      out.push_back(line);
  return out;
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  for (const auto& l : lines)
    if (l == line) return true;
  return false;
}

/// check-skeleton: the skeleton must not hold the answers its holes ask for.
///  - A hole's stub must not be its solution: the same lines of code, comments and blanks aside (a
///    redaction's neutral lines must not be its step lines).
///  - Every line of a hole's solution (or of a redacted text) that says something (not trivial), is not
///    kept by its stub (or neutral lines) and is not also a line of the step outside the holes and
///    redactions (then it is no secret) may be in the skeleton neither as a line of its own nor, for
///    its code (16 characters or more), quoted in a comment.
/// Lines are compared with their blanks normalized.
int check_skeleton(const fs::path& spec_path, const fs::path& steps_dir) {
  const Spec spec = parse_exercise(spec_path);
  const Language lang = language_of(spec);
  const std::vector<std::string> skeleton = lines_of(skeleton_text(spec, spec_path, steps_dir));
  // The step with every hole's and redaction's lines taken out: what the skeleton may show freely.
  std::string outside = read_file(steps_dir / spec.fields.at("step"));
  for (const Edit& e : spec.edits)
    if (const auto at = outside.find(e.find); at != std::string::npos)
      outside = outside.substr(0, at) + "\n" + outside.substr(at + e.find.size());
  const std::vector<std::string> outside_lines = said(outside, true, lang), outside_code = said(outside, false, lang);
  int leaks = 0, checked = 0;
  std::size_t hole = 0;
  for (const Edit& e : spec.edits) {
    const std::string name = e.redact ? "a redaction" : "hole " + std::to_string(++hole);
    if (said(e.find, e.redact, lang) == said(e.replace, e.redact, lang)) {
      ++leaks;
      std::cerr << spec_path.string() << ": " << name << ": its "
                << (e.redact ? "'--- with' lines are the step's lines" : "stub is the step's code") << "\n";
    }
    const std::vector<std::string> kept = said(e.replace, true, lang), kept_code = said(e.replace, false, lang);
    for (const auto& line : said(e.find, true, lang)) {
      if (trivial(line, 12) || contains(kept, line) || contains(outside_lines, line)) continue;
      ++checked;
      // Its code, quoted in a comment, unless that code is also the stub's or in the step outside the holes.
      const std::string code = code_of(line, lang.comment);
      bool look_for_code = !trivial(code, 16) && !contains(kept_code, code);
      for (const auto& c : outside_code) look_for_code = look_for_code && c.find(code) == std::string::npos;
      for (std::size_t k = 0; k < skeleton.size(); ++k) {
        const std::string s = normalized(skeleton[k]);
        const bool whole = s == line, quoted = look_for_code && comment_of(s, lang.comment).find(code) != std::string::npos;
        if (!whole && !quoted) continue;
        ++leaks;
        std::cerr << spec_path.string() << ": " << name << ": line " << k + 1 << " of the skeleton "
                  << (whole ? "is" : "quotes") << " a line of its solution: " << line << "\n";
      }
    }
  }
  if (leaks > 0) {
    std::cerr << "fa-patch: exercise " << spec.name << ": the skeleton gives its solution away (" << leaks
              << " finding(s) above): change the stub, or hide the line (a longer hole, or a '--- redact' block)\n";
    return 1;
  }
  std::cout << "exercise " << spec.name << ": no stub is its solution, and none of the " << checked
            << " solution lines checked is in the skeleton\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 4 && args[0] == "mutant") return make_mutant(args[1], args[2], args[3]);
    if (args.size() >= 2 && args[0] == "mutant-list")
      return make_list(args[1], std::vector<fs::path>(args.begin() + 2, args.end()));
    if ((args.size() == 4 || args.size() == 5) && args[0] == "skeleton")
      return make_skeleton(args[1], args[2], args[3], args.size() == 5 ? args[4] : "");
    if ((args.size() == 4 || (args.size() == 5 && args[4] == "--as-exercise")) && args[0] == "fill")
      return fill_holes(args[1], args[2], args[3], args.size() == 5);
    if (args.size() == 3 && args[0] == "check-skeleton") return check_skeleton(args[1], args[2]);
    std::cerr << "usage: fa-patch mutant SPEC STEPS_DIR OUT.cu | mutant-list OUT.cpp SPEC... |\n"
                 "       skeleton SPEC STEPS_DIR OUT.cu ENTRY.cpp (a Python step: OUT.py) | fill SPEC SKELETON.cu OUT.cu [--as-exercise] |\n"
                 "       check-skeleton SPEC STEPS_DIR\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fa-patch: " << e.what() << "\n";
    return 1;
  }
}
