// The dashboard mount (dashboard.hpp): JSON views over the store, the executor, the tool registry
// and the observer; an SSE stream of observer events; actions that start, cancel, resume and fork
// agents. The store actor stays the only owner of SQLite: every store read is a request to it.
#include "runtime/server/dashboard.hpp"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/agent_options_json.hpp"
#include "runtime/observer.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/server/dashboard_assets.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {

namespace {

using njson = nlohmann::json;
using namespace std::chrono_literals;

constexpr auto store_timeout = std::chrono::seconds(10);

// ============================================================================================
// state behind the routes
// ============================================================================================
struct dashboard_state {
  agent_runtime& rt;
  agent_runtime::impl& in;
  std::mutex mu;
  std::map<int64_t, agent> agents;          // sessions this dashboard holds an agent for
  std::vector<std::thread> turns;           // running or finished asks
  std::atomic<bool> closing{false};
  std::mutex sample_mu;
  std::chrono::steady_clock::time_point last_sample{};
  int64_t last_tokens = -1;

  explicit dashboard_state(agent_runtime& r) : rt(r), in(r.internals()) {}
  ~dashboard_state() {
    closing = true;
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& [id, a] : agents) a.cancel();
      ts.swap(turns);
    }
    for (auto& t : ts)
      if (t.joinable()) t.join();
  }

  observer& obs() { return *in.obs; }

  // Runs one turn of `a` on a worker thread; its events reach the observer through the agent.
  void run_turn(agent a, std::string text) {
    std::lock_guard<std::mutex> lk(mu);
    turns.emplace_back([a, text = std::move(text)]() mutable { (void)a.ask(text); });
  }

  result<executor_status> exec_status() {
    caf::scoped_actor self{*in.sys};
    result<executor_status> out = make_error(errc::unavailable, "executor did not answer");
    self->request(in.exec, store_timeout, status_atom::value)
        .receive([&](executor_status& s) { out = s; },
                 [&](caf::error& e) { out = make_error(errc::unavailable, "executor: " + caf::to_string(e)); });
    return out;
  }

  // One executor sample per second at most (called by SSE streams and the executor view).
  void maybe_sample() {
    std::unique_lock<std::mutex> lk(sample_mu, std::try_to_lock);
    if (!lk.owns_lock()) return;
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - last_sample).count();
    if (last_tokens >= 0 && dt < 1.0) return;
    auto st = exec_status();
    if (!st) return;
    double tok_s = last_tokens >= 0 && dt > 0 ? double(st->tokens_generated - last_tokens) / dt : 0.0;
    last_tokens = st->tokens_generated;
    last_sample = now;
    obs().publish("executor", -1,
                  njson{{"n_resident", st->n_resident}, {"n_active", st->n_active}, {"batch", st->n_active},
                        {"resident_bytes", st->resident_bytes}, {"ram_budget", st->ram_budget},
                        {"steps", st->steps}, {"tokens_generated", st->tokens_generated},
                        {"max_batch", st->max_batch}, {"tok_s", tok_s}});
  }

  result<std::vector<session_msg>> list() {
    caf::scoped_actor self{*in.sys};
    result<std::vector<session_msg>> out = make_error(errc::unavailable, "store did not answer");
    self->request(in.store, store_timeout, list_atom::value)
        .receive(
            [&](std::vector<session_msg>& v, std::string& err) {
              if (!err.empty()) out = make_error(errc::io, err);
              else out = std::move(v);
            },
            [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
    return out;
  }

  kv_usage_msg kv_usage(int64_t id) {
    caf::scoped_actor self{*in.sys};
    kv_usage_msg out;
    out.error = "store did not answer";
    self->request(in.store, store_timeout, kv_usage_atom::value, id)
        .receive([&](kv_usage_msg& m) { out = std::move(m); },
                 [&](caf::error& e) { out.error = "store: " + caf::to_string(e); });
    return out;
  }

  result<std::vector<item_msg>> items(int64_t id) {
    caf::scoped_actor self{*in.sys};
    result<std::vector<item_msg>> out = make_error(errc::unavailable, "store did not answer");
    self->request(in.store, store_timeout, items_atom::value, id)
        .receive(
            [&](std::vector<item_msg>& v, std::string& err) {
              if (!err.empty()) out = make_error(errc::not_found, err);
              else out = std::move(v);
            },
            [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
    return out;
  }

  result<int64_t> fork(int64_t parent, uint32_t n_turns) {
    caf::scoped_actor self{*in.sys};
    result<int64_t> out = make_error(errc::unavailable, "store did not answer");
    self->request(in.store, store_timeout, fork_atom::value, parent, n_turns)
        .receive(
            [&](store_reply& r) {
              if (!r.error.empty()) out = make_error(errc::invalid_argument, r.error);
              else out = r.value;
            },
            [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
    return out;
  }

  // Per-turn generation timings kept by the store (they outlive the observer: a restart).
  std::map<uint32_t, turn_timing_msg> timings(int64_t id) {
    caf::scoped_actor self{*in.sys};
    std::map<uint32_t, turn_timing_msg> out;
    self->request(in.store, store_timeout, timings_atom::value, id)
        .receive(
            [&](std::vector<turn_timing_msg>& v, std::string&) {
              for (auto& t : v) out[t.turn] = t;
            },
            [&](caf::error&) {});
    return out;
  }

  // The options the session's agent was created with ("" when none were stored).
  std::string stored_options(int64_t id) {
    caf::scoped_actor self{*in.sys};
    std::string out;
    self->request(in.store, store_timeout, opts_atom::value, id)
        .receive([&](std::string& o, std::string&) { out = std::move(o); }, [&](caf::error&) {});
    return out;
  }

  // The agent this dashboard holds for `id`, resuming it from the store when it holds none — with
  // the options stored for the session (a fork inherits its parent's), `name` overriding the
  // stored name when given.
  result<agent> agent_for(int64_t id, const std::string& name) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = agents.find(id);
      if (it != agents.end()) return it->second;
    }
    agent_options o;
    if (std::string stored = stored_options(id); !stored.empty()) {
      auto so = agent_options_from_json(stored);
      if (!so) return make_error(errc::invalid_format, "session " + std::to_string(id) + ": " + so.err().message);
      o = std::move(*so);
    }
    if (!name.empty()) o.name = name;
    if (o.name.empty()) o.name = "agent";
    auto a = rt.resume_agent(id, o);
    if (!a) return a.take_err();
    std::lock_guard<std::mutex> lk(mu);
    return agents.emplace(id, *a).first->second;
  }
};

// ============================================================================================
// JSON views
// ============================================================================================
// The dashboard's four statuses from the store's and the observer's.
std::string view_status(const std::string& store_status, const observer::session_live& live) {
  if (live.running) return "running";
  if (store_status == "failed") return "failed";
  if (store_status == "done" || store_status == "cancelled") return "done";
  if (!live.turns.empty() && !live.turns.back().value("error", "").empty()) return "failed";
  return "waiting";
}

njson session_json(dashboard_state& st, const session_msg& m) {
  observer::session_live live = st.obs().session(m.id);
  kv_usage_msg kv = st.kv_usage(m.id);
  njson j{{"id", m.id},
          {"agent", m.agent},
          {"status", view_status(m.status, live)},
          {"store_status", m.status},
          {"running", live.running},
          {"turns", m.n_turns},
          {"tokens", m.n_tokens},
          {"context", m.n_tokens},
          {"created_ms", m.created_ms},
          {"last_activity_ms", std::max<int64_t>(m.updated_ms, live.last_ms)},
          {"parent", m.parent},
          {"kv_pages", kv.n_pages},
          {"kv_entries", kv.n_entries},
          {"kv_fp4_bytes", kv.fp4_bytes},
          {"kv_bf16_bytes", kv.bf16_bytes}};
  if (!kv.error.empty()) j["kv_error"] = kv.error;
  int64_t gen = 0;
  for (const auto& t : live.turns) gen += t.value("generated_tokens", int64_t{0});
  j["generated_tokens_observed"] = gen;
  return j;
}

// One transcript item, with derived per-generation metrics on assistant items; the time to first
// token and decode time come from the store's timing of the item's turn when it has one.
njson item_json(const item_msg& i, const std::map<uint32_t, turn_timing_msg>& timings) {
  njson p = njson::parse(i.payload, nullptr, false);
  if (p.is_discarded()) p = njson{{"raw", i.payload}};
  njson j{{"kind", i.kind}, {"turn", i.turn}, {"token_begin", i.token_begin}, {"token_end", i.token_end}, {"payload", p}};
  if (i.kind == "assistant" && p.is_object()) {
    int64_t n_gen = p.value("n_generated", int64_t{0}), n_new = p.value("n_prompt", int64_t{0});
    int64_t n_rep = p.value("n_replayed", int64_t{0});
    double resume_ms = p.value("resume_ms", 0.0), prefill_ms = p.value("prefill_ms", 0.0);
    double decode_ms = p.value("decode_ms", 0.0);
    // The prompt of this generation is the token log before its first sampled token.
    int64_t prompt = int64_t(i.token_begin);
    njson m{{"prompt_tokens", prompt},
            {"new_tokens", n_new},
            {"replayed_tokens", n_rep},
            {"cached_tokens", std::max<int64_t>(0, prompt - n_new - n_rep)},
            {"generated_tokens", n_gen},
            {"resume_path", p.value("resume_path", "")},
            {"ttft_ms", resume_ms + prefill_ms},
            {"decode_ms", decode_ms},
            {"decode_tok_s", decode_ms > 0 ? double(n_gen) / decode_ms * 1000.0 : 0.0},
            {"timing", "transcript"}};
    if (auto t = timings.find(i.turn); t != timings.end()) {
      m["ttft_ms"] = t->second.ttft_ms;
      m["decode_ms"] = t->second.decode_ms;
      m["decode_tok_s"] = t->second.decode_ms > 0 ? double(t->second.n_decoded) / t->second.decode_ms * 1000.0 : 0.0;
      m["timing"] = "store";
    }
    j["metrics"] = m;
  }
  return j;
}

njson mcp_json(dashboard_state& st) {
  auto& reg = *st.in.reg;
  njson stats = st.obs().tool_stats();
  std::map<std::string, njson> servers;
  for (const auto& t : reg.list()) {
    size_t k = t->name.find("__");
    if (k == std::string::npos) continue;
    std::string server = t->name.substr(0, k);
    auto c = reg.server(server);
    if (!c) continue;
    njson& s = servers[server];
    if (s.is_null()) {
      const auto& info = c->server();
      s = {{"name", server},
           {"status", info.protocol_version.empty() ? "not initialized" : "ready"},
           {"protocol_version", info.protocol_version},
           {"server_name", info.name},
           {"server_version", info.version},
           {"transport", c->wire().describe()},
           {"reinitialized", c->n_reinitialized()},
           {"stderr_tail", c->stderr_tail()},
           {"tools", njson::array()},
           {"calls", 0},
           {"errors", 0},
           {"total_ms", 0.0}};
    }
    njson tool{{"name", t->name}, {"description", t->description}, {"input_schema", t->input_schema}};
    if (stats.contains(t->name)) {
      const njson& ts = stats[t->name];
      tool["stats"] = ts;
      s["calls"] = s["calls"].get<int64_t>() + ts.value("calls", int64_t{0});
      s["errors"] = s["errors"].get<int64_t>() + ts.value("errors", int64_t{0});
      s["total_ms"] = s["total_ms"].get<double>() + ts.value("total_ms", 0.0);
    }
    s["tools"].push_back(std::move(tool));
  }
  njson out = njson::array();
  for (auto& [name, s] : servers) out.push_back(std::move(s));
  return out;
}

// ============================================================================================
// HTTP helpers
// ============================================================================================
void send_json(httplib::Response& res, const njson& j, int status = 200) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(cedar::tools::json_dump(j), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg) {
  send_json(res, njson{{"error", {{"message", msg}, {"status", status}}}}, status);
}

// Parses the request body as a JSON object; on failure answers 400 and returns discarded.
njson body_object(const httplib::Request& req, httplib::Response& res) {
  njson j = req.body.empty() ? njson::object() : njson::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    send_error(res, 400, "request body must be a JSON object");
    return njson(njson::value_t::discarded);
  }
  return j;
}

bool path_id(const httplib::Request& req, httplib::Response& res, int64_t* id) {
  const std::string& s = req.matches[1];
  try {
    size_t n = 0;
    *id = std::stoll(s, &n);
    if (n == s.size()) return true;
  } catch (...) {
  }
  send_error(res, 400, "session id '" + s + "' is not a number");
  return false;
}

std::string content_type_of(const std::string& name) {
  auto ends = [&](const char* ext) {
    std::string e(ext);
    return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

void send_file(httplib::Response& res, const std::string& name) {
  const embedded_file* f = find_dashboard_file(name);
  if (!f) {
    send_error(res, 404, "no dashboard file '" + name + "'");
    return;
  }
  res.set_content(reinterpret_cast<const char*>(f->data), f->size, content_type_of(name).c_str());
}

}  // namespace

// ============================================================================================
// routes
// ============================================================================================
void mount_dashboard(httplib::Server& svr, agent_runtime& rt) {
  auto st = std::make_shared<dashboard_state>(rt);

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) { send_file(res, "index.html"); });
  svr.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) { send_file(res, "index.html"); });
  svr.Get(R"(/dash/([A-Za-z0-9_.-]+))",
          [](const httplib::Request& req, httplib::Response& res) { send_file(res, req.matches[1]); });

  svr.Get("/api/dash/sessions", [st](const httplib::Request&, httplib::Response& res) {
    auto l = st->list();
    if (!l) return send_error(res, 503, l.err().message);
    njson out = njson::array();
    for (const auto& m : *l) out.push_back(session_json(*st, m));
    send_json(res, njson{{"sessions", out}});
  });

  svr.Get(R"(/api/dash/sessions/(-?\d+))", [st](const httplib::Request& req, httplib::Response& res) {
    int64_t id = 0;
    if (!path_id(req, res, &id)) return;
    auto l = st->list();
    if (!l) return send_error(res, 503, l.err().message);
    const session_msg* m = nullptr;
    for (const auto& s : *l)
      if (s.id == id) m = &s;
    if (!m) return send_error(res, 404, "no session " + std::to_string(id));
    auto items = st->items(id);
    if (!items) return send_error(res, 404, items.err().message);
    njson j = session_json(*st, *m);
    auto timings = st->timings(id);
    njson arr = njson::array();
    for (const auto& i : *items) arr.push_back(item_json(i, timings));
    j["items"] = arr;
    njson tt = njson::array();
    for (const auto& [turn, t] : timings)
      tt.push_back({{"turn", turn},
                    {"ttft_ms", t.ttft_ms},
                    {"decode_ms", t.decode_ms},
                    {"n_decoded", t.n_decoded},
                    {"decode_tok_s", t.decode_ms > 0 ? double(t.n_decoded) / t.decode_ms * 1000.0 : 0.0}});
    j["turn_timings"] = tt;
    std::string opts = st->stored_options(id);
    j["agent_options"] = opts.empty() ? njson(nullptr) : njson::parse(opts, nullptr, false);
    observer::session_live live = st->obs().session(id);
    j["live_text"] = live.live_text;
    j["turn_summaries"] = njson(std::vector<njson>(live.turns.begin(), live.turns.end()));
    njson evs = njson::array();
    for (const auto& e : live.events) evs.push_back(e.to_json());
    j["events"] = evs;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      j["held"] = st->agents.count(id) != 0;
    }
    send_json(res, j);
  });

  svr.Get("/api/dash/executor", [st](const httplib::Request&, httplib::Response& res) {
    st->maybe_sample();
    auto s = st->exec_status();
    if (!s) return send_error(res, 503, s.err().message);
    send_json(res, njson{{"n_resident", s->n_resident},
                         {"n_active", s->n_active},
                         {"resident_bytes", s->resident_bytes},
                         {"ram_budget", s->ram_budget},
                         {"steps", s->steps},
                         {"tokens_generated", s->tokens_generated},
                         {"max_batch", s->max_batch},
                         {"samples", st->obs().executor_samples()}});
  });

  svr.Get("/api/dash/mcp", [st](const httplib::Request&, httplib::Response& res) {
    send_json(res, njson{{"servers", mcp_json(*st)}});
  });

  svr.Get("/api/dash/tools", [st](const httplib::Request&, httplib::Response& res) {
    njson out = njson::array();
    njson stats = st->obs().tool_stats();
    for (const auto& t : st->in.reg->list()) {
      njson j{{"name", t->name}, {"description", t->description}, {"input_schema", t->input_schema}};
      if (stats.contains(t->name)) j["stats"] = stats[t->name];
      out.push_back(std::move(j));
    }
    send_json(res, njson{{"tools", out}});
  });

  svr.Get("/api/dash/events", [st](const httplib::Request& req, httplib::Response& res) {
    // A new subscriber starts at the head (the JSON views carry the state so far); a
    // reconnecting EventSource resumes after its Last-Event-ID; ?after=N replays the kept ring.
    std::string from = req.has_header("Last-Event-ID") ? req.get_header_value("Last-Event-ID")
                                                        : req.get_param_value("after");
    uint64_t after = from.empty() ? st->obs().last_seq() : std::strtoull(from.c_str(), nullptr, 10);
    res.set_header("Cache-Control", "no-store");
    auto started = std::chrono::steady_clock::now();
    bool first = true;
    res.set_chunked_content_provider(
        "text/event-stream", [st, after, started, first](size_t, httplib::DataSink& sink) mutable {
          if (first) {
            first = false;
            std::string hello = "retry: 500\n: cedar dashboard events\n\n";
            return sink.write(hello.data(), hello.size());
          }
          // Each stream is bounded (~15 s) so that a stopping server never waits long on it.
          if (st->closing || std::chrono::steady_clock::now() - started > 15s) {
            sink.done();
            return true;
          }
          st->maybe_sample();
          auto evs = st->obs().wait(after, 1000ms, 256);
          std::string out;
          for (const auto& e : evs) {
            after = e.seq;
            out += "id: " + std::to_string(e.seq) + "\ndata: " +
                   cedar::tools::json_dump(e.to_json()) + "\n\n";
          }
          if (out.empty()) out = ": ping\n\n";
          return sink.write(out.data(), out.size());
        });
  });

  svr.Post("/api/dash/agents", [st](const httplib::Request& req, httplib::Response& res) {
    njson b = body_object(req, res);
    if (b.is_discarded()) return;
    agent_options o;
    o.name = b.value("name", "agent");
    if (o.name.empty()) o.name = "agent";
    o.system_prompt = b.value("system_prompt", "");
    if (b.contains("tools")) {
      if (!b["tools"].is_array()) return send_error(res, 400, "'tools' must be an array of tool names");
      for (const auto& t : b["tools"]) {
        if (!t.is_string()) return send_error(res, 400, "'tools' must be an array of tool names");
        o.tools.push_back(t.get<std::string>());
      }
    }
    if (b.contains("max_new_tokens")) {
      if (!b["max_new_tokens"].is_number_integer() || b["max_new_tokens"].get<int64_t>() < 1 ||
          b["max_new_tokens"].get<int64_t>() > 8192)
        return send_error(res, 400, "'max_new_tokens' must be an integer in [1, 8192]");
      o.max_new_tokens = b["max_new_tokens"].get<int>();
    }
    if (b.contains("min_new_tokens")) {
      if (!b["min_new_tokens"].is_number_integer() || b["min_new_tokens"].get<int64_t>() < 0 ||
          b["min_new_tokens"].get<int64_t>() > o.max_new_tokens)
        return send_error(res, 400, "'min_new_tokens' must be an integer in [0, max_new_tokens = " +
                                        std::to_string(o.max_new_tokens) + "]");
      o.min_new_tokens = b["min_new_tokens"].get<int>();
    }
    for (auto [key, out] : {std::pair<const char*, int*>{"max_tool_rounds", &o.max_tool_rounds},
                            std::pair<const char*, int*>{"max_repeated_failures", &o.max_repeated_failures}}) {
      if (!b.contains(key)) continue;
      if (!b[key].is_number_integer() || b[key].get<int64_t>() < 0 || b[key].get<int64_t>() > 64)
        return send_error(res, 400, std::string("'") + key + "' must be an integer in [0, 64]");
      *out = b[key].get<int>();
    }
    if (b.contains("answer_on_limit")) {
      if (!b["answer_on_limit"].is_boolean()) return send_error(res, 400, "'answer_on_limit' must be true or false");
      o.answer_on_limit = b["answer_on_limit"].get<bool>();
    }
    std::string message = b.value("message", "");
    if (message.empty()) return send_error(res, 400, "'message' (the first user message) is empty");
    auto a = st->rt.create_agent(o);
    if (!a) return send_error(res, 400, a.err().message);
    int64_t id = a->session();
    {
      std::lock_guard<std::mutex> lk(st->mu);
      st->agents.emplace(id, *a);
    }
    st->obs().publish("session", id, njson{{"action", "started"}, {"agent", o.name}});
    st->run_turn(*a, message);
    send_json(res, njson{{"session", id}}, 201);
  });

  svr.Post(R"(/api/dash/sessions/(-?\d+)/cancel)", [st](const httplib::Request& req, httplib::Response& res) {
    int64_t id = 0;
    if (!path_id(req, res, &id)) return;
    // The agent this dashboard started, else any agent of the runtime for the session.
    bool sent = false;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      auto it = st->agents.find(id);
      if (it != st->agents.end()) {
        it->second.cancel();
        sent = true;
      }
    }
    if (!sent) {
      std::lock_guard<std::mutex> lk(st->in.mu);
      auto it = st->in.agent_of.find(id);
      if (it != st->in.agent_of.end()) {
        caf::anon_send(it->second, cancel_atom::value);
        sent = true;
      }
    }
    if (!sent) return send_error(res, 404, "session " + std::to_string(id) + " has no agent in this runtime");
    st->obs().publish("session", id, njson{{"action", "cancel"}});
    send_json(res, njson{{"session", id}, {"cancelling", true}});
  });

  svr.Post(R"(/api/dash/sessions/(-?\d+)/resume)", [st](const httplib::Request& req, httplib::Response& res) {
    int64_t id = 0;
    if (!path_id(req, res, &id)) return;
    njson b = body_object(req, res);
    if (b.is_discarded()) return;
    std::string message = b.value("message", "");
    if (message.empty()) return send_error(res, 400, "'message' (the next user message) is empty");
    if (st->obs().session(id).running) return send_error(res, 409, "session " + std::to_string(id) + " is running a turn");
    auto a = st->agent_for(id, b.value("name", ""));
    if (!a) return send_error(res, 404, a.err().message);
    st->obs().publish("session", id, njson{{"action", "resumed"}});
    st->run_turn(*a, message);
    send_json(res, njson{{"session", id}}, 202);
  });

  svr.Post(R"(/api/dash/sessions/(-?\d+)/fork)", [st](const httplib::Request& req, httplib::Response& res) {
    int64_t id = 0;
    if (!path_id(req, res, &id)) return;
    njson b = body_object(req, res);
    if (b.is_discarded()) return;
    if (!b.contains("turns") || !b["turns"].is_number_integer() || b["turns"].get<int64_t>() < 0)
      return send_error(res, 400, "'turns' (how many store turns the fork keeps) must be an integer >= 0");
    auto f = st->fork(id, uint32_t(b["turns"].get<int64_t>()));
    if (!f) return send_error(res, 400, f.err().message);
    st->obs().publish("session", *f, njson{{"action", "forked"}, {"parent", id}, {"turns", b["turns"]}});
    std::string message = b.value("message", "");
    if (!message.empty()) {
      auto a = st->agent_for(*f, b.value("name", ""));
      if (!a) return send_error(res, 500, a.err().message);
      st->run_turn(*a, message);
    }
    send_json(res, njson{{"session", *f}, {"parent", id}}, 201);
  });
}

}  // namespace cedar::runtime
