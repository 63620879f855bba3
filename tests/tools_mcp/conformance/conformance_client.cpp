// A small cedar MCP client for the official conformance suite in client mode
// (@modelcontextprotocol/conformance: `conformance client --command "<this> " --scenario S`).
// The suite starts a loopback server per scenario and runs this program as
//   mcp_conformance_client <server url>      with MCP_CONFORMANCE_SCENARIO=<scenario>
// It connects over Streamable HTTP, lists the tools and calls the ones the scenario expects:
//   initialize   -> initialize + tools/list only
//   tools_call   -> add_numbers {a: 5, b: 3}
//   sse-retry    -> test_reconnection {} (the server closes the stream; we resume with
//                   GET + Last-Event-ID after its retry: delay)
// Any other scenario: every listed tool is called with {} (best effort).
// Exit status 0 when every step succeeded, 1 otherwise (the message on stderr).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/mcp_http.hpp"

using namespace cedar;
using namespace cedar::tools;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SERVER_URL  (MCP_CONFORMANCE_SCENARIO selects the calls)\n", argv[0]);
    return 2;
  }
  const char* env = std::getenv("MCP_CONFORMANCE_SCENARIO");
  std::string scenario = env ? env : "";
  mcp::http_options o;
  o.url = argv[argc - 1];
  // sse-retry times the gap between the tools/call stream closing and the next GET, and
  // answers the pending call on whichever GET comes first: a standalone GET stream that
  // connects late (a loaded machine) would take the answer and the timing. The scenario is
  // about resuming the POST stream, so it runs without one.
  if (scenario == "sse-retry") o.listen = false;
  mcp::client c("conformance", std::make_unique<mcp::http_transport>(o));
  if (auto st = c.connect(); !st.ok()) {
    std::fprintf(stderr, "connect: %s\n", st.err().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "connected: %s %s, protocol %s\n", c.server().name.c_str(), c.server().version.c_str(),
               c.server().protocol_version.c_str());
  auto tools = c.list_tools();
  if (!tools.ok()) {
    std::fprintf(stderr, "tools/list: %s\n", tools.err().message.c_str());
    return 1;
  }
  invoke_context ctx;
  ctx.timeout = std::chrono::milliseconds(10000);
  int failures = 0;
  auto call = [&](const std::string& name, const json& args) {
    auto r = c.call_tool(name, args, ctx);
    if (!r.ok()) {
      std::fprintf(stderr, "tools/call %s: %s\n", name.c_str(), r.err().message.c_str());
      ++failures;
      return;
    }
    std::printf("%s -> %s%s\n", name.c_str(), r->is_error ? "tool error: " : "", r->to_text().c_str());
  };
  if (scenario == "tools_call") {
    call("add_numbers", json{{"a", 5}, {"b", 3}});
  } else if (scenario == "sse-retry") {
    call("test_reconnection", json::object());
  } else if (scenario != "initialize") {
    for (const auto& t : *tools) call(t.name, json::object());
  }
  c.close();
  return failures == 0 ? 0 : 1;
}
