// The registry of tools an agent can call: C++ tools and MCP servers' tools, one namespace.
//
// Naming: an MCP tool `t` of server `s` is registered as "s__t" (double underscore). Chosen
// over "s.t" because OpenAI-style function names allow only [A-Za-z0-9_-]; server names may
// not contain "__" (mcp_config.hpp), so the split is unambiguous. Every registered name must
// match [A-Za-z0-9_.-]{1,128}; server tools whose prefixed name does not are skipped with a
// warning. Names never clash: add() refuses a duplicate.
//
// call(): refreshes MCP servers whose tool list changed, validates the arguments against the
// tool's input schema (json_schema.hpp), then invokes. Bad arguments give an is_error result
// (the model can fix its call), unknown tools an error.
// Thread safety: all methods lock; invoke runs unlocked on the caller's thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::tools {

std::string mcp_tool_name(const std::string& server, const std::string& tool);

class tool_registry {
 public:
  status add(tool t);
  // Lists the server's tools and registers them as "<server>__<tool>".
  status add_mcp_server(std::shared_ptr<mcp::client> c);
  // Re-lists servers whose tool list changed; removed tools disappear, new ones appear.
  status refresh();

  std::shared_ptr<const tool> find(const std::string& name) const;
  std::vector<std::shared_ptr<const tool>> list() const;  // sorted by name
  std::shared_ptr<mcp::client> server(const std::string& name) const;

  result<tool_result> call(const std::string& name, const json& arguments, const invoke_context& ctx);

  // Closes every MCP client (their processes and sessions end).
  void close_servers();

 private:
  status sync_server_(const std::shared_ptr<mcp::client>& c);
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const tool>> tools_;
  std::map<std::string, std::shared_ptr<mcp::client>> servers_;
  std::map<std::string, std::string> owner_;  // tool name -> server ("" for C++ tools)
};

}  // namespace cedar::tools
