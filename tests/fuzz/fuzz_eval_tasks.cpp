// Fuzz target: runtime::parse_eval_tasks, the task-file reader of `cedar eval` (a task file is
// untrusted input: hand-written, generated, downloaded), and eval_expect_matches, which runs a
// task's `expect` (a substring or an ECMAScript regex from the file) over a model's answer.
//
// Input: byte 0 picks how much of the tail is used as the "answer" (0-255 bytes); the rest is
// the task file. Checked: no crash/UB/leak/timeout; an accepted file has tasks with what the
// reader promises (1-based increasing lines, unique non-empty ids, non-empty tools and turns,
// exactly one of expect.text / expect.regex, file paths relative and inside the root); a
// rejected file gets an error that names the origin.
// Built from runtime/eval_tasks.cpp alone (tests/fuzz/CMakeLists.txt), not the whole runtime.
#include <set>
#include <string>

#include "runtime/eval_tasks.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::runtime;
using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const size_t answer_len = in.take_byte();
  std::string_view file = in.rest();
  std::string answer(file.substr(file.size() > answer_len ? file.size() - answer_len : 0));

  auto r = parse_eval_tasks(file, "fuzz.jsonl");
  if (!r.ok()) {
    fuzz_require(r.err().message.rfind("fuzz.jsonl", 0) == 0, "eval_tasks: an error that does not name the file");
    return 0;
  }
  fuzz_require(!r->empty(), "eval_tasks: an accepted file without tasks");
  std::set<std::string> ids;
  int last_line = 0;
  for (const eval_task& t : *r) {
    fuzz_require(t.line > last_line, "eval_tasks: task lines not increasing");
    last_line = t.line;
    fuzz_require(!t.id.empty() && ids.insert(t.id).second, "eval_tasks: empty or duplicate id");
    fuzz_require(!t.tools.empty() && !t.turns.empty(), "eval_tasks: empty tools or turns accepted");
    for (const auto& name : t.tools) fuzz_require(!name.empty(), "eval_tasks: empty tool name");
    fuzz_require(t.expect.text.empty() != t.expect.regex.empty(), "eval_tasks: expect must be text xor regex");
    for (const auto& [path, content] : t.files) {
      fuzz_require(!path.empty() && path.front() != '/', "eval_tasks: absolute or empty file path accepted");
      size_t b = 0;
      while (b <= path.size()) {  // no ".." component
        size_t e = path.find('/', b);
        if (e == std::string::npos) e = path.size();
        fuzz_require(path.compare(b, e - b, "..") != 0, "eval_tasks: a path leaving the root accepted");
        b = e + 1;
      }
    }
    // The expectation is run over an answer, as `cedar eval` does with the model's reply.
    (void)eval_expect_matches(t.expect, answer);
    if (!t.expect.text.empty()) fuzz_require(eval_expect_matches(t.expect, t.expect.text), "eval_tasks: text expect does not match itself");
  }
  return 0;
}
