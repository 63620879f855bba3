// The runtime end to end through its public API (cedar.hpp): real actors, the real executor on a
// random-weight model of the V4.1 architecture, the real SQLite store on a temp file.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "model/backend.hpp"
#include "runtime/cedar.hpp"
#include "runtime_test_util.hpp"

using namespace cedar;

namespace {

std::unique_ptr<agent_runtime> open_rt(const std::string& store, size_t budget_mb = 512) {
  runtime_options o;
  o.engine = test::random_engine();
  o.tokenizer = test::test_tokenizer();
  o.store_path = store;
  o.ram_budget_mb = budget_mb;
  auto rt = agent_runtime::open(o);
  EXPECT_TRUE(rt.ok()) << (rt.ok() ? "" : rt.err().message);
  return rt.ok() ? std::move(*rt) : nullptr;
}

agent_options small_agent(int max_new = 6) {
  agent_options a;
  a.system_prompt = "You are a test agent.";
  a.max_new_tokens = max_new;
  return a;
}

}  // namespace

TEST(Runtime, TurnsAreGeneratedCommittedAndResumedResident) {
  test::temp_dir dir;
  auto rt = open_rt(dir.file("s.db"));
  ASSERT_TRUE(rt);
  auto names = rt->tool_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "calculator"), names.end());
  auto a = rt->create_agent(small_agent());
  ASSERT_TRUE(a.ok()) << a.err().message;
  int tokens_seen = 0;
  auto r = a->ask("hello there", [&](const agent_event& e) {
    if (e.type == agent_event::kind::token) ++tokens_seen;
  });
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->resume_path, "fresh");
  EXPECT_GE(r->generated_tokens, 1);
  EXPECT_LE(r->generated_tokens, 6 * 9);  // ≤ max_new_tokens per round, ≤ 9 rounds
  EXPECT_GT(r->context, r->prompt_tokens - 1);
  EXPECT_GE(r->first_token_ms, 0.0);

  auto r2 = a->ask("and again");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_EQ(r2->resume_path, "resident");
  EXPECT_GT(r2->context, r->context);

  auto sessions = rt->sessions();
  ASSERT_TRUE(sessions.ok());
  ASSERT_EQ(sessions->size(), 1u);
  EXPECT_EQ((*sessions)[0].id, a->session());
  EXPECT_EQ((*sessions)[0].tokens, uint64_t(r2->context));  // the token log holds every fed token
  EXPECT_GE((*sessions)[0].turns, 2u);
}

TEST(Runtime, RestartResumesFromTheStoreByBoundedReplay) {
  test::temp_dir dir;
  int64_t session = 0;
  int64_t context = 0;
  {
    auto rt = open_rt(dir.file("s.db"));
    auto a = rt->create_agent(small_agent(4));
    ASSERT_TRUE(a.ok());
    session = a->session();
    // Enough context that the window (16) is smaller than the history.
    auto r = a->ask("a first message that is long enough to fill more than one sliding window of the tiny model");
    ASSERT_TRUE(r.ok()) << r.err().message;
    context = r->context;
  }
  auto rt = open_rt(dir.file("s.db"));
  auto a = rt->resume_agent(session, small_agent(4));
  ASSERT_TRUE(a.ok()) << a.err().message;
  auto r = a->ask("continue");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->resume_path, "replayed");
  EXPECT_EQ(r->replayed_tokens, 16);  // n_win of the tiny config, not the whole history
  EXPECT_GT(r->context, context);
}

TEST(Runtime, UnknownSessionAndUnknownToolAreClearErrors) {
  test::temp_dir dir;
  auto rt = open_rt(dir.file("s.db"));
  auto a = rt->resume_agent(424242, small_agent());
  // The agent starts (an empty transcript) but its first turn cannot load the session.
  if (a.ok()) {
    auto r = a->ask("hi");
    EXPECT_FALSE(r.ok());
  }
  agent_options o = small_agent();
  o.tools = {"no_such_tool"};
  auto b = rt->create_agent(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.err().message.find("no_such_tool"), std::string::npos);
}

// Limits out of range are refused with the field named (they were clamped silently before), and
// nothing is created for them: the store holds no new session.
TEST(Runtime, OptionsOutOfRangeAreClearErrors) {
  test::temp_dir dir;
  auto rt = open_rt(dir.file("s.db"));
  auto before = rt->sessions();
  ASSERT_TRUE(before.ok());
  struct bad_case {
    const char* field;
    void (*set)(agent_options&);
  };
  const bad_case cases[] = {
      {"max_repeated_failures", [](agent_options& o) { o.max_repeated_failures = -1; }},
      {"max_tool_rounds", [](agent_options& o) { o.max_tool_rounds = -3; }},
      {"max_new_tokens", [](agent_options& o) { o.max_new_tokens = 0; }},
      {"min_new_tokens", [](agent_options& o) { o.min_new_tokens = -1; }},
      {"min_new_tokens", [](agent_options& o) { o.min_new_tokens = o.max_new_tokens + 1; }},
      {"tool_timeout_ms", [](agent_options& o) { o.tool_timeout_ms = 0; }},
  };
  for (const auto& c : cases) {
    agent_options o = small_agent();
    c.set(o);
    auto a = rt->create_agent(o);
    ASSERT_FALSE(a.ok()) << c.field;
    EXPECT_EQ(a.err().code, errc::invalid_argument) << c.field;
    EXPECT_NE(a.err().message.find(c.field), std::string::npos) << a.err().message;
    auto r = rt->resume_agent(1, o);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_NE(r.err().message.find(c.field), std::string::npos) << r.err().message;
  }
  auto after = rt->sessions();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), before->size());
  // 0 is valid for both counters (no tool rounds; the guard off) and the runtime keeps working.
  agent_options ok = small_agent();
  ok.max_repeated_failures = 0;
  auto a = rt->create_agent(ok);
  ASSERT_TRUE(a.ok()) << a.err().message;
  EXPECT_TRUE(a->ask("hi").ok());
}

TEST(Runtime, BadModelDirIsAClearError) {
  test::temp_dir dir;
  runtime_options o;
  o.model_dir = dir.file("missing-model");
  o.store_path = dir.file("s.db");
  auto rt = agent_runtime::open(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.err().message.find("missing-model"), std::string::npos) << rt.err().message;
}

// Backend selection (model/backend.hpp): a bad name and a cuda backend that cannot run here
// (no GPU in CI; or a build without CUDA) are clear errors at open(); auto falls back to the CPU
// and generates.
TEST(Runtime, BackendSelectionErrorsAreClearAndAutoRuns) {
  test::temp_dir dir;
  runtime_options o;
  o.engine = test::random_engine();
  o.tokenizer = test::test_tokenizer();
  o.store_path = dir.file("s.db");
  o.backend = "gpu";
  auto bad = agent_runtime::open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("unknown backend 'gpu'"), std::string::npos) << bad.err().message;
  if (!model::cuda_unavailable_reason().empty()) {
    o.backend = "cuda";
    auto no_gpu = agent_runtime::open(o);
    ASSERT_FALSE(no_gpu.ok());
    EXPECT_NE(no_gpu.err().message.find("backend cuda"), std::string::npos) << no_gpu.err().message;
    EXPECT_NE(no_gpu.err().message.find(model::cuda_unavailable_reason()), std::string::npos);
  }
  o.backend = "auto";
  auto rt = agent_runtime::open(o);
  ASSERT_TRUE(rt.ok()) << rt.err().message;
  auto a = (*rt)->create_agent(small_agent());
  ASSERT_TRUE(a.ok()) << a.err().message;
  auto r = a->ask("hello");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_GT(r->generated_tokens, 0);
}

TEST(Runtime, SixtyFourConcurrentAgentsShareOneExecutor) {
  test::temp_dir dir;
  auto rt = open_rt(dir.file("s.db"));
  constexpr int kAgents = 64;
  std::vector<agent> agents;
  agent_options o = small_agent(4);
  o.tools = {"calculator"};  // a short system turn: the test is about concurrency
  for (int i = 0; i < kAgents; ++i) {
    auto a = rt->create_agent(o);
    ASSERT_TRUE(a.ok()) << a.err().message;
    agents.push_back(*a);
  }
  std::atomic<int> ok{0};
  std::vector<int64_t> contexts(kAgents, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAgents; ++i)
    threads.emplace_back([&, i] {
      auto r = agents[size_t(i)].ask("agent number " + std::to_string(i) + " says hello");
      if (r.ok()) {
        ++ok;
        contexts[size_t(i)] = r->context;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kAgents);
  auto sessions = rt->sessions();
  ASSERT_TRUE(sessions.ok());
  ASSERT_EQ(int(sessions->size()), kAgents);
  // No crossed messages: every session's token log has exactly its own agent's context.
  for (int i = 0; i < kAgents; ++i) {
    auto it = std::find_if(sessions->begin(), sessions->end(),
                           [&](const session_summary& s) { return s.id == agents[size_t(i)].session(); });
    ASSERT_NE(it, sessions->end());
    EXPECT_EQ(int64_t(it->tokens), contexts[size_t(i)]) << "agent " << i;
  }
}

TEST(Runtime, EvictionUnderATinyRamBudgetStillResumes) {
  test::temp_dir dir;
  auto rt = open_rt(dir.file("s.db"), /*budget_mb=*/0);  // every idle sequence is evicted
  auto a = rt->create_agent(small_agent(3));
  ASSERT_TRUE(a.ok());
  auto r1 = a->ask("first turn with a few words in it to pass the window size of sixteen tokens");
  ASSERT_TRUE(r1.ok()) << r1.err().message;
  auto r2 = a->ask("second");
  ASSERT_TRUE(r2.ok()) << r2.err().message;
  EXPECT_EQ(r2->resume_path, "replayed");
}

// min_new_tokens masks the end of a reply until it holds that many tokens (vLLM's min_tokens), on
// the shipped model: it answers this request in a few words, so without the option the reply is
// short, and with it the reply runs to the minimum. Greedy, so both are deterministic.
TEST(Runtime, MinNewTokensKeepsAReplyGoingOnTheShippedModel) {
  test::temp_dir dir;
  runtime_options ro;
  ro.model_dir = test::src("model/weights/cedar-agent-tiny");
  ro.store_path = dir.file("s.db");
  auto rt = agent_runtime::open(ro);
  ASSERT_TRUE(rt.ok()) << rt.err().message;
  const char* ask = "Write a very long story about a cedar tree, with many chapters.";
  agent_options o;
  o.tools = {"clock"};
  o.max_new_tokens = 200;
  o.max_tool_rounds = 0;
  auto plain = (*rt)->create_agent(o);
  ASSERT_TRUE(plain.ok()) << plain.err().message;
  auto r0 = plain->ask(ask);
  ASSERT_TRUE(r0.ok()) << r0.err().message;
  ASSERT_LT(r0->generated_tokens, 48) << "the premise: the model ends this reply early";
  o.min_new_tokens = 48;
  auto held = (*rt)->create_agent(o);
  ASSERT_TRUE(held.ok()) << held.err().message;
  auto r1 = held->ask(ask);
  ASSERT_TRUE(r1.ok()) << r1.err().message;
  EXPECT_GE(r1->generated_tokens, 48);
  EXPECT_LE(r1->generated_tokens, 200);
}
