// eval_tasks — the task file of `cedar eval` (issue 6 "Evaluation"): JSON Lines, one task per
// line, read by a pure function from bytes to tasks. Every error names the line and the field.
//
//   {"id": "single-3", "family": "single", "system": "You are cedar...",
//    "tools": ["calculator", "file_read"], "files": {"conf/app.conf": "port = 8080"},
//    "notes": {"budget": "1200"}, "clock": "2028-05-03 14:22",
//    "turns": ["What is the port in conf/app.conf?"], "expect": "8080"}
//
// Fields: id (non-empty string, unique in the file); family (optional string, summaries group by
// it); system (optional system prompt); tools (non-empty array of tool names offered to the
// agent); files (optional object: relative path -> content, created in the task's fresh file
// root); notes (optional object: key -> text, saved in the notebook before the first turn);
// clock (optional string: what the clock tool returns, for reproducible tasks); turns (non-empty
// array of user messages, in order); expect (a non-empty string the final answer must contain,
// or {"regex": "..."} that must match somewhere in it, ECMAScript syntax). Unknown fields are
// errors (a typo must not silently drop a condition). Blank lines are skipped.
//
// Does not run anything (runtime/cmd_eval.cpp does); never throws; bounded work per byte (JSON
// nesting deeper than 32 levels is rejected before parsing).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::runtime {

struct eval_expect {
  std::string text;   // the answer must contain it (when regex is empty)
  std::string regex;  // else: the answer must match it (std::regex_search, ECMAScript)
};

struct eval_task {
  int line = 0;  // 1-based line of the task file
  std::string id, family, system;
  bool has_system = false;
  std::vector<std::string> tools;
  std::vector<std::pair<std::string, std::string>> files;  // relative path -> content, file order
  std::vector<std::pair<std::string, std::string>> notes;  // key -> text
  std::optional<std::string> clock;
  std::vector<std::string> turns;
  eval_expect expect;
};

// Parses a whole task file. `origin` names it in errors ("tasks.jsonl:12: field 'turns': ...").
result<std::vector<eval_task>> parse_eval_tasks(std::string_view bytes, const std::string& origin = "tasks");
// Reads and parses a file.
result<std::vector<eval_task>> load_eval_tasks(const std::string& path);

// Whether `answer` satisfies `e` (a regex that fails to compile never matches; the reader
// rejects such tasks, so that only happens for hand-built values).
bool eval_expect_matches(const eval_expect& e, const std::string& answer);

}  // namespace cedar::runtime
