// agent_loop — the tool-calling loop of one agent, as a plain state machine (no actors; the
// agent actor in actors.cpp drives it and GoogleTest tests it directly).
//
// State diagram (transitions named after the methods that perform them):
//
//            begin_turn                      end_reply (calls)
//   idle ───────────────► generating ─────────────────────────► running_tools
//    ▲                     │   ▲  │                                  │
//    │   end_reply         │   │  └── on_token (stream: text, DSML)   │ tool_results
//    └── (no calls, round ─┘   └──────────────────────────────────────┘
//         or repeat limit)
//   cancel: any state ──► idle (the turn ends; the transcript stays valid)
//
// Invariants:
//   1. messages() rendered by the chat format is, token for token, what the sequence holds,
//      except that assistant replies hold the tokens the model sampled (not a re-encoding).
//   2. Every tool call of a reply gets exactly one tool result, in call order, before the next
//      generation; malformed calls, unknown tools and bad arguments get an error result.
//   3. Token deltas start with a special token, so encoding them apart equals encoding the
//      whole prompt (BPE never merges across an added token).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/chat_format.hpp"
#include "model/dsml.hpp"
#include "model/tokenizer.hpp"

namespace cedar::runtime {

enum class agent_phase { idle, generating, running_tools };
const char* agent_phase_name(agent_phase p);

struct agent_limits {
  int max_new_tokens = 512;   // per model reply
  int min_new_tokens = 0;     // the reply cannot end before this many tokens (0: off)
  int max_tool_rounds = 8;    // model replies with tool calls per user turn
  // A call (same tool, same arguments text) that already failed this many times in the turn ends
  // the turn when the model makes it again, instead of running it a futile time more; 0: no limit.
  int max_repeated_failures = 2;
  // When a limit stops a reply's calls: true, the calls get "not run" error results and the model
  // writes one more reply with tool calls forbidden (the turn ends with an answer; LangChain's
  // early_stopping_method "generate"); false, the turn ends at that reply.
  bool answer_on_limit = true;
};

// A call the model made, ready to run (or already failed: `error` set, never run).
struct tool_call {
  std::string id;
  std::string name;
  std::string arguments_json;
  std::string error;  // malformed call / unknown tool: becomes the call's error result
  bool refused = false;  // a limit stopped it (answer_on_limit): `error` says why; never run
};

struct tool_outcome {
  std::string id;
  std::string text;      // what the model reads
  bool is_error = false;
  double ms = 0;
};

// What the loop wants next after a reply.
struct reply_action {
  std::vector<tool_call> calls;  // empty: the turn is over
  std::string content;           // the reply's text (without the DSML block)
  std::vector<std::string> parse_errors;
  bool round_limit = false;      // calls were made but the round limit was reached
  bool repeat_limit = false;     // a call repeated one that already failed max_repeated_failures times
  // The reply's calls a limit stopped, never run. answer_on_limit: they are also in `calls`
  // (refused, `error` the "not run" result) and the next reply is the final one; else they are not
  // in messages() and the turn is over.
  std::vector<tool_call> refused;
};

class agent_loop {
 public:
  // `tools_json`: OpenAI tool objects rendered into the system turn. `known_tools`: names the
  // agent may call (unknown names become error results).
  agent_loop(const model::tokenizer& tok, std::string system_prompt, std::vector<std::string> tools_json,
             std::vector<std::string> known_tools, agent_limits limits);

  agent_phase phase() const { return phase_; }
  const std::vector<model::chat_message>& messages() const { return msgs_; }
  int round() const { return round_; }
  // False for the final reply after a limit (answer_on_limit): its generation must not call tools.
  bool calls_allowed() const { return !final_pass_; }

  // Starts a user turn: the tokens to prefill (BOS + system on the first turn).
  result<std::vector<int32_t>> begin_turn(const std::string& user_text);
  // Streams one sampled token: appends decoded text and DSML events (content, calls).
  void on_token(int32_t id, std::vector<model::dsml_event>& events);
  // The reply is complete (`stopped`: it ended on EOS). Records the assistant message.
  reply_action end_reply(bool stopped);
  // Tool results (any order; matched by id) -> the tokens to prefill for the next generation.
  result<std::vector<int32_t>> tool_results(std::vector<tool_outcome> outcomes);
  // Ends the turn wherever it is (cancellation); pending calls get "cancelled" results.
  void cancel();

  // Restores a loop from a stored transcript (resume after a restart): messages as recorded.
  // A turn cut by a crash is closed as cancel() closes one: the token log ends with the last
  // reply, so tool results stored after it are rendered with the next turn's delta, and calls
  // of that reply that have no result get "interrupted" error results (take_interrupted()).
  status restore(std::vector<model::chat_message> msgs, bool last_reply_stopped);
  // The calls restore() answered "interrupted" (error holds the text), once: the agent commits
  // them as tool results with the next turn.
  std::vector<tool_call> take_interrupted() { return std::move(interrupted_); }

 private:
  result<std::vector<int32_t>> delta_tokens(const std::vector<model::chat_message>& next);

  const model::tokenizer& tok_;
  agent_limits limits_;
  std::vector<std::string> known_;
  std::vector<model::chat_message> msgs_;
  std::string rendered_;          // render_chat(msgs_) + the generation prefix, when generating
  agent_phase phase_ = agent_phase::idle;
  int round_ = 0;
  int call_counter_ = 0;
  bool last_stopped_ = true;      // the previous reply ended with EOS (else EOS is owed)
  bool final_pass_ = false;       // a limit was reached this turn: the reply being made is the last
  bool final_by_round_ = false;   // ... the round limit (else the repeat guard)
  model::stream_decoder dec_;
  std::optional<model::dsml_parser> parser_;
  std::string raw_reply_;
  std::vector<tool_call> pending_;
  std::vector<tool_call> interrupted_;
  std::map<std::string, int> failed_;  // this turn's failed calls: name + '\n' + arguments -> count
};

}  // namespace cedar::runtime
