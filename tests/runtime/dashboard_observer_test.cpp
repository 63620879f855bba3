// The observer (runtime/observer.hpp) on its own: sequence numbers, the bounded rings, the live
// state of a session, tool statistics, and subscribers waiting on a cursor from another thread.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "runtime/observer.hpp"

namespace cedar::runtime {
namespace {

using njson = nlohmann::json;

TEST(DashboardObserver, SequencesAndHistoryRingAreBounded) {
  observer_limits lim;
  lim.history = 8;
  observer o(lim);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(o.publish("token", 1, njson{{"text", std::to_string(i)}}), uint64_t(i + 1));
  EXPECT_EQ(o.last_seq(), 20u);
  auto all = o.since(0);
  ASSERT_EQ(all.size(), 8u);  // only the ring's last 8 are kept
  EXPECT_EQ(all.front().seq, 13u);
  EXPECT_EQ(all.back().seq, 20u);
  EXPECT_EQ(all.back().data["text"], "19");
  auto tail = o.since(17);
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(tail.front().seq, 18u);
  EXPECT_TRUE(o.since(20).empty());
  EXPECT_EQ(o.since(0, 3).size(), 3u);
}

TEST(DashboardObserver, SessionLiveStateFollowsTheTurn) {
  observer_limits lim;
  lim.live_text_bytes = 10;
  lim.session_events = 3;
  observer o(lim);
  EXPECT_FALSE(o.known(5));
  o.publish("turn_begin", 5, njson{{"agent", "a"}, {"text", "hi"}});
  EXPECT_TRUE(o.session(5).running);
  for (const char* t : {"Hello", ", ", "world", "!"}) o.publish("token", 5, njson{{"text", t}});
  auto live = o.session(5);
  EXPECT_EQ(live.live_text, "lo, world!");  // capped to the last 10 bytes (at a char boundary)
  EXPECT_EQ(live.events.size(), 1u);      // tokens are not kept as events
  o.publish("tool_call", 5, njson{{"id", "c1"}, {"name", "calculator"}});
  o.publish("tool_result", 5, njson{{"id", "c1"}, {"name", "calculator"}, {"text", "4"}, {"ms", 2.5}});
  o.publish("turn_end", 5, njson{{"answer", "4"}, {"generated_tokens", 12}});
  live = o.session(5);
  EXPECT_FALSE(live.running);
  ASSERT_EQ(live.turns.size(), 1u);
  EXPECT_EQ(live.turns[0]["generated_tokens"], 12);
  EXPECT_TRUE(live.turns[0].contains("t_ms"));
  ASSERT_EQ(live.events.size(), 3u);  // bounded: the turn_begin fell out
  EXPECT_EQ(live.events.front().type, "tool_call");
  EXPECT_GT(live.last_ms, 0);
  o.publish("turn_begin", 5, njson{{"text", "again"}});
  EXPECT_EQ(o.session(5).live_text, "");  // a new turn starts a new live text
}

TEST(DashboardObserver, KeepsABoundedNumberOfSessionsDroppingIdleOnes) {
  observer_limits lim;
  lim.sessions = 3;
  observer o(lim);
  o.publish("turn_begin", 1, njson::object());  // running: never dropped
  for (int64_t id = 2; id <= 6; ++id) o.publish("turn_end", id, njson::object());
  EXPECT_TRUE(o.known(1));
  EXPECT_TRUE(o.known(6));
  EXPECT_TRUE(o.known(5));
  EXPECT_FALSE(o.known(2));
  EXPECT_FALSE(o.known(4));
}

TEST(DashboardObserver, ToolStatisticsAndExecutorSamples) {
  observer o;
  o.publish("tool_result", 1, njson{{"name", "calculator"}, {"ms", 3.0}, {"is_error", false}});
  o.publish("tool_result", 2, njson{{"name", "calculator"}, {"ms", 7.0}, {"is_error", true}, {"text", "bad expression"}});
  o.publish("tool_result", 2, njson{{"name", "clock"}, {"ms", 1.0}, {"is_error", false}});
  njson s = o.tool_stats();
  EXPECT_EQ(s["calculator"]["calls"], 2);
  EXPECT_EQ(s["calculator"]["errors"], 1);
  EXPECT_DOUBLE_EQ(s["calculator"]["total_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(s["calculator"]["max_ms"].get<double>(), 7.0);
  EXPECT_EQ(s["calculator"]["last_error"], "bad expression");
  EXPECT_EQ(s["clock"]["calls"], 1);
  o.publish("executor", -1, njson{{"tok_s", 12.5}, {"n_active", 2}});
  auto ex = o.executor_samples();
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_DOUBLE_EQ(ex[0]["tok_s"].get<double>(), 12.5);
  EXPECT_TRUE(ex[0].contains("t_ms"));
  EXPECT_FALSE(o.known(-1));  // runtime-wide events have no session state
}

TEST(DashboardObserver, CutKeepsUtf8Whole) {
  observer_limits lim;
  lim.text_bytes = 4;
  observer o(lim);
  EXPECT_EQ(o.cut("abc"), "abc");
  std::string s = "ab\xC3\xA9xyz";  // "abéxyz": é is 2 bytes at [2, 4)
  std::string c = o.cut(s);
  EXPECT_EQ(c.substr(0, 4), "ab\xC3\xA9");
  EXPECT_NE(c.find("more bytes"), std::string::npos);
  std::string t = "abc\xC3\xA9";  // the cut at 4 would split é: it moves back to 3
  EXPECT_EQ(o.cut(t).substr(0, 4), "abc\xE2");  // "abc" then the ellipsis' first byte
}

TEST(DashboardObserver, SubscribersWakeOnPublishFromAnotherThread) {
  observer o;
  o.publish("token", 1, njson{{"text", "a"}});
  uint64_t cursor = o.last_seq();
  std::atomic<size_t> got{0};
  std::thread sub([&] {
    auto evs = o.wait(cursor, std::chrono::seconds(30));
    got = evs.size();
  });
  o.publish("tool_call", 1, njson{{"name", "clock"}});
  sub.join();
  EXPECT_GE(got.load(), 1u);
  // A cursor at the head with nothing new returns empty after the timeout.
  EXPECT_TRUE(o.wait(o.last_seq(), std::chrono::milliseconds(1)).empty());
}

}  // namespace
}  // namespace cedar::runtime
