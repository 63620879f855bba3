// `cedar serve`'s server and OpenAI-compatible API against a real server on 127.0.0.1: the
// shipped default model (greedy), a temp SQLite store, cpp-httplib's client. The model is small
// and imperfect: the tests assert on structure, on consistency between answers (streamed ==
// not streamed under greedy decoding) and on KV reuse, not on what the model says — except that
// "What is 1234 * 5678?" with the calculator offered gets a calculator call (as in
// tool_faults_test; a retrained model that stops doing so fails here loudly).
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/cedar.hpp"
#include "runtime/server/http_server.hpp"
#include "runtime/server/openai_api.hpp"
#include "runtime_test_util.hpp"

using namespace cedar;
using njson = nlohmann::json;

namespace {

const char* k_system = "You are cedar, a helpful assistant. Use the tools when they help.";

njson calculator_tool() {
  return njson::parse(R"({"type": "function", "function": {"name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / and parentheses; returns the exact result.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. (12 + 30) * 4"}},
                   "required": ["expression"]}}})");
}

// One runtime + server for the whole suite (loading the model once).
class ServeApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::temp_dir();
    runtime_options o;
    o.model_dir = test::src("model/weights/cedar-agent-tiny");
    o.store_path = dir_->file("s.db");
    o.builtin_tools = false;
    auto rt = agent_runtime::open(o);
    ASSERT_TRUE(rt.ok()) << rt.err().message;
    rt_ = rt->release();
    runtime::serve_options so;
    so.port = 0;
    auto s = runtime::http_server::start(*rt_, so, {runtime::openai_api_mount()});
    ASSERT_TRUE(s.ok()) << s.err().message;
    srv_ = s->release();
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete rt_;
    delete dir_;
  }

  httplib::Client client(bool auth = true) const {
    httplib::Client c("127.0.0.1", srv_->port());
    c.set_read_timeout(120, 0);
    if (auth) c.set_bearer_token_auth(srv_->token().c_str());
    return c;
  }
  njson post(const njson& body, int* status = nullptr) const {
    auto c = client();
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    if (status) *status = r->status;
    else EXPECT_EQ(r->status, 200) << r->body;
    return njson::parse(r->body, nullptr, false);
  }
  njson request(njson messages, int max_tokens) const {
    return njson{{"model", "cedar-agent-tiny"}, {"messages", std::move(messages)}, {"temperature", 0},
                 {"max_tokens", max_tokens}};
  }

  static test::temp_dir* dir_;
  static agent_runtime* rt_;
  static runtime::http_server* srv_;
};
test::temp_dir* ServeApi::dir_ = nullptr;
agent_runtime* ServeApi::rt_ = nullptr;
runtime::http_server* ServeApi::srv_ = nullptr;

void expect_usage(const njson& u) {
  ASSERT_TRUE(u.is_object()) << u.dump();
  EXPECT_GT(u["prompt_tokens"].get<int64_t>(), 0);
  EXPECT_GT(u["completion_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(u["total_tokens"].get<int64_t>(), u["prompt_tokens"].get<int64_t>() + u["completion_tokens"].get<int64_t>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

// Parses an SSE body into its `data:` payloads.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end == std::string::npos ? body.size() : end + 2;
  }
  return out;
}

}  // namespace

TEST_F(ServeApi, TokenFileIs0600AndRequestsWithoutItGet401) {
  struct stat st;
  ASSERT_EQ(::stat(srv_->token_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(srv_->token().size(), 64u);
  // The same file gives the same token on the next start.
  auto again = runtime::load_or_create_token(srv_->token_file());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, srv_->token());

  auto c = client(false);
  for (const char* path : {"/v1/models", "/v1/chat/completions", "/", "/nothing"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    njson e = njson::parse(r->body, nullptr, false);
    EXPECT_EQ(e["error"]["type"], "authentication_error") << r->body;
  }
  auto wrong = client(false);
  wrong.set_bearer_token_auth(std::string(64, 'a').c_str());
  auto r = wrong.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  // ?token= is not accepted on the API itself.
  r = c.Get(("/v1/models?token=" + srv_->token()).c_str());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
}

TEST_F(ServeApi, BrowserTokenQuerySetsAnHttpOnlyCookieThatAuthenticates) {
  auto c = client(false);
  auto r = c.Get(("/?token=" + srv_->token()).c_str());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);  // no dashboard mounted here; authentication passed
  std::string cookie = r->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("cedar_token=" + srv_->token()), std::string::npos) << cookie;
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos);
  EXPECT_NE(cookie.find("SameSite=Strict"), std::string::npos);
  httplib::Headers h{{"Cookie", "cedar_token=" + srv_->token()}};
  r = c.Get("/v1/models", h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(r->get_header_value("Access-Control-Allow-Origin").empty());  // CORS off by default
}

TEST_F(ServeApi, ModelsListTheServedModel) {
  auto c = client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  njson j = njson::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "cedar-agent-tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  r = c.Get("/v1/models/cedar-agent-tiny");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(njson::parse(r->body)["error"]["code"], "model_not_found");
}

TEST_F(ServeApi, PlainAndStreamedCompletionsAgreeUnderGreedyDecoding) {
  njson body = request({{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "Say hello."}}}, 24);
  njson j = post(body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "cedar-agent-tiny");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  const njson& ch = j["choices"][0];
  EXPECT_EQ(ch["message"]["role"], "assistant");
  ASSERT_TRUE(ch["message"]["content"].is_string());
  std::string fr = ch["finish_reason"];
  EXPECT_TRUE(fr == "stop" || fr == "length") << fr;
  expect_usage(j["usage"]);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 24);
  if (fr == "length") {
    EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 24);
  }

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto events = sse_data(r->body);
  ASSERT_GE(events.size(), 4u) << r->body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  njson usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    njson e = njson::parse(events[i], nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], events.size() > 1 ? njson::parse(events[0])["id"] : e["id"]);  // one id per stream
    if (e["choices"].empty()) {
      usage = e["usage"];
      EXPECT_EQ(i, events.size() - 2) << "the usage chunk comes last";
      continue;
    }
    const njson& d = e["choices"][0]["delta"];
    if (i == 0) {
      EXPECT_EQ(d["role"], "assistant");
    } else {
      EXPECT_FALSE(d.contains("role"));
    }
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, ch["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, fr);
  expect_usage(usage);
  EXPECT_EQ(usage["completion_tokens"], j["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["prompt_tokens"], j["usage"]["prompt_tokens"]);
}

TEST_F(ServeApi, ToolCallThenFollowUpReusesTheFirstRequestsKv) {
  njson messages = {{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "What is 1234 * 5678?"}}};
  njson body = request(messages, 80);
  body["tools"] = njson::array({calculator_tool()});
  njson j = post(body);
  const njson& ch = j["choices"][0];
  ASSERT_EQ(ch["finish_reason"], "tool_calls") << j.dump();
  ASSERT_TRUE(ch["message"]["tool_calls"].is_array());
  ASSERT_GE(ch["message"]["tool_calls"].size(), 1u);
  const njson& call = ch["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "calculator");
  njson args = njson::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call.dump();
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // a new conversation

  // The follow-up: the same messages, the reply as returned, the tool's result.
  messages.push_back(ch["message"]);
  messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "7006652"}});
  njson body2 = request(messages, 40);
  body2["tools"] = body["tools"];
  njson j2 = post(body2);
  ASSERT_EQ(j2["choices"].size(), 1u);
  expect_usage(j2["usage"]);
  // Every token of the first request (prompt + reply) came from its session's KV.
  EXPECT_EQ(j2["usage"]["prompt_tokens_details"]["cached_tokens"], j["usage"]["total_tokens"]) << j2.dump();
  EXPECT_GT(j2["usage"]["prompt_tokens"].get<int64_t>(), j["usage"]["total_tokens"].get<int64_t>());

  // Another follow-up of the FIRST request (a different tool result): its session has moved on
  // past that turn, so the match ends mid-session and the server forks it at that turn.
  auto before = rt_->sessions();
  ASSERT_TRUE(before.ok());
  messages.back()["content"] = "7006653";
  njson body3 = request(messages, 8);
  body3["tools"] = body["tools"];
  njson j3 = post(body3);
  EXPECT_EQ(j3["usage"]["prompt_tokens_details"]["cached_tokens"], j["usage"]["total_tokens"]) << j3.dump();
  auto after = rt_->sessions();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), before->size() + 1);  // the fork
}

TEST_F(ServeApi, ToolChoiceNoneRequiredAndNamed) {
  njson messages = {{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "What is 1234 * 5678?"}}};
  njson body = request(messages, 40);
  body["tools"] = njson::array({calculator_tool()});
  body["tool_choice"] = "none";
  njson j = post(body);
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls")) << j.dump();
  EXPECT_NE(j["choices"][0]["finish_reason"], "tool_calls");

  // Forced: the reply opens a call block (named: of that function); the model writes the rest.
  for (njson choice : {njson("required"), njson{{"type", "function"}, {"function", {{"name", "calculator"}}}}}) {
    body = request({{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "What is 12 + 30?"}}}, 60);
    body["tools"] = njson::array({calculator_tool()});
    body["tool_choice"] = choice;
    j = post(body);
    const njson& m = j["choices"][0]["message"];
    ASSERT_TRUE(m.contains("tool_calls")) << choice.dump() << " -> " << j.dump();
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "calculator");
    EXPECT_TRUE(njson::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>(), nullptr, false).is_object());
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  }
  int status = 0;
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "weather"}}}};
  j = post(body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "tool_choice");
}

TEST_F(ServeApi, StreamedToolCallDeltasCarryIndexIdAndType) {
  njson body = request({{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "What is 1234 * 5678?"}}}, 80);
  body["tools"] = njson::array({calculator_tool()});
  body["stream"] = true;
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  auto events = sse_data(r->body);
  ASSERT_EQ(events.back(), "[DONE]");
  std::string name, arguments, id, finish;
  int fragments = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    njson e = njson::parse(events[i]);
    EXPECT_FALSE(e.contains("usage"));  // no include_usage
    const njson& ch = e["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) continue;
    for (const njson& tc : ch["delta"]["tool_calls"]) {
      EXPECT_EQ(tc["index"], 0);
      if (fragments++ == 0) {
        id = tc["id"];
        EXPECT_EQ(tc["type"], "function");
        name = tc["function"]["name"];
        EXPECT_EQ(tc["function"]["arguments"], "");  // the arguments follow as they are generated
      } else {
        EXPECT_FALSE(tc.contains("id"));
        EXPECT_FALSE(tc.contains("type"));
        EXPECT_FALSE(tc["function"].contains("name"));
      }
      arguments += tc["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(name, "calculator");
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_TRUE(njson::parse(arguments, nullptr, false).is_object()) << arguments;
  // Streamed incrementally: the name, then each parameter, then the closing brace.
  EXPECT_GE(fragments, 3) << r->body;
  // The same request unstreamed (greedy): the pieces concatenate to its arguments exactly.
  body.erase("stream");
  njson j = post(body);
  ASSERT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>(), arguments);
}

// min_tokens (vLLM's extension): greedy, the model's own reply to this is a few words; with
// min_tokens = max_tokens it runs to the limit and ends for length.
TEST_F(ServeApi, MinTokensHoldsTheReplyToItsLength) {
  njson body = request({{{"role", "system"}, {"content", k_system}}, {{"role", "user"}, {"content", "Say hello."}}}, 40);
  njson plain = post(body);
  ASSERT_EQ(plain["choices"].size(), 1u) << plain.dump();
  ASSERT_LT(plain["usage"]["completion_tokens"].get<int>(), 40) << "the premise: the model stops early";
  body["min_tokens"] = 40;
  njson held = post(body);
  ASSERT_EQ(held["choices"].size(), 1u) << held.dump();
  EXPECT_EQ(held["usage"]["completion_tokens"].get<int>(), 40);
  EXPECT_EQ(held["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeApi, BadRequestsGetOpenAiErrorsAndTheServerKeepsServing) {
  auto c = client();
  auto r = c.Post("/v1/chat/completions", "{\"model\": \"cedar-agent-tiny\", \"messages\": [", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  njson e = njson::parse(r->body);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos) << r->body;

  struct bad_case {
    njson body;
    int status;
    std::string param;
  };
  njson ok_msgs = {{{"role", "user"}, {"content", "hi"}}};
  std::vector<bad_case> cases = {
      {njson{{"messages", ok_msgs}}, 400, "model"},
      {njson{{"model", "cedar-agent-tiny"}}, 400, "messages"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", njson::array()}}, 400, "messages"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, 400, "messages[0].role"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}, 400,
       "messages[0].tool_call_id"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"temperature", "hot"}}, 400, "temperature"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"max_tokens", 0}}, 400, "max_tokens"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"max_tokens", 20}, {"min_tokens", 30}}, 400, "min_tokens"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"min_tokens", -1}}, 400, "min_tokens"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"n", 2}}, 400, "n"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", ok_msgs}, {"tools", "calculator"}}, 400, "tools"},
      {njson{{"model", "cedar-agent-tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}}},
       400, "messages"},
      {njson{{"model", "gpt-4o"}, {"messages", ok_msgs}}, 404, "model"},
  };
  for (const auto& bc : cases) {
    int status = 0;
    njson j = post(bc.body, &status);
    EXPECT_EQ(status, bc.status) << bc.body.dump() << " -> " << j.dump();
    EXPECT_EQ(j["error"]["param"], bc.param) << bc.body.dump() << " -> " << j.dump();
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  r = c.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(njson::parse(r->body)["error"]["type"], "not_found_error");

  // Still serving.
  njson j = post(request(ok_msgs, 4));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
}

TEST_F(ServeApi, ConcurrentRequestsAllComplete) {
  const char* prompts[] = {"What is 2 + 2?", "Name a colour.", "Say hello."};
  std::vector<njson> out(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] { out[size_t(i)] = post(request({{{"role", "user"}, {"content", prompts[i]}}}, 12)); });
  for (auto& t : ts) t.join();
  for (const auto& j : out) {
    ASSERT_TRUE(j.contains("choices")) << j.dump();
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    expect_usage(j["usage"]);
  }
}
