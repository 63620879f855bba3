// MCP server declarations in the common `mcpServers` JSON shape:
//
//   { "mcpServers": {
//       "fs":   { "command": "npx", "args": ["-y", "..."], "env": {"K": "V"} },
//       "web":  { "url": "http://127.0.0.1:3001/mcp", "headers": {"Authorization": "Bearer ..."} } } }
//
// A server is stdio when it has `command`, Streamable HTTP when it has `url`; an explicit
// "type" ("stdio", "http", "streamable-http", "streamableHttp") must agree. The legacy SSE
// transport ("type": "sse") is rejected with a clear error. Server names must match
// [A-Za-z0-9_-]{1,64} without "__", because tools appear as "<server>__<tool>".
// Optional per server: "timeout" (seconds, default 60): the default inactivity timeout of that
// server's tool calls (invoke_context::timeout) for the CLI and the runtime.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "tools_mcp/mcp_transport.hpp"

namespace cedar::tools::mcp {

struct server_config {
  enum class kind { stdio, http };
  std::string name;
  kind type = kind::stdio;
  std::string command;
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string url;
  std::map<std::string, std::string> headers;
  std::chrono::milliseconds timeout{60000};
};

// `source` names the text in errors (a path or "inline config").
result<std::vector<server_config>> parse_mcp_config(std::string_view text, std::string_view source);
result<std::vector<server_config>> load_mcp_config(const std::string& path);

// ok when `name` can prefix tool names ([A-Za-z0-9_-]{1,64}, no "__").
status server_name_check(const std::string& name);

std::unique_ptr<transport> make_transport(const server_config& cfg);

}  // namespace cedar::tools::mcp
