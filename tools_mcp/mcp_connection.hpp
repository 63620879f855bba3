// JSON-RPC 2.0 over an MCP transport: ids, out-of-order matching, timeouts, progress, cancel.
//
// Owns the pending-request table. request() blocks its caller until the response with its id
// arrives, the transport fails it, the deadline passes or the caller cancels; responses may
// arrive in any order and on any transport thread.
//
// Per request: deadline = start + timeout; every notifications/progress for its token moves
// the deadline to min(now + timeout, start + hard_cap). On expiry or cancel the connection
// sends notifications/cancelled {requestId, reason} and forgets the id (late responses are
// dropped).
//
// Server -> client requests (their own id space): `ping` is answered {}, anything else -32601
// (cedar advertises no client capabilities, so servers have no reason to ask for more).
// Other notifications go to the handler given to set_notification_handler (called on a
// transport thread; it must not block or issue requests).
//
// Invariants: (1) every pending entry is completed exactly once (response, failure, timeout,
// cancel or close); (2) after the transport reports closed, request() fails at once with that
// error; (3) no callback runs after close() returned.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "tools_mcp/mcp_transport.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::tools::mcp {

// JSON-RPC error codes used by the protocol.
enum class rpc_code : int {
  parse_error = -32700,
  invalid_request = -32600,
  method_not_found = -32601,
  invalid_params = -32602,
  internal_error = -32603,
};

struct request_options {
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds hard_cap{300000};
  cancel_token cancel;
  // When set, a progress token is attached (params._meta.progressToken) and progress reports
  // are forwarded here.
  std::function<void(const progress_update&)> on_progress;
};

class connection {
 public:
  explicit connection(std::unique_ptr<transport> t);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  void set_notification_handler(std::function<void(const std::string& method, const json& params)> h);
  status open();
  // The `result` member of the response; a JSON-RPC error becomes an error naming the method
  // and the server's code and message.
  result<json> request(const std::string& method, json params, const request_options& opt);
  status notify(const std::string& method, json params);
  void close();

  transport& wire() { return *t_; }
  size_t n_pending() const;
  // Requests the server made of us that we answered, by method, for tests and diagnostics.
  size_t n_server_requests() const { return n_server_requests_.load(); }

 private:
  struct pending;
  void on_message_(std::string_view text);
  void handle_(const json& msg);
  void on_progress_(const json& params);
  void fail_all_(const error& e);

  std::unique_ptr<transport> t_;
  std::function<void(const std::string&, const json&)> on_note_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::shared_ptr<pending>> pending_;
  int64_t next_id_ = 1;
  std::optional<error> closed_;
  std::atomic<size_t> n_server_requests_{0};
  std::atomic<bool> open_{false};
};

}  // namespace cedar::tools::mcp
