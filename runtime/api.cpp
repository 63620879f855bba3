// The public API (cedar.hpp) over the actors: one actor system per runtime; blocking calls
// talk to the actors through scoped actors. A runtime opened with remote_port borrows another
// process's executor and store (runtime/remote.cpp); its blocking requests get a deadline and
// ask() watches the remote executor.
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "kernels/base/log.hpp"
#include "kernels/cpu/qmatmul.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/device.hpp"
#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/model_dir.hpp"
#include "model/tokenizer.hpp"
#include "runtime/actors.hpp"
#include "runtime/agent_options_json.hpp"
#include "runtime/builtin_tools.hpp"
#include "runtime/cedar.hpp"
#include "runtime/mcp_setup.hpp"
#include "runtime/remote.hpp"
#include "runtime/runtime_impl.hpp"

namespace cedar {

using namespace cedar::runtime;  // the internal namespace (actors, messages)
namespace fs = std::filesystem;

// ============================================================================================
// model loading
// ============================================================================================
namespace {

// The model hash that pages are stamped with: config.json, the safetensors header and the
// checkpoint's size (weights differ -> header offsets or size differ in practice; a retrained
// model of the same shape must also differ, so the first MiB of tensor bytes joins in).
uint64_t model_dir_hash(const std::string& dir) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x63656461);  // "ceda"
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::ifstream f(dir + "/" + name, std::ios::binary);
    std::vector<char> buf(1 << 20);
    f.read(buf.data(), std::streamsize(buf.size()));
    XXH64_update(st, buf.data(), size_t(f.gcount()));
    std::error_code ec;
    uint64_t size = fs::file_size(dir + "/" + name, ec);
    XXH64_update(st, &size, sizeof size);
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

// XXH64 (seed vocab_size) of the first 2^16 embedding values as fp32, as when the engine held
// an fp32 copy: the embedding stays in its checkpoint dtype, so the values are dequantised row
// by row into a small buffer and streamed (stored session hashes stay valid).
uint64_t engine_hash(const model::engine& e) {
  const kernels::qmatrix& emb = e.embed();
  const size_t cols = size_t(emb.cols);
  size_t left = std::min<size_t>(size_t(emb.rows) * cols, 1 << 16);
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, uint64_t(e.config().vocab_size));
  std::vector<float> row(cols);
  for (int64_t r = 0; left > 0; ++r) {
    kernels::dequant_rows(emb, r, 1, row.data());
    const size_t k = std::min(left, cols);
    XXH64_update(st, row.data(), k * sizeof(float));
    left -= k;
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h ^ uint64_t(e.config().hidden_size) * 0x9E3779B97F4A7C15ull;
}

// Blocking requests of the API: a remote peer may vanish, so they get a deadline there.
caf::duration request_timeout(bool remote) {
  return remote ? caf::duration(std::chrono::seconds(60)) : caf::duration(caf::infinite);
}

}  // namespace

// ============================================================================================
// runtime
// ============================================================================================
agent_runtime::agent_runtime(std::unique_ptr<impl> p) : p_(std::move(p)) {}
agent_runtime::~agent_runtime() = default;

result<std::unique_ptr<agent_runtime>> agent_runtime::open(runtime_options o) {
  if (o.remote_port != 0) {  // runtime/remote.cpp
    if (!(o.engine && o.tokenizer) && o.model_dir.empty())
      return make_error(errc::invalid_argument, "runtime: no model_dir given");
    uint64_t hash = o.engine && o.tokenizer ? engine_hash(*o.engine) : model_dir_hash(o.model_dir);
    auto p = open_remote(o, hash);
    if (!p) return p.take_err();
    return std::unique_ptr<agent_runtime>(new agent_runtime(std::move(*p)));
  }
  kernels::announce_device();
  auto p = std::make_unique<impl>();
  p->opts = o;
  if (o.engine && o.tokenizer) {
    p->engine = o.engine;
    p->tok = o.tokenizer;
    p->model_hash = engine_hash(*o.engine);
  } else {
    if (o.model_dir.empty()) return make_error(errc::invalid_argument, "runtime: no model_dir given");
    auto m = model::load_model_dir(o.model_dir, /*need_tokenizer=*/true);
    if (!m) return m.take_err();
    p->engine = m->eng;
    p->tok = m->tok;
    const std::string& dir = o.model_dir;
    p->model_hash = model_dir_hash(dir);
  }
  auto want = model::parse_backend_request(o.backend);
  if (!want) return want.take_err();
  if (*want == model::backend_request::cuda) {
    if (o.kv_unquantised)
      return make_error(errc::invalid_argument, "runtime: the cuda backend keeps packed KV (no unquantised diagnostic)");
    if (const std::string why = model::cuda_unavailable_reason(); !why.empty())
      return make_error(errc::unavailable, "runtime: backend cuda: " + why);
  }
  if (o.store_path.empty()) return make_error(errc::invalid_argument, "runtime: no store_path given");
  auto st = sessions::store::open(o.store_path);
  if (!st) return st.take_err();

  if (o.builtin_tools)
    for (auto& t : builtin_tools(o.files_root)) CEDAR_TRY(p->reg->add(std::move(t)));
  if (!o.mcp_config.empty()) CEDAR_TRY(add_mcp_servers(*p->reg, o.mcp_config));

  p->config = std::make_shared<const model::model_config>(p->engine->config());
  register_message_types(p->cfg);
  configure_middleman(p->cfg);  // publish() may offer the executor and store
  p->cfg.set("scheduler.max-threads", std::max(1, o.scheduler_threads));
  p->cfg.set("logger.verbosity", caf::atom("quiet"));
  p->sys = std::make_unique<caf::actor_system>(p->cfg);

  const model::model_config& c = p->engine->config();
  sessions::page_geometry g;
  g.main_dims = uint16_t(c.head_dim);
  g.index_dims = uint16_t(c.index_head_dim);
  g.main_entry_bytes = uint32_t(kernels::fp4_kv_bytes(c.head_dim));
  g.index_entry_bytes = uint32_t(kernels::fp4_index_bytes(c.index_head_dim));
  p->store = spawn_store(*p->sys, std::move(*st), p->model_hash, g);
  runtime::executor_options xo;
  xo.policy = o.resume;
  if (o.kv_unquantised) xo.storage = model::kv_storage::f32_diagnostic, xo.kv_rounded = o.kv_rounded;
  xo.backend = *want;
  xo.tokenizer = p->tok;
  p->exec = spawn_executor(*p->sys, p->engine, o.ram_budget_mb << 20, p->store, xo);
  return std::unique_ptr<agent_runtime>(new agent_runtime(std::move(p)));
}

status agent_runtime::add_tool(tools::tool t) { return p_->reg->add(std::move(t)); }

std::vector<std::string> agent_runtime::tool_names() const {
  std::vector<std::string> out;
  for (const auto& t : p_->reg->list()) out.push_back(t->name);
  return out;
}

const model::tokenizer& agent_runtime::tokenizer() const { return *p_->tok; }
const model::model_config& agent_runtime::config() const { return *p_->config; }
bool agent_runtime::has_engine() const { return p_->engine != nullptr; }
const model::engine& agent_runtime::engine() const { return *p_->engine; }

// The limits an agent runs under, checked where options enter (a clear error, not a clamp).
static status check_options(const agent_options& o) {
  auto bad = [&](const char* field, int v, const std::string& want) {
    return make_error(errc::invalid_argument, "agent '" + o.name + "': " + field + " = " + std::to_string(v) +
                                                  " (must be " + want + ")");
  };
  if (o.max_new_tokens < 1) return bad("max_new_tokens", o.max_new_tokens, ">= 1");
  if (o.min_new_tokens < 0 || o.min_new_tokens > o.max_new_tokens)
    return bad("min_new_tokens", o.min_new_tokens, "in [0, max_new_tokens = " + std::to_string(o.max_new_tokens) + "]");
  if (o.max_tool_rounds < 0) return bad("max_tool_rounds", o.max_tool_rounds, ">= 0");
  if (o.max_repeated_failures < 0) return bad("max_repeated_failures", o.max_repeated_failures, ">= 0; 0 turns the guard off");
  if (o.tool_timeout_ms < 1) return bad("tool_timeout_ms", o.tool_timeout_ms, ">= 1");
  return {};
}

static agent_config to_config(const agent_options& o, std::shared_ptr<observer> obs) {
  agent_config c;
  c.obs = std::move(obs);
  c.name = o.name;
  c.system_prompt = o.system_prompt;
  c.tools = o.tools;
  c.temperature = o.temperature;
  c.top_p = o.top_p;
  c.min_p = o.min_p;
  c.seed = o.seed;
  c.limits.max_new_tokens = o.max_new_tokens;
  c.limits.min_new_tokens = o.min_new_tokens;
  c.limits.max_tool_rounds = o.max_tool_rounds;
  c.limits.max_repeated_failures = o.max_repeated_failures;
  c.limits.answer_on_limit = o.answer_on_limit;
  c.tool_timeout_ms = o.tool_timeout_ms;
  c.constrain_tool_calls = o.constrain_tool_calls;
  return c;
}

result<agent> agent_runtime::create_agent(const agent_options& o) {
  CEDAR_TRY(check_options(o));
  for (const auto& name : o.tools)
    if (!p_->reg->find(name)) return make_error(errc::not_found, "agent '" + o.name + "': unknown tool '" + name + "'");
  caf::scoped_actor self{*p_->sys};
  result<agent> out = make_error(errc::unavailable, "store did not answer");
  self->request(p_->store, request_timeout(p_->remote), create_atom::value, o.name, uint64_t(0))
      .receive(
          [&](store_reply& r) {
            if (!r.error.empty()) {
              out = make_error(errc::io, r.error);
              return;
            }
            auto a = std::make_shared<agent::impl>();
            a->session = r.value;
            a->sys = p_->sys.get();
            if (p_->remote) a->remote_exec = caf::actor_cast<caf::actor>(p_->exec);
            a->actor = spawn_agent(*p_->sys, p_->tok, p_->reg, p_->exec, p_->store, r.value, to_config(o, p_->obs), {}, true,
                                   p_->config->eos_token_id);
            std::lock_guard<std::mutex> lk(p_->mu);
            p_->agents.push_back(a->actor);
            p_->agent_of[r.value] = a->actor;
            out = agent(a);
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
  if (out.ok()) {
    // The options stay with the session: a later resume (the dashboard's, after a restart) uses them.
    std::string err;
    self->request(p_->store, request_timeout(p_->remote), opts_atom::value, out->session(), agent_options_to_json(o))
        .receive([&](store_reply& r) { err = r.error; }, [&](caf::error& e) { err = caf::to_string(e); });
    if (!err.empty()) CEDAR_LOG_WARN("agent %lld: options not stored: %s", (long long)out->session(), err.c_str());
  }
  return out;
}

result<agent> agent_runtime::resume_agent(int64_t session, const agent_options& o) {
  CEDAR_TRY(check_options(o));
  caf::scoped_actor self{*p_->sys};
  result<agent> out = make_error(errc::unavailable, "store did not answer");
  self->request(p_->store, request_timeout(p_->remote), items_atom::value, session)
      .receive(
          [&](std::vector<item_msg>& items, std::string& err) {
            if (!err.empty()) {
              out = make_error(errc::not_found, err);
              return;
            }
            bool stopped = true;
            auto msgs = messages_from_items(items, &stopped);
            auto a = std::make_shared<agent::impl>();
            a->session = session;
            a->sys = p_->sys.get();
            if (p_->remote) a->remote_exec = caf::actor_cast<caf::actor>(p_->exec);
            a->actor = spawn_agent(*p_->sys, p_->tok, p_->reg, p_->exec, p_->store, session, to_config(o, p_->obs),
                                   std::move(msgs), stopped, p_->config->eos_token_id);
            std::lock_guard<std::mutex> lk(p_->mu);
            p_->agents.push_back(a->actor);
            p_->agent_of[session] = a->actor;
            out = agent(a);
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
  return out;
}

result<std::vector<session_summary>> agent_runtime::sessions() {
  caf::scoped_actor self{*p_->sys};
  result<std::vector<session_summary>> out = make_error(errc::unavailable, "store did not answer");
  self->request(p_->store, request_timeout(p_->remote), list_atom::value)
      .receive(
          [&](std::vector<session_msg>& v, std::string& err) {
            if (!err.empty()) {
              out = make_error(errc::io, err);
              return;
            }
            std::vector<session_summary> s;
            for (auto& m : v) s.push_back({m.id, m.agent, m.status, m.n_turns, m.n_tokens, m.updated_ms});
            out = std::move(s);
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, "store: " + caf::to_string(e)); });
  return out;
}

// ============================================================================================
// agent
// ============================================================================================
int64_t agent::session() const { return p_->session; }

void agent::cancel() { caf::anon_send(p_->actor, cancel_atom::value); }

result<turn_result> agent::ask(const std::string& text, const std::function<void(const agent_event&)>& on_event) {
  caf::scoped_actor self{*p_->sys};
  if (p_->remote_exec) self->monitor(p_->remote_exec);
  // The agent actor itself may end (an exception escaping a handler terminates a CAF actor):
  // its down message turns into this turn's error instead of a wait that never ends.
  self->monitor(p_->actor);
  self->send(p_->actor, ask_atom::value, text, caf::actor(self));
  bool done = false;
  turn_summary sum;
  while (!done) {
    self->receive(
        [&](caf::down_msg& d) {
          if (d.source == p_->actor.address()) {
            sum.error = "the agent actor of session " + std::to_string(p_->session) +
                        " terminated: " + p_->sys->render(d.reason);
            done = true;
            return;
          }
          // The remote executor went away (its process or the link): the agent's request to it
          // will never be answered, so the turn fails here.
          sum.error = "remote executor is gone: " + p_->sys->render(d.reason);
          done = true;
          caf::anon_send(p_->actor, cancel_atom::value);
        },
        [&](event_atom, const agent_event_msg& e) {
          if (!on_event) return;
          agent_event ev;
          static const std::pair<const char*, agent_event::kind> kinds[] = {
              {"token", agent_event::kind::token},
              {"tool_call", agent_event::kind::tool_call},
              {"tool_result", agent_event::kind::tool_result},
              {"answer", agent_event::kind::answer},
              {"error", agent_event::kind::error},
              {"refused_call", agent_event::kind::refused_call}};
          bool known = false;
          for (auto& [n, k] : kinds)
            if (e.kind == n) ev.type = k, known = true;
          if (!known) return;  // a kind this build does not know (a newer remote agent): not a token
          ev.text = e.text;
          ev.tool = e.tool;
          ev.arguments = e.arguments;
          ev.is_error = e.is_error;
          ev.ms = e.ms;
          on_event(ev);
        },
        [&](turn_summary& s) {
          sum = std::move(s);
          done = true;
        },
        [&](caf::error& e) {
          sum.error = "agent: " + caf::to_string(e);
          done = true;
        });
  }
  if (p_->remote_exec) self->demonitor(p_->remote_exec);
  self->demonitor(p_->actor);
  if (!sum.error.empty() && sum.rounds == 0 && !sum.cancelled) return make_error(errc::internal, sum.error);
  turn_result r;
  r.answer = sum.answer;
  r.cancelled = sum.cancelled;
  r.round_limit = sum.round_limit;
  r.repeat_limit = sum.repeat_limit;
  r.rounds = sum.rounds;
  r.tool_calls = sum.tool_calls;
  r.invalid_tool_calls = sum.invalid_tool_calls;
  r.masked_tokens = sum.masked_tokens;
  r.resume_paths = sum.resume_paths;
  r.prompt_tokens = sum.prompt_tokens;
  r.generated_tokens = sum.generated_tokens;
  r.replayed_tokens = sum.replayed_tokens;
  r.context = sum.context;
  r.resume_path = sum.resume_path;
  r.first_token_ms = sum.first_token_ms;
  r.total_ms = sum.total_ms;
  if (!sum.error.empty()) return make_error(errc::internal, sum.error);
  return r;
}

}  // namespace cedar
