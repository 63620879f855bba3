// The dashboard's endpoints (runtime/server/dashboard.hpp) on a real runtime: the default model
// (model/weights/cedar-agent-tiny), a temp store, the built-in tools, the MCP filesystem server,
// and cedar's http_server (127.0.0.1, free port, bearer token) with the dashboard mounted. One runtime serves every test of the suite (the model
// loads once); tests that need a finished turn share the calculator session.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "runtime/cedar.hpp"
#include "runtime/server/dashboard.hpp"
#include "runtime/server/http_server.hpp"
#include "runtime_test_util.hpp"

namespace cedar::runtime {
namespace {

using njson = nlohmann::json;
using test::src;

class DashboardEndpoints : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::temp_dir();
    runtime_options o;
    o.model_dir = src("model/weights/cedar-agent-tiny");
    o.store_path = dir_->file("store.db");
    // The MCP filesystem server (npm, stdio) for the MCP view: it logs to stderr at start.
    std::string js = src("tests/tools_mcp/servers/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    ASSERT_TRUE(std::filesystem::exists(js)) << "run scripts/setup-npm.sh (the MCP test servers are missing)";
    std::filesystem::create_directories(dir_->path / "ws");
    std::ofstream(dir_->file("mcp.json")) << R"({"mcpServers": {"filesystem": {"command": "node", "args": [")" << js
                                          << R"(", ")" << dir_->file("ws") << R"("]}}})";
    o.mcp_config = dir_->file("mcp.json");
    auto rt = agent_runtime::open(o);
    ASSERT_TRUE(rt.ok()) << rt.err().message;
    rt_ = rt->release();
    serve_options so;
    so.port = 0;
    so.token_file = dir_->file("serve.token");
    auto svr = http_server::start(*rt_, so, {mount_dashboard});
    ASSERT_TRUE(svr.ok()) << svr.err().message;
    svr_ = svr->release();
    port_ = svr_->port();
    ASSERT_GT(port_, 0);
  }
  static void TearDownTestSuite() {
    svr_->stop();
    delete svr_;  // the dashboard's state (and its turn threads) ends with the handlers
    delete rt_;
    delete dir_;
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    c.set_bearer_token_auth(svr_->token().c_str());
    return c;
  }
  static njson get_json(const std::string& path, int want = 200) {
    auto r = client().Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return njson();
    EXPECT_EQ(r->status, want) << path << ": " << r->body;
    return njson::parse(r->body, nullptr, false);
  }
  static std::pair<int, njson> post(const std::string& path, const std::string& body) {
    auto r = client().Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {0, njson()};
    return {r->status, njson::parse(r->body, nullptr, false)};
  }
  // Polls a session until no turn runs and `n_turns` turn summaries are in (bounded by a count
  // of polls, not by a time assertion).
  static njson wait_idle(int64_t id, size_t n_turns) {
    njson s;
    for (int i = 0; i < 1200; ++i) {
      s = get_json("/api/dash/sessions/" + std::to_string(id));
      if (!s.is_discarded() && !s["running"].get<bool>() && s["turn_summaries"].size() >= n_turns) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "session " << id << " did not finish: " << s.dump();
    return s;
  }
  // The calculator session, created (and its first turn finished) once.
  static int64_t calculator_session() {
    if (calc_ > 0) return calc_;
    auto [status, j] = post("/api/dash/agents", R"({"name":"calc","message":"What is 17 * 23?",)"
                                                R"("tools":["calculator"],"max_new_tokens":128,)"
                                                R"("system_prompt":"You are cedar, a helpful assistant. Use the tools when they help."})");
    EXPECT_EQ(status, 201) << j.dump();
    calc_ = j.value("session", int64_t{0});
    wait_idle(calc_, 1);
    return calc_;
  }

  static inline test::temp_dir* dir_ = nullptr;
  static inline agent_runtime* rt_ = nullptr;
  static inline http_server* svr_ = nullptr;
  static inline int port_ = 0;
  static inline int64_t calc_ = 0;
};

TEST_F(DashboardEndpoints, ServesTheEmbeddedAssets) {
  auto r = client().Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_NE(r->body.find("id=\"start-form\""), std::string::npos);
  // The vendored uPlot is byte for byte the npm package's dist file.
  std::ifstream f(src("runtime/server/web/node_modules/uplot/dist/uPlot.iife.min.js"), std::ios::binary);
  std::stringstream want;
  want << f.rdbuf();
  auto u = client().Get("/dash/uplot.js");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->status, 200);
  EXPECT_GT(want.str().size(), 10000u);
  EXPECT_EQ(u->body, want.str());
  EXPECT_NE(u->get_header_value("Content-Type").find("javascript"), std::string::npos);
  auto missing = client().Get("/dash/nothing.js");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(DashboardEndpoints, RequestsWithoutTheTokenGet401) {
  httplib::Client c("127.0.0.1", port_);
  for (const char* path : {"/", "/dash/app.js", "/api/dash/sessions", "/api/dash/events"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
  }
  auto p = c.Post("/api/dash/agents", R"({"message":"hi"})", "application/json");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 401);
}

// A turn the repeat guard ended: the timeline's assistant item says why and which call was not
// run (the same prompt, tools and limit as ToolFaults.ACallRepeatedAfterFailingEnds...: the
// default model asks for a missing note, a variant, then one of them again).
TEST_F(DashboardEndpoints, ATurnEndedByTheRepeatGuardShowsTheCallNotRun) {
  auto [status, j] = post("/api/dash/agents", R"({"name":"notes","message":"Look up my note called ploutwo.",)"
                                              R"("tools":["notes_read","notes_save","calculator"],"max_new_tokens":120,)"
                                              R"("max_tool_rounds":8,"max_repeated_failures":1,"answer_on_limit":false,)"
                                              R"("system_prompt":"You are cedar, a helpful assistant. Use the tools when they help."})");
  ASSERT_EQ(status, 201) << j.dump();
  int64_t id = j.value("session", int64_t{0});
  njson s = wait_idle(id, 1);
  const njson* end = nullptr;
  int calls_run = 0;
  for (const auto& it : s["items"]) {
    if (it["kind"] == "tool_call") ++calls_run;
    if (it["kind"] == "assistant" && !it["payload"].value("turn_end", std::string()).empty()) end = &it;
  }
  ASSERT_NE(end, nullptr) << "no turn_end on any assistant item: " << s["items"].dump();
  EXPECT_EQ((*end)["payload"]["turn_end"], "repeat_limit");
  ASSERT_EQ((*end)["payload"]["refused_calls"].size(), 1u);
  EXPECT_EQ((*end)["payload"]["refused_calls"][0]["name"], "notes_read");
  EXPECT_TRUE((*end)["payload"]["tool_calls"].empty());
  EXPECT_GE(calls_run, 1);
  // The refused call repeats one that ran (and failed): same arguments.
  bool ran_before = false;
  for (const auto& it : s["items"])
    if (it["kind"] == "tool_call" && it["payload"]["arguments"] == (*end)["payload"]["refused_calls"][0]["arguments"])
      ran_before = true;
  EXPECT_TRUE(ran_before);
}

TEST_F(DashboardEndpoints, BadRequestsGetClearErrors) {
  auto [s1, j1] = post("/api/dash/agents", "not json");
  EXPECT_EQ(s1, 400);
  EXPECT_NE(j1["error"]["message"].get<std::string>().find("JSON object"), std::string::npos);
  auto [s2, j2] = post("/api/dash/agents", R"({"system_prompt":"x"})");
  EXPECT_EQ(s2, 400);
  EXPECT_NE(j2["error"]["message"].get<std::string>().find("message"), std::string::npos);
  auto [s3, j3] = post("/api/dash/agents", R"({"message":"hi","tools":["no_such_tool"]})");
  EXPECT_EQ(s3, 400);
  EXPECT_NE(j3["error"]["message"].get<std::string>().find("no_such_tool"), std::string::npos);
  auto [s4, j4] = post("/api/dash/agents", R"({"message":"hi","max_new_tokens":"many"})");
  EXPECT_EQ(s4, 400);
  auto [s4b, j4b] = post("/api/dash/agents", R"({"message":"hi","max_repeated_failures":-1})");
  EXPECT_EQ(s4b, 400);
  EXPECT_NE(j4b["error"]["message"].get<std::string>().find("'max_repeated_failures' must be an integer in [0, 64]"),
            std::string::npos) << j4b.dump();
  auto [s4d, j4d] = post("/api/dash/agents", R"({"message":"hi","answer_on_limit":"yes"})");
  EXPECT_EQ(s4d, 400);
  EXPECT_NE(j4d["error"]["message"].get<std::string>().find("'answer_on_limit' must be true or false"),
            std::string::npos) << j4d.dump();
  auto [s4c, j4c] = post("/api/dash/agents", R"({"message":"hi","max_new_tokens":64,"min_new_tokens":65})");
  EXPECT_EQ(s4c, 400);
  EXPECT_NE(j4c["error"]["message"].get<std::string>().find("'min_new_tokens' must be an integer in [0, max_new_tokens = 64]"),
            std::string::npos) << j4c.dump();
  get_json("/api/dash/sessions/987654", 404);
  auto [s5, j5] = post("/api/dash/sessions/987654/cancel", "");
  EXPECT_EQ(s5, 404);
  auto [s6, j6] = post("/api/dash/sessions/1/fork", R"({"turns":"x"})");
  EXPECT_EQ(s6, 400);
  auto [s7, j7] = post("/api/dash/sessions/987654/fork", R"({"turns":1})");
  EXPECT_EQ(s7, 400);
  EXPECT_FALSE(j7["error"]["message"].get<std::string>().empty());
}

TEST_F(DashboardEndpoints, AnAgentStartedFromTheFormRunsItsTurnWithMetricsAndToolCalls) {
  int64_t id = calculator_session();
  ASSERT_GT(id, 0);
  njson s = get_json("/api/dash/sessions/" + std::to_string(id));
  EXPECT_EQ(s["agent"], "calc");
  EXPECT_EQ(s["status"], "waiting");  // the turn ended; the agent waits for the next message
  EXPECT_TRUE(s["held"].get<bool>());
  ASSERT_EQ(s["turn_summaries"].size(), 1u);
  const njson& t = s["turn_summaries"][0];
  EXPECT_TRUE(t["error"].get<std::string>().empty()) << t.dump();
  EXPECT_GE(t["rounds"].get<int>(), 1);
  EXPECT_GT(t["first_token_ms"].get<double>(), 0);
  EXPECT_FALSE(s["live_text"].get<std::string>().empty());

  // Transcript items: user, assistant with per-generation metrics, the calculator call.
  int n_user = 0, n_assistant = 0, n_calc = 0;
  for (const njson& i : s["items"]) {
    if (i["kind"] == "user") n_user++;
    if (i["kind"] == "assistant") {
      n_assistant++;
      const njson& m = i["metrics"];
      EXPECT_GT(m["prompt_tokens"].get<int64_t>(), 0);
      EXPECT_GT(m["new_tokens"].get<int64_t>(), 0);
      EXPECT_GT(m["generated_tokens"].get<int64_t>(), 0);
      EXPECT_GT(m["ttft_ms"].get<double>(), 0);
      EXPECT_GE(m["cached_tokens"].get<int64_t>(), 0);
      std::string path = m["resume_path"];
      EXPECT_TRUE(path == "fresh" || path == "resident" || path == "replayed" || path == "reprefilled") << path;
    }
    if (i["kind"] == "tool_call" && i["payload"]["name"] == "calculator") n_calc++;
  }
  EXPECT_EQ(n_user, 1);
  EXPECT_GE(n_assistant, 1);
  EXPECT_EQ(n_calc, t["tool_calls"].get<int>());

  // The list: KV pages on disk in FP4, against the bf16 equivalent of the same entries.
  njson l = get_json("/api/dash/sessions");
  const njson* row = nullptr;
  for (const njson& r : l["sessions"])
    if (r["id"] == id) row = &r;
  ASSERT_NE(row, nullptr);
  EXPECT_EQ((*row)["tokens"], s["tokens"]);
  EXPECT_GT((*row)["kv_entries"].get<int64_t>(), 0);
  EXPECT_GT((*row)["kv_fp4_bytes"].get<int64_t>(), 0);
  EXPECT_GT((*row)["kv_bf16_bytes"].get<int64_t>(), (*row)["kv_fp4_bytes"].get<int64_t>());
  EXPECT_GT((*row)["last_activity_ms"].get<int64_t>(), 0);

  // The executor saw the tokens.
  njson x = get_json("/api/dash/executor");
  EXPECT_GT(x["tokens_generated"].get<int64_t>(), 0);
  EXPECT_GT(x["ram_budget"].get<int64_t>(), 0);
  EXPECT_GE(x["n_resident"].get<int64_t>(), 1);
  EXPECT_FALSE(x["samples"].empty());

  // Tool statistics count what the transcript holds.
  njson tools = get_json("/api/dash/tools");
  int64_t calls = 0;
  for (const njson& tl : tools["tools"])
    if (tl["name"] == "calculator" && tl.contains("stats")) calls = tl["stats"]["calls"];
  EXPECT_EQ(calls, n_calc);
}

TEST_F(DashboardEndpoints, McpServersShowVersionToolsSchemasAndStderr) {
  // The server logs "... using allowed directories ..." to stderr once initialized.
  njson mcp;
  for (int i = 0; i < 300; ++i) {
    mcp = get_json("/api/dash/mcp");
    if (mcp["servers"].size() == 1 && mcp["servers"][0]["stderr_tail"].get<std::string>().find("allowed directories") !=
                                          std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(mcp["servers"].size(), 1u) << mcp.dump();
  const njson& s = mcp["servers"][0];
  EXPECT_EQ(s["name"], "filesystem");
  EXPECT_EQ(s["status"], "ready");
  std::string v = s["protocol_version"];
  EXPECT_TRUE(v == "2025-11-25" || v == "2025-06-18" || v == "2025-03-26") << v;
  EXPECT_NE(s["transport"].get<std::string>().find("stdio"), std::string::npos);
  EXPECT_NE(s["stderr_tail"].get<std::string>().find("allowed directories"), std::string::npos) << s["stderr_tail"];
  bool read_file = false;
  for (const njson& t : s["tools"]) {
    EXPECT_EQ(t["name"].get<std::string>().rfind("filesystem__", 0), 0u);
    EXPECT_EQ(t["input_schema"]["type"], "object");
    if (t["name"] == "filesystem__read_text_file") read_file = true;
  }
  EXPECT_TRUE(read_file);
}

TEST_F(DashboardEndpoints, EventStreamReplaysTheTurnFromACursor) {
  int64_t id = calculator_session();
  // Read the SSE stream from the start until the session's turn_end arrives.
  std::string buf;
  bool begin = false, token = false, end = false;
  auto r = client().Get("/api/dash/events?after=0", [&](const char* data, size_t n) {
    buf.append(data, n);
    size_t p;
    while ((p = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, p);
      buf.erase(0, p + 2);
      size_t d = ev.find("data: ");
      if (d == std::string::npos) continue;
      njson j = njson::parse(ev.substr(d + 6), nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << ev;
      if (j.is_discarded() || j["session"] != id) continue;
      EXPECT_NE(ev.find("id: " + std::to_string(j["seq"].get<uint64_t>())), std::string::npos);
      if (j["type"] == "turn_begin") begin = true;
      if (j["type"] == "token") token = true;
      if (j["type"] == "turn_end") end = true;
    }
    return !end;  // stop reading once the turn's end is seen
  });
  EXPECT_TRUE(begin);
  EXPECT_TRUE(token);
  EXPECT_TRUE(end);
}

TEST_F(DashboardEndpoints, ForkAtATurnThenResumeTheFork) {
  int64_t id = calculator_session();
  njson parent = get_json("/api/dash/sessions/" + std::to_string(id));
  ASSERT_GE(parent["turns"].get<int>(), 1);
  auto [status, f] = post("/api/dash/sessions/" + std::to_string(id) + "/fork", R"({"turns":1})");
  ASSERT_EQ(status, 201) << f.dump();
  int64_t fork = f["session"];
  EXPECT_NE(fork, id);
  njson fs = get_json("/api/dash/sessions/" + std::to_string(fork));
  EXPECT_EQ(fs["parent"], id);
  EXPECT_EQ(fs["turns"], 1);
  for (const njson& i : fs["items"]) EXPECT_EQ(i["turn"], 0);
  EXPECT_FALSE(fs["held"].get<bool>());
  // The fork shares the parent's pages for its first turn.
  EXPECT_GT(fs["kv_fp4_bytes"].get<int64_t>(), 0);

  auto [rs, rj] = post("/api/dash/sessions/" + std::to_string(fork) + "/resume", R"({"message":"And 5 * 5?"})");
  ASSERT_EQ(rs, 202) << rj.dump();
  // 202 means accepted, not started: the fork already has a finished turn summary (inherited),
  // so wait for the resumed turn itself to be committed before reading the session.
  njson after;
  for (int i = 0; i < 1200; ++i) {
    after = wait_idle(fork, 1);
    if (!after.is_discarded() && after["turns"].get<int>() > 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(after["turns"].get<int>(), 1);
  EXPECT_TRUE(after["held"].get<bool>());
  const njson& t = after["turn_summaries"].back();
  EXPECT_TRUE(t["error"].get<std::string>().empty()) << t.dump();
  EXPECT_NE(t["resume_path"], "fresh");  // restored from the store (the fork was never resident)
}

TEST_F(DashboardEndpoints, CancelStopsARunningTurn) {
  auto [status, j] = post("/api/dash/agents", R"({"name":"story","message":"Write a very long story about a cedar tree.",)"
                                              R"("tools":["clock"],"max_new_tokens":4000,"min_new_tokens":4000})");
  ASSERT_EQ(status, 201) << j.dump();
  int64_t id = j["session"];
  // min_new_tokens keeps the reply going (the small model answers a story request in a few words);
  // the cancel reaches the executor after its generate request, so the generation stops early.
  for (int i = 0; i < 600; ++i) {
    njson s = get_json("/api/dash/sessions/" + std::to_string(id));
    if (s["running"].get<bool>()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto [cs, cj] = post("/api/dash/sessions/" + std::to_string(id) + "/cancel", "");
  EXPECT_EQ(cs, 200) << cj.dump();
  njson s = wait_idle(id, 1);
  const njson& t = s["turn_summaries"].back();
  EXPECT_TRUE(t["cancelled"].get<bool>()) << t.dump();
  EXPECT_LT(t["generated_tokens"].get<int64_t>(), 4000);
  // A running turn refuses a resume; an idle one accepts the next message.
  EXPECT_EQ(s["status"], "waiting");
}

}  // namespace
}  // namespace cedar::runtime
