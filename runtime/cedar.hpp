// cedar — the public C++ API. Include this header; it pulls in no CAF headers.
//
//   auto rt = cedar::agent_runtime::open({.model_dir = "model/weights/cedar-agent-tiny", .store_path = "s.db"});
//   rt.value()->add_tool(cedar::tools::make_tool("shout", "Upper-cases text", schema, fn));
//   auto a = rt.value()->create_agent({.system_prompt = "You are helpful."});
//   auto r = a->ask("What is 17 * 23?", [](const cedar::agent_event& e) { ... });
//
// A runtime owns one CAF actor system with an executor actor (the model and every session's
// sequence, continuous batching), a store actor (the SQLite session store) and one actor per
// agent; tool calls run on their own threads with timeouts. Agents resume by session id after a
// restart: their transcript comes from the store and their KV is restored (bounded replay).
// Thread safety: runtime and agent methods may be called from any thread; one agent runs one
// turn at a time (a second concurrent ask() gets an error).
//
// Beyond one machine (CAF's io middleman, no home-made RPC): publish() offers the runtime's
// executor and store on a 127.0.0.1 port; a runtime opened with `remote_port` set uses those
// remote actors while its agents and tools stay local (it loads only the tokenizer and the model
// config, for prompt rendering; the remote side holds the weights and every sequence):
//
//   server:  auto port = rt->publish();                        // 0: any free port
//   client:  agent_runtime::open({.model_dir = "model/weights/cedar-agent-tiny", .remote_port = *port});
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::model {
class engine;
class tokenizer;
struct model_config;
}  // namespace cedar::model

namespace cedar {

// How a session comes back for its next generation (after a tool result or a user turn).
//   resident   it stays in RAM while the budget allows (production default)
//   replay     evicted to the store after every commit: every resume restores the FP4 global KV
//              and runs bounded replay (what production does under memory pressure; `cedar eval`)
//   reprefill  evicted likewise, restored by re-prefilling the whole token log (exact, slow)
enum class resume_policy { resident, replay, reprefill };

struct runtime_options {
  // A model directory: config.json, model.safetensors, tokenizer.json (+ token_map.npy).
  std::string model_dir;
  // The SQLite session store (created if missing).
  std::string store_path;
  size_t ram_budget_mb = 2048;  // resident sequences beyond it are evicted (they stay in the store)
  resume_policy resume = resume_policy::resident;
  // Diagnostic (`cedar eval --kv bf16`): keep every KV entry unquantised (fp32). Such KV is not
  // persisted, so a session that leaves RAM comes back by re-prefilling its token log.
  bool kv_unquantised = false;
  // With kv_unquantised: the parts still rounded through their stored format, as fp32 (bits: 1 the
  // FP4 main entries, 2 the FP4 index keys and indexer queries, 4 the FP8 SWA entries;
  // `cedar eval --kv bf16+main+index+swa`): which quantisation costs what.
  uint8_t kv_rounded = 0;
  // Where decode steps run: "cpu", "cuda" (an NVIDIA GPU; open() fails, saying why, when none
  // can be used) or "auto" (cuda when a GPU is present). Prefill and replay run on the CPU.
  std::string backend = "cpu";
  int scheduler_threads = 2;
  // Optional `mcpServers` config file: every server's tools join the registry as "<server>__<tool>".
  std::string mcp_config;
  // Add the built-in tools (calculator, notes_save/notes_read, clock, file_read/file_list).
  bool builtin_tools = true;
  std::string files_root = ".";  // file_read / file_list never leave this directory
  // Bring your own model (embedding apps, tests): used instead of model_dir when both are set.
  std::shared_ptr<const model::engine> engine;
  std::shared_ptr<const model::tokenizer> tokenizer;
  // Non-zero: use the executor and store that another runtime published (publish()) on
  // remote_host:remote_port; store_path, ram_budget_mb, resume and kv_unquantised are then the
  // remote side's business and ignored here. The model (model_dir or engine) must be the one the
  // remote side serves: it is checked by its hash when connecting.
  std::string remote_host = "127.0.0.1";
  uint16_t remote_port = 0;
};

struct agent_options {
  std::string name = "agent";
  std::string system_prompt;
  std::vector<std::string> tools;  // tool names offered to the model; empty: every registered tool
  float temperature = 0;           // 0: greedy
  float top_p = 1, min_p = 0;
  uint64_t seed = 0;
  int max_new_tokens = 256;        // per model reply
  // The end of a reply (EOS, end of turn) is masked until it holds this many tokens; 0: off,
  // at most max_new_tokens (vLLM's min_tokens: replies of a known length, e.g. for benchmarks).
  int min_new_tokens = 0;
  int max_tool_rounds = 8;         // model replies with tool calls per ask()
  // A call (same tool, same arguments) that already failed this many times in one ask() ends the
  // turn (turn_result::repeat_limit) when the model makes it again; 0: no limit.
  int max_repeated_failures = 2;
  // When one of those limits stops a reply's calls: true (default), the calls are answered "not
  // run: ..." and the model writes one more reply with tool calls forbidden, so the turn ends with
  // an answer (LangChain's early_stopping_method "generate"); false, the turn ends at that reply.
  // turn_result::round_limit / repeat_limit say which limit was reached either way.
  bool answer_on_limit = true;
  int tool_timeout_ms = 30000;
  // Constrained decoding of tool calls: only offered tool names, their schemas' parameter names
  // and string/JSON forms, required parameters before a call closes (model/tool_grammar.hpp).
  bool constrain_tool_calls = true;
};

// Streamed while a turn runs.
struct agent_event {
  // refused_call: a call the model made that a limit stopped (agent_options::answer_on_limit);
  // never run, not counted in turn_result::tool_calls; `text` is the "not run: ..." result the
  // model reads before its final reply.
  enum class kind { token, tool_call, tool_result, answer, error, refused_call };
  kind type = kind::token;
  std::string text;       // token text / tool result / answer / error message / why not run
  std::string tool;       // tool_call, tool_result, refused_call
  std::string arguments;  // tool_call, refused_call: JSON
  bool is_error = false;  // tool_result
  double ms = 0;          // tool_result: duration
};

struct turn_result {
  std::string answer;
  bool cancelled = false;
  bool round_limit = false;     // the model kept calling tools past max_tool_rounds
  bool repeat_limit = false;    // the model repeated a call that had failed max_repeated_failures times
  int rounds = 0, tool_calls = 0;
  // Calls that could not run as made: malformed DSML, a tool not offered, arguments that are not
  // JSON or do not match the tool's input schema. (A tool that ran and reported an error is valid.)
  int invalid_tool_calls = 0;
  // Sampled tokens the tool grammar rejected (agent_options::constrain_tool_calls); each was drawn
  // again from the rest of the distribution.
  int64_t masked_tokens = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, replayed_tokens = 0, context = 0;
  std::string resume_path;      // fresh | resident | replayed | reprefilled
  std::vector<std::string> resume_paths;  // every generation's, in order
  double first_token_ms = 0, total_ms = 0;
};

struct session_summary {
  int64_t id = 0;
  std::string agent, status;
  uint32_t turns = 0;
  uint64_t tokens = 0;
  int64_t updated_ms = 0;
};

class agent_runtime;

class agent {
 public:
  int64_t session() const;
  // Runs one user turn to its end (answer, cancel, error or round limit); `on_event` is called
  // on the calling thread for every streamed event.
  result<turn_result> ask(const std::string& text, const std::function<void(const agent_event&)>& on_event = {});
  // Stops the running turn (from any thread): decoding stops, running tools are cancelled, the
  // transcript stays valid.
  void cancel();

  struct impl;
  explicit agent(std::shared_ptr<impl> p) : p_(std::move(p)) {}

 private:
  std::shared_ptr<impl> p_;
};

class agent_runtime {
 public:
  static result<std::unique_ptr<agent_runtime>> open(runtime_options opts);
  ~agent_runtime();

  // Registers a C++ tool (before creating the agents that should see it).
  status add_tool(tools::tool t);
  std::vector<std::string> tool_names() const;

  // Both refuse options out of range (errc::invalid_argument naming the field: max_new_tokens
  // and tool_timeout_ms below 1, max_tool_rounds or max_repeated_failures below 0).
  result<agent> create_agent(const agent_options& opts);
  // An agent continuing a stored session (after a restart or crash).
  result<agent> resume_agent(int64_t session, const agent_options& opts);
  result<std::vector<session_summary>> sessions();

  const model::tokenizer& tokenizer() const;
  const model::model_config& config() const;
  // The weights: local runtimes only (a remote runtime opened from model_dir holds none).
  bool has_engine() const;
  const model::engine& engine() const;

  // Publishes the executor and store on 127.0.0.1:`port` (0: a free port) for runtimes in other
  // processes (runtime_options::remote_port); returns the bound port. Loopback only; a runtime
  // that is itself remote cannot re-publish; publishing again returns the same port. The port
  // closes when this runtime is destroyed.
  result<uint16_t> publish(uint16_t port = 0);
  bool is_remote() const;

  struct impl;
  // The internals (runtime/runtime_impl.hpp), for cedar's own server and tools.
  impl& internals() const { return *p_; }

 private:
  explicit agent_runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

}  // namespace cedar
