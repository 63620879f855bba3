// Streamable HTTP transport (MCP 2025-03-26 and later) over libcurl.
//
// Every client message is a POST to one endpoint with
//   Accept: application/json, text/event-stream   Content-Type: application/json
//   Mcp-Session-Id: <from the initialize reply>    MCP-Protocol-Version: <after initialize>
// Notifications and responses expect 202 and are sent synchronously. Each request gets a worker
// thread: the reply is either one JSON body or an SSE stream carrying server requests and
// notifications before the response. If the stream ends before the response and an event id
// was seen, the worker resumes with GET + Last-Event-ID after the server's `retry:` delay.
// After initialize an optional GET stream carries server-initiated messages (405 = none).
// 404, or 400 mentioning "session", on a request with a session id = session gone:
// take_session_expired() turns true and the client re-initialises once.
// close(): abort every stream (shutdown(2) on its socket), join workers, DELETE the session.
//
// Loopback servers must be reachable whatever the environment says: CURLOPT_NOPROXY "*".
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tools_mcp/mcp_transport.hpp"

namespace cedar::tools::mcp {

// Incremental text/event-stream parser (WHATWG rules: data lines joined by '\n', comments
// skipped, `id` and `retry` remembered across events, CRLF/CR/LF line ends).
class sse_parser {
 public:
  struct event {
    std::string id, type, data;
  };
  // Feeds bytes; calls `on_event` for each complete event (including ones with empty data,
  // e.g. priming events, which only move last_event_id).
  void feed(std::string_view bytes, const std::function<void(const event&)>& on_event);
  const std::string& last_event_id() const { return last_id_; }
  long retry_ms() const { return retry_ms_; }  // -1 when the server sent none
  void set_last_event_id(std::string id) { last_id_ = std::move(id); }
  // Bytes of the event being read (its unterminated line + data so far): the transport caps
  // this, so a server that never ends an event cannot grow memory without bound.
  size_t buffered_bytes() const { return buf_.size() + data_.size() + type_.size(); }

 private:
  void line_(std::string_view line, const std::function<void(const event&)>& on_event);
  std::string buf_, data_, type_, last_id_;
  bool has_data_ = false;
  bool last_cr_ = false;
  long retry_ms_ = -1;
};

struct http_options {
  std::string url;
  std::map<std::string, std::string> headers;  // added to every request (e.g. Authorization)
  size_t max_message_bytes = 64u << 20;
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds send_timeout{30000};  // notifications/responses (202 expected)
  std::chrono::milliseconds default_retry{1000};  // reconnect delay when the server gave none
  int max_reconnects = 5;                         // per stream, without progress in between
  // Open the standalone GET stream after initialisation, for server-initiated requests and
  // notifications. Off for servers that never send any (one connection fewer).
  bool listen = true;
};

class http_transport final : public transport {
 public:
  explicit http_transport(http_options options);
  ~http_transport() override;

  status start(transport_events events) override;
  status send(const json& message) override;
  void close() override;
  void forget(const json& id) override;
  void set_protocol_version(const std::string& protocol_version) override;
  void initialized() override;
  bool take_session_expired() override { return session_expired_.exchange(false); }
  void reset_session() override;
  std::string describe() const override { return "http: " + opt_.url; }

  std::string session_id() const;
  // Number of worker threads alive (requests in flight + the GET stream), for leak checks.
  size_t n_workers() const;

  struct stream;  // one in-flight HTTP exchange (curl handle, its socket, abort flag)

 private:
  struct exchange_result;
  exchange_result perform_(const char* method, const std::string* body, const std::string& last_event_id,
                           stream& s, sse_parser* sse, const std::function<void(const std::string&)>& on_data,
                           std::chrono::milliseconds timeout);
  void run_request_(std::shared_ptr<stream> s, json id, std::string body);
  void run_get_stream_(std::shared_ptr<stream> s);
  bool deliver_(const std::string& data, const json* wait_id);  // true if it was wait_id's response
  bool sleep_(stream& s, std::chrono::milliseconds d);          // false when aborted meanwhile
  void reap_workers_();

  http_options opt_;
  transport_events ev_;
  mutable std::mutex mu_;  // session_, version_, workers_
  std::string session_, version_;
  std::list<std::pair<std::shared_ptr<stream>, std::thread>> workers_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> session_expired_{false};
  std::atomic<bool> get_started_{false};
};

}  // namespace cedar::tools::mcp
