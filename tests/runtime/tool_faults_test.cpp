// Tools that hang, fail or get cancelled, through the real actors and the shipped default model.
// Greedy decoding makes the model's first reply to "What is 1234 * 5678?" with only the
// calculator offered a calculator call (checked below, so a retrained model that stops doing
// so fails loudly here rather than passing vacuously); the test swaps in its own "calculator".
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/cedar.hpp"
#include "sessions/store.hpp"
#include "runtime_test_util.hpp"

using namespace cedar;
using namespace std::chrono_literals;

namespace {

tools::tool fake_calculator(std::function<result<tools::tool_result>(const tools::invoke_context&)> body) {
  tools::tool t;
  t.name = "calculator";
  t.description = "Evaluate an arithmetic expression with + - * / and parentheses; returns the exact result.";
  t.input_schema = {{"type", "object"},
                    {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. (12 + 30) * 4"}}}}},
                    {"required", {"expression"}}};
  t.invoke = [body](const tools::json&, const tools::invoke_context& ctx) { return body(ctx); };
  return t;
}

// A "calculator" that hangs until the runtime cancels it (on its timeout or the turn's cancel).
tools::tool hanging_calculator() {
  return fake_calculator([](const tools::invoke_context& ctx) -> result<tools::tool_result> {
    while (!ctx.cancel.cancelled()) std::this_thread::sleep_for(5ms);
    return make_error(errc::cancelled, "cancelled");
  });
}

std::unique_ptr<agent_runtime> open_default(const std::string& store) {
  runtime_options o;
  o.model_dir = test::src("model/weights/cedar-agent-tiny");
  o.store_path = store;
  o.builtin_tools = false;
  auto rt = agent_runtime::open(o);
  EXPECT_TRUE(rt.ok()) << (rt.ok() ? "" : rt.err().message);
  return rt.ok() ? std::move(*rt) : nullptr;
}

std::unique_ptr<agent_runtime> open_with_builtins(const std::string& store) {
  runtime_options o;
  o.model_dir = test::src("model/weights/cedar-agent-tiny");
  o.store_path = store;
  auto rt = agent_runtime::open(o);
  EXPECT_TRUE(rt.ok()) << (rt.ok() ? "" : rt.err().message);
  return rt.ok() ? std::move(*rt) : nullptr;
}

// The notes tools with room for many rounds and the repeat guard at its tightest: the default
// model asks for a missing note, a variant, then one of them again.
agent_options notes_agent() {
  agent_options o;
  o.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  o.tools = {"notes_read", "notes_save", "calculator"};
  o.max_new_tokens = 120;
  o.max_tool_rounds = 8;
  o.max_repeated_failures = 1;
  return o;
}

agent_options calc_agent(int timeout_ms) {
  agent_options a;
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = {"calculator"};
  a.max_new_tokens = 120;
  a.max_tool_rounds = 1;
  a.tool_timeout_ms = timeout_ms;
  return a;
}

struct seen {
  int calls = 0, errors = 0;
  std::string last_result;
};

// Asks the question the model answers with a calculator call, counting what comes back.
result<turn_result> ask_calculation(agent& a, seen& s) {
  return a.ask("What is 1234 * 5678?", [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_call) ++s.calls;
    if (e.type == agent_event::kind::tool_result) s.last_result = e.text, s.errors += e.is_error;
  });
}

}  // namespace

TEST(ToolFaults, AHangingToolTimesOutAndBlocksNoOtherAgent) {
  test::temp_dir dir;
  auto rt = open_default(dir.file("s.db"));
  ASSERT_TRUE(rt);
  ASSERT_TRUE(rt->add_tool(hanging_calculator()).ok());  // the runtime cancels it on its timeout
  auto a = rt->create_agent(calc_agent(400));
  auto b = rt->create_agent(calc_agent(400));
  ASSERT_TRUE(a.ok() && b.ok());
  seen sa;
  std::thread other;
  std::atomic<bool> other_done{false};
  auto r = a->ask("What is 1234 * 5678?", [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_call) {
      ++sa.calls;
      // While a's tool hangs, another agent runs a whole turn on the same executor.
      if (!other.joinable())
        other = std::thread([&] {
          auto rb = b->ask("hello");
          other_done = rb.ok();
        });
    }
    if (e.type == agent_event::kind::tool_result) {
      sa.errors += e.is_error;
      sa.last_result = e.text;
    }
  });
  if (other.joinable()) other.join();
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_GE(sa.calls, 1) << "the default model no longer calls the calculator for this prompt";
  EXPECT_GE(sa.errors, 1);
  EXPECT_NE(sa.last_result.find("timed out after 400 ms"), std::string::npos) << sa.last_result;
  EXPECT_TRUE(other_done.load());
  EXPECT_GE(r->rounds, 2);  // the model read the timeout and answered
}

TEST(ToolFaults, AFailingToolIsAnErrorResultAndTheLoopGoesOn) {
  test::temp_dir dir;
  auto rt = open_default(dir.file("s.db"));
  ASSERT_TRUE(rt);
  ASSERT_TRUE(rt->add_tool(fake_calculator([](const tools::invoke_context&) -> result<tools::tool_result> {
                  return make_error(errc::unavailable, "calculator backend is down");
                })).ok());
  auto a = rt->create_agent(calc_agent(5000));
  ASSERT_TRUE(a.ok());
  seen s;
  auto r = ask_calculation(*a, s);
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_GE(s.calls, 1) << "the default model no longer calls the calculator for this prompt";
  EXPECT_EQ(s.errors, s.calls);
  EXPECT_NE(s.last_result.find("calculator backend is down"), std::string::npos) << s.last_result;
  EXPECT_GE(r->rounds, 2);
}

// A note that does not exist, the real notes tools, room for many rounds: the default model asks
// for the key, then for a variant, then for one of them again (in the held-out eval it went on
// until --max-rounds). With max_repeated_failures = 1 the repeat is not run: the turn ends (with
// answer_on_limit off), no failed call runs twice, and the session goes on.
TEST(ToolFaults, ACallRepeatedAfterFailingEndsTheTurnWithoutRunningAgain) {
  test::temp_dir dir;
  auto rt = open_with_builtins(dir.file("s.db"));
  ASSERT_TRUE(rt);
  agent_options o = notes_agent();
  o.answer_on_limit = false;
  auto a = rt->create_agent(o);
  ASSERT_TRUE(a.ok());
  std::vector<std::string> ran;
  int errors = 0;
  auto r = a->ask("Look up my note called ploutwo.", [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_call) ran.push_back(e.tool + " " + e.arguments);
    if (e.type == agent_event::kind::tool_result) errors += e.is_error;
  });
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_FALSE(ran.empty()) << "the default model no longer reads the note";
  EXPECT_TRUE(r->repeat_limit) << "the default model no longer repeats a failed call; answer: " << r->answer;
  EXPECT_FALSE(r->round_limit);
  EXPECT_EQ(errors, int(ran.size()));  // every call failed: the note does not exist
  std::vector<std::string> distinct = ran;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end()) << "a failed call ran twice";
  EXPECT_EQ(r->tool_calls, int(ran.size()));
  EXPECT_EQ(r->rounds, int(ran.size()) + 1);  // the last reply's call was not run
  EXPECT_LT(r->rounds, 8);
  // The transcript is valid: the next turn runs on the same session.
  auto r2 = a->ask("What is 6 * 7?");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_GT(r2->context, r->context);
}

// The same turn with answer_on_limit (the default): the repeat is answered "not run: ..." without
// running, the model writes one more reply with tool calls forbidden, and the turn ends with that
// text; the stored transcript holds the refused call and its result, and the session goes on.
TEST(ToolFaults, ACallStoppedByTheRepeatGuardGetsAFinalReplyWithoutTools) {
  test::temp_dir dir;
  auto rt = open_with_builtins(dir.file("s.db"));
  ASSERT_TRUE(rt);
  agent_options o = notes_agent();
  ASSERT_TRUE(o.answer_on_limit);  // the default
  auto a = rt->create_agent(o);
  ASSERT_TRUE(a.ok());
  std::vector<std::string> ran, results, refused_events;
  auto r = a->ask("Look up my note called ploutwo.", [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_call) ran.push_back(e.tool + " " + e.arguments);
    if (e.type == agent_event::kind::tool_result) results.push_back(e.text);
    if (e.type == agent_event::kind::refused_call) {
      refused_events.push_back(e.tool + " " + e.arguments);
      EXPECT_EQ(e.text.rfind("not run: this call already failed 1 times", 0), 0u) << e.text;
    }
  });
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_FALSE(ran.empty()) << "the default model no longer reads the note";
  EXPECT_TRUE(r->repeat_limit) << "the default model no longer repeats a failed call; answer: " << r->answer;
  std::vector<std::string> distinct = ran;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end()) << "a failed call ran twice";
  EXPECT_EQ(r->tool_calls, int(ran.size()));      // the refused call is not counted as run
  EXPECT_EQ(results.size(), ran.size());          // nor streamed as a tool event
  ASSERT_EQ(refused_events.size(), 1u);           // but as a refused_call event: the repeat
  EXPECT_NE(std::find(ran.begin(), ran.end(), refused_events[0]), ran.end()) << refused_events[0];
  EXPECT_EQ(r->rounds, int(ran.size()) + 2);      // the refused call's reply + the final one
  EXPECT_FALSE(r->answer.empty()) << "the final reply has no text";
  EXPECT_EQ(r->answer.find("DSML"), std::string::npos) << r->answer;
  // The store holds the refused call with its "not run" result.
  auto store = sessions::store::open(dir.file("s.db"));
  ASSERT_TRUE(store.ok()) << store.err().message;
  auto items = (*store)->transcript(a->session());
  ASSERT_TRUE(items.ok()) << items.err().message;
  int refused = 0, not_run = 0;
  for (const auto& it : *items) {
    auto p = nlohmann::json::parse(it.payload);
    if (it.kind == sessions::item_kind::tool_call && p.value("refused", false)) ++refused;
    if (it.kind == sessions::item_kind::tool_result &&
        p.value("content", std::string()).rfind("not run: this call already failed 1 times", 0) == 0)
      ++not_run;
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(not_run, 1);
  // The transcript is valid: the next turn runs on the same session and may call tools again.
  auto r2 = a->ask("What is 6 * 7?");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_NE(r2->answer.find("42"), std::string::npos) << r2->answer;
  // ... and after a restart: the stored transcript (refused call, "not run" result, final reply)
  // renders to the stored token log, so the session resumes by bounded replay.
  const int64_t session = a->session();
  store->reset();
  { agent gone = std::move(*a); }  // the agent before its runtime
  rt.reset();
  auto rt2 = open_with_builtins(dir.file("s.db"));
  ASSERT_TRUE(rt2);
  auto b = rt2->resume_agent(session, o);
  ASSERT_TRUE(b.ok()) << b.err().message;
  auto r3 = b->ask("What is 9 * 9?");
  ASSERT_TRUE(r3.ok()) << r3.err().message;
  EXPECT_EQ(r3->resume_path, "replayed");
  EXPECT_NE(r3->answer.find("81"), std::string::npos) << r3->answer;
}

TEST(ToolFaults, CancelDuringAToolEndsTheTurnAndTheSessionContinues) {
  test::temp_dir dir;
  auto rt = open_default(dir.file("s.db"));
  ASSERT_TRUE(rt);
  ASSERT_TRUE(rt->add_tool(hanging_calculator()).ok());
  auto a = rt->create_agent(calc_agent(60000));
  ASSERT_TRUE(a.ok());
  agent handle = *a;
  std::thread canceller;
  auto t0 = std::chrono::steady_clock::now();
  auto r = a->ask("What is 1234 * 5678?", [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_call && !canceller.joinable())
      canceller = std::thread([&] {
        std::this_thread::sleep_for(200ms);
        handle.cancel();
      });
  });
  if (canceller.joinable()) canceller.join();
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_TRUE(r->cancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);  // far below the 60 s tool timeout
  // The transcript is valid: the next turn runs on the same session.
  auto r2 = a->ask("hello again");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_GT(r2->context, r->context);
}

// Bytes that are not valid UTF-8: a C++ tool may return them (file_read of a Latin-1 file), and
// the model's byte-level BPE may put them into a tool call's arguments. The first used to fail
// the turn (the chat template refuses invalid UTF-8); the second threw inside the agent actor
// while writing the store's JSON items (nlohmann type_error 316), which ended the actor and left
// ask() waiting forever. Tool results are now repaired (U+FFFD), items are written with
// replacement, and ask() watches the agent actor.
TEST(ToolFaults, InvalidUtf8InAToolResultIsStoredAndTheSessionGoesOn) {
  test::temp_dir dir;
  auto rt = open_default(dir.file("s.db"));
  ASSERT_TRUE(rt);
  ASSERT_TRUE(rt->add_tool(fake_calculator([](const tools::invoke_context&) -> result<tools::tool_result> {
                  tools::tool_result res;
                  tools::content_block b;
                  b.text = "7006652 \xE2\x82'\xFF";  // a cut 3-byte sequence, then a byte that never starts one
                  res.content.push_back(b);
                  return res;
                })).ok());
  auto a = rt->create_agent(calc_agent(5000));
  ASSERT_TRUE(a.ok());
  seen s;
  auto r = ask_calculation(*a, s);
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_GE(s.calls, 1) << "the default model no longer calls the calculator for this prompt";
  EXPECT_EQ(s.errors, 0);
  EXPECT_EQ(s.last_result.rfind("7006652", 0), 0u) << s.last_result;
  EXPECT_NE(s.last_result.find("\xEF\xBF\xBD"), std::string::npos) << s.last_result;  // U+FFFD
  auto r2 = a->ask("hello again");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_GT(r2->context, r->context);
}
