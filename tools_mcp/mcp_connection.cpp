// JSON-RPC request/response matching over a transport (see mcp_connection.hpp).
#include "tools_mcp/mcp_connection.hpp"

#include "kernels/base/log.hpp"

namespace cedar::tools::mcp {

using clock = std::chrono::steady_clock;

struct connection::pending {
  std::string method;
  clock::time_point start, deadline, cap;
  std::chrono::milliseconds timeout{0};
  std::function<void(const progress_update&)> on_progress;
  double last_progress = -1e300;
  bool done = false;
  std::optional<json> response;  // the whole response object
  std::optional<error> failure;
};

connection::connection(std::unique_ptr<transport> t) : t_(std::move(t)) {}

connection::~connection() { close(); }

void connection::set_notification_handler(std::function<void(const std::string&, const json&)> h) {
  on_note_ = std::move(h);
}

status connection::open() {
  transport_events ev;
  ev.on_message = [this](std::string_view text) { on_message_(text); };
  ev.on_request_failed = [this](const json& id, error e) {
    if (!id.is_number_integer()) return;
    std::lock_guard lock(mu_);
    auto it = pending_.find(id.get<int64_t>());
    if (it == pending_.end() || it->second->done) return;
    it->second->failure = std::move(e);
    it->second->done = true;
    cv_.notify_all();
  };
  ev.on_closed = [this](error e) { fail_all_(e); };
  CEDAR_TRY(t_->start(std::move(ev)));
  open_.store(true);
  return {};
}

void connection::fail_all_(const error& e) {
  std::lock_guard lock(mu_);
  if (!closed_) closed_ = e;
  for (auto& [id, p] : pending_) {
    if (p->done) continue;
    p->failure = e;
    p->done = true;
  }
  cv_.notify_all();
}

size_t connection::n_pending() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

void connection::on_message_(std::string_view text) {
  auto parsed = json_parse(text, "message from the MCP server (" + t_->describe() + ")");
  if (!parsed.ok()) {
    // Garbage on the wire: the stream can no longer be trusted, fail everything clearly.
    error e = parsed.take_err();
    e.code = errc::invalid_format;
    fail_all_(e);
    return;
  }
  if (parsed->is_array()) {
    for (const auto& m : *parsed) handle_(m);
  } else {
    handle_(*parsed);
  }
}

void connection::handle_(const json& msg) {
  if (!msg.is_object()) {
    CEDAR_LOG_WARN("mcp: ignoring a non-object JSON-RPC message from %s", t_->describe().c_str());
    return;
  }
  const json* method = json_member(msg, "method");
  const json* id = json_member(msg, "id");
  if (method && method->is_string()) {
    const std::string& m = method->get_ref<const std::string&>();
    json params = msg.contains("params") ? msg["params"] : json::object();
    if (id && !id->is_null()) {  // a request from the server
      n_server_requests_.fetch_add(1);
      json reply = {{"jsonrpc", "2.0"}, {"id", *id}};
      if (m == "ping") {
        reply["result"] = json::object();
      } else {
        reply["error"] = {{"code", static_cast<int>(rpc_code::method_not_found)},
                          {"message", "Method not found: " + m + " (cedar advertises no client capabilities)"}};
      }
      auto st = t_->send(reply);
      if (!st.ok()) CEDAR_LOG_WARN("mcp: cannot answer server request '%s': %s", m.c_str(), st.err().message.c_str());
      return;
    }
    if (m == "notifications/progress") {
      on_progress_(params);
      return;
    }
    if (on_note_) on_note_(m, params);
    return;
  }
  if (id && (msg.contains("result") || msg.contains("error"))) {
    if (!id->is_number_integer()) {
      CEDAR_LOG_WARN("mcp: response with unknown id %s from %s", json_dump(*id).c_str(), t_->describe().c_str());
      return;
    }
    std::lock_guard lock(mu_);
    auto it = pending_.find(id->get<int64_t>());
    if (it == pending_.end() || it->second->done) return;  // late reply to a timed-out request
    it->second->response = msg;
    it->second->done = true;
    cv_.notify_all();
    return;
  }
  CEDAR_LOG_WARN("mcp: ignoring a malformed JSON-RPC message from %s: %s", t_->describe().c_str(),
                 excerpt(json_dump(msg)).c_str());
}

void connection::on_progress_(const json& params) {
  const json* token = json_member(params, "progressToken");
  const json* progress = json_member(params, "progress");
  if (!token || !token->is_number_integer() || !progress || !progress->is_number()) return;
  std::function<void(const progress_update&)> cb;
  progress_update u;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(token->get<int64_t>());
    if (it == pending_.end() || it->second->done) return;
    pending& p = *it->second;
    double v = progress->get<double>();
    if (v <= p.last_progress) return;  // progress must increase; ignore replays
    p.last_progress = v;
    p.deadline = std::min(clock::now() + p.timeout, p.cap);
    cb = p.on_progress;
    u.progress = v;
    if (const json* t = json_member(params, "total"); t && t->is_number()) u.total = t->get<double>();
    u.message = json_string_or(params, "message");
    cv_.notify_all();
  }
  if (cb) cb(u);
}

result<json> connection::request(const std::string& method, json params, const request_options& opt) {
  auto p = std::make_shared<pending>();
  p->method = method;
  p->start = clock::now();
  p->timeout = opt.timeout;
  p->cap = p->start + std::max(opt.hard_cap, opt.timeout);
  p->deadline = p->start + opt.timeout;
  p->on_progress = opt.on_progress;
  int64_t id;
  {
    std::lock_guard lock(mu_);
    if (closed_) return make_error(closed_->code, closed_->message);
    if (!open_.load()) return make_error(errc::unavailable, "MCP connection is not open");
    id = next_id_++;
    pending_[id] = p;
  }
  if (!params.is_object()) params = json::object();
  if (opt.on_progress) params["_meta"]["progressToken"] = id;
  json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
  auto erase = [&] {
    std::lock_guard lock(mu_);
    pending_.erase(id);
  };
  if (auto st = t_->send(msg); !st.ok()) {
    erase();
    return st.take_err();
  }

  std::unique_lock lock(mu_);
  for (;;) {
    if (p->done) break;
    auto now = clock::now();
    bool cancelled = opt.cancel.cancelled();
    if (cancelled || now >= p->deadline) {
      pending_.erase(id);
      lock.unlock();
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - p->start).count();
      std::string reason = cancelled ? "cancelled by the caller" : "timed out after " + std::to_string(ms) + " ms";
      (void)t_->send({{"jsonrpc", "2.0"},
                      {"method", "notifications/cancelled"},
                      {"params", {{"requestId", id}, {"reason", reason}}}});
      t_->forget(id);
      if (cancelled) return make_error(errc::cancelled, "MCP request '" + method + "' to " + t_->describe() + " " + reason);
      bool capped = p->deadline >= p->cap;
      return make_error(errc::timeout, "MCP request '" + method + "' to " + t_->describe() + " " + reason +
                                           (capped ? " (hard cap reached)" : " without a response or progress"));
    }
    // Wake at least every 20 ms to observe the cancel token.
    cv_.wait_until(lock, std::min(p->deadline, now + std::chrono::milliseconds(20)));
  }
  pending_.erase(id);
  lock.unlock();
  if (p->failure) {
    error e = *p->failure;
    e.message = "MCP request '" + method + "' failed: " + e.message;
    return e;
  }
  const json& resp = *p->response;
  if (const json* err = json_member(resp, "error")) {
    int code = 0;
    if (const json* c = json_member(*err, "code"); c && c->is_number_integer()) code = c->get<int>();
    std::string text = json_string_or(*err, "message", "(no message)");
    errc ec = code == static_cast<int>(rpc_code::method_not_found) ? errc::not_found
              : code == static_cast<int>(rpc_code::invalid_params) ? errc::invalid_argument
                                                                    : errc::unavailable;
    return make_error(ec, "MCP server (" + t_->describe() + ") rejected '" + method + "': error " +
                              std::to_string(code) + ": " + text);
  }
  return resp["result"];
}

status connection::notify(const std::string& method, json params) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return make_error(closed_->code, closed_->message);
  }
  json msg = {{"jsonrpc", "2.0"}, {"method", method}};
  if (!params.is_null()) msg["params"] = std::move(params);
  return t_->send(msg);
}

void connection::close() {
  if (!t_) return;
  t_->close();
  fail_all_(make_error(errc::unavailable, "MCP connection (" + t_->describe() + ") closed"));
}

}  // namespace cedar::tools::mcp
