// MCP client: lifecycle, version negotiation, tools/list and tools/call on one server.
//
// State diagram (functions named on the edges):
//
//   created --connect()--> initializing --(initialize ok, version supported)--> ready
//      |                        |--(error / unsupported version)--> failed (transport closed)
//   ready --call_tool()/list_tools()--> ready
//   ready --(session expired: HTTP 404/400)--> reinitialize_() once --> ready | failed
//   any --close()--> closed
//
// Versions: proposes the first of client_options::protocol_versions (2025-11-25) and accepts a
// reply naming any of them; anything else closes the connection with an error naming both.
// Capabilities: cedar advertises none (no roots, sampling or elicitation handlers exist).
// Tool lists: fetched with pagination (cursor/nextCursor) and cached; a
// notifications/tools/list_changed marks the cache stale and the next tools() re-lists.
// Results: content blocks of all five kinds, structuredContent validated against the tool's
// outputSchema, isError passed through as tool_result::is_error (not an error).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tools_mcp/mcp_connection.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::tools::mcp {

inline const std::vector<std::string>& supported_protocol_versions() {
  static const std::vector<std::string> v{"2025-11-25", "2025-06-18", "2025-03-26"};
  return v;
}

struct client_options {
  std::string client_name = "cedar";
  std::string client_version = "0.1.0";
  // The first is proposed; a reply naming any of them is accepted.
  std::vector<std::string> protocol_versions = supported_protocol_versions();
  std::chrono::milliseconds request_timeout{30000};  // initialize, tools/list
};

struct server_info {
  std::string protocol_version;
  std::string name, title, version;
  std::string instructions;
  json capabilities = json::object();
};

// A tool as the server describes it (no invoke function: the registry binds one).
struct tool_spec {
  std::string name, title, description;
  json input_schema = json::object();
  std::optional<json> output_schema;
  json annotations = json::object();
};

class client {
 public:
  client(std::string server_name, std::unique_ptr<transport> t, client_options options = {});
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  // Starts the transport, runs initialize + notifications/initialized.
  status connect();
  const server_info& server() const { return info_; }
  const std::string& name() const { return name_; }

  // All tools, following nextCursor; replaces the cache.
  result<std::vector<tool_spec>> list_tools();
  // The cached list, re-listed first when the server said it changed (or never listed).
  result<std::vector<tool_spec>> tools();
  bool tools_stale() const { return stale_.load(); }

  // tools/call. Errors: transport/protocol failures, timeout, cancel, invalid structured
  // content. A tool failure is a tool_result with is_error = true.
  result<tool_result> call_tool(const std::string& tool_name, const json& arguments, const invoke_context& ctx);

  // Raw request with the session-expiry retry (for methods this class does not wrap).
  result<json> request(const std::string& method, json params, const request_options& opt);

  void close();
  std::string stderr_tail() const { return conn_.wire().stderr_tail(); }
  transport& wire() { return conn_.wire(); }
  connection& conn() { return conn_; }
  // How many times the session was re-initialised (HTTP), for tests and the dashboard.
  int n_reinitialized() const { return n_reinit_.load(); }

 private:
  status initialize_();
  status reinitialize_();
  mutable connection conn_;
  std::string name_;
  client_options opt_;
  server_info info_;
  std::mutex tools_mu_;
  std::vector<tool_spec> tools_;
  std::atomic<bool> stale_{true};
  std::atomic<int> n_reinit_{0};
  std::mutex reinit_mu_;
};

// Converts a tools/call result object into a tool_result (content kinds, isError); validates
// structuredContent against `output_schema` when given and the result is not an error.
result<tool_result> parse_call_result(const json& r, const std::optional<json>& output_schema,
                                      const std::string& tool_name);

}  // namespace cedar::tools::mcp
