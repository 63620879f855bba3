// completion — stateless chat completions through the executor and store actors (the OpenAI
// API's engine; protocol-neutral: runtime/server/openai_api.cpp maps JSON onto it).
//
// A request is a whole conversation. It is rendered with the V4.1 chat format and tokenized;
// the prompt P then reuses KV by exact token-prefix matching against the sessions this service
// created:
//   prefix index   for every checkpoint of every API session (the store writes one at the end
//                  of each turn; KV pages and aux state exist only there): a hash of the token
//                  log up to it -> (session, turn). Matching hashes P at every position and
//                  verifies a hit token by token against the session's log (kept in memory).
//                  So when P and a stored log share a prefix that ends inside a turn, the match
//                  is the longest checkpoint <= that common prefix, and the rest of P is prefilled.
//   rebuilt        at construction from the store: the most recently updated API sessions
//                  (agent "openai") with their token logs, checkpoints and the message count at
//                  each; a restarted server matches what it stored before.
//   longest match  at the session's end, the session idle   -> continue that session
//                  at an earlier turn, the session busy, or -> fork it at that turn (the store
//                  the session finished (done/cancelled)       shares its KV pages)
//                  none                                     -> a fresh session
//   generation     the unmatched tail of P is prefilled (resident / replayed / reprefilled as
//                  the executor decides), the reply decoded, then committed as ONE turn (input
//                  items + the assistant item + every token and KV page of the turn).
//   replies        the tokens the model sampled for a reply are remembered, keyed by the reply
//                  as returned (content + calls with their ids): when a client sends that reply
//                  back, the prompt holds the sampled tokens, not a re-encoding of the text, so
//                  the follow-up's prefix matches the first request's log exactly. Rebuilt from
//                  the assistant items marked "faithful" (their token range is the reply).
//   tool calls     streamed as they are parsed: call_begin gives the first fragment (index, id,
//                  type, name, empty arguments), each complete parameter a piece of the
//                  arguments JSON, call_end the closing brace; the pieces concatenate to the
//                  call's final arguments (the DSML parser's `{"K": V, ...}`).
//   timing         each turn's time to first token (request to first sampled token) and decode
//                  time are stored with the turn (sessions::turn_timing).
// usage.cached_tokens = the matched prefix length (0 when the executor had to re-prefill).
//
// Owns: the in-memory prefix index and reply map (bounded: max_sessions, LRU; rebuilt from the
// store at construction). Thread-safe: many HTTP threads call complete() at once;
// the executor batches their decode steps.
// tool_choice is the caller's: `forced_prefix` starts the reply (required / a named function
// force the opening of the DSML block), `drop_calls` discards calls (tool_choice none).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/chat_format.hpp"

namespace cedar {
class agent_runtime;
}

namespace cedar::runtime {

struct completion_request {
  std::vector<model::chat_message> messages;  // the conversation; it must end on a user-side turn
  std::vector<std::string> tools_json;        // OpenAI tool objects, rendered into the system turn
  std::string forced_prefix;                  // text the reply starts with (part of the reply)
  bool drop_calls = false;                    // tool_choice none: calls are not returned
  float temperature = 1, top_p = 1;
  uint64_t seed = 0;
  int max_tokens = 512;                       // sampled tokens (the forced prefix not counted)
  int min_tokens = 0;                         // EOS masked until this many (generation_params::min_new_tokens)
  std::vector<std::string> stop;              // stop strings (content; not part of the reply)
};

struct completion_call {
  std::string id;  // call_<hex>
  std::string name;
  std::string arguments_json;
};

struct completion_result {
  std::string content;
  std::vector<completion_call> calls;
  std::string finish_reason;  // stop | length | tool_calls
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int64_t session = 0;        // the store session that holds the conversation now
  std::string resume_path;    // fresh | resident | replayed | reprefilled
  std::vector<std::string> parse_errors;  // malformed DSML in the reply
};

// Streaming callbacks (called on the caller's thread, in order). Returning false stops the
// generation (the client went away); what was generated is still committed.
struct completion_call_delta {
  int index = 0;          // the call's position in the reply
  bool first = false;     // the first fragment: carries id and name
  std::string id, name;   // set on the first fragment only
  std::string arguments;  // the next piece of the arguments JSON (empty on the first fragment)
};
struct completion_sink {
  std::function<bool(std::string_view)> content;
  std::function<bool(const completion_call_delta&)> tool_call_delta;  // pieces, as parsed
  std::function<bool(const completion_call&, int index)> tool_call;    // each complete call
};

class completion_service {
 public:
  explicit completion_service(agent_runtime& rt, size_t max_sessions = 256);
  ~completion_service();
  completion_service(const completion_service&) = delete;
  completion_service& operator=(const completion_service&) = delete;

  // Renders and tokenizes the request without generating: the errors complete() would give for
  // a bad conversation (so a stream can answer 400 before it starts).
  status validate(const completion_request& req) const;
  // errc::invalid_argument / invalid_format: the request is wrong (HTTP 400); others: 500.
  result<completion_result> complete(const completion_request& req, const completion_sink& sink = {});

  // The model's name (its directory's base name, or "cedar" for an engine given in memory).
  std::string model_id() const;
  size_t n_indexed_sessions() const;
  // How many sessions the construction took back from the store.
  size_t n_rebuilt_sessions() const;

  struct state;

 private:
  void rebuild();

  agent_runtime& rt_;
  std::unique_ptr<state> st_;
};

}  // namespace cedar::runtime
