// Stateless completions: prompt building, the prefix index, one generation, one commit.
// Design notes in completion.hpp.
#include "runtime/completion.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>

#include "kernels/base/log.hpp"
#include "model/dsml.hpp"
#include "model/engine.hpp"
#include "model/tokenizer.hpp"
#include "model/tool_grammar.hpp"
#include "runtime/runtime_impl.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {

using njson = nlohmann::json;

namespace {

// The tool grammar (model/tool_grammar.hpp) of a request's OpenAI tool objects: its calls may
// name only these functions with their parameters. "" (unconstrained) when there are none or
// one cannot be read (the request was validated before; the model then samples freely).
std::string grammar_of(const std::vector<std::string>& tools_json) {
  std::vector<std::pair<std::string, std::string>> tools;
  for (const auto& t : tools_json) {
    auto j = nlohmann::json::parse(t, nullptr, false);
    if (j.is_discarded() || !j.contains("function") || !j["function"].is_object()) return "";
    const auto& f = j["function"];
    if (!f.contains("name") || !f["name"].is_string()) return "";
    tools.emplace_back(f["name"].get<std::string>(), f.contains("parameters") ? cedar::tools::json_dump(f["parameters"]) : std::string());
  }
  return tools.empty() ? std::string() : model::tool_grammar_spec(tools);
}

// ---- token-prefix hashes ------------------------------------------------------------------
uint64_t hash_step(uint64_t h, int32_t t) {
  h = (h + uint64_t(uint32_t(t)) + 1) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}
constexpr uint64_t k_hash_seed = 0x63656461722d6f61ull;

// H[i] = hash of tokens[0, i); H has tokens.size() + 1 entries.
std::vector<uint64_t> prefix_hashes(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h(tokens.size() + 1);
  h[0] = k_hash_seed;
  for (size_t i = 0; i < tokens.size(); ++i) h[i + 1] = hash_step(h[i], tokens[i]);
  return h;
}

std::string random_hex(size_t n_bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n_bytes; ++i) {
    uint8_t b = uint8_t(rng());
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// The identity of an assistant reply as a client sends it back: content and calls (ids
// included: they are unique per reply), arguments compared as JSON values.
std::string reply_key(const std::string& content, const std::vector<model::chat_tool_call>& calls) {
  std::string k = content;
  k += '\x1f';
  for (const auto& c : calls) {
    njson a = njson::parse(c.arguments_json, nullptr, false);
    k += c.id + '\x1e' + c.name + '\x1e' + (a.is_discarded() ? c.arguments_json : cedar::tools::json_dump(a)) + '\x1d';
  }
  return k;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Transcript item of an input message (the dashboard and `cedar sessions` show these).
item_msg input_item(const model::chat_message& m) {
  njson p;
  std::string kind;
  switch (m.role) {
    case model::chat_role::system:
    case model::chat_role::developer:
    case model::chat_role::latest_reminder:
      kind = "system";
      p = njson{{"content", m.content}, {"tools", m.tools_json}, {"role", model::chat_role_name(m.role)}};
      break;
    case model::chat_role::user:
      kind = "user";
      p = njson{{"content", m.content}};
      break;
    case model::chat_role::assistant: {
      kind = "assistant";
      njson calls = njson::array();
      for (const auto& c : m.tool_calls) calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments_json}});
      p = njson{{"content", m.content}, {"tool_calls", calls}, {"stopped", true}, {"source", "request"}};
      break;
    }
    case model::chat_role::tool:
      kind = "tool_result";
      p = njson{{"tool_call_id", m.tool_call_id}, {"content", m.content}, {"is_error", false}};
      break;
  }
  return item_msg{kind, cedar::tools::json_dump(p), 0, 0, 0};
}

}  // namespace

// ============================================================================================
// state: the prefix index and the reply map
// ============================================================================================
struct api_session {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // the committed token log
  struct boundary {
    uint64_t n_tokens = 0;
    uint32_t n_turns = 0;
    size_t n_messages = 0;  // request messages (tools attached) the log holds up to here
  };
  std::vector<boundary> bounds;  // ascending; the last one is the session's end
  bool busy = false;
  bool terminal = false;  // done/failed/cancelled in the store: fork it, never continue it
  uint64_t used = 0;
};

struct completion_service::state {
  size_t max_sessions = 256;
  mutable std::mutex mu;
  std::map<int64_t, api_session> sessions;
  std::unordered_multimap<uint64_t, int64_t> by_hash;  // prefix hash at a boundary -> session
  std::unordered_map<std::string, std::vector<int32_t>> replies;  // reply_key -> sampled tokens
  std::deque<std::string> reply_order;
  size_t max_replies = 4096;
  uint64_t clock = 0;
  size_t n_rebuilt = 0;

  void index(const api_session& s, const api_session::boundary& b) {
    auto h = prefix_hashes(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + int64_t(b.n_tokens)));
    by_hash.emplace(h.back(), s.id);
  }
  void unindex(int64_t id) {
    for (auto it = by_hash.begin(); it != by_hash.end();) it = it->second == id ? by_hash.erase(it) : std::next(it);
  }
  // Drops the least recently used idle sessions beyond max_sessions (they stay in the store).
  void evict() {
    while (sessions.size() > max_sessions) {
      auto victim = sessions.end();
      for (auto it = sessions.begin(); it != sessions.end(); ++it)
        if (!it->second.busy && (victim == sessions.end() || it->second.used < victim->second.used)) victim = it;
      if (victim == sessions.end()) return;
      unindex(victim->first);
      sessions.erase(victim);
    }
  }
  void remember_reply(std::string key, std::vector<int32_t> toks) {
    if (replies.count(key)) return;
    replies.emplace(key, std::move(toks));
    reply_order.push_back(std::move(key));
    while (reply_order.size() > max_replies) {
      replies.erase(reply_order.front());
      reply_order.pop_front();
    }
  }

  // The longest boundary of an indexed session that is a prefix of `p` (leaving >= 1 token).
  struct match {
    int64_t session = -1;
    api_session::boundary at;
    bool at_end = false;
  };
  match longest(const std::vector<int32_t>& p) const {
    match m;
    if (p.size() < 2) return m;
    auto h = prefix_hashes(p);
    for (size_t n = p.size() - 1; n >= 1; --n) {
      auto range = by_hash.equal_range(h[n]);
      for (auto it = range.first; it != range.second; ++it) {
        auto s = sessions.find(it->second);
        if (s == sessions.end() || s->second.tokens.size() < n) continue;
        if (!std::equal(p.begin(), p.begin() + int64_t(n), s->second.tokens.begin())) continue;
        for (const auto& b : s->second.bounds)
          if (b.n_tokens == n) {
            m.session = s->first;
            m.at = b;
            m.at_end = &b == &s->second.bounds.back() && !s->second.terminal;
            if (m.at_end && !s->second.busy) return m;  // best: continue it
          }
      }
      if (m.session >= 0) return m;
    }
    return m;
  }
};

namespace {

const char* const k_agent = "openai";  // the store's agent name of API sessions

}  // namespace

completion_service::completion_service(agent_runtime& rt, size_t max_sessions)
    : rt_(rt), st_(std::make_unique<state>()) {
  st_->max_sessions = std::max<size_t>(1, max_sessions);
  rebuild();
}

// The prefix index and reply map from the store: the max_sessions most recently updated API
// sessions, oldest first (so the LRU order is the store's). A session that cannot be read is
// left out (logged); it stays in the store.
void completion_service::rebuild() {
  auto& rt = rt_.internals();
  caf::scoped_actor self{*rt.sys};
  const auto timeout = std::chrono::seconds(30);
  std::vector<session_msg> list;
  std::string err;
  self->request(rt.store, timeout, list_atom::value)
      .receive(
          [&](std::vector<session_msg>& v, std::string& e) {
            list = std::move(v);
            err = e;
          },
          [&](caf::error& e) { err = caf::to_string(e); });
  if (!err.empty()) {
    CEDAR_LOG_WARN("completion: prefix index not rebuilt: %s", err.c_str());
    return;
  }
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](const session_msg& m) { return m.agent != k_agent || m.n_tokens == 0; }),
             list.end());
  std::sort(list.begin(), list.end(), [](const session_msg& a, const session_msg& b) {
    return a.updated_ms != b.updated_ms ? a.updated_ms > b.updated_ms : a.id > b.id;
  });
  if (list.size() > st_->max_sessions) list.resize(st_->max_sessions);
  const int32_t eos = rt.tok->eos_id();
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    session_log_msg log;
    std::vector<item_msg> items;
    err.clear();
    self->request(rt.store, timeout, log_atom::value, it->id)
        .receive([&](session_log_msg& m) { log = std::move(m); }, [&](caf::error& e) { log.error = caf::to_string(e); });
    if (log.error.empty())
      self->request(rt.store, timeout, items_atom::value, it->id)
          .receive(
              [&](std::vector<item_msg>& v, std::string& e) {
                items = std::move(v);
                err = e;
              },
              [&](caf::error& e) { err = caf::to_string(e); });
    if (!log.error.empty() || !err.empty()) {
      CEDAR_LOG_WARN("completion: session %lld left out of the prefix index: %s", (long long)it->id,
                     (log.error.empty() ? err : log.error).c_str());
      continue;
    }
    api_session s;
    s.id = it->id;
    s.tokens = std::move(log.tokens);
    s.terminal = it->status == "done" || it->status == "failed" || it->status == "cancelled";
    // Request messages up to each checkpoint: one item per message, one per reply (tool_call
    // items repeat the reply's calls).
    std::vector<size_t> msgs_by_turn(log.checkpoint_tokens.size(), 0);
    for (const auto& i : items)
      if (i.kind != "tool_call" && i.turn < msgs_by_turn.size()) msgs_by_turn[i.turn]++;
    size_t n_msgs = 0;
    for (size_t t = 0; t < log.checkpoint_tokens.size(); ++t) {
      n_msgs += msgs_by_turn[t];
      uint64_t n = log.checkpoint_tokens[t];
      if (n == 0 || n > s.tokens.size()) continue;
      s.bounds.push_back({n, uint32_t(t + 1), n_msgs});
    }
    if (s.bounds.empty() || s.bounds.back().n_tokens != s.tokens.size()) continue;
    std::lock_guard<std::mutex> lk(st_->mu);
    for (const auto& i : items) {
      if (i.kind != "assistant") continue;
      njson p = njson::parse(i.payload, nullptr, false);
      if (!p.is_object() || !p.value("faithful", false) || i.token_end > s.tokens.size() || i.token_begin > i.token_end)
        continue;
      std::vector<int32_t> reply(s.tokens.begin() + int64_t(i.token_begin), s.tokens.begin() + int64_t(i.token_end));
      if (!reply.empty() && reply.back() == eos && p.value("stopped", false)) reply.pop_back();
      std::vector<model::chat_tool_call> cc;
      if (p.contains("tool_calls") && p["tool_calls"].is_array())
        for (const auto& c : p["tool_calls"]) cc.push_back({c.value("id", ""), c.value("name", ""), c.value("arguments", "")});
      st_->remember_reply(reply_key(p.value("content", ""), cc), std::move(reply));
    }
    s.used = ++st_->clock;
    auto& slot = st_->sessions[s.id];
    slot = std::move(s);
    auto h = prefix_hashes(slot.tokens);
    for (const auto& b : slot.bounds) st_->by_hash.emplace(h[b.n_tokens], slot.id);
    st_->n_rebuilt++;
  }
}

size_t completion_service::n_rebuilt_sessions() const {
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->n_rebuilt;
}
completion_service::~completion_service() = default;

std::string completion_service::model_id() const {
  const auto& dir = rt_.internals().opts.model_dir;
  if (dir.empty() || rt_.internals().opts.engine) return "cedar";
  auto p = std::filesystem::path(dir);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  return name.empty() ? "cedar" : name;
}

size_t completion_service::n_indexed_sessions() const {
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->sessions.size();
}

// ============================================================================================
// complete
// ============================================================================================
namespace {

// The prompt's ids: the rendered conversation, where each assistant reply this service produced
// (recognised by reply_key) holds the tokens the model sampled for it. Every cut is at a special
// token (the generation prefix ends in </think>, a reply ends in EOS), so encoding the pieces
// apart equals encoding the whole text (agent_loop invariant 3).
result<std::vector<int32_t>> build_prompt(const model::tokenizer& tok, const std::vector<model::chat_message>& msgs,
                                          const std::function<const std::vector<int32_t>*(const std::string&)>& reply) {
  model::chat_options o;
  auto full = model::render_chat(msgs, o);
  if (!full) return make_error(errc::invalid_argument, "messages: " + full.err().message);
  std::string gen_prefix = std::string(model::tokens::assistant) + std::string(model::tokens::think_end);
  if (!ends_with(*full, gen_prefix))
    return make_error(errc::invalid_argument,
                      "messages: the conversation must end with a user, tool or developer message (the model answers it)");
  std::vector<int32_t> out;
  size_t cursor = 0;
  auto encode_to = [&](size_t end) -> status {
    if (end <= cursor) return {};
    auto ids = tok.encode(std::string_view(*full).substr(cursor, end - cursor), true);
    if (!ids) return make_error(errc::invalid_argument, "messages: " + ids.err().message);
    out.insert(out.end(), ids->begin(), ids->end());
    cursor = end;
    return {};
  };
  for (size_t a = 0; a < msgs.size(); ++a) {
    if (msgs[a].role != model::chat_role::assistant) continue;
    const std::vector<int32_t>* sampled = reply(reply_key(msgs[a].content, msgs[a].tool_calls));
    if (!sampled) continue;
    std::span<const model::chat_message> head(msgs.data(), a), with(msgs.data(), a + 1);
    auto pre = model::render_chat(head, o);
    auto post = model::render_chat(with, o);
    if (!pre || !post || pre->size() < cursor || post->compare(0, pre->size(), *pre) != 0 ||
        full->compare(0, post->size(), *post) != 0)
      continue;  // not prefix-stable here: the text is encoded instead
    CEDAR_TRY(encode_to(pre->size()));
    out.insert(out.end(), sampled->begin(), sampled->end());
    if (ends_with(*post, model::tokens::eos)) out.push_back(tok.eos_id());
    cursor = post->size();
  }
  CEDAR_TRY(encode_to(full->size()));
  return out;
}

// Content that may end in the beginning of a stop string is held back until it cannot.
struct stop_filter {
  std::vector<std::string> stops;
  std::string hold;
  bool hit = false;
  size_t keep = 0;  // longest stop - 1

  explicit stop_filter(std::vector<std::string> s) : stops(std::move(s)) {
    stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
    for (const auto& x : stops) keep = std::max(keep, x.size() - 1);
  }
  // Returns the text that is safe to emit now.
  std::string push(std::string_view text) {
    if (hit) return {};
    hold += text;
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, hold.find(s));
    if (cut != std::string::npos) {
      hit = true;
      std::string out = hold.substr(0, cut);
      hold.clear();
      return out;
    }
    if (hold.size() <= keep) return {};
    size_t n = hold.size() - keep;
    while (n > 0 && n < hold.size() && (uint8_t(hold[n]) & 0xC0) == 0x80) --n;  // whole UTF-8 characters
    std::string out = hold.substr(0, n);
    hold.erase(0, n);
    return out;
  }
  std::string flush() {
    std::string out = hit ? std::string() : hold;
    hold.clear();
    return out;
  }
};

}  // namespace

status completion_service::validate(const completion_request& req) const {
  if (req.max_tokens < 1) return make_error(errc::invalid_argument, "max_tokens: must be at least 1");
  if (req.messages.empty()) return make_error(errc::invalid_argument, "messages: must not be empty");
  std::vector<model::chat_message> msgs = req.messages;
  model::attach_tools(msgs, req.tools_json);
  auto p = build_prompt(*rt_.internals().tok, msgs, [](const std::string&) { return nullptr; });
  if (!p) return p.take_err();
  const int64_t n_ctx = int64_t(rt_.internals().config->max_position_embeddings);
  if (int64_t(p->size()) + req.max_tokens > n_ctx)
    return make_error(errc::invalid_argument, "messages: the prompt (" + std::to_string(p->size()) +
                                                  " tokens) plus max_tokens exceeds the model's context of " +
                                                  std::to_string(n_ctx) + " tokens");
  return {};
}

result<completion_result> completion_service::complete(const completion_request& req, const completion_sink& sink) {
  auto& rt = rt_.internals();
  const model::tokenizer& tok = *rt.tok;
  CEDAR_TRY(validate(req));

  std::vector<model::chat_message> msgs = req.messages;
  model::attach_tools(msgs, req.tools_json);

  // 1. The prompt (+ the forced start of the reply).
  std::vector<int32_t> prompt;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    auto p = build_prompt(tok, msgs, [&](const std::string& k) -> const std::vector<int32_t>* {
      auto it = st_->replies.find(k);
      return it == st_->replies.end() ? nullptr : &it->second;
    });
    if (!p) return p.take_err();
    prompt = std::move(*p);
  }
  std::vector<int32_t> forced;
  if (!req.forced_prefix.empty()) {
    auto f = tok.encode(req.forced_prefix, true);
    if (!f) return f.take_err();
    forced = std::move(*f);
  }
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), forced.begin(), forced.end());
  const int64_t n_ctx = int64_t(rt.config->max_position_embeddings);
  if (int64_t(full.size()) + req.max_tokens > n_ctx)
    return make_error(errc::invalid_argument, "messages: the prompt (" + std::to_string(full.size()) +
                                                  " tokens) plus max_tokens exceeds the model's context of " +
                                                  std::to_string(n_ctx) + " tokens");

  // 2. Where its KV comes from: continue a session, fork one, or start fresh.
  auto m = [&] {
    std::lock_guard<std::mutex> lk(st_->mu);
    auto mm = st_->longest(full);
    if (mm.session >= 0 && mm.at_end) {
      auto& s = st_->sessions[mm.session];
      if (!s.busy) s.busy = true;
      else mm.at_end = false;  // raced: fork instead
    }
    return mm;
  }();
  caf::scoped_actor self{*rt.sys};
  api_session sess;
  bool fresh = false;
  size_t n_cached = 0, n_msgs_before = 0;
  if (m.session >= 0 && m.at_end) {
    std::lock_guard<std::mutex> lk(st_->mu);
    sess = st_->sessions[m.session];  // a copy; the entry stays busy until the commit
    n_cached = m.at.n_tokens;
    n_msgs_before = m.at.n_messages;
  } else {
    std::string err;
    int64_t id = -1;
    auto on_reply = [&](store_reply& r) {
      if (!r.error.empty()) err = r.error;
      else id = r.value;
    };
    auto on_err = [&](caf::error& e) { err = "store unavailable: " + caf::to_string(e); };
    if (m.session >= 0) {
      self->request(rt.store, caf::infinite, fork_atom::value, m.session, m.at.n_turns).receive(on_reply, on_err);
      if (err.empty()) {
        std::lock_guard<std::mutex> lk(st_->mu);
        auto it = st_->sessions.find(m.session);
        if (it == st_->sessions.end() || it->second.tokens.size() < m.at.n_tokens) {
          err = "the matched session left the index";
        } else {
          sess.tokens.assign(it->second.tokens.begin(), it->second.tokens.begin() + int64_t(m.at.n_tokens));
          for (const auto& b : it->second.bounds)
            if (b.n_tokens <= m.at.n_tokens) sess.bounds.push_back(b);
        }
      }
      if (!err.empty()) {  // fall back to a fresh session
        CEDAR_LOG_WARN("completion: fork of session %lld failed (%s); starting fresh", (long long)m.session, err.c_str());
        err.clear();
        id = -1;
        sess = api_session{};
      } else {
        n_cached = m.at.n_tokens;
        n_msgs_before = m.at.n_messages;
      }
    }
    if (id < 0) {
      self->request(rt.store, caf::infinite, create_atom::value, std::string(k_agent), uint64_t(0))
          .receive(on_reply, on_err);
      if (!err.empty()) return make_error(errc::io, "store: " + err);
      fresh = true;
    }
    sess.id = id;
    sess.busy = true;
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->sessions[id] = sess;
  }
  auto release = [&](bool keep) {
    std::lock_guard<std::mutex> lk(st_->mu);
    if (!keep) {
      st_->unindex(sess.id);
      st_->sessions.erase(sess.id);
    } else {
      st_->sessions[sess.id].busy = false;
    }
  };

  // 3. Generate, streaming through the DSML parser.
  gen_request g;
  g.session = sess.id;
  g.tokens.assign(full.begin() + int64_t(n_cached), full.end());
  g.temperature = std::max(0.0f, req.temperature);
  g.top_p = req.top_p;
  g.seed = req.seed;
  g.max_new_tokens = req.max_tokens;
  g.min_new_tokens = req.min_tokens;
  g.stop_ids = {tok.eos_id()};
  g.fresh = fresh;
  g.tool_grammar = grammar_of(req.tools_json);
  g.reply_prefix = req.forced_prefix;

  completion_result out;
  out.session = sess.id;
  model::stream_decoder dec(tok);
  model::dsml_parser parser(false);
  stop_filter stopf(req.stop);
  bool cancelled = false, dropped_calls = false;
  // The call being streamed: its index in the reply, id, and whether a parameter was sent.
  struct open_call {
    bool active = false;
    int index = 0;
    std::string id, name, streamed;
    bool any_param = false;
  } oc;
  int n_begun = 0;
  auto cancel = [&] {
    if (!cancelled) self->send(rt.exec, cancel_atom::value, sess.id);
    cancelled = true;
  };
  auto send_delta = [&](completion_call_delta&& cd) {
    if (sink.tool_call_delta && !sink.tool_call_delta(cd)) cancel();
  };
  auto emit_content = [&](std::string_view text) {
    if (text.empty()) return;
    out.content += text;
    if (sink.content && !sink.content(text)) cancel();
  };
  auto handle = [&](std::vector<model::dsml_event>& ev) {
    for (auto& e : ev) {
      switch (e.kind) {
        case model::dsml_event_kind::content:
          emit_content(stopf.push(e.text));
          if (stopf.hit) cancel();
          break;
        case model::dsml_event_kind::call_begin:
          oc = open_call{};
          if (req.drop_calls || stopf.hit) break;
          oc.active = true;
          oc.index = n_begun++;
          oc.id = "call_" + random_hex(12);
          oc.name = e.name;
          send_delta({oc.index, true, oc.id, oc.name, ""});
          break;
        case model::dsml_event_kind::parameter: {
          if (!oc.active) break;
          std::string piece = (oc.any_param ? ", " : "{") + model::json_quote(e.name) + ": " + e.value;
          oc.any_param = true;
          oc.streamed += piece;
          send_delta({oc.index, false, "", "", std::move(piece)});
          break;
        }
        case model::dsml_event_kind::call_end: {
          if (req.drop_calls) dropped_calls = true;
          if (!oc.active) break;
          std::string piece = oc.any_param ? "}" : "{}";
          oc.streamed += piece;
          if (oc.streamed != e.value)  // the parser's own arguments are the truth
            CEDAR_LOG_WARN("completion: streamed arguments of call %s differ from the parsed ones", oc.id.c_str());
          send_delta({oc.index, false, "", "", std::move(piece)});
          out.calls.push_back({oc.id, e.name, e.value});
          oc.active = false;
          if (sink.tool_call && !sink.tool_call(out.calls.back(), int(out.calls.size()) - 1)) cancel();
          break;
        }
        case model::dsml_event_kind::error:
          out.parse_errors.push_back(e.text);
          oc.active = false;  // a call with an error never ends (dsml invariant 4)
          break;
        default:
          break;
      }
    }
    ev.clear();
  };
  std::vector<model::dsml_event> ev;
  if (!req.forced_prefix.empty()) {
    parser.feed(req.forced_prefix, ev);
    handle(ev);
  }

  const auto t_request = std::chrono::steady_clock::now();
  double ttft_ms = -1;
  self->send(rt.exec, generate_atom::value, g, caf::actor(self));
  gen_done d;
  std::string gen_err;
  bool done = false;
  while (!done) {
    self->receive(
        [&](token_atom, int64_t, int32_t t) {
          if (ttft_ms < 0)
            ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_request).count();
          if (stopf.hit) return;
          auto piece = dec.push(t);
          if (!piece) return;
          parser.feed(*piece, ev);
          handle(ev);
        },
        [&](gen_done& r) {
          d = std::move(r);
          done = true;
        },
        [&](caf::error& e) {
          gen_err = "executor: " + caf::to_string(e);
          done = true;
        },
        caf::after(std::chrono::minutes(10)) >> [&] {
          gen_err = "executor: no answer for 10 minutes";
          done = true;
        });
  }
  if (gen_err.empty() && !d.error.empty()) gen_err = "executor: " + d.error;
  if (!gen_err.empty()) {
    release(false);
    return make_error(errc::internal, gen_err);
  }
  if (!stopf.hit) {
    std::string tail = dec.finish();
    if (!tail.empty()) parser.feed(tail, ev);
  }
  parser.finish(ev);
  handle(ev);
  emit_content(stopf.flush());

  out.resume_path = d.resume_path;
  out.prompt_tokens = int64_t(prompt.size());
  out.completion_tokens = int64_t(forced.size() + d.generated.size());
  out.cached_tokens = d.resume_path == "reprefilled" ? 0 : int64_t(n_cached);
  out.finish_reason = !out.calls.empty() ? "tool_calls" : (stopf.hit || d.stopped) ? "stop" : "length";

  // 4. Commit the turn: the request's new messages, the reply, every token and KV page. A
  // faithful reply is exactly what the tokens of its range say (no stop string cut it, no call
  // was dropped or malformed): a rebuilt index may map it back to those tokens.
  const bool faithful = !stopf.hit && out.parse_errors.empty() && !dropped_calls;
  commit_request c;
  c.session = sess.id;
  for (size_t i = std::min(n_msgs_before, msgs.size()); i < msgs.size(); ++i) c.items.push_back(input_item(msgs[i]));
  uint64_t end = d.first_token + d.tokens.size();
  njson calls = njson::array();
  for (const auto& call : out.calls) calls.push_back({{"id", call.id}, {"name", call.name}, {"arguments", call.arguments_json}});
  c.items.push_back(item_msg{"assistant",
                             cedar::tools::json_dump(njson{{"content", out.content}, {"tool_calls", calls}, {"stopped", d.stopped},
                                   {"parse_errors", out.parse_errors}, {"resume_path", d.resume_path},
                                   {"n_prompt", d.n_prompt}, {"n_generated", d.n_generated},
                                   {"n_replayed", d.n_replayed}, {"context", d.context},
                                   {"resume_ms", d.resume_ms}, {"prefill_ms", d.prefill_ms},
                                   {"decode_ms", d.decode_ms}, {"finish_reason", out.finish_reason},
                                   {"source", "openai"}, {"faithful", faithful}}),
                             end - uint64_t(d.generated.size() + forced.size()), end, 0});
  for (const auto& call : out.calls)
    c.items.push_back(item_msg{"tool_call",
                               cedar::tools::json_dump(njson{{"id", call.id}, {"name", call.name},
                                                             {"arguments", call.arguments_json}, {"error", ""}}),
                               0, 0, 0});
  c.first_token = d.first_token;
  c.tokens = d.tokens;
  c.sources = std::move(d.sources);
  c.aux = std::move(d.aux);
  c.status_after = out.calls.empty() ? "active" : "waiting_tool";
  c.ttft_ms = ttft_ms >= 0 ? ttft_ms : d.resume_ms + d.prefill_ms;
  c.decode_ms = d.decode_ms;
  c.n_decoded = d.n_generated;
  std::string commit_err;
  uint32_t turn = 0;
  self->request(rt.store, caf::infinite, commit_atom::value, std::move(c))
      .receive(
          [&](store_reply& r) {
            if (!r.error.empty()) commit_err = r.error;
            else turn = uint32_t(r.value);
          },
          [&](caf::error& e) { commit_err = "store unavailable: " + caf::to_string(e); });
  if (!commit_err.empty() || d.first_token != sess.tokens.size()) {
    // The answer stands; the session just is not offered for reuse.
    CEDAR_LOG_WARN("completion: session %lld not indexed: %s", (long long)sess.id,
                   commit_err.empty() ? "token log out of step" : commit_err.c_str());
    release(false);
    return out;
  }

  // 5. Index the new boundary and remember the reply's sampled tokens.
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    auto& s = st_->sessions[sess.id];
    s = std::move(sess);
    s.tokens.insert(s.tokens.end(), d.tokens.begin(), d.tokens.end());
    api_session::boundary b{s.tokens.size(), turn + 1, msgs.size() + 1};
    s.bounds.push_back(b);
    s.busy = false;
    s.used = ++st_->clock;
    st_->index(s, b);
    if (faithful) {
      std::vector<int32_t> reply(forced);
      reply.insert(reply.end(), d.generated.begin(), d.generated.end());
      if (!reply.empty() && reply.back() == tok.eos_id() && d.stopped) reply.pop_back();
      std::vector<model::chat_tool_call> cc;
      for (const auto& call : out.calls) cc.push_back({call.id, call.name, call.arguments_json});
      st_->remember_reply(reply_key(out.content, cc), std::move(reply));
    }
    st_->evict();
  }
  return out;
}

}  // namespace cedar::runtime
