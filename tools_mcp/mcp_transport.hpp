// MCP transports: how JSON-RPC messages reach a server and come back.
//
//   client (lifecycle, tools) -> connection (JSON-RPC ids, timeouts) -> transport (bytes)
//
// A transport moves whole JSON-RPC messages; it knows nothing of ids except what HTTP needs
// (which POST carries which request). Incoming messages are delivered on the transport's own
// threads through `transport_events`; the connection must not block in those callbacks.
//
// Implementations: stdio_transport (a child process, newline-delimited JSON) and
// http_transport (Streamable HTTP over libcurl).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "kernels/base/result.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::tools::mcp {

struct transport_events {
  // One JSON-RPC message (or a batch array), raw text.
  std::function<void(std::string_view)> on_message;
  // HTTP only: the POST that carried request `id` failed; the request will get no response.
  std::function<void(const json& id, error)> on_request_failed;
  // The transport is gone (process exited, protocol garbage); every pending request fails.
  std::function<void(error)> on_closed;
};

class transport {
 public:
  virtual ~transport() = default;
  // Starts the server or checks the endpoint; callbacks may fire from now on.
  virtual status start(transport_events events) = 0;
  // Sends one message; thread-safe. Requests' responses arrive through on_message.
  virtual status send(const json& message) = 0;
  // Idempotent; after it returns no callback fires and no thread or child process remains.
  virtual void close() = 0;
  // The connection no longer waits for request `id` (timeout, cancel): drop its stream if any.
  virtual void forget(const json& id) {}
  // The negotiated version, before notifications/initialized is sent (HTTP: the
  // MCP-Protocol-Version header of every later message).
  virtual void set_protocol_version(const std::string& protocol_version) {}
  // After notifications/initialized was sent (HTTP: opens the optional GET stream).
  virtual void initialized() {}
  // HTTP: true once after the server said the session is gone (404, or 400 "no valid session");
  // the client then re-initialises and retries once.
  virtual bool take_session_expired() { return false; }
  // Resets per-session state before a re-initialise (HTTP: forgets the session id).
  virtual void reset_session() {}
  // "stdio: node server.js" / "http: http://127.0.0.1:3001/mcp", for messages.
  virtual std::string describe() const = 0;
  // The tail of the server's stderr (stdio), for the dashboard and error messages.
  virtual std::string stderr_tail() const { return {}; }
};

}  // namespace cedar::tools::mcp
