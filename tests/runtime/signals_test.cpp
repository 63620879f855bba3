// SIGINT and SIGTERM delivered to real `cedar` processes (runtime/shutdown_signals.hpp: the
// handler only writes a byte to a pipe, ordinary code reacts). The kernel may hand the signal
// to any thread — OpenBLAS's pool, CAF's scheduler, the HTTP server's workers — so each case
// runs many times: with the old signal-mask design a signal that landed in a thread started
// before main (OpenBLAS) killed the process with the default action instead of an orderly exit.
//   - `cedar serve` on 127.0.0.1 port 0: 20 signals alternating SIGINT/SIGTERM, each must end
//     in exit 0 with the shutdown line, and the store (holding a committed session made
//     beforehand) must still pass its invariants with the session intact.
//   - `cedar chat`: after a turn, SIGINT or SIGTERM at the prompt quits with exit 0 and the
//     turn committed.
//   - `cedar run`: SIGTERM while it loads or runs ends it with exit status 128 + 15 (or 0 when
//     the turn had already finished), never by the default action.
// Cancelling a reply mid-stream is not asserted here: the default model answers in about a
// second, too short to aim a signal at from a test without timing assumptions.
// Uses the shipped default model (model/weights/cedar-agent-tiny) and child_process.hpp.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "child_process.hpp"
#include "runtime/cedar.hpp"
#include "runtime_test_util.hpp"
#include "sessions/store.hpp"

using namespace cedar;

namespace {

const std::string kModelDir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
const std::string kCedar = std::string(CEDAR_BINARY_DIR) + "/bin/cedar";
// A task without a tool, for `cedar run`.
const char* kLongTask = "Tell me a very long story about a cedar tree, a river and a fox.";

// One HTTP request to 127.0.0.1:port; true when any response comes back (the server's accept
// loop is running). A 401 (no token given) is fine.
bool http_answers(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const std::string req = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  ok = ok && ::write(fd, req.data(), req.size()) == ssize_t(req.size());
  char buf[64];
  ok = ok && ::read(fd, buf, sizeof buf) > 0;
  ::close(fd);
  return ok;
}

// One committed turn in a new store, through the public API; returns the session id.
int64_t make_session(const std::string& store) {
  runtime_options o;
  o.model_dir = kModelDir;
  o.store_path = store;
  auto rt = agent_runtime::open(o);
  EXPECT_TRUE(rt.ok()) << rt.err().message;
  if (!rt.ok()) return -1;
  agent_options a;
  a.name = "signals";
  a.tools = {"calculator"};
  a.max_new_tokens = 48;
  auto ag = (*rt)->create_agent(a);
  EXPECT_TRUE(ag.ok()) << ag.err().message;
  if (!ag.ok()) return -1;
  auto r = ag->ask("What is 12 * 12?");
  EXPECT_TRUE(r.ok()) << r.err().message;
  return ag->session();
}

void expect_store_intact(const std::string& store, int64_t session, uint32_t min_turns) {
  auto st = sessions::store::open(store);
  ASSERT_TRUE(st.ok()) << st.err().message;
  auto info = (*st)->get_session(session);
  ASSERT_TRUE(info.ok()) << info.err().message;
  EXPECT_GE(info->n_turns, min_turns);
  auto inv = (*st)->check_invariants(session);
  EXPECT_TRUE(inv.ok()) << inv.err().message;
}

}  // namespace

TEST(Signals, ServeExitsCleanlyOnEachOfTwentySignals) {
  test::temp_dir dir;
  const std::string store = dir.file("serve.db");
  const int64_t session = make_session(store);
  ASSERT_GT(session, 0);
  for (int i = 0; i < 20; ++i) {
    const int sig = i % 2 == 0 ? SIGINT : SIGTERM;
    test::child_process c;
    ASSERT_TRUE(c.start({kCedar, "serve", "--model", kModelDir, "--store", store, "--host", "127.0.0.1", "--port",
                         "0", "--token-file", dir.file("serve.token")},
                        /*merge_stderr=*/true));
    const std::string key = "listening on http://127.0.0.1:";
    const std::string line = c.read_line_with(key);
    ASSERT_NE(line, "") << "run " << i << ": " << c.out;
    // The accept loop runs before the signal (a stop() racing the server's start is another
    // matter: see the report of issue #10).
    ASSERT_TRUE(http_answers(std::atoi(line.c_str() + line.find(key) + key.size()))) << c.out;
    const int rc = c.stop(sig, 60);
    EXPECT_EQ(rc, 0) << "run " << i << " (" << (sig == SIGINT ? "SIGINT" : "SIGTERM") << "): " << c.out;
    EXPECT_NE(c.out.find(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down"), std::string::npos)
        << "run " << i << ": " << c.out;
    if (rc != 0) break;  // one clear failure is enough
  }
  expect_store_intact(store, session, 1);
}

TEST(Signals, ChatQuitsCleanlyOnASignalAtThePrompt) {
  test::temp_dir dir;
  const std::string store = dir.file("chat.db");
  for (int i = 0; i < 4; ++i) {
    const int sig = i % 2 == 0 ? SIGINT : SIGTERM;
    test::child_process c;
    ASSERT_TRUE(c.start({kCedar, "chat", "--model", kModelDir, "--store", store}, /*merge_stderr=*/true,
                        /*with_stdin=*/true));
    const std::string header = c.read_line_with("cedar chat: session ");
    ASSERT_NE(header, "") << c.out;
    const int64_t session = std::atoll(header.c_str() + header.find("session ") + 8);
    ASSERT_TRUE(c.write_input("What is 6 * 7?\n"));
    ASSERT_NE(c.read_line_with("[session "), "") << c.out;  // the turn's summary: back at the prompt
    EXPECT_EQ(c.stop(sig, 60), 0) << c.out;
    EXPECT_NE(c.out.find(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ", quitting"), std::string::npos)
        << c.out;
    expect_store_intact(store, session, 1);
  }
}

// The default model answers in about a second, so the signal lands while the model loads or
// while the turn runs; either way the command ends itself with 128 + SIGTERM (a process killed
// by the default action has no exit status: stop() returns -1).
TEST(Signals, RunEndsCleanlyOnSigterm) {
  test::temp_dir dir;
  const std::string store = dir.file("run.db");
  for (int i = 0; i < 4; ++i) {
    test::child_process c;
    ASSERT_TRUE(
        c.start({kCedar, "run", "--model", kModelDir, "--store", store, "--max-new-tokens", "4000", kLongTask},
                /*merge_stderr=*/true));
    ASSERT_NE(c.read_line_with("loading"), "") << c.out;
    const int rc = c.stop(SIGTERM, 60);
    EXPECT_TRUE(rc == 128 + SIGTERM || rc == 0) << rc << ": " << c.out;
    if (rc == 128 + SIGTERM) {
      EXPECT_TRUE(c.out.find("SIGTERM, turn cancelled") != std::string::npos ||
                  c.out.find("SIGTERM before the turn started") != std::string::npos)
          << c.out;
    }
  }
  auto st = sessions::store::open(store);
  ASSERT_TRUE(st.ok()) << st.err().message;
  auto list = (*st)->list_sessions();
  ASSERT_TRUE(list.ok()) << list.err().message;
  for (const auto& s : *list) {
    auto inv = (*st)->check_invariants(s.id);
    EXPECT_TRUE(inv.ok()) << inv.err().message;
  }
}
