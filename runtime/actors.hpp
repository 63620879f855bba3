// Spawning the runtime's actors. Implementation in actors.cpp; CAF types in messages.hpp.
#pragma once

#include <memory>
#include <string>

#include "runtime/agent_loop.hpp"
#include "runtime/messages.hpp"
#include "runtime/observer.hpp"
#include "sessions/store.hpp"
#include "tools_mcp/tool_registry.hpp"

namespace cedar::runtime {

// The executor: owns the sequences of every session, batches all agents' decode steps.
executor_actor spawn_executor(caf::actor_system& sys, std::shared_ptr<const model::engine> e, size_t ram_budget_bytes,
                              store_actor store, executor_options opts = {});

// The store: the only owner of the SQLite connection.
store_actor spawn_store(caf::actor_system& sys, std::unique_ptr<sessions::store> st, uint64_t model_hash,
                        sessions::page_geometry geometry);

struct agent_config {
  std::string name = "agent";
  std::string system_prompt;
  std::vector<std::string> tools;        // registry names offered to the model (empty: all)
  float temperature = 0, top_p = 1, min_p = 0;
  uint64_t seed = 0;
  agent_limits limits;
  int tool_timeout_ms = 30000;
  bool constrain_tool_calls = true;      // tool grammar (model/tool_grammar.hpp) on every reply
  std::shared_ptr<observer> obs;         // when set, the agent publishes its events there
};

// An agent bound to `session` (created or resumed by the caller). Its behavior:
//   (ask_atom, text, events)  runs a turn: sends (event_atom, agent_event_msg)... then the
//                             turn_summary to `events`, as ordinary messages
//   (cancel_atom)            -> stops the current turn
caf::actor spawn_agent(caf::actor_system& sys, std::shared_ptr<const model::tokenizer> tok,
                       std::shared_ptr<tools::tool_registry> reg, executor_actor exec, store_actor store,
                       int64_t session, agent_config cfg, std::vector<model::chat_message> history,
                       bool last_reply_stopped, int32_t eos_id);

// The OpenAI tool object of a tool as the system turn renders it (keys in trained order).
std::string tool_schema_json(const tools::tool& t);

// The tools an agent offers the model: the registry's tools named in `only` (empty: every one),
// in registry order, with what the system turn renders and the grammar its replies sample under.
struct offered_tools {
  std::vector<std::string> names;
  std::vector<std::string> schemas;  // tool_schema_json of each
  std::string grammar;               // model::tool_grammar_spec of them; "" when none is offered
};
offered_tools offer_tools(const tools::tool_registry& reg, const std::vector<std::string>& only);

// Transcript items <-> chat messages (the payload JSON of each item kind).
std::vector<model::chat_message> messages_from_items(const std::vector<item_msg>& items, bool* last_stopped);

}  // namespace cedar::runtime
