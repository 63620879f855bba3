// The runtime's actors: executor, store, agent, and one-shot tool workers. Each is thin: the
// logic lives in executor_core, sessions::store and agent_loop, which tests drive directly.
#include "runtime/actors.hpp"

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "kernels/base/log.hpp"
#include "model/tokenizer.hpp"
#include "model/tool_grammar.hpp"
#include "tools_mcp/json.hpp"
#include "tools_mcp/json_schema.hpp"

namespace cedar::runtime {

using njson = nlohmann::json;

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<gen_request>("gen_request");
  cfg.add_message_type<kv_source_msg>("kv_source_msg");
  cfg.add_message_type<std::vector<kv_source_msg>>("std::vector<kv_source_msg>");
  cfg.add_message_type<aux_msg>("aux_msg");
  cfg.add_message_type<std::vector<aux_msg>>("std::vector<aux_msg>");
  cfg.add_message_type<gen_done>("gen_done");
  cfg.add_message_type<executor_status>("executor_status");
  cfg.add_message_type<item_msg>("item_msg");
  cfg.add_message_type<std::vector<item_msg>>("std::vector<item_msg>");
  cfg.add_message_type<commit_request>("commit_request");
  cfg.add_message_type<resume_msg>("resume_msg");
  cfg.add_message_type<session_msg>("session_msg");
  cfg.add_message_type<std::vector<session_msg>>("std::vector<session_msg>");
  cfg.add_message_type<store_reply>("store_reply");
  cfg.add_message_type<kv_usage_msg>("kv_usage_msg");
  cfg.add_message_type<session_log_msg>("session_log_msg");
  cfg.add_message_type<turn_timing_msg>("turn_timing_msg");
  cfg.add_message_type<std::vector<turn_timing_msg>>("std::vector<turn_timing_msg>");
  cfg.add_message_type<agent_event_msg>("agent_event_msg");
  cfg.add_message_type<turn_summary>("turn_summary");
  cfg.add_message_type<std::vector<int32_t>>("std::vector<int32_t>");
  cfg.add_message_type<std::vector<uint8_t>>("std::vector<uint8_t>");
}

// ============================================================================================
// executor
// ============================================================================================
namespace {

struct executor_state {
  std::shared_ptr<const model::engine> engine;
  std::unique_ptr<executor_core> core;
  store_actor store;
  struct waiter {
    caf::typed_response_promise<gen_done> rp;
    caf::actor sink;
  };
  std::map<int64_t, waiter> waiting;
  bool stepping = false;
  executor_status st;
  static inline const char* name = "cedar.executor";
};

gen_done to_msg(finished_generation& f) {
  gen_done d;
  d.session = f.session;
  d.generated = std::move(f.generated);
  d.stopped = f.stopped;
  d.resume_path = resume_path_name(f.stats.path);
  d.n_prompt = f.stats.n_prompt;
  d.n_replayed = f.stats.n_replayed;
  d.n_generated = f.stats.n_generated;
  d.context = f.stats.context;
  d.resume_ms = f.stats.resume_ms;
  d.prefill_ms = f.stats.prefill_ms;
  d.decode_ms = f.stats.decode_ms;
  d.n_masked = f.stats.n_masked;
  d.first_token = f.kv.first_token;
  d.tokens = std::move(f.kv.tokens);
  for (auto& s : f.kv.sources)
    d.sources.push_back({s.layer, s.first_entry, s.n_entries, std::move(s.main), std::move(s.index)});
  for (auto& a : f.kv.aux) d.aux.push_back({a.first, std::move(a.second)});
  return d;
}

gen_done error_done(int64_t session, std::string msg) {
  gen_done d;
  d.session = session;
  d.error = std::move(msg);
  return d;
}

executor_actor::behavior_type executor_fn(executor_actor::stateful_pointer<executor_state> self,
                                          std::shared_ptr<const model::engine> e, size_t budget, store_actor store,
                                          executor_options opts) {
  self->state.engine = e;
  self->state.core = std::make_unique<executor_core>(*e, budget, opts);
  self->state.store = store;

  auto deliver_finished = [self] {
    auto& s = self->state;
    for (auto& f : s.core->take_finished()) {
      auto it = s.waiting.find(f.session);
      if (it == s.waiting.end()) continue;
      it->second.rp.deliver(to_msg(f));
      s.waiting.erase(it);
    }
    for (int64_t id : s.core->enforce_budget()) CEDAR_LOG_DEBUG("executor: evicted session %lld", (long long)id);
  };
  auto schedule = [self] {
    if (!self->state.stepping && self->state.core->n_active() > 0) {
      self->state.stepping = true;
      self->send(self, step_atom::value);
    }
  };
  // Starts a generation on a resident session and streams its first token.
  auto begin = [self, schedule](gen_request req, caf::actor sink, caf::typed_response_promise<gen_done> rp,
                                resume_path path, double resume_ms) mutable {
    auto& s = self->state;
    generation_params p;
    p.sampling = {req.temperature, req.top_p, req.min_p, req.seed};
    p.max_new_tokens = req.max_new_tokens;
    p.min_new_tokens = req.min_new_tokens;
    p.stop_ids = req.stop_ids;
    p.tool_grammar = req.tool_grammar;
    p.reply_prefix = req.reply_prefix;
    auto first = s.core->start(req.session, req.tokens, p, path, resume_ms);
    if (!first) {
      rp.deliver(error_done(req.session, first.err().message));
      return;
    }
    caf::anon_send(sink, token_atom::value, req.session, first->token);
    s.waiting[req.session] = {rp, sink};
    s.st.tokens_generated++;
    schedule();
  };

  return {
      [self, begin](generate_atom, gen_request req, caf::actor sink) mutable {
        auto rp = self->make_response_promise<gen_done>();
        auto& s = self->state;
        if (s.core->active(req.session) || s.waiting.count(req.session)) {
          rp.deliver(error_done(req.session, "session " + std::to_string(req.session) + " is already generating"));
          return rp;
        }
        if (s.core->resident(req.session)) {
          begin(std::move(req), sink, rp, resume_path::resident, 0.0);
        } else if (req.fresh) {
          s.core->open_fresh(req.session);
          begin(std::move(req), sink, rp, resume_path::fresh, 0.0);
        } else {
          int64_t id = req.session;
          self->request(s.store, caf::infinite, load_atom::value, id)
              .then(
                  [self, begin, req, sink, rp](resume_msg& m) mutable {
                    auto& s = self->state;
                    if (!m.error.empty()) {
                      rp.deliver(error_done(req.session, m.error));
                      return;
                    }
                    if (s.core->resident(req.session)) {  // raced with another request
                      begin(std::move(req), sink, rp, resume_path::resident, 0.0);
                      return;
                    }
                    resume_state rs;
                    rs.tokens = std::move(m.tokens);
                    rs.pages_ok = m.pages_ok;
                    rs.problem = m.problem;
                    for (auto& src : m.sources) rs.sources.push_back({src.layer, std::move(src.main), std::move(src.index)});
                    for (auto& a : m.aux) rs.aux.emplace_back(a.name, std::move(a.bytes));
                    double ms = 0;
                    auto path = s.core->restore(req.session, rs, &ms);
                    if (!path) {
                      rp.deliver(error_done(req.session, path.err().message));
                      return;
                    }
                    begin(std::move(req), sink, rp, *path, ms);
                  },
                  [rp, id](caf::error& err) mutable {
                    rp.deliver(error_done(id, "store unavailable: " + caf::to_string(err)));
                  });
        }
        return rp;
      },
      [self, deliver_finished](cancel_atom, int64_t session) {
        self->state.core->cancel(session);
        deliver_finished();
      },
      [self](status_atom) {
        auto& s = self->state;
        s.st.n_resident = int64_t(s.core->n_resident());
        s.st.n_active = int64_t(s.core->n_active());
        s.st.resident_bytes = int64_t(s.core->resident_bytes());
        s.st.ram_budget = int64_t(s.core->ram_budget());
        return s.st;
      },
      [self, deliver_finished](step_atom) {
        auto& s = self->state;
        s.stepping = false;
        s.st.max_batch = std::max<int64_t>(s.st.max_batch, int64_t(s.core->n_active()));
        auto toks = s.core->step();
        s.st.steps++;
        if (!toks) {
          // A failed step fails every waiting generation; sequences stay as they were.
          CEDAR_LOG_ERROR("executor: decode step failed: %s", toks.err().message.c_str());
          for (auto& [id, w] : s.waiting) {
            s.core->cancel(id);
            w.rp.deliver(error_done(id, toks.err().message));
          }
          s.waiting.clear();
          s.core->take_finished();
          return;
        }
        for (const step_token& t : *toks) {
          auto it = s.waiting.find(t.session);
          if (it != s.waiting.end()) caf::anon_send(it->second.sink, token_atom::value, t.session, t.token);
          s.st.tokens_generated++;
        }
        deliver_finished();
        if (s.core->n_active() > 0) {
          s.stepping = true;
          self->send(self, step_atom::value);
        }
      },
  };
}

}  // namespace

executor_actor spawn_executor(caf::actor_system& sys, std::shared_ptr<const model::engine> e, size_t ram_budget_bytes,
                              store_actor store, executor_options opts) {
  return sys.spawn<caf::detached>(executor_fn, std::move(e), ram_budget_bytes, std::move(store), opts);
}

// ============================================================================================
// store
// ============================================================================================
namespace {

struct store_state {
  std::shared_ptr<sessions::store> st;  // the actor is its only user
  uint64_t model_hash = 0;
  sessions::page_geometry geometry;
  static inline const char* name = "cedar.store";
};

session_msg to_msg(const sessions::session_info& s) {
  session_msg m;
  m.id = s.id;
  m.agent = s.agent;
  m.status = sessions::session_status_name(s.status);
  m.created_ms = s.created_ms;
  m.updated_ms = s.updated_ms;
  m.n_turns = s.n_turns;
  m.n_tokens = s.n_tokens;
  m.parent = s.parent ? *s.parent : -1;
  return m;
}

store_actor::behavior_type store_fn(store_actor::stateful_pointer<store_state> self, std::shared_ptr<sessions::store> st,
                                    uint64_t model_hash, sessions::page_geometry g) {
  // The store arrives as a shared_ptr only to be movable into the spawn call; the actor is
  // its one user from here on (ARCHITECTURE "Ownership").
  self->state.st = std::move(st);
  self->state.model_hash = model_hash;
  self->state.geometry = g;
  sessions::store* raw = self->state.st.get();
  return {
      [self, raw](create_atom, const std::string& agent, uint64_t hash) {
        store_reply r;
        auto id = raw->create_session(hash ? hash : self->state.model_hash, agent, self->state.geometry);
        if (!id) r.error = id.err().message;
        else r.value = *id;
        return r;
      },
      [raw](commit_atom, const commit_request& c) {
        store_reply r;
        sessions::turn_write t;
        for (const item_msg& i : c.items) {
          auto k = sessions::parse_item_kind(i.kind);
          if (!k) {
            r.error = k.err().message;
            return r;
          }
          t.items.push_back({*k, i.payload, i.token_begin, i.token_end});
        }
        t.tokens = c.tokens;
        for (const kv_source_msg& s : c.sources)
          t.pages.push_back({s.layer, s.first_entry, s.n_entries, s.main, s.index});
        for (const aux_msg& a : c.aux) t.aux.push_back({a.name, a.bytes});
        auto st = sessions::parse_session_status(c.status_after);
        if (!st) {
          r.error = st.err().message;
          return r;
        }
        t.status_after = *st;
        if (c.ttft_ms >= 0) t.timing = sessions::turn_timing{0, c.ttft_ms, c.decode_ms, uint64_t(std::max<int64_t>(0, c.n_decoded))};
        auto rec = raw->commit_turn(c.session, t);
        if (!rec) r.error = rec.err().message;
        else r.value = rec->turn;
        return r;
      },
      [raw](load_atom, int64_t id) {
        resume_msg m;
        auto cp = raw->load_checkpoint(id);
        if (!cp) {
          m.error = cp.err().message;
          return m;
        }
        resume_state rs = resume_state_from(*cp);
        m.tokens = std::move(rs.tokens);
        m.pages_ok = rs.pages_ok;
        m.problem = rs.problem;
        for (auto& s : rs.sources) m.sources.push_back({s.layer, 0, 0, std::move(s.main), std::move(s.index)});
        for (auto& a : rs.aux) m.aux.push_back({a.first, std::move(a.second)});
        return m;
      },
      [raw](items_atom, int64_t id) -> caf::result<std::vector<item_msg>, std::string> {
        std::vector<item_msg> out;
        auto tr = raw->transcript(id);
        if (!tr) return {out, tr.err().message};
        for (const auto& i : *tr)
          out.push_back({sessions::item_kind_name(i.kind), i.payload, i.token_begin, i.token_end, i.turn});
        return {out, std::string()};
      },
      [raw](finish_atom, int64_t id, const std::string& status) {
        store_reply r;
        auto st = sessions::parse_session_status(status);
        if (!st) r.error = st.err().message;
        else if (auto s = raw->finish_session(id, *st); !s) r.error = s.err().message;
        return r;
      },
      [raw](list_atom) -> caf::result<std::vector<session_msg>, std::string> {
        std::vector<session_msg> out;
        auto l = raw->list_sessions();
        if (!l) return {out, l.err().message};
        for (const auto& s : *l) out.push_back(to_msg(s));
        return {out, std::string()};
      },
      [raw](kv_usage_atom, int64_t id) {
        kv_usage_msg m;
        auto info = raw->get_session(id);
        if (!info) {
          m.error = info.err().message;
          return m;
        }
        auto refs = raw->page_refs(id);
        if (!refs) {
          m.error = refs.err().message;
          return m;
        }
        const sessions::page_geometry& g = info->geometry;
        for (const auto& r : *refs) {
          m.n_pages++;
          m.n_entries += int64_t(r.n_entries);
          m.fp4_bytes += int64_t(sessions::page_header_bytes + uint64_t(r.n_entries) * g.entry_bytes());
          m.bf16_bytes += int64_t(r.n_entries) * (int64_t(g.main_dims) + int64_t(g.index_dims)) * 2;
        }
        return m;
      },
      [raw](fork_atom, int64_t parent, uint32_t n_turns) {
        store_reply r;
        auto id = raw->fork_session(parent, n_turns);
        if (!id) r.error = id.err().message;
        else r.value = *id;
        return r;
      },
      [raw](log_atom, int64_t id) {
        session_log_msg m;
        auto toks = raw->tokens(id);
        auto cps = toks ? raw->checkpoints(id) : result<std::vector<sessions::checkpoint_info>>(toks.err());
        if (!cps) {
          m.error = cps.err().message;
          return m;
        }
        m.tokens = std::move(*toks);
        for (const auto& c : *cps) m.checkpoint_tokens.push_back(c.n_tokens);
        return m;
      },
      [raw](timings_atom, int64_t id) -> caf::result<std::vector<turn_timing_msg>, std::string> {
        std::vector<turn_timing_msg> out;
        auto tt = raw->turn_timings(id);
        if (!tt) return {out, tt.err().message};
        for (const auto& t : *tt) out.push_back({t.turn, t.ttft_ms, t.decode_ms, int64_t(t.n_decoded)});
        return {out, std::string()};
      },
      [raw](opts_atom, int64_t id) -> caf::result<std::string, std::string> {
        auto info = raw->get_session(id);
        if (!info) return {std::string(), info.err().message};
        return {info->agent_options, std::string()};
      },
      [raw](opts_atom, int64_t id, const std::string& options_json) {
        store_reply r;
        if (auto st = raw->set_agent_options(id, options_json); !st) r.error = st.err().message;
        return r;
      },
  };
}

}  // namespace

store_actor spawn_store(caf::actor_system& sys, std::unique_ptr<sessions::store> st, uint64_t model_hash,
                        sessions::page_geometry geometry) {
  std::shared_ptr<sessions::store> shared(std::move(st));
  return sys.spawn<caf::detached>(store_fn, std::move(shared), model_hash, geometry);
}

// ============================================================================================
// transcript items <-> chat messages
// ============================================================================================
namespace {

item_msg make_item(const char* kind, njson payload, uint64_t b = 0, uint64_t e = 0) {
  return item_msg{kind, cedar::tools::json_dump(payload), b, e, 0};
}

}  // namespace

std::vector<model::chat_message> messages_from_items(const std::vector<item_msg>& items, bool* last_stopped) {
  std::vector<model::chat_message> msgs;
  bool stopped = true;
  for (const item_msg& i : items) {
    njson p = njson::parse(i.payload, nullptr, false);
    if (p.is_discarded() || !p.is_object()) continue;
    model::chat_message m;
    if (i.kind == "system") {
      m.role = model::chat_role::system;
      m.content = p.value("content", "");
      if (p.contains("tools") && p["tools"].is_array())
        for (const auto& t : p["tools"]) m.tools_json.push_back(t.is_string() ? t.get<std::string>() : cedar::tools::json_dump(t));
    } else if (i.kind == "user") {
      m.role = model::chat_role::user;
      m.content = p.value("content", "");
    } else if (i.kind == "assistant") {
      m.role = model::chat_role::assistant;
      m.content = p.value("content", "");
      stopped = p.value("stopped", true);
      if (p.contains("tool_calls"))
        for (const auto& c : p["tool_calls"])
          m.tool_calls.push_back({c.value("id", ""), c.value("name", ""), c.value("arguments", "{}")});
    } else if (i.kind == "tool_result") {
      m.role = model::chat_role::tool;
      m.tool_call_id = p.value("tool_call_id", "");
      m.content = p.value("content", "");
      if (p.value("is_error", false)) m.content = "error: " + m.content;  // as agent_loop renders it
    } else {
      continue;  // tool_call items duplicate the assistant's calls (for the dashboard)
    }
    msgs.push_back(std::move(m));
  }
  if (last_stopped) *last_stopped = stopped;
  return msgs;
}

// ============================================================================================
// agent
// ============================================================================================
namespace {

struct agent_state {
  std::unique_ptr<agent_loop> loop;
  std::shared_ptr<const model::tokenizer> tok;
  std::shared_ptr<tools::tool_registry> reg;
  executor_actor exec;
  store_actor store;
  int64_t session = 0;
  agent_config cfg;
  int32_t eos = 1;
  std::string grammar;  // tool grammar spec for every generation ("" = unconstrained)
  bool fresh = true;              // nothing generated for this session yet
  bool system_committed = false;

  // the current turn
  bool busy = false;
  caf::actor events;  // receives agent_event_msg while the turn runs, then its turn_summary
  std::vector<item_msg> round_items;  // input items of the round, committed with its generation
  std::map<std::string, tool_outcome> results;
  std::map<std::string, tools::cancel_token> cancels;
  std::map<std::string, std::chrono::steady_clock::time_point> started;
  std::vector<tool_call> calls;
  turn_summary sum;
  std::chrono::steady_clock::time_point t0;
  bool first_token_seen = false;
  std::chrono::steady_clock::time_point gen_t0;  // the current generation's request
  double gen_ttft_ms = -1;                       // its first token (stored with its turn)
  static inline const char* name = "cedar.agent";
};

using agent_ptr = caf::stateful_actor<agent_state>*;

// Publishes an event of this agent's session to the runtime's observer (the dashboard).
void note(agent_ptr self, const char* type, njson data) {
  if (self->state.cfg.obs) self->state.cfg.obs->publish(type, self->state.session, std::move(data));
}

void finish_turn(agent_ptr self, std::string error = {}) {
  auto& s = self->state;
  s.sum.error = std::move(error);
  s.sum.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.t0).count();
  if (!s.sum.error.empty() && s.events) self->send(s.events, event_atom::value, agent_event_msg{"error", s.sum.error, "", "", true, 0});
  s.busy = false;
  note(self, "turn_end",
       njson{{"answer", s.sum.answer}, {"error", s.sum.error}, {"cancelled", s.sum.cancelled},
             {"rounds", s.sum.rounds}, {"tool_calls", s.sum.tool_calls}, {"masked_tokens", s.sum.masked_tokens},
             {"prompt_tokens", s.sum.prompt_tokens},
             {"generated_tokens", s.sum.generated_tokens}, {"replayed_tokens", s.sum.replayed_tokens},
             {"context", s.sum.context}, {"resume_path", s.sum.resume_path},
             {"first_token_ms", s.sum.first_token_ms}, {"total_ms", s.sum.total_ms}});
  if (s.events) self->send(s.events, s.sum);
  s.events = nullptr;
}

void generate(agent_ptr self, std::vector<int32_t> tokens);

// All results of the round are in: commit them, then generate again.
void after_tools(agent_ptr self) {
  auto& s = self->state;
  std::vector<tool_outcome> outs;
  commit_request c;
  c.session = s.session;
  c.status_after = "active";
  if (s.sum.cancelled) {
    // The turn ends here: every call is answered "cancelled" (what agent_loop::cancel renders),
    // committed, and the loop is idle for the next turn.
    for (const tool_call& call : s.calls)
      c.items.push_back(make_item("tool_result", njson{{"tool_call_id", call.id}, {"name", call.name},
                                                       {"content", "cancelled"}, {"is_error", true}, {"ms", 0}}));
    s.results.clear();
    s.cancels.clear();
    s.loop->cancel();
    self->request(s.store, caf::infinite, commit_atom::value, c)
        .then([self](store_reply& r) { finish_turn(self, r.error.empty() ? std::string() : "store: " + r.error); },
              [self](caf::error& e) { finish_turn(self, "store unavailable: " + caf::to_string(e)); });
    return;
  }
  for (const tool_call& call : s.calls) {
    tool_outcome o = s.results.count(call.id) ? s.results[call.id] : tool_outcome{call.id, "no result", true, 0};
    outs.push_back(o);
    c.items.push_back(make_item("tool_result", njson{{"tool_call_id", call.id}, {"name", call.name},
                                                     {"content", o.text}, {"is_error", o.is_error}, {"ms", o.ms}}));
  }
  s.results.clear();
  s.cancels.clear();
  auto toks = s.loop->tool_results(std::move(outs));
  if (!toks) {
    finish_turn(self, toks.err().message);
    return;
  }
  // Every item is committed before the next step (the results survive a crash mid-generation).
  self->request(s.store, caf::infinite, commit_atom::value, c)
      .then([self, t = std::move(*toks)](store_reply& r) mutable {
        if (!r.error.empty()) {
          finish_turn(self, "store: " + r.error);
          return;
        }
        if (self->state.sum.cancelled) {
          finish_turn(self);
          return;
        }
        generate(self, std::move(t));
      },
      [self](caf::error& e) { finish_turn(self, "store unavailable: " + caf::to_string(e)); });
}

// A call that can run as made: parsed, offered, arguments JSON that match the tool's schema
// (turn_result::invalid_tool_calls counts the others).
bool valid_call(const tools::tool_registry& reg, const tool_call& call) {
  if (!call.error.empty()) return false;
  auto t = reg.find(call.name);
  if (!t) return false;
  auto args = tools::json::parse(call.arguments_json, nullptr, false);
  return !args.is_discarded() && tools::schema_validate(t->input_schema, args).ok();
}

// One tool call handed to the detached actor that runs it.
struct tool_job {
  std::shared_ptr<tools::tool_registry> reg;
  tool_call call;
  tools::cancel_token cancel;
  caf::actor agent;  // gets tool_done
  int timeout_ms = 0;
  std::string session;
};

void run_tools(agent_ptr self) {
  auto& s = self->state;
  for (const tool_call& call : s.calls) {
    if (call.refused) {  // a limit stopped it (agent_limits::answer_on_limit): answered, never run
      note(self, "tool_result", njson{{"id", call.id}, {"name", call.name}, {"text", call.error}, {"is_error", true},
                                      {"ms", 0}, {"refused", true}});
      s.results[call.id] = {call.id, call.error, true, 0};
      if (s.events)
        self->send(s.events, event_atom::value,
                   agent_event_msg{"refused_call", call.error, call.name, call.arguments_json, true, 0});
      continue;
    }
    s.sum.tool_calls++;
    if (!valid_call(*s.reg, call)) s.sum.invalid_tool_calls++;
    if (s.events)
      self->send(s.events, event_atom::value, agent_event_msg{"tool_call", "", call.name, call.arguments_json, false, 0});
    note(self, "tool_call", njson{{"id", call.id}, {"name", call.name}, {"arguments", call.arguments_json}});
    if (!call.error.empty()) {
      note(self, "tool_result", njson{{"id", call.id}, {"name", call.name}, {"text", call.error}, {"is_error", true}, {"ms", 0}});
      // the API's event stream sees the error result the model will see, as for a call that ran
      if (s.events)
        self->send(s.events, event_atom::value, agent_event_msg{"tool_result", call.error, call.name, "", true, 0});
      s.results[call.id] = {call.id, call.error, true, 0};
      continue;
    }
    tools::cancel_token cancel;
    s.cancels[call.id] = cancel;
    s.started[call.id] = std::chrono::steady_clock::now();
    const int timeout = s.cfg.tool_timeout_ms;
    // Blocking tool code runs on its own thread; a hanging tool never blocks an actor. What it
    // needs goes in as the spawn argument rather than a capture: CAF 0.17.6 dereferences a null
    // argument tuple for a function actor spawned without arguments (UB, caught by UBSan).
    tool_job job{s.reg, call, cancel, caf::actor_cast<caf::actor>(self), timeout, std::to_string(s.session)};
    self->spawn<caf::detached>([](const tool_job& j) {
      tools::invoke_context ctx;
      ctx.cancel = j.cancel;
      ctx.session = j.session;
      ctx.timeout = std::chrono::milliseconds(j.timeout_ms);
      ctx.hard_cap = std::chrono::milliseconds(j.timeout_ms) * 4;
      auto t0 = std::chrono::steady_clock::now();
      std::string text;
      bool is_error = true;
      auto args = tools::json::parse(j.call.arguments_json, nullptr, false);
      if (args.is_discarded()) {
        text = "arguments are not valid JSON";
      } else {
        auto r = j.reg->call(j.call.name, args, ctx);
        if (!r) text = r.err().message;
        else {
          text = r->to_text();
          is_error = r->is_error;
        }
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      caf::anon_send(j.agent, tool_done_atom::value, j.call.id, text, is_error, ms);
    }, std::move(job));
    self->delayed_send(self, std::chrono::milliseconds(timeout), tool_tmo_atom::value, call.id);
  }
  if (s.results.size() == s.calls.size()) after_tools(self);
}

void on_generation(agent_ptr self, gen_done& d) {
  auto& s = self->state;
  if (!d.error.empty()) {
    finish_turn(self, "executor: " + d.error);
    return;
  }
  s.fresh = false;
  note(self, "generation",
       njson{{"resume_path", d.resume_path}, {"n_prompt", d.n_prompt}, {"n_replayed", d.n_replayed},
             {"n_generated", d.n_generated}, {"context", d.context}, {"resume_ms", d.resume_ms},
             {"prefill_ms", d.prefill_ms}, {"decode_ms", d.decode_ms}});
  s.sum.rounds++;
  s.sum.prompt_tokens += d.n_prompt;
  s.sum.generated_tokens += d.n_generated;
  s.sum.masked_tokens += d.n_masked;
  s.sum.replayed_tokens += d.n_replayed;
  s.sum.context = d.context;
  if (s.sum.resume_path.empty()) s.sum.resume_path = d.resume_path;
  s.sum.resume_paths.push_back(d.resume_path);
  const bool final_reply = !s.loop->calls_allowed();  // made under the grammar of no tools
  reply_action act = s.loop->end_reply(d.stopped);

  commit_request c;
  c.session = s.session;
  c.items = std::move(s.round_items);
  s.round_items.clear();
  njson calls = njson::array();
  for (const tool_call& tc : act.calls) calls.push_back({{"id", tc.id}, {"name", tc.name}, {"arguments", tc.arguments_json}});
  // The limit this reply reached and the calls it stopped (dashboard). With answer_on_limit the
  // calls are answered "not run" and one more reply, without tools, ends the turn.
  njson refused = njson::array();
  for (const tool_call& tc : act.refused) refused.push_back({{"name", tc.name}, {"arguments", tc.arguments_json}});
  const char* turn_end = act.round_limit ? "round_limit" : act.repeat_limit ? "repeat_limit" : "";
  uint64_t end = d.first_token + d.tokens.size();
  c.items.push_back(make_item("assistant",
                              njson{{"content", act.content}, {"tool_calls", calls}, {"stopped", d.stopped},
                                    {"turn_end", turn_end}, {"refused_calls", refused}, {"final_reply", final_reply},
                                    {"parse_errors", act.parse_errors}, {"resume_path", d.resume_path},
                                    {"prefill_ms", d.prefill_ms}, {"decode_ms", d.decode_ms},
                                    {"n_prompt", d.n_prompt}, {"n_generated", d.n_generated},
                                    {"n_replayed", d.n_replayed}, {"context", d.context}, {"resume_ms", d.resume_ms}},
                              end - uint64_t(d.generated.size()), end));
  for (const tool_call& tc : act.calls)
    c.items.push_back(make_item("tool_call", njson{{"id", tc.id}, {"name", tc.name}, {"arguments", tc.arguments_json},
                                                   {"error", tc.error}, {"refused", tc.refused}}));
  c.first_token = d.first_token;
  c.tokens = std::move(d.tokens);
  c.sources = std::move(d.sources);
  c.aux = std::move(d.aux);
  c.status_after = act.calls.empty() ? "active" : "waiting_tool";
  c.ttft_ms = s.gen_ttft_ms >= 0 ? s.gen_ttft_ms : d.resume_ms + d.prefill_ms;
  c.decode_ms = d.decode_ms;
  c.n_decoded = d.n_generated;
  s.calls = act.calls;
  s.sum.round_limit = s.sum.round_limit || act.round_limit;
  s.sum.repeat_limit = s.sum.repeat_limit || act.repeat_limit;
  self->request(s.store, caf::infinite, commit_atom::value, std::move(c))
      .then(
          [self, act](store_reply& r) {
            auto& s = self->state;
            if (!r.error.empty()) {
              finish_turn(self, "store: " + r.error);
              return;
            }
            if (s.calls.empty() || s.sum.cancelled) {
              if (s.sum.cancelled && !s.calls.empty()) s.loop->cancel();
              s.sum.answer = act.content;
              if (s.events) self->send(s.events, event_atom::value, agent_event_msg{"answer", act.content, "", "", false, 0});
              finish_turn(self);
              return;
            }
            run_tools(self);
          },
          [self](caf::error& e) { finish_turn(self, "store unavailable: " + caf::to_string(e)); });
}

void generate(agent_ptr self, std::vector<int32_t> tokens) {
  auto& s = self->state;
  gen_request req;
  req.session = s.session;
  req.tokens = std::move(tokens);
  req.temperature = s.cfg.temperature;
  req.top_p = s.cfg.top_p;
  req.min_p = s.cfg.min_p;
  req.seed = s.cfg.seed + uint64_t(s.sum.rounds);
  req.max_new_tokens = s.cfg.limits.max_new_tokens;
  req.min_new_tokens = s.cfg.limits.min_new_tokens;
  req.stop_ids = {s.eos};
  req.fresh = s.fresh;
  // The final reply after a limit (agent_limits::answer_on_limit) may not call tools: the grammar
  // of no tools forbids a DSML block, with or without constrain_tool_calls.
  req.tool_grammar = s.loop->calls_allowed() ? s.grammar : model::tool_grammar_spec({});
  s.gen_t0 = std::chrono::steady_clock::now();
  s.gen_ttft_ms = -1;
  self->request(s.exec, caf::infinite, generate_atom::value, std::move(req), caf::actor_cast<caf::actor>(self))
      .then([self](gen_done& d) { on_generation(self, d); },
            [self](caf::error& e) { finish_turn(self, "executor unavailable: " + caf::to_string(e)); });
}

}  // namespace

nlohmann::ordered_json canonical_schema(const njson& j);
nlohmann::ordered_json canonical_props(const njson& j) {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  if (!j.is_object()) return nlohmann::ordered_json(j);
  for (auto it = j.begin(); it != j.end(); ++it) o[it.key()] = canonical_schema(it.value());
  return o;
}

// JSON Schema keys in the order the default model was trained on (cedar_ref/data.py writes
// "type" first, then "description", "properties"/"items", "required"); the rest alphabetical.
nlohmann::ordered_json canonical_schema(const njson& j) {
  if (j.is_array()) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& x : j) a.push_back(canonical_schema(x));
    return a;
  }
  if (!j.is_object()) return nlohmann::ordered_json(j);
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  static const char* first[] = {"type", "description", "properties", "items", "required", "default"};
  for (const char* k : first)
    if (j.contains(k)) o[k] = std::string_view(k) == "properties" ? canonical_props(j[k]) : canonical_schema(j[k]);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!o.contains(it.key())) o[it.key()] = canonical_schema(it.value());
  return o;
}

// The OpenAI tool object rendered into the system turn: {"type": "function", "function":
// {"name", "description", "parameters"}}, in that order.
std::string tool_schema_json(const tools::tool& t) {
  nlohmann::ordered_json fn;
  fn["name"] = t.name;
  fn["description"] = t.description;
  fn["parameters"] = canonical_schema(t.input_schema);
  nlohmann::ordered_json o;
  o["type"] = "function";
  o["function"] = fn;
  return cedar::tools::json_dump_ordered(o);
}

offered_tools offer_tools(const tools::tool_registry& reg, const std::vector<std::string>& only) {
  offered_tools o;
  std::vector<std::pair<std::string, std::string>> spec;
  for (const auto& t : reg.list()) {
    if (!only.empty() && std::find(only.begin(), only.end(), t->name) == only.end()) continue;
    o.names.push_back(t->name);
    o.schemas.push_back(tool_schema_json(*t));
    spec.emplace_back(t->name, cedar::tools::json_dump(t->input_schema));
  }
  // No tools offered: nothing to constrain (the grammar of no tools is a final reply's).
  if (!spec.empty()) o.grammar = model::tool_grammar_spec(spec);
  return o;
}

namespace {

caf::behavior agent_fn(agent_ptr self, std::shared_ptr<const model::tokenizer> tok,
                       std::shared_ptr<tools::tool_registry> reg, executor_actor exec, store_actor store,
                       int64_t session, agent_config cfg, std::vector<model::chat_message> history,
                       bool last_stopped, int32_t eos) {
  auto& s = self->state;
  s.tok = tok;
  s.reg = reg;
  s.exec = exec;
  s.store = store;
  s.session = session;
  s.cfg = cfg;
  s.eos = eos;
  // The tools this agent offers: the named ones, or every registered tool.
  auto offered = offer_tools(*reg, cfg.tools);
  if (cfg.constrain_tool_calls) s.grammar = std::move(offered.grammar);
  s.loop = std::make_unique<agent_loop>(*tok, cfg.system_prompt, offered.schemas, offered.names, cfg.limits);
  if (!history.empty()) {
    s.fresh = false;
    s.system_committed = true;
    if (auto st = s.loop->restore(std::move(history), last_stopped); !st)
      CEDAR_LOG_ERROR("agent %lld: cannot restore its transcript: %s", (long long)session, st.err().message.c_str());
  }
  return {
      [self](ask_atom, const std::string& text, caf::actor events) {
        auto& s = self->state;
        if (s.busy) {
          turn_summary busy;
          busy.error = "agent is busy with another turn";
          self->send(events, busy);
          return;
        }
        s.busy = true;
        s.events = events;
        s.sum = turn_summary{};
        s.t0 = std::chrono::steady_clock::now();
        s.first_token_seen = false;
        note(self, "turn_begin", njson{{"agent", s.cfg.name}, {"text", text}});
        auto toks = s.loop->begin_turn(text);
        if (!toks) {
          finish_turn(self, toks.err().message);
          return;
        }
        s.round_items.clear();
        if (!s.system_committed && !s.loop->messages().empty() &&
            s.loop->messages().front().role == model::chat_role::system) {
          const auto& sys = s.loop->messages().front();
          s.round_items.push_back(make_item("system", njson{{"content", sys.content}, {"tools", sys.tools_json}}));
          s.system_committed = true;
        }
        // Calls a crash left without a result (agent_loop::restore) are answered in the store too.
        for (const tool_call& c : s.loop->take_interrupted())
          s.round_items.push_back(make_item("tool_result", njson{{"tool_call_id", c.id}, {"name", c.name},
                                                                 {"content", c.error}, {"is_error", true}, {"ms", 0}}));
        s.round_items.push_back(make_item("user", njson{{"content", text}}));
        generate(self, std::move(*toks));
      },
      [self](token_atom, int64_t, int32_t tok) {
        auto& s = self->state;
        if (s.gen_ttft_ms < 0)
          s.gen_ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.gen_t0).count();
        if (!s.first_token_seen) {
          s.first_token_seen = true;
          s.sum.first_token_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.t0).count();
        }
        std::vector<model::dsml_event> ev;
        s.loop->on_token(tok, ev);
        for (const auto& e : ev)
          if (e.kind == model::dsml_event_kind::content && !e.text.empty()) note(self, "token", njson{{"text", e.text}});
        if (!s.events) return;
        for (const auto& e : ev)
          if (e.kind == model::dsml_event_kind::content && !e.text.empty())
            self->send(s.events, event_atom::value, agent_event_msg{"token", e.text, "", "", false, 0});
      },
      [self](tool_done_atom, const std::string& id, const std::string& raw, bool is_error, double ms) {
        auto& s = self->state;
        if (!s.busy || s.results.count(id) || !s.cancels.count(id)) return;  // late (timed out) or stale
        // A C++ tool may return any bytes (file_read of a Latin-1 file): the model, the chat
        // template and the store take UTF-8, so invalid sequences become U+FFFD here.
        std::string text;
        if (model::utf8_valid(raw)) text = raw;
        else model::utf8_sanitize(raw, /*final=*/true, text);
        s.results[id] = {id, text, is_error, ms};
        std::string name;
        for (const auto& c : s.calls)
          if (c.id == id) name = c.name;
        note(self, "tool_result", njson{{"id", id}, {"name", name}, {"text", s.cfg.obs ? s.cfg.obs->cut(text) : text},
                                        {"is_error", is_error}, {"ms", ms}});
        if (s.events) self->send(s.events, event_atom::value, agent_event_msg{"tool_result", text, name, "", is_error, ms});
        if (s.results.size() == s.calls.size()) after_tools(self);
      },
      [self](tool_tmo_atom, const std::string& id) {
        auto& s = self->state;
        if (!s.busy || s.results.count(id) || !s.cancels.count(id)) return;
        s.cancels[id].cancel();
        std::string name;
        for (const auto& c : s.calls)
          if (c.id == id) name = c.name;
        std::string text = "tool '" + name + "' timed out after " + std::to_string(s.cfg.tool_timeout_ms) + " ms";
        s.results[id] = {id, text, true, double(s.cfg.tool_timeout_ms)};
        note(self, "tool_result", njson{{"id", id}, {"name", name}, {"text", text}, {"is_error", true}, {"ms", double(s.cfg.tool_timeout_ms)}});
        if (s.events) self->send(s.events, event_atom::value, agent_event_msg{"tool_result", text, name, "", true, 0});
        if (s.results.size() == s.calls.size()) after_tools(self);
      },
      [self](cancel_atom) {
        auto& s = self->state;
        if (!s.busy) return;
        s.sum.cancelled = true;
        for (auto& [id, c] : s.cancels) c.cancel();
        self->send(s.exec, cancel_atom::value, s.session);
      },
  };
}

}  // namespace

caf::actor spawn_agent(caf::actor_system& sys, std::shared_ptr<const model::tokenizer> tok,
                       std::shared_ptr<tools::tool_registry> reg, executor_actor exec, store_actor store,
                       int64_t session, agent_config cfg, std::vector<model::chat_message> history,
                       bool last_reply_stopped, int32_t eos_id) {
  return sys.spawn(agent_fn, std::move(tok), std::move(reg), std::move(exec), std::move(store), session, std::move(cfg),
                   std::move(history), last_reply_stopped, eos_id);
}

}  // namespace cedar::runtime
