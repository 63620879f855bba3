// The server the browser test drives: what `cedar serve` runs, reduced to the dashboard — a real
// runtime (the default model, a temp store, the built-in tools, optionally MCP servers) and
// cedar's http_server (127.0.0.1, any free port, bearer token in a 0600 file; the token also
// rides on the cookie a page opened with ?token= gets) with the dashboard mounted. It prints
// "listening <port> <token>" and serves until its stdin closes (the test's child process handle).
//
//   dashboard_test_server --model DIR --store FILE [--mcp mcpServers.json]
#include <cstdio>
#include <iostream>
#include <string>

#include "runtime/cedar.hpp"
#include "runtime/server/dashboard.hpp"
#include "runtime/server/http_server.hpp"

int main(int argc, char** argv) {
  std::string model, store, mcp;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    else if (k == "--store") store = argv[i + 1];
    else if (k == "--mcp") mcp = argv[i + 1];
  }
  if (model.empty() || store.empty()) {
    std::fprintf(stderr, "usage: dashboard_test_server --model DIR --store FILE [--mcp mcpServers.json]\n");
    return 2;
  }
  cedar::runtime_options o;
  o.model_dir = model;
  o.store_path = store;
  o.mcp_config = mcp;
  auto rt = cedar::agent_runtime::open(o);
  if (!rt) {
    std::fprintf(stderr, "dashboard_test_server: %s\n", rt.err().message.c_str());
    return 1;
  }
  {
    cedar::runtime::serve_options so;
    so.port = 0;  // a free port on 127.0.0.1; the token file goes next to the store
    auto svr = cedar::runtime::http_server::start(**rt, so, {cedar::runtime::mount_dashboard});
    if (!svr) {
      std::fprintf(stderr, "dashboard_test_server: %s\n", svr.err().message.c_str());
      return 1;
    }
    std::printf("listening %d %s\n", (*svr)->port(), (*svr)->token().c_str());
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    (*svr)->stop();
  }
  return 0;
}
