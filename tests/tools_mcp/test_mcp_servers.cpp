// The MCP client against the real reference servers from npm (pinned by
// tests/tools_mcp/servers/package-lock.json, installed by scripts/setup-npm.sh):
// server-everything over stdio and over Streamable HTTP (forced onto 127.0.0.1 by
// servers/loopback.cjs), server-filesystem over stdio on a temp directory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mcp_test_util.hpp"
#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/mcp_http.hpp"
#include "tools_mcp/mcp_stdio.hpp"
#include "tools_mcp/tool_registry.hpp"

using namespace cedar;
using namespace cedar::tools;
using namespace cedar::tools::test;

namespace {

json J(const char* s) { return json_parse(s).value(); }

// The shared checks for server-everything, whatever the transport.
void exercise_everything(tool_registry& reg, mcp::client& c) {
  EXPECT_EQ(c.server().protocol_version, "2025-11-25");
  EXPECT_EQ(c.server().name, "mcp-servers/everything");
  EXPECT_TRUE(c.server().capabilities.contains("tools"));
  for (const char* name : {"everything__echo", "everything__get-sum", "everything__get-structured-content",
                           "everything__trigger-long-running-operation", "everything__get-tiny-image"})
    EXPECT_NE(reg.find(name), nullptr) << name;
  auto structured = reg.find("everything__get-structured-content");
  ASSERT_NE(structured, nullptr);
  ASSERT_TRUE(structured->output_schema.has_value());

  invoke_context ctx;
  ctx.timeout = std::chrono::milliseconds(20000);
  auto echo = reg.call("everything__echo", J(R"({"message":"hello from cedar"})"), ctx);
  ASSERT_TRUE(echo.ok()) << echo.err().message;
  EXPECT_FALSE(echo->is_error);
  EXPECT_EQ(echo->to_text(), "Echo: hello from cedar");

  auto sum = reg.call("everything__get-sum", J(R"({"a":2,"b":40.5})"), ctx);
  ASSERT_TRUE(sum.ok()) << sum.err().message;
  EXPECT_NE(sum->to_text().find("42.5"), std::string::npos) << sum->to_text();

  auto weather = reg.call("everything__get-structured-content", J(R"({"location":"Chicago"})"), ctx);
  ASSERT_TRUE(weather.ok()) << weather.err().message;
  ASSERT_TRUE(weather->structured.has_value());
  EXPECT_TRUE((*weather->structured)["temperature"].is_number());
  EXPECT_TRUE((*weather->structured)["conditions"].is_string());

  auto image = reg.call("everything__get-tiny-image", json::object(), ctx);
  ASSERT_TRUE(image.ok()) << image.err().message;
  bool has_image = false;
  for (const auto& b : image->content)
    if (b.kind == content_kind::image) has_image = b.mime_type == "image/png" && b.data.size() > 100;
  EXPECT_TRUE(has_image) << image->to_text();

  // Arguments are validated before the call: an enum violation never reaches the server.
  auto bad = reg.call("everything__get-structured-content", J(R"({"location":"Paris"})"), ctx);
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(bad->is_error);
  EXPECT_NE(bad->to_text().find("$.location"), std::string::npos);

  // Progress: 4 steps of 250 ms each against an inactivity timeout of 700 ms; each progress
  // report extends the deadline, so the 1 s operation completes.
  std::atomic<int> n_progress{0};
  std::atomic<double> last{0};
  invoke_context slow;
  slow.timeout = std::chrono::milliseconds(700);
  slow.hard_cap = std::chrono::milliseconds(20000);
  slow.on_progress = [&](const progress_update& u) {
    n_progress++;
    last = u.progress;
    EXPECT_EQ(u.total.value_or(-1), 4);
  };
  auto lr = reg.call("everything__trigger-long-running-operation", J(R"({"duration":1,"steps":4})"), slow);
  ASSERT_TRUE(lr.ok()) << lr.err().message;
  EXPECT_FALSE(lr->is_error);
  EXPECT_EQ(n_progress.load(), 4);
  EXPECT_EQ(last.load(), 4);
  EXPECT_NE(lr->to_text().find("completed"), std::string::npos) << lr->to_text();
  EXPECT_EQ(c.conn().n_pending(), 0u);
}

std::shared_ptr<mcp::client> connect(mcp::server_config cfg) {
  auto c = std::make_shared<mcp::client>(cfg.name, mcp::make_transport(cfg));
  auto st = c->connect();
  EXPECT_TRUE(st.ok()) << st.err().message << "\nstderr: " << c->stderr_tail();
  return st.ok() ? c : nullptr;
}

}  // namespace

TEST(mcp_everything, stdio) {
  CEDAR_REQUIRE_NPM_SERVERS();
  int threads_before = n_threads(), fds_before = n_fds();
  pid_t pid;
  {
    auto c = connect(stdio_config("everything", "node", {everything_js(), "stdio"}));
    ASSERT_NE(c, nullptr);
    pid = static_cast<mcp::stdio_transport&>(c->wire()).pid();
    tool_registry reg;
    ASSERT_TRUE(reg.add_mcp_server(c).ok());
    exercise_everything(reg, *c);
    EXPECT_NE(c->stderr_tail().find("Starting default (STDIO) server"), std::string::npos) << c->stderr_tail();
    EXPECT_EQ(c->conn().n_server_requests(), 0u);
    reg.close_servers();
    EXPECT_EQ(static_cast<mcp::stdio_transport&>(c->wire()).exit_text(), "exit 0");  // closing stdin sufficed
  }
  EXPECT_TRUE(reaped(pid));
  EXPECT_EQ(n_threads(), threads_before);
  EXPECT_EQ(n_fds(), fds_before);
}

TEST(mcp_everything, streamable_http) {
  CEDAR_REQUIRE_NPM_SERVERS();
  int port = free_port();
  loopback_server server({"node", "--require", servers_dir() + "/loopback.cjs", everything_js(), "streamableHttp"}, port);
  ASSERT_TRUE(server.wait_ready()) << "server-everything (streamableHttp) did not listen on 127.0.0.1:" << port;
  int threads_before = n_threads();
  {
    mcp::server_config cfg;
    cfg.name = "everything";
    cfg.type = mcp::server_config::kind::http;
    cfg.url = server.url();
    auto c = connect(cfg);
    ASSERT_NE(c, nullptr);
    auto& http = static_cast<mcp::http_transport&>(c->wire());
    EXPECT_FALSE(http.session_id().empty());
    tool_registry reg;
    ASSERT_TRUE(reg.add_mcp_server(c).ok());
    exercise_everything(reg, *c);
    reg.close_servers();  // aborts the GET stream, DELETEs the session
    EXPECT_EQ(http.n_workers(), 0u);
  }
  EXPECT_EQ(n_threads(), threads_before);
}

TEST(mcp_filesystem, stdio_read_list_and_denied_access) {
  CEDAR_REQUIRE_NPM_SERVERS();
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "cedar-mcp-fs-").string() + std::string(6, 'X');  // mkdtemp pattern
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  fs::path root = fs::canonical(tmpl);
  fs::create_directory(root / "sub");
  std::ofstream(root / "hello.txt") << "hello, filesystem\nline two\n";
  std::ofstream(root / "sub" / "inner.md") << "# inner\n";
  pid_t pid;
  {
    auto c = connect(stdio_config("fs", "node", {filesystem_js(), root.string()}));
    ASSERT_NE(c, nullptr);
    pid = static_cast<mcp::stdio_transport&>(c->wire()).pid();
    tool_registry reg;
    ASSERT_TRUE(reg.add_mcp_server(c).ok());
    ASSERT_NE(reg.find("fs__read_text_file"), nullptr);
    ASSERT_NE(reg.find("fs__list_directory"), nullptr);
    invoke_context ctx;
    ctx.timeout = std::chrono::milliseconds(20000);

    auto read = reg.call("fs__read_text_file", json{{"path", (root / "hello.txt").string()}}, ctx);
    ASSERT_TRUE(read.ok()) << read.err().message;
    EXPECT_FALSE(read->is_error);
    EXPECT_EQ(read->to_text(), "hello, filesystem\nline two\n");

    auto list = reg.call("fs__list_directory", json{{"path", root.string()}}, ctx);
    ASSERT_TRUE(list.ok()) << list.err().message;
    EXPECT_NE(list->to_text().find("[FILE] hello.txt"), std::string::npos) << list->to_text();
    EXPECT_NE(list->to_text().find("[DIR] sub"), std::string::npos) << list->to_text();

    // Outside the allowed directory: a tool error for the model, not a failure.
    auto denied = reg.call("fs__read_text_file", json{{"path", "/etc/hostname"}}, ctx);
    ASSERT_TRUE(denied.ok()) << denied.err().message;
    EXPECT_TRUE(denied->is_error);
    EXPECT_NE(denied->to_text().find("Access denied"), std::string::npos) << denied->to_text();

    // The connection is still usable after the tool error.
    auto again = reg.call("fs__read_text_file", json{{"path", (root / "sub" / "inner.md").string()}}, ctx);
    ASSERT_TRUE(again.ok()) << again.err().message;
    EXPECT_EQ(again->to_text(), "# inner\n");
  }
  EXPECT_TRUE(reaped(pid));
  fs::remove_all(root);
}
