// Connects the MCP servers of an `mcpServers` config file and registers their tools.
#pragma once

#include <string>

#include "kernels/base/result.hpp"
#include "tools_mcp/tool_registry.hpp"

namespace cedar::runtime {
// A server that fails to start or initialise is reported (logged, named) and skipped; the
// error is returned only when the file itself is unreadable or malformed.
status add_mcp_servers(tools::tool_registry& reg, const std::string& config_path);
}
