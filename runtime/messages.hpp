// The actor interfaces and message types of the runtime, declared in one place (HOUSE_STYLE 11)
// and registered once (register_message_types). Only values cross actor boundaries: ids, token
// vectors, byte blobs, JSON text. Every type has an `inspect` so executor and store actors can be
// published through CAF's io middleman and used from another process.
//
// CAF headers stay inside runtime/: include this file only from runtime/*.cpp.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/executor_core.hpp"

namespace cedar::runtime {

// ---- atoms (≤ 10 characters) ---------------------------------------------------------------
using generate_atom = caf::atom_constant<caf::atom("generate")>;
using token_atom = caf::atom_constant<caf::atom("token")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using create_atom = caf::atom_constant<caf::atom("create")>;
using commit_atom = caf::atom_constant<caf::atom("commit")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using items_atom = caf::atom_constant<caf::atom("items")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using ask_atom = caf::atom_constant<caf::atom("ask")>;
using event_atom = caf::atom_constant<caf::atom("event")>;
using tool_done_atom = caf::atom_constant<caf::atom("tool_done")>;
using tool_tmo_atom = caf::atom_constant<caf::atom("tool_tmo")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using kv_usage_atom = caf::atom_constant<caf::atom("kv_usage")>;
using fork_atom = caf::atom_constant<caf::atom("fork")>;
using log_atom = caf::atom_constant<caf::atom("log")>;
using timings_atom = caf::atom_constant<caf::atom("timings")>;
using opts_atom = caf::atom_constant<caf::atom("agent_opts")>;

// The gateway a published runtime offers (runtime/remote.cpp): one request returns the
// executor, the store and the model hash. Both ends compile this declaration (its reply types
// are CAF built-ins).
using endpoints_atom = caf::atom_constant<caf::atom("endpoints")>;
using gateway_actor = caf::typed_actor<caf::replies_to<endpoints_atom>::with<caf::actor, caf::actor, uint64_t>>;

// ---- executor ------------------------------------------------------------------------------
struct gen_request {
  int64_t session = 0;
  std::vector<int32_t> tokens;   // new tokens to prefill
  float temperature = 0, top_p = 1, min_p = 0;
  uint64_t seed = 0;
  int32_t max_new_tokens = 256;
  int32_t min_new_tokens = 0;    // generation_params::min_new_tokens
  std::vector<int32_t> stop_ids;
  bool fresh = false;            // a new session: nothing to restore
  std::string tool_grammar;      // constrained tool calls (generation_params::tool_grammar)
  std::string reply_prefix;      // generation_params::reply_prefix
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gen_request& x) {
  return f(caf::meta::type_name("gen_request"), x.session, x.tokens, x.temperature, x.top_p, x.min_p, x.seed,
           x.max_new_tokens, x.min_new_tokens, x.stop_ids, x.fresh, x.tool_grammar, x.reply_prefix);
}

struct kv_source_msg {
  uint32_t layer = 0;
  uint64_t first_entry = 0;
  uint32_t n_entries = 0;
  std::vector<uint8_t> main, index;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_source_msg& x) {
  return f(caf::meta::type_name("kv_source_msg"), x.layer, x.first_entry, x.n_entries, x.main, x.index);
}

struct aux_msg {
  std::string name;
  std::vector<uint8_t> bytes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, aux_msg& x) {
  return f(caf::meta::type_name("aux_msg"), x.name, x.bytes);
}

struct gen_done {
  int64_t session = 0;
  std::string error;              // non-empty: the generation failed (nothing to commit)
  std::vector<int32_t> generated;
  bool stopped = false;
  std::string resume_path;
  int64_t n_prompt = 0, n_replayed = 0, n_generated = 0, context = 0;
  double resume_ms = 0, prefill_ms = 0, decode_ms = 0;
  int64_t n_masked = 0;           // sampled tokens the tool grammar rejected
  // the turn's KV delta
  uint64_t first_token = 0;
  std::vector<int32_t> tokens;
  std::vector<kv_source_msg> sources;
  std::vector<aux_msg> aux;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gen_done& x) {
  return f(caf::meta::type_name("gen_done"), x.session, x.error, x.generated, x.stopped, x.resume_path, x.n_prompt,
           x.n_replayed, x.n_generated, x.context, x.resume_ms, x.prefill_ms, x.decode_ms, x.n_masked, x.first_token,
           x.tokens, x.sources, x.aux);
}

struct executor_status {
  int64_t n_resident = 0, n_active = 0;
  int64_t resident_bytes = 0, ram_budget = 0;
  int64_t steps = 0, tokens_generated = 0, max_batch = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, executor_status& x) {
  return f(caf::meta::type_name("executor_status"), x.n_resident, x.n_active, x.resident_bytes, x.ram_budget, x.steps,
           x.tokens_generated, x.max_batch);
}

// ---- store ---------------------------------------------------------------------------------
struct item_msg {
  std::string kind;      // system | user | assistant | tool_call | tool_result
  std::string payload;   // JSON text
  uint64_t token_begin = 0, token_end = 0;
  uint32_t turn = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, item_msg& x) {
  return f(caf::meta::type_name("item_msg"), x.kind, x.payload, x.token_begin, x.token_end, x.turn);
}

struct commit_request {
  int64_t session = 0;
  std::vector<item_msg> items;
  uint64_t first_token = 0;
  std::vector<int32_t> tokens;
  std::vector<kv_source_msg> sources;
  std::vector<aux_msg> aux;
  std::string status_after = "active";
  // The turn's generation timing (stored per turn); ttft_ms < 0: the turn did not generate.
  double ttft_ms = -1, decode_ms = 0;
  int64_t n_decoded = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, commit_request& x) {
  return f(caf::meta::type_name("commit_request"), x.session, x.items, x.first_token, x.tokens, x.sources, x.aux,
           x.status_after, x.ttft_ms, x.decode_ms, x.n_decoded);
}

struct resume_msg {
  std::string error;      // the session could not be loaded at all
  std::vector<int32_t> tokens;
  bool pages_ok = true;
  std::string problem;
  std::vector<kv_source_msg> sources;
  std::vector<aux_msg> aux;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, resume_msg& x) {
  return f(caf::meta::type_name("resume_msg"), x.error, x.tokens, x.pages_ok, x.problem, x.sources, x.aux);
}

struct session_msg {
  int64_t id = 0;
  std::string agent, status;
  int64_t created_ms = 0, updated_ms = 0;
  uint32_t n_turns = 0;
  uint64_t n_tokens = 0;
  int64_t parent = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_msg& x) {
  return f(caf::meta::type_name("session_msg"), x.id, x.agent, x.status, x.created_ms, x.updated_ms, x.n_turns,
           x.n_tokens, x.parent);
}

// Replies carry their error in-band (`error` non-empty) so they cross process boundaries as
// plain values.
struct store_reply {
  std::string error;
  int64_t value = 0;  // session id (create) or turn index (commit)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_reply& x) {
  return f(caf::meta::type_name("store_reply"), x.error, x.value);
}

// The FP4 KV pages a session references (the dashboard), and what they would take in bf16.
struct kv_usage_msg {
  std::string error;
  int64_t n_pages = 0, n_entries = 0;
  int64_t fp4_bytes = 0;   // page blobs: 64-byte headers + main + index entries
  int64_t bf16_bytes = 0;  // the same entries as bf16 values (main_dims + index_dims) * 2
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_usage_msg& x) {
  return f(caf::meta::type_name("kv_usage_msg"), x.error, x.n_pages, x.n_entries, x.fp4_bytes, x.bf16_bytes);
}

// A session's token log and where its checkpoints fall (the OpenAI API's prefix index).
struct session_log_msg {
  std::string error;
  std::vector<int32_t> tokens;
  std::vector<uint64_t> checkpoint_tokens;  // [i]: log length after turn i (n_turns = i + 1)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_log_msg& x) {
  return f(caf::meta::type_name("session_log_msg"), x.error, x.tokens, x.checkpoint_tokens);
}

// One turn's stored generation timing (sessions::turn_timing).
struct turn_timing_msg {
  uint32_t turn = 0;
  double ttft_ms = 0, decode_ms = 0;
  int64_t n_decoded = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, turn_timing_msg& x) {
  return f(caf::meta::type_name("turn_timing_msg"), x.turn, x.ttft_ms, x.decode_ms, x.n_decoded);
}

using executor_actor = caf::typed_actor<
    caf::replies_to<generate_atom, gen_request, caf::actor>::with<gen_done>,  // actor: token sink
    caf::reacts_to<cancel_atom, int64_t>,
    caf::replies_to<status_atom>::with<executor_status>,
    caf::reacts_to<step_atom>>;

using store_actor = caf::typed_actor<
    caf::replies_to<create_atom, std::string, uint64_t>::with<store_reply>,   // agent name, model hash
    caf::replies_to<commit_atom, commit_request>::with<store_reply>,
    caf::replies_to<load_atom, int64_t>::with<resume_msg>,
    caf::replies_to<items_atom, int64_t>::with<std::vector<item_msg>, std::string>,
    caf::replies_to<finish_atom, int64_t, std::string>::with<store_reply>,
    caf::replies_to<list_atom>::with<std::vector<session_msg>, std::string>,
    caf::replies_to<kv_usage_atom, int64_t>::with<kv_usage_msg>,
    caf::replies_to<fork_atom, int64_t, uint32_t>::with<store_reply>,    // parent, n_turns -> fork id
    caf::replies_to<log_atom, int64_t>::with<session_log_msg>,
    caf::replies_to<timings_atom, int64_t>::with<std::vector<turn_timing_msg>, std::string>,
    caf::replies_to<opts_atom, int64_t>::with<std::string, std::string>,     // -> options JSON, error
    caf::replies_to<opts_atom, int64_t, std::string>::with<store_reply>>;    // sets the options JSON

// Registers every message type above with the actor system config (both ends of a remote link
// must call it).
void register_message_types(caf::actor_system_config& cfg);

}  // namespace cedar::runtime

namespace cedar::runtime {

// ---- agent ---------------------------------------------------------------------------------
// Streamed to the asker of a turn: kind = token | tool_call | tool_result | answer | error.
struct agent_event_msg {
  std::string kind, text, tool, arguments;
  bool is_error = false;
  double ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_event_msg& x) {
  return f(caf::meta::type_name("agent_event_msg"), x.kind, x.text, x.tool, x.arguments, x.is_error, x.ms);
}

struct turn_summary {
  std::string error;      // the turn failed (the transcript up to it is committed)
  std::string answer;
  bool cancelled = false, round_limit = false;
  bool repeat_limit = false;  // turn_result::repeat_limit
  int32_t rounds = 0, tool_calls = 0;
  int32_t invalid_tool_calls = 0;  // turn_result::invalid_tool_calls
  int64_t masked_tokens = 0;       // turn_result::masked_tokens
  int64_t prompt_tokens = 0, generated_tokens = 0, replayed_tokens = 0, context = 0;
  std::string resume_path;  // of the turn's first generation
  std::vector<std::string> resume_paths;  // of every generation, in order
  double first_token_ms = 0, total_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, turn_summary& x) {
  return f(caf::meta::type_name("turn_summary"), x.error, x.answer, x.cancelled, x.round_limit, x.repeat_limit, x.rounds, x.tool_calls,
           x.invalid_tool_calls, x.masked_tokens, x.prompt_tokens, x.generated_tokens, x.replayed_tokens, x.context, x.resume_path,
           x.resume_paths, x.first_token_ms, x.total_ms);
}

}  // namespace cedar::runtime
