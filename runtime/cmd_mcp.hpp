// `cedar mcp …` — MCP servers from the command line, for humans checking a configuration:
//   cedar mcp list-tools CONFIG [--json]
//       connects to every server of CONFIG's "mcpServers", prints each server's tools under
//       their registry names ("<server>__<tool>") with descriptions (or all of it as JSON)
//   cedar mcp call CONFIG SERVER TOOL JSON [--timeout S] [--json]
//       calls one tool with JSON arguments (validated against its input schema first) and
//       prints the result's content; --timeout is the inactivity timeout in seconds (default:
//       the server's "timeout" in CONFIG, else 60); progress extends it, up to 10x.
//
// add_mcp_commands registers the `mcp` sub-command on `app`; its callbacks run while CLI11
// parses and write the process exit code to *exit_code: 0 ok, 1 failure (server unreachable,
// timeout, or the tool reported an error), 2 bad input (config, JSON, unknown server or tool).
// No CAF here: the commands drive cedar::tools::mcp::client directly.
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {

void add_mcp_commands(CLI::App& app, int* exit_code);

}  // namespace cedar::runtime
