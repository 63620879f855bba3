// The official MCP conformance suite (@modelcontextprotocol/conformance, run on the Node 22
// from node_modules) in client mode against cedar's client program
// (tests/tools_mcp/conformance/conformance_client.cpp, built as mcp_conformance_client).
// The suite's scenario servers are forced onto 127.0.0.1 by servers/loopback.cjs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "mcp_test_util.hpp"

using namespace cedar::tools::test;

namespace {

struct run_result {
  int exit_code = -1;
  std::string output;
};

run_result run_scenario(const std::string& scenario) {
  std::string client = std::string(CEDAR_BINARY_DIR) + "/tests/mcp_conformance_client";
  std::string cmd = "cd '" + servers_dir() + "' && '" + node22() + "' --require ./loopback.cjs '" + conformance_js() +
                    "' client --timeout 20000 --command '" + client + "' --scenario " + scenario + " 2>&1";
  run_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

class mcp_conformance : public ::testing::TestWithParam<const char*> {};

TEST_P(mcp_conformance, client_scenario_passes) {
  CEDAR_REQUIRE_NPM_SERVERS();
  ASSERT_TRUE(file_exists(std::string(CEDAR_BINARY_DIR) + "/tests/mcp_conformance_client"))
      << "build the mcp_conformance_client target";
  run_result r = run_scenario(GetParam());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("OVERALL: PASSED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", 0 failed, "), std::string::npos) << r.output;
  // No warnings, except the one a loaded machine can cause: sse-retry warns when the resume
  // GET arrives 200-500 ms later than the server's retry: (it fails below or above that).
  size_t warnings = 0, timing_warnings = 0;
  for (size_t at = 0, end; at < r.output.size(); at = end + 1) {
    end = r.output.find('\n', at);
    if (end == std::string::npos) end = r.output.size();
    std::string line = r.output.substr(at, end - at);
    if (line.find("WARNING") == std::string::npos || line.find('[') == std::string::npos) continue;
    ++warnings;
    if (line.find("client-sse-retry-timing") != std::string::npos) ++timing_warnings;
  }
  EXPECT_EQ(warnings, timing_warnings) << r.output;
}

INSTANTIATE_TEST_SUITE_P(scenarios, mcp_conformance, ::testing::Values("initialize", "tools_call", "sse-retry"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });
