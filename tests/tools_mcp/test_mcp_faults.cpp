// Faults and protocol corners against small scripted servers run as real processes
// (tests/tools_mcp/fakes/*.js on the system node): a server that exits mid-call, writes
// garbage, never answers, answers with a huge payload, speaks an unknown protocol version,
// pages its tool list, changes it, asks the client things, answers out of order; over HTTP a
// server that drops the session, closes an SSE stream before the response, or hangs.
// Every test checks the child is reaped and no thread is left behind.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

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

struct fake_stdio {
  std::shared_ptr<mcp::client> c;
  pid_t pid = -1;
  explicit fake_stdio(const std::string& mode, size_t max_bytes = 64u << 20) {
    mcp::stdio_options o;
    o.command = "node";
    o.args = {fakes_dir() + "/fake_stdio_server.js", mode};
    o.max_message_bytes = max_bytes;
    o.grace = std::chrono::milliseconds(1000);
    auto t = std::make_unique<mcp::stdio_transport>(o);
    auto* raw = t.get();
    c = std::make_shared<mcp::client>("fake", std::move(t));
    status st = c->connect();
    pid = raw->pid();
    connected = st.ok();
    if (!st.ok()) connect_error = st.err();
  }
  bool connected = false;
  error connect_error;
  mcp::stdio_transport& wire() { return static_cast<mcp::stdio_transport&>(c->wire()); }
  // Polls the server's stderr for `needle` (the server logs what it received there).
  bool stderr_has(const std::string& needle, int ms = 3000) {
    for (int i = 0; i < ms / 10; ++i) {
      if (c->stderr_tail().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

invoke_context timeout_ctx(int ms, int cap_ms = 60000) {
  invoke_context ctx;
  ctx.timeout = std::chrono::milliseconds(ms);
  ctx.hard_cap = std::chrono::milliseconds(cap_ms);
  return ctx;
}

class mcp_faults : public ::testing::Test {
 protected:
  void SetUp() override { threads_before_ = n_threads(); }
  void TearDown() override { EXPECT_EQ(n_threads(), threads_before_) << "a thread outlived its client"; }
  int threads_before_ = 0;
};

}  // namespace

TEST_F(mcp_faults, pagination_server_requests_out_of_order_and_list_changed) {
  fake_stdio f("ok");
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  tool_registry reg;
  ASSERT_TRUE(reg.add_mcp_server(f.c).ok());
  // Two pages of tools, all registered under the server prefix.
  std::vector<std::string> names;
  for (const auto& t : reg.list()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fake__fast", "fake__huge", "fake__progress", "fake__slow"}));
  // The server pinged us and sent a request we do not implement.
  EXPECT_TRUE(f.stderr_has("client answered 1000 {\"result\":{}}")) << f.c->stderr_tail();
  EXPECT_TRUE(f.stderr_has("client answered 1001 {\"error\":{\"code\":-32601")) << f.c->stderr_tail();

  // The first call makes the server announce a changed list (before its response, on the
  // same ordered stream) with a new tool; the registry re-lists before its next call.
  auto first = f.c->call_tool("fast", json::object(), timeout_ctx(5000));
  ASSERT_TRUE(first.ok()) << first.err().message;
  EXPECT_TRUE(f.c->tools_stale());
  EXPECT_EQ(reg.find("fake__added"), nullptr);
  auto added = reg.call("fake__added", json::object(), timeout_ctx(5000));
  ASSERT_TRUE(added.ok()) << added.err().message;
  EXPECT_EQ(added->to_text(), "added works");
  EXPECT_FALSE(f.c->tools_stale());
  EXPECT_NE(reg.find("fake__added"), nullptr);

  // Out of order: "slow" is sent first; the server answers it only after answering "fast", so
  // each caller getting its own text shows responses are matched by id, not by order.
  std::string slow_text;
  std::atomic<bool> slow_done{false};
  std::thread t([&] {
    auto r = reg.call("fake__slow", J(R"({"until_fast":true})"), timeout_ctx(5000));
    slow_text = r.ok() ? r->to_text() : r.err().message;
    slow_done = true;
  });
  ASSERT_TRUE(f.stderr_has("holding slow")) << f.c->stderr_tail();
  auto fast = reg.call("fake__fast", json::object(), timeout_ctx(5000));
  t.join();
  ASSERT_TRUE(fast.ok()) << fast.err().message;
  EXPECT_EQ(fast->to_text(), "fast done");
  EXPECT_EQ(slow_text, "slow done");
  reg.close_servers();
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, progress_extends_the_timeout_up_to_the_hard_cap) {
  fake_stdio f("ok");
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  // 8 steps of 100 ms against a 300 ms inactivity timeout: progress keeps it alive.
  int n = 0;
  invoke_context ok = timeout_ctx(300, 20000);
  ok.on_progress = [&](const progress_update& u) {
    ++n;
    EXPECT_EQ(u.message, "step " + std::to_string(n));
  };
  auto r = f.c->call_tool("progress", J(R"({"steps":8,"ms":100})"), ok);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->to_text(), "progress done");
  EXPECT_EQ(n, 8);
  // Same call under a 450 ms hard cap: progress cannot extend past it.
  auto capped = f.c->call_tool("progress", J(R"({"steps":20,"ms":100})"), timeout_ctx(300, 450));
  ASSERT_FALSE(capped.ok());
  EXPECT_EQ(capped.err().code, errc::timeout);
  EXPECT_NE(capped.err().message.find("hard cap reached"), std::string::npos) << capped.err().message;
  EXPECT_TRUE(f.stderr_has("reason=timed out after")) << f.c->stderr_tail();
  f.c->close();
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, server_exits_mid_call) {
  fake_stdio f("exit");
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  auto r = f.c->call_tool("fast", json::object(), timeout_ctx(10000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::unavailable);
  EXPECT_NE(r.err().message.find("closed its stdout (exit 3)"), std::string::npos) << r.err().message;
  EXPECT_NE(r.err().message.find("fake server: exiting mid-call"), std::string::npos) << r.err().message;
  // Later calls fail at once with the same cause; the caller carries on.
  auto again = f.c->call_tool("fast", json::object(), timeout_ctx(10000));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.err().message.find("exit 3"), std::string::npos) << again.err().message;
  f.c->close();
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, server_writes_garbage) {
  fake_stdio f("garbage");
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  auto r = f.c->call_tool("fast", json::object(), timeout_ctx(10000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::invalid_format);
  EXPECT_NE(r.err().message.find("is not valid JSON"), std::string::npos) << r.err().message;
  EXPECT_NE(r.err().message.find("this is not JSON {{{"), std::string::npos) << r.err().message;
  f.c->close();
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, server_never_answers_timeout_and_cancel_send_cancelled) {
  fake_stdio f("silent");
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  auto r = f.c->call_tool("fast", json::object(), timeout_ctx(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::timeout);
  EXPECT_NE(r.err().message.find("without a response or progress"), std::string::npos) << r.err().message;
  EXPECT_TRUE(f.stderr_has("reason=timed out after")) << f.c->stderr_tail();

  invoke_context ctx = timeout_ctx(60000);
  std::thread canceller([tok = ctx.cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    tok.cancel();
  });
  auto c = f.c->call_tool("fast", json::object(), ctx);
  canceller.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::cancelled);
  EXPECT_TRUE(f.stderr_has("reason=cancelled by the caller")) << f.c->stderr_tail();
  EXPECT_EQ(f.c->conn().n_pending(), 0u);
  // A server that ignores stdin EOF is still stopped by close(): SIGTERM after the grace.
  f.c->close();
  EXPECT_EQ(f.wire().exit_text(), "signal 15");
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, huge_payload_within_and_over_the_limit) {
  {
    fake_stdio f("ok");
    ASSERT_TRUE(f.connected) << f.connect_error.message;
    auto r = f.c->call_tool("huge", J(R"({"bytes":8000000})"), timeout_ctx(20000));
    ASSERT_TRUE(r.ok()) << r.err().message;
    ASSERT_EQ(r->content.size(), 1u);
    EXPECT_EQ(r->content[0].text.size(), 8000000u);
    EXPECT_EQ(r->content[0].text.find_first_not_of('x'), std::string::npos);
  }
  fake_stdio f("ok", 1u << 20);
  ASSERT_TRUE(f.connected) << f.connect_error.message;
  auto r = f.c->call_tool("huge", J(R"({"bytes":4000000})"), timeout_ctx(20000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::invalid_format);
  EXPECT_NE(r.err().message.find("sent a message longer than 1048576 bytes"), std::string::npos) << r.err().message;
  f.c->close();
  EXPECT_TRUE(reaped(f.pid));
}

TEST_F(mcp_faults, unsupported_protocol_version_and_missing_command) {
  fake_stdio f("bad-version");
  ASSERT_FALSE(f.connected);
  EXPECT_EQ(f.connect_error.code, errc::mismatch);
  EXPECT_EQ(f.connect_error.message,
            "MCP server 'fake' answered protocol version '1999-01-01'; cedar speaks 2025-11-25, 2025-06-18, "
            "2025-03-26; disconnected");
  EXPECT_TRUE(reaped(f.pid));

  mcp::client missing("nope", mcp::make_transport(stdio_config("nope", "cedar-no-such-mcp-server", {})));
  auto st = missing.connect();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().message, "cannot start MCP server 'cedar-no-such-mcp-server': No such file or directory");
}

namespace {

struct fake_http {
  int port = free_port();
  loopback_server server{{"node", fakes_dir() + "/fake_http_server.js"}, port};
  std::shared_ptr<mcp::client> connect() {
    mcp::http_options o;
    o.url = server.url();
    auto c = std::make_shared<mcp::client>("fakehttp", std::make_unique<mcp::http_transport>(o));
    auto st = c->connect();
    EXPECT_TRUE(st.ok()) << st.err().message;
    return st.ok() ? c : nullptr;
  }
};

std::string text_of(const result<tool_result>& r) { return r.ok() ? r->to_text() : "error: " + r.err().message; }

}  // namespace

TEST_F(mcp_faults, http_session_dropped_reinitialises_once) {
  fake_http f;
  ASSERT_TRUE(f.server.wait_ready());
  auto c = f.connect();
  ASSERT_NE(c, nullptr);
  auto& http = static_cast<mcp::http_transport&>(c->wire());
  EXPECT_EQ(http.session_id(), "s1");
  EXPECT_EQ(text_of(c->call_tool("drop", json::object(), timeout_ctx(5000))), "dropping session");
  // The next request meets 400 "No valid session ID": re-initialise, retry, succeed.
  EXPECT_EQ(text_of(c->call_tool("inits", json::object(), timeout_ctx(5000))), "2");
  EXPECT_EQ(c->n_reinitialized(), 1);
  EXPECT_EQ(http.session_id(), "s2");
  c->close();
  EXPECT_EQ(http.n_workers(), 0u);
  // close() ended the session with DELETE: a new client sees the count.
  auto c2 = f.connect();
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(text_of(c2->call_tool("deletes", json::object(), timeout_ctx(5000))), "1");
}

TEST_F(mcp_faults, http_stream_closed_before_response_resumes_with_last_event_id) {
  fake_http f;
  ASSERT_TRUE(f.server.wait_ready());
  auto c = f.connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(text_of(c->call_tool("resume", json::object(), timeout_ctx(5000))), "resumed");
}

TEST_F(mcp_faults, http_server_never_answers_gets_cancelled) {
  fake_http f;
  ASSERT_TRUE(f.server.wait_ready());
  auto c = f.connect();
  ASSERT_NE(c, nullptr);
  auto r = c->call_tool("hang", json::object(), timeout_ctx(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::timeout);
  EXPECT_EQ(text_of(c->call_tool("cancels", json::object(), timeout_ctx(5000))), "1");
  c->close();
  EXPECT_EQ(static_cast<mcp::http_transport&>(c->wire()).n_workers(), 0u);
}

TEST_F(mcp_faults, http_server_gone) {
  mcp::http_options o;
  o.url = "http://127.0.0.1:" + std::to_string(free_port()) + "/mcp";
  mcp::client c("gone", std::make_unique<mcp::http_transport>(o));
  auto st = c.connect();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().code, errc::unavailable);
  EXPECT_NE(st.err().message.find("initialize failed: MCP request 'initialize' failed: HTTP POST to " + o.url + " failed"),
            std::string::npos)
      << st.err().message;
}
