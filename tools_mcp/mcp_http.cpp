// Streamable HTTP transport (see mcp_http.hpp for the protocol rules it follows).
#include "tools_mcp/mcp_http.hpp"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>

#include "kernels/base/log.hpp"

namespace cedar::tools::mcp {

// ---------------------------------------------------------------- SSE parsing

void sse_parser::feed(std::string_view bytes, const std::function<void(const event&)>& on_event) {
  for (char c : bytes) {
    if (c == '\n' && last_cr_) {  // the LF of a CRLF pair
      last_cr_ = false;
      continue;
    }
    last_cr_ = (c == '\r');
    if (c == '\r' || c == '\n') {
      line_(buf_, on_event);
      buf_.clear();
    } else {
      buf_ += c;
    }
  }
}

void sse_parser::line_(std::string_view line, const std::function<void(const event&)>& on_event) {
  if (line.empty()) {  // dispatch
    event e{last_id_, type_.empty() ? "message" : type_, data_};
    bool any = has_data_;
    data_.clear();
    type_.clear();
    has_data_ = false;
    if (any || !e.id.empty()) on_event(e);
    return;
  }
  if (line[0] == ':') return;  // comment
  auto colon = line.find(':');
  std::string_view field = line.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    type_ = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_id_ = std::string(value);
  } else if (field == "retry") {
    if (!value.empty() && std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      retry_ms_ = std::stol(std::string(value.substr(0, 9)));
  }
}

// ---------------------------------------------------------------- curl plumbing

namespace {

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

}  // namespace

struct http_transport::stream {
  std::atomic<bool> abort{false};
  std::atomic<bool> done{false};
  json id;  // null for the GET stream
  std::mutex sock_mu;
  curl_socket_t sock = CURL_SOCKET_BAD;

  void kill() {
    abort.store(true);
    std::lock_guard lock(sock_mu);
    if (sock != CURL_SOCKET_BAD) ::shutdown(sock, SHUT_RDWR);  // wakes curl at once
  }
};

struct http_transport::exchange_result {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string content_type, session, body;
  bool too_big = false;
};

namespace {

struct transfer {
  http_transport::stream* s;
  sse_parser* sse;
  const std::function<void(const std::string&)>* on_data;
  std::string* body;
  std::string content_type, session;
  size_t max_bytes;
  // Stores the session id as soon as its header arrives: an SSE reply to initialize delivers
  // the result (and the client sends notifications/initialized) before the transfer ends.
  std::function<void(const std::string&)> on_session;
  bool too_big = false;
  bool is_sse() const { return content_type.rfind("text/event-stream", 0) == 0; }
};

size_t on_header(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<transfer*>(ud);
  std::string line(p, size * n);
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = lower(trim(line.substr(0, colon)));
    std::string value = trim(line.substr(colon + 1));
    if (name == "content-type") t->content_type = lower(value);
    if (name == "mcp-session-id") {
      t->session = value;
      if (t->on_session) t->on_session(value);
    }
  }
  return size * n;
}

size_t on_body(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<transfer*>(ud);
  size_t len = size * n;
  if (t->s->abort.load()) return 0;
  if (t->is_sse() && t->sse) {
    bool big = false;
    t->sse->feed(std::string_view(p, len), [&](const sse_parser::event& e) {
      if (e.data.size() > t->max_bytes) big = true;
      else if (!e.data.empty()) (*t->on_data)(e.data);
    });
    if (big || t->sse->buffered_bytes() > t->max_bytes) {
      t->too_big = true;
      return 0;
    }
    return len;
  }
  if (t->body->size() + len > t->max_bytes) {
    t->too_big = true;
    return 0;
  }
  t->body->append(p, len);
  return len;
}

int on_progress(void* ud, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<http_transport::stream*>(ud)->abort.load() ? 1 : 0;
}

curl_socket_t on_open_socket(void* ud, curlsocktype, curl_sockaddr* addr) {
  auto* s = static_cast<http_transport::stream*>(ud);
  curl_socket_t fd = ::socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
  std::lock_guard lock(s->sock_mu);
  s->sock = fd;
  if (s->abort.load() && fd != CURL_SOCKET_BAD) ::shutdown(fd, SHUT_RDWR);
  return fd;
}

int on_close_socket(void* ud, curl_socket_t fd) {
  auto* s = static_cast<http_transport::stream*>(ud);
  std::lock_guard lock(s->sock_mu);
  if (s->sock == fd) s->sock = CURL_SOCKET_BAD;
  return ::close(fd);
}

bool is_response_for(const json& msg, const json& id) {
  auto one = [&](const json& m) {
    return m.is_object() && m.contains("id") && m["id"] == id && (m.contains("result") || m.contains("error"));
  };
  if (msg.is_array()) return std::any_of(msg.begin(), msg.end(), one);
  return one(msg);
}

}  // namespace

// ---------------------------------------------------------------- transport

http_transport::http_transport(http_options options) : opt_(std::move(options)) { curl_init_once(); }

http_transport::~http_transport() { close(); }

std::string http_transport::session_id() const {
  std::lock_guard lock(mu_);
  return session_;
}

size_t http_transport::n_workers() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& w : workers_) n += w.first->done.load() ? 0 : 1;
  return n;
}

status http_transport::start(transport_events events) {
  if (opt_.url.rfind("http://", 0) != 0 && opt_.url.rfind("https://", 0) != 0)
    return make_error(errc::invalid_argument, "MCP server url '" + opt_.url + "' must start with http:// or https://");
  ev_ = std::move(events);
  return {};
}

http_transport::exchange_result http_transport::perform_(const char* method, const std::string* body,
                                                         const std::string& last_event_id, stream& s,
                                                         sse_parser* sse,
                                                         const std::function<void(const std::string&)>& on_data,
                                                         std::chrono::milliseconds timeout) {
  exchange_result out;
  CURL* h = curl_easy_init();
  if (!h) {
    out.code = CURLE_FAILED_INIT;
    out.curl_error = "curl_easy_init failed";
    return out;
  }
  transfer t{&s, sse, &on_data, &out.body, {}, {}, opt_.max_message_bytes, {}};
  if (body) {
    t.on_session = [this](const std::string& id) {
      std::lock_guard lock(mu_);
      if (!closing_.load()) session_ = id;
    };
  }
  curl_slist* hdrs = nullptr;
  std::string session, version;
  {
    std::lock_guard lock(mu_);
    session = session_;
    version = version_;
  }
  bool is_get = std::string(method) == "GET";
  hdrs = curl_slist_append(hdrs, is_get ? "Accept: text/event-stream" : "Accept: application/json, text/event-stream");
  if (body) hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
  if (!session.empty()) hdrs = curl_slist_append(hdrs, ("Mcp-Session-Id: " + session).c_str());
  if (!version.empty()) hdrs = curl_slist_append(hdrs, ("MCP-Protocol-Version: " + version).c_str());
  if (!last_event_id.empty()) hdrs = curl_slist_append(hdrs, ("Last-Event-ID: " + last_event_id).c_str());
  for (const auto& [k, v] : opt_.headers) hdrs = curl_slist_append(hdrs, (k + ": " + v).c_str());
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, opt_.url.c_str());
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
  } else if (is_get) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  }
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &s);
  curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
  curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &s);
  curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
  curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, &s);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt_.connect_timeout.count()));
  if (timeout.count() > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  out.code = curl_easy_perform(h);
  if (out.code != CURLE_OK) out.curl_error = errbuf[0] ? errbuf : curl_easy_strerror(out.code);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out.status);
  curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  out.content_type = t.content_type;
  out.session = t.session;
  out.too_big = t.too_big;
  return out;
}

bool http_transport::deliver_(const std::string& data, const json* wait_id) {
  bool hit = false;
  if (wait_id) {
    auto parsed = json_parse(data, "SSE event");
    if (parsed.ok()) hit = is_response_for(*parsed, *wait_id);
  }
  if (!closing_.load() && ev_.on_message) ev_.on_message(data);
  return hit;
}

bool http_transport::sleep_(stream& s, std::chrono::milliseconds d) {
  auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
    if (s.abort.load()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !s.abort.load();
}

void http_transport::run_request_(std::shared_ptr<stream> s, json id, std::string body) {
  auto fail = [&](errc code, std::string msg) {
    if (!s->abort.load() && !closing_.load() && ev_.on_request_failed) ev_.on_request_failed(id, make_error(code, msg));
  };
  sse_parser sse;
  bool got = false;
  std::function<void(const std::string&)> on_data = [&](const std::string& d) { got = deliver_(d, &id) || got; };
  std::string had_session = session_id();
  exchange_result r = perform_("POST", &body, "", *s, &sse, on_data, std::chrono::milliseconds(0));
  if (!r.session.empty()) {
    std::lock_guard lock(mu_);
    session_ = r.session;
  }
  if (s->abort.load()) return;
  if (r.too_big)
    return fail(errc::invalid_format, "MCP server (" + opt_.url + ") sent a message longer than " +
                                          std::to_string(opt_.max_message_bytes) + " bytes");
  if (r.code != CURLE_OK && r.status == 0)
    return fail(errc::unavailable, "HTTP POST to " + opt_.url + " failed: " + r.curl_error);
  bool sse_reply = r.content_type.rfind("text/event-stream", 0) == 0;
  if (r.status == 404 || (r.status == 400 && lower(r.body).find("session") != std::string::npos)) {
    if (!had_session.empty()) {
      session_expired_.store(true);
      return fail(errc::unavailable, "MCP session expired (HTTP " + std::to_string(r.status) + " from " + opt_.url +
                                         ": " + excerpt(r.body, 200) + ")");
    }
  }
  if (r.status >= 300)
    return fail(errc::unavailable, "HTTP POST to " + opt_.url + " answered " + std::to_string(r.status) +
                                       (r.body.empty() ? "" : ": " + excerpt(r.body, 300)));
  if (r.status == 202) return;  // the response will come over the GET stream
  if (!sse_reply) {
    if (r.code != CURLE_OK) return fail(errc::unavailable, "HTTP POST to " + opt_.url + " failed: " + r.curl_error);
    deliver_(r.body, nullptr);
    return;
  }
  // SSE: resume with GET + Last-Event-ID until the response arrives (a disconnect is not a
  // cancel). Attempts count only while no event arrives in between.
  int attempts = 0;
  while (!got) {
    if (sse.last_event_id().empty())
      return fail(errc::unavailable, "the SSE stream of " + opt_.url + " ended before the response" +
                                         (r.code != CURLE_OK ? " (" + r.curl_error + ")" : "") +
                                         " and carried no event id to resume from");
    if (++attempts > opt_.max_reconnects)
      return fail(errc::unavailable, "the SSE stream of " + opt_.url + " could not be resumed after " +
                                         std::to_string(opt_.max_reconnects) + " attempts");
    long retry = sse.retry_ms() >= 0 ? sse.retry_ms() : static_cast<long>(opt_.default_retry.count());
    if (!sleep_(*s, std::chrono::milliseconds(retry))) return;
    std::string before = sse.last_event_id();
    r = perform_("GET", nullptr, sse.last_event_id(), *s, &sse, on_data, std::chrono::milliseconds(0));
    if (s->abort.load()) return;
    if (r.too_big) return fail(errc::invalid_format, "MCP server (" + opt_.url + ") sent an oversized SSE event");
    if (r.status == 405 || r.status == 404 || r.status == 400)
      return fail(errc::unavailable, "cannot resume the SSE stream of " + opt_.url + " (HTTP " +
                                         std::to_string(r.status) + ")");
    if (sse.last_event_id() != before) attempts = 0;
  }
}

void http_transport::run_get_stream_(std::shared_ptr<stream> s) {
  sse_parser sse;
  std::function<void(const std::string&)> on_data = [&](const std::string& d) { deliver_(d, nullptr); };
  int failures = 0;
  while (!s->abort.load() && !closing_.load()) {
    std::string before = sse.last_event_id();
    exchange_result r = perform_("GET", nullptr, sse.last_event_id(), *s, &sse, on_data, std::chrono::milliseconds(0));
    if (s->abort.load()) return;
    if (r.status == 405) {
      CEDAR_LOG_DEBUG("mcp: %s offers no GET stream (405)", opt_.url.c_str());
      return;
    }
    if (r.status >= 400 || (r.code != CURLE_OK && r.status == 0)) ++failures;
    else if (sse.last_event_id() != before || r.code == CURLE_OK) failures = 0;
    if (failures >= 3) {
      CEDAR_LOG_WARN("mcp: GET stream of %s stopped after 3 failures (last: HTTP %ld %s)", opt_.url.c_str(), r.status,
                     r.curl_error.c_str());
      return;
    }
    long retry = sse.retry_ms() >= 0 ? sse.retry_ms() : static_cast<long>(opt_.default_retry.count());
    if (!sleep_(*s, std::chrono::milliseconds(retry))) return;
  }
}

void http_transport::reap_workers_() {
  std::list<std::thread> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->first->done.load()) {
        finished.push_back(std::move(it->second));
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : finished) t.join();
}

status http_transport::send(const json& message) {
  if (closing_.load()) return make_error(errc::unavailable, "MCP transport (" + describe() + ") is closed");
  reap_workers_();
  bool is_request = message.is_object() && message.contains("method") && message.contains("id");
  std::string body = json_dump(message);
  if (is_request) {
    auto s = std::make_shared<stream>();
    s->id = message["id"];
    std::lock_guard lock(mu_);
    workers_.emplace_back(s, std::thread([this, s, body = std::move(body)]() mutable {
      run_request_(s, s->id, std::move(body));
      s->done.store(true);
    }));
    return {};
  }
  stream s;
  sse_parser sse;
  std::function<void(const std::string&)> on_data = [&](const std::string& d) { deliver_(d, nullptr); };
  exchange_result r = perform_("POST", &body, "", s, &sse, on_data, opt_.send_timeout);
  if (r.code != CURLE_OK && r.status == 0)
    return make_error(errc::unavailable, "HTTP POST to " + opt_.url + " failed: " + r.curl_error);
  if (r.status == 404 || (r.status == 400 && lower(r.body).find("session") != std::string::npos)) {
    session_expired_.store(true);
    return make_error(errc::unavailable, "MCP session expired (HTTP " + std::to_string(r.status) + ")");
  }
  if (r.status >= 300)
    return make_error(errc::unavailable, "HTTP POST to " + opt_.url + " answered " + std::to_string(r.status) +
                                             (r.body.empty() ? "" : ": " + excerpt(r.body, 300)));
  if (!r.body.empty() && r.content_type.rfind("application/json", 0) == 0) deliver_(r.body, nullptr);
  return {};
}

void http_transport::forget(const json& id) {
  std::lock_guard lock(mu_);
  for (auto& w : workers_)
    if (!w.first->id.is_null() && w.first->id == id) w.first->kill();
}

void http_transport::set_protocol_version(const std::string& protocol_version) {
  std::lock_guard lock(mu_);
  version_ = protocol_version;
}

void http_transport::initialized() {
  if (!opt_.listen || get_started_.exchange(true) || closing_.load()) return;
  auto s = std::make_shared<stream>();
  std::lock_guard lock(mu_);
  workers_.emplace_back(s, std::thread([this, s] {
    run_get_stream_(s);
    s->done.store(true);
  }));
}

void http_transport::reset_session() {
  {
    std::lock_guard lock(mu_);
    session_.clear();
    version_.clear();
    for (auto& w : workers_)
      if (w.first->id.is_null()) w.first->kill();  // the old session's GET stream
  }
  get_started_.store(false);
}

void http_transport::close() {
  if (closing_.exchange(true)) return;
  std::list<std::pair<std::shared_ptr<stream>, std::thread>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& w : workers_) w.first->kill();
    all.swap(workers_);
  }
  for (auto& w : all)
    if (w.second.joinable()) w.second.join();
  std::string session = session_id();
  if (!session.empty()) {
    stream s;
    sse_parser sse;
    std::function<void(const std::string&)> ignore = [](const std::string&) {};
    exchange_result r = perform_("DELETE", nullptr, "", s, &sse, ignore, std::chrono::milliseconds(2000));
    if (r.status != 200 && r.status != 202 && r.status != 204 && r.status != 405)
      CEDAR_LOG_DEBUG("mcp: DELETE of session at %s answered %ld", opt_.url.c_str(), r.status);
  }
}

}  // namespace cedar::tools::mcp
