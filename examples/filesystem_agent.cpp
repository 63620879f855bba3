// An agent with the MCP filesystem server's tools (stdio): the runtime connects every server of
// an `mcpServers` config and offers its tools as "<server>__<tool>".
//
//   build/examples/example_filesystem_agent MCP_CONFIG.json [MODEL_DIR] [STORE.db]
//
// MCP_CONFIG.json, e.g.:
//   {"mcpServers": {"filesystem": {"command": "node",
//     "args": ["<...>/server-filesystem/dist/index.js", "/tmp/workspace"]}}}
#include <cstdio>
#include <string>

#include "runtime/cedar.hpp"

int main(int argc, char** argv) {
  const char* usage = "usage: %s MCP_CONFIG.json [MODEL_DIR] [STORE.db]\n";
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf(usage, argv[0]);
    std::printf("An agent with the tools of the MCP servers in MCP_CONFIG.json (mcpServers).\n");
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  cedar::runtime_options opts;
  opts.mcp_config = argv[1];
  opts.model_dir = argc > 2 ? argv[2] : CEDAR_SOURCE_DIR "/model/weights/cedar-agent-tiny";
  opts.store_path = argc > 3 ? argv[3] : "filesystem_agent.db";
  auto rt = cedar::agent_runtime::open(opts);
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", rt.err().message.c_str());
    return 1;
  }
  std::vector<std::string> fs_tools;
  for (const auto& n : (*rt)->tool_names())
    if (n.rfind("filesystem__", 0) == 0) fs_tools.push_back(n);
  std::printf("MCP tools:");
  for (const auto& n : fs_tools) std::printf(" %s", n.c_str());
  std::printf("\n");
  if (fs_tools.empty()) {
    std::fprintf(stderr, "the filesystem server offered no tools\n");
    return 1;
  }
  cedar::agent_options a;
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = fs_tools;
  a.max_new_tokens = 160;
  a.max_tool_rounds = 3;
  auto agent = (*rt)->create_agent(a);
  if (!agent) return 1;
  auto r = agent->ask("Which files are in the workspace?", [](const cedar::agent_event& e) {
    if (e.type == cedar::agent_event::kind::token) std::fputs(e.text.c_str(), stdout);
    if (e.type == cedar::agent_event::kind::tool_call) std::printf("\n[%s %s]\n", e.tool.c_str(), e.arguments.c_str());
    if (e.type == cedar::agent_event::kind::tool_result)
      std::printf("[result%s] %s\n", e.is_error ? " (error)" : "", e.text.c_str());
  });
  if (!r) {
    std::fprintf(stderr, "turn failed: %s\n", r.err().message.c_str());
    return 1;
  }
  std::printf("\n%d tool call(s), context %lld\n", r->tool_calls, (long long)r->context);
  return 0;
}
