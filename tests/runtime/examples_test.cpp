// The examples run as real processes on the shipped default model (what the README quotes).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime_test_util.hpp"

namespace {
using cedar::test::run_result;
run_result run(const std::string& cmd) { return cedar::test::run_command(cmd); }
std::string example(const std::string& name) { return std::string(CEDAR_BINARY_DIR) + "/examples/example_" + name; }
}  // namespace

TEST(Examples, CalculatorAgentRuns) {
  cedar::test::temp_dir dir;
  run_result r = run(example("calculator_agent") + " " + cedar::test::src("model/weights/cedar-agent-tiny") + " " + dir.file("c.db"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("session 1:"), std::string::npos) << r.out;
}

TEST(Examples, TwoAgentsRun) {
  cedar::test::temp_dir dir;
  run_result r = run(example("two_agents") + " " + cedar::test::src("model/weights/cedar-agent-tiny") + " " + dir.file("t.db"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sessions in the store"), std::string::npos) << r.out;
}

TEST(Examples, SessionIsResumedInANewProcessByReplay) {
  cedar::test::temp_dir dir;
  std::string db = dir.file("r.db"), model = cedar::test::src("model/weights/cedar-agent-tiny");
  run_result a = run(example("resume_session") + " start " + db + " " + model);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("resume_path fresh"), std::string::npos) << a.out;
  run_result b = run(example("resume_session") + " resume " + db + " 1 " + model);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("resume_path replayed"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("replayed_tokens 64"), std::string::npos) << b.out;  // n_win of the default model
}

TEST(Examples, ReadmeQuotesTheReadmeAgentVerbatimAndItRuns) {
  std::ifstream r(cedar::test::src("README.md")), e(cedar::test::src("examples/readme_agent.cpp"));
  std::stringstream rs, es;
  rs << r.rdbuf();
  es << e.rdbuf();
  std::string readme = rs.str();
  size_t b = readme.find("```cpp\n");
  ASSERT_NE(b, std::string::npos);
  size_t end = readme.find("```\n", b + 7);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(readme.substr(b + 7, end - b - 7), es.str());
  cedar::test::temp_dir dir;
  run_result out = run(example("readme_agent") + " " + cedar::test::src("model/weights/cedar-agent-tiny") + " " + dir.file("r.db"));
  ASSERT_EQ(out.code, 0) << out.out;
  EXPECT_NE(out.out.find("tokens of context, resume path fresh"), std::string::npos) << out.out;
}

// The MCP filesystem server (npm, stdio) joins the runtime's tools and an agent can use them.
TEST(Examples, FilesystemAgentWithTheMcpServer) {
  std::string js = cedar::test::src("tests/tools_mcp/servers/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
  ASSERT_TRUE(std::filesystem::exists(js)) << "run scripts/setup-npm.sh (the MCP test servers are missing)";
  cedar::test::temp_dir dir;
  std::filesystem::create_directories(dir.path / "ws");
  std::ofstream(dir.file("ws/shopping.txt")) << "buy milk\n";
  std::ofstream(dir.file("mcp.json")) << R"({"mcpServers": {"filesystem": {"command": "node", "args": [")" << js
                                      << R"(", ")" << dir.file("ws") << R"("]}}})";
  run_result out = run(example("filesystem_agent") + " " + dir.file("mcp.json") + " " +
                       cedar::test::src("model/weights/cedar-agent-tiny") + " " + dir.file("f.db"));
  ASSERT_EQ(out.code, 0) << out.out;
  EXPECT_NE(out.out.find("filesystem__read_text_file"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("filesystem__list_directory"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("tool call(s), context"), std::string::npos) << out.out;
}
