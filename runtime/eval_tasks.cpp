// eval_tasks — see eval_tasks.hpp for the format. Parsing order per line: nesting pre-check,
// JSON parse (no exceptions: nlohmann's non-throwing parse), then each field in a fixed order so
// the first error reported is deterministic.
#include "runtime/eval_tasks.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

namespace cedar::runtime {

namespace {

using njson = nlohmann::json;

constexpr int kMaxDepth = 32;
constexpr size_t kMaxRegex = 512;  // std::regex compiles recursively: keep patterns small

// Deepest [ / { nesting outside strings; stops counting past the limit.
int nesting_depth(std::string_view line) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : line) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') depth = std::max(0, depth - 1);
    if (max_depth > kMaxDepth) break;
  }
  return max_depth;
}

const char* type_name(const njson& v) {
  switch (v.type()) {
    case njson::value_t::null: return "null";
    case njson::value_t::object: return "an object";
    case njson::value_t::array: return "an array";
    case njson::value_t::string: return "a string";
    case njson::value_t::boolean: return "a boolean";
    case njson::value_t::number_integer:
    case njson::value_t::number_unsigned:
    case njson::value_t::number_float: return "a number";
    default: return "something else";
  }
}

// A relative path that stays inside the file root: no absolute path, no "..", no empty part.
bool safe_relative(const std::string& p, std::string& why) {
  if (p.empty()) return why = "empty path", false;
  if (p.find('\0') != std::string::npos) return why = "path contains a NUL byte", false;
  if (p.front() == '/' || p.front() == '\\') return why = "absolute path '" + p + "'", false;
  std::filesystem::path fp(p);
  if (fp.has_root_name() || fp.has_root_directory()) return why = "absolute path '" + p + "'", false;
  for (const auto& part : fp) {
    if (part == "..") return why = "path '" + p + "' leaves the file root", false;
  }
  if (p.back() == '/') return why = "path '" + p + "' names a directory", false;
  return true;
}

struct line_error {
  std::string origin;
  int line;
  result<std::vector<eval_task>> operator()(const std::string& field, const std::string& what) const {
    std::string where = origin + ":" + std::to_string(line) + ": ";
    if (!field.empty()) where += "field '" + field + "': ";
    return make_error(errc::invalid_format, where + what);
  }
};

}  // namespace

result<std::vector<eval_task>> parse_eval_tasks(std::string_view bytes, const std::string& origin) {
  static const std::set<std::string> known = {"id",    "family", "system", "tools",  "files",
                                              "notes", "clock",  "turns",  "expect"};
  std::vector<eval_task> tasks;
  std::set<std::string> ids;
  size_t pos = 0;
  int line_no = 0;
  while (pos < bytes.size()) {
    size_t nl = bytes.find('\n', pos);
    std::string_view line = bytes.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? bytes.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    line_error fail{origin, line_no};

    if (nesting_depth(line) > kMaxDepth)
      return fail("", "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    njson j = njson::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail("", "not valid JSON (one task object per line)");
    if (!j.is_object()) return fail("", std::string("expected a JSON object, got ") + type_name(j));
    for (const auto& [k, v] : j.items())
      if (!known.count(k))
        return fail(k, "unknown field (expected id, family, system, tools, files, notes, clock, turns, expect)");

    eval_task t;
    t.line = line_no;
    // id
    if (!j.contains("id")) return fail("id", "missing");
    if (!j["id"].is_string() || j["id"].get_ref<const std::string&>().empty())
      return fail("id", std::string("expected a non-empty string, got ") + type_name(j["id"]));
    t.id = j["id"].get<std::string>();
    if (!ids.insert(t.id).second) return fail("id", "duplicate id '" + t.id + "'");
    // family, system, clock: optional strings
    auto opt_str = [&](const char* k, std::string& out, bool* has) -> bool {
      if (!j.contains(k)) return true;
      if (!j[k].is_string()) return false;
      out = j[k].get<std::string>();
      if (has) *has = true;
      return true;
    };
    if (!opt_str("family", t.family, nullptr))
      return fail("family", std::string("expected a string, got ") + type_name(j["family"]));
    if (!opt_str("system", t.system, &t.has_system))
      return fail("system", std::string("expected a string, got ") + type_name(j["system"]));
    if (j.contains("clock")) {
      if (!j["clock"].is_string()) return fail("clock", std::string("expected a string, got ") + type_name(j["clock"]));
      t.clock = j["clock"].get<std::string>();
    }
    // tools
    if (!j.contains("tools")) return fail("tools", "missing");
    const njson& tl = j["tools"];
    if (!tl.is_array()) return fail("tools", std::string("expected an array of tool names, got ") + type_name(tl));
    if (tl.empty()) return fail("tools", "empty (an agent with no tool list is offered every registered tool)");
    for (size_t i = 0; i < tl.size(); ++i) {
      if (!tl[i].is_string() || tl[i].get_ref<const std::string&>().empty())
        return fail("tools", "element " + std::to_string(i) + ": expected a non-empty string, got " + type_name(tl[i]));
      t.tools.push_back(tl[i].get<std::string>());
    }
    // files, notes: objects of strings
    auto str_map = [&](const char* k, std::vector<std::pair<std::string, std::string>>& out,
                       bool paths) -> result<std::vector<eval_task>> {
      const njson& m = j[k];
      if (!m.is_object()) return fail(k, std::string("expected an object, got ") + type_name(m));
      for (const auto& [key, v] : m.items()) {
        if (!v.is_string()) return fail(k, "'" + key + "': expected a string, got " + type_name(v));
        std::string why;
        if (paths && !safe_relative(key, why)) return fail(k, why);
        if (!paths && key.empty()) return fail(k, "empty key");
        out.emplace_back(key, v.get<std::string>());
      }
      return std::vector<eval_task>{};
    };
    if (j.contains("files"))
      if (auto r = str_map("files", t.files, true); !r) return r;
    if (j.contains("notes"))
      if (auto r = str_map("notes", t.notes, false); !r) return r;
    // turns
    if (!j.contains("turns")) return fail("turns", "missing");
    const njson& tu = j["turns"];
    if (!tu.is_array() || tu.empty())
      return fail("turns", std::string("expected a non-empty array of user messages, got ") +
                               (tu.is_array() ? "an empty array" : type_name(tu)));
    for (size_t i = 0; i < tu.size(); ++i) {
      if (!tu[i].is_string()) return fail("turns", "element " + std::to_string(i) + ": expected a string, got " + type_name(tu[i]));
      t.turns.push_back(tu[i].get<std::string>());
    }
    // expect
    if (!j.contains("expect")) return fail("expect", "missing");
    const njson& ex = j["expect"];
    if (ex.is_string()) {
      if (ex.get_ref<const std::string&>().empty()) return fail("expect", "empty string (every answer would match)");
      t.expect.text = ex.get<std::string>();
    } else if (ex.is_object()) {
      if (ex.size() != 1 || !ex.contains("regex")) return fail("expect", "an object must be exactly {\"regex\": \"...\"}");
      if (!ex["regex"].is_string() || ex["regex"].get_ref<const std::string&>().empty())
        return fail("expect", std::string("'regex': expected a non-empty string, got ") + type_name(ex["regex"]));
      t.expect.regex = ex["regex"].get<std::string>();
      if (t.expect.regex.size() > kMaxRegex)
        return fail("expect", "'regex' longer than " + std::to_string(kMaxRegex) + " characters");
      try {
        std::regex re(t.expect.regex, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return fail("expect", "'regex' does not compile: " + std::string(e.what()));
      }
    } else {
      return fail("expect", std::string("expected a string or {\"regex\": \"...\"}, got ") + type_name(ex));
    }
    tasks.push_back(std::move(t));
  }
  if (tasks.empty()) return make_error(errc::invalid_format, origin + ": no tasks (one JSON object per line)");
  return tasks;
}

result<std::vector<eval_task>> load_eval_tasks(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::not_found, path + ": cannot open the task file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_eval_tasks(ss.str(), path);
}

bool eval_expect_matches(const eval_expect& e, const std::string& answer) {
  if (e.regex.empty()) return !e.text.empty() && answer.find(e.text) != std::string::npos;
  try {
    return std::regex_search(answer, std::regex(e.regex, std::regex::ECMAScript));
  } catch (const std::regex_error&) {
    return false;
  }
}

}  // namespace cedar::runtime
