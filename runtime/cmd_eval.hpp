// `cedar eval TASKS.jsonl [--json]`: runs a task file through the real runtime (issue 6).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/base/result.hpp"
#include "runtime/cedar.hpp"
#include "runtime/eval_tasks.hpp"

namespace cedar::runtime {

void add_eval_command(CLI::App& app, int* exit_code);

// ---- the evaluation as a library (the command and tests/runtime/eval_test.cpp use it) ----

struct eval_settings {
  std::string model_dir;                 // used when engine/tokenizer are not given
  std::shared_ptr<const model::engine> engine;
  std::shared_ptr<const model::tokenizer> tokenizer;
  std::string mcp_config;
  resume_policy resume = resume_policy::replay;
  bool kv_unquantised = false;
  uint8_t kv_rounded = 0;                // with kv_unquantised: runtime_options::kv_rounded
  int max_rounds = 8;                    // model replies with tool calls per user turn
  int max_repeated_failures = 2;         // agent_options::max_repeated_failures
  bool answer_on_limit = true;           // agent_options::answer_on_limit
  int max_new_tokens = 256;              // per model reply
  bool constrain_tool_calls = true;      // agent_options::constrain_tool_calls
  std::string default_system = "You are cedar, a helpful assistant. Use the tools when they help.";
};

// One step of a task's conversation, for --transcripts: a user turn, the model's streamed text
// (DSML included), a tool call, a tool result.
struct eval_step {
  std::string role;        // user | assistant | tool_call | tool_result | refused_call (a limit stopped it)
  std::string text;        // user / assistant text, tool result text
  std::string tool, arguments;
  bool is_error = false;   // tool_result
};

struct eval_outcome {
  std::string id, family;
  bool ok = false;
  std::string error;                     // the task could not run to its end (setup or runtime)
  int turns = 0, rounds = 0, tool_calls = 0, invalid_tool_calls = 0, tool_errors = 0;
  int64_t masked_tokens = 0;  // turn_result::masked_tokens, summed over the task's turns
  int64_t prompt_tokens = 0, replayed_tokens = 0, generated_tokens = 0, context = 0;
  int fresh = 0, resident = 0, replayed = 0, reprefilled = 0;  // resume path of every generation
  bool round_limit = false;
  bool repeat_limit = false;             // a turn ended on a call repeated after failing
  std::string answer;                    // the final answer
  double seconds = 0;
  std::vector<eval_step> transcript;     // every step, in order
};

// A task's transcript as one JSON object: id, family, ok, expect, answer, steps [...].
std::string eval_transcript_json(const eval_task& t, const eval_outcome& o);

// Runs one task in a fresh temporary directory (file root + SQLite store), with its own runtime
// on the shared model; removes the directory afterwards.
eval_outcome run_eval_task(const eval_task& t, const eval_settings& s);

// `--kv`: "fp4" -> {false, 0}; "bf16" -> {true, 0}; "bf16+main+index+swa" (any non-empty set of
// the three, any order, each once) -> {true, model::kv_part bits}; anything else an error naming
// the value and the part. kv_name gives the canonical form back (parts in main, index, swa order).
result<std::pair<bool, uint8_t>> parse_kv(const std::string& v);
std::string kv_name(const eval_settings& s);

// The summary object of `cedar eval --json` (per family when tasks carry one; per task when
// `details`).
std::string eval_summary_json(const std::vector<eval_outcome>& r, const eval_settings& s, bool details, double seconds);

}  // namespace cedar::runtime
