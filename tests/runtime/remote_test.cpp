// Two processes on 127.0.0.1 (ARCHITECTURE "Scale-out"): `cedar serve-remote` opens a runtime on
// the shipped default model and a temp SQLite store and publishes its executor and store; this
// process opens runtimes with remote_port, whose agents and tools run here while the sequences
// and the store live in the server. The same turns run first in a local runtime: with greedy
// sampling the remote transcript must be the local one, token for token. The server stops on
// SIGTERM and must exit 0 every time (a hung shutdown fails the test; CEDAR_REMOTE_STACKS=1
// writes the hung server's stacks to remote_stacks.txt in the build dir before killing it).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cedar.hpp"
#include "child_process.hpp"
#include "runtime_test_util.hpp"
#include "sessions/store.hpp"

using namespace cedar;

namespace {

const std::string kModelDir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";

// `cedar serve-remote` as a child process (child_process.hpp), its stdout on a pipe.
struct server_process : test::child_process {
  bool start(const std::string& store) {
    return child_process::start({std::string(CEDAR_BINARY_DIR) + "/bin/cedar", "serve-remote", "--model", kModelDir,
                                 "--store", store, "--ram-budget-mb", "512"});
  }

  // The port of the "... published on 127.0.0.1:PORT ..." line, or 0 when the server exits or
  // prints nothing of the kind for `timeout_s`.
  uint16_t read_port(int timeout_s = 120) {
    const std::string key = "published on 127.0.0.1:";
    const std::string line = read_line_with(key, timeout_s);
    return line.empty() ? 0 : uint16_t(std::atoi(line.c_str() + line.find(key) + key.size()));
  }

  // SIGTERM, then waits (child_process::stop).
  int stop(int timeout_s = 60) { return child_process::stop(SIGTERM, timeout_s); }
};

// A loopback port that nothing listens on (bound, read, closed).
uint16_t closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

runtime_options client_options(uint16_t port) {
  runtime_options o;
  o.model_dir = kModelDir;
  o.remote_port = port;
  return o;
}

agent_options calculator_agent() {
  agent_options a;
  a.name = "remote-calc";
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = {"calculator"};
  a.max_new_tokens = 96;
  a.max_tool_rounds = 2;
  return a;
}

// What a turn produced, for comparing the remote run with the local one.
struct turn_record {
  std::string answer, tool_results, resume_path;
  int tool_calls = 0;
  int64_t generated = 0, context = 0;
};

turn_record ask(agent& a, const std::string& text) {
  turn_record t;
  auto r = a.ask(text, [&](const agent_event& e) {
    if (e.type == agent_event::kind::tool_result) t.tool_results += e.text + "\n";
  });
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
  if (!r.ok()) return t;
  t.answer = r->answer;
  t.resume_path = r->resume_path;
  t.tool_calls = r->tool_calls;
  t.generated = r->generated_tokens;
  t.context = r->context;
  return t;
}

const char* kTurn1 = "What is 1234 * 5678?";
const char* kTurn2 = "And 7 plus 8?";
const char* kTurn3 = "What is 99 * 3?";

}  // namespace

TEST(Remote, AgentsInThisProcessUseTheExecutorAndStoreOfAnother) {
  test::temp_dir dir;

  // The reference: the same turns in local runtimes (turn 3 after a restart, as below).
  turn_record local1, local2, local3;
  runtime_options lo;
  lo.model_dir = kModelDir;
  lo.store_path = dir.file("local.db");
  int64_t local_session = 0;
  {
    auto rt = agent_runtime::open(lo);
    ASSERT_TRUE(rt.ok()) << rt.err().message;
    auto a = (*rt)->create_agent(calculator_agent());
    ASSERT_TRUE(a.ok()) << a.err().message;
    local_session = a->session();
    local1 = ask(*a, kTurn1);
    local2 = ask(*a, kTurn2);
  }
  {
    auto rt = agent_runtime::open(lo);
    ASSERT_TRUE(rt.ok()) << rt.err().message;
    auto a = (*rt)->resume_agent(local_session, calculator_agent());
    ASSERT_TRUE(a.ok()) << a.err().message;
    local3 = ask(*a, kTurn3);
  }
  ASSERT_GE(local1.tool_calls, 1) << "the default model no longer calls the calculator for " << kTurn1;

  const std::string store = dir.file("remote.db");
  int64_t session = 0;
  {
    server_process server;
    ASSERT_TRUE(server.start(store));
    uint16_t port = server.read_port();
    ASSERT_NE(port, 0) << "the server did not publish: " << server.out;

    {
      auto rt = agent_runtime::open(client_options(port));
      ASSERT_TRUE(rt.ok()) << rt.err().message;
      auto& client = *rt;
      EXPECT_TRUE(client->is_remote());
      EXPECT_FALSE(client->has_engine());    // the weights stay in the server
      EXPECT_FALSE(client->publish().ok());  // borrowed actors are not re-published
      auto a = client->create_agent(calculator_agent());
      ASSERT_TRUE(a.ok()) << a.err().message;
      session = a->session();

      // Turn 1: the tool runs here, the tokens stream back from the server's executor.
      turn_record r1 = ask(*a, kTurn1);
      EXPECT_EQ(r1.resume_path, "fresh");
      EXPECT_EQ(r1.tool_calls, local1.tool_calls);
      EXPECT_EQ(r1.tool_results, local1.tool_results);
      EXPECT_FALSE(r1.tool_results.empty());  // the calculator ran here, in the client
      EXPECT_EQ(r1.answer, local1.answer);
      EXPECT_EQ(r1.generated, local1.generated);
      EXPECT_EQ(r1.context, local1.context);
    }  // the client goes first; the remote actors outlive it

    // A new client resumes the session from the server's store; its sequence is still resident
    // in the server's executor.
    {
      auto rt = agent_runtime::open(client_options(port));
      ASSERT_TRUE(rt.ok()) << rt.err().message;
      auto ss = (*rt)->sessions();
      ASSERT_TRUE(ss.ok()) << ss.err().message;
      ASSERT_EQ(ss->size(), 1u);
      EXPECT_EQ((*ss)[0].id, session);
      EXPECT_EQ(int64_t((*ss)[0].tokens), local1.context);
      auto a = (*rt)->resume_agent(session, calculator_agent());
      ASSERT_TRUE(a.ok()) << a.err().message;
      turn_record r2 = ask(*a, kTurn2);
      EXPECT_EQ(r2.resume_path, "resident");
      EXPECT_EQ(r2.answer, local2.answer);
      EXPECT_EQ(r2.context, local2.context);

      // A client whose model differs from the server's is refused when it connects.
      runtime_options other;
      other.engine = test::random_engine();
      other.tokenizer = test::test_tokenizer();
      other.remote_port = port;
      auto wrong = agent_runtime::open(other);
      ASSERT_FALSE(wrong.ok());
      EXPECT_NE(wrong.err().message.find("different model"), std::string::npos) << wrong.err().message;
    }
    EXPECT_EQ(server.stop(), 0) << "the server did not shut down cleanly";
  }

  // A new server process on the same store: the session comes back by the store's resume path.
  {
    server_process server;
    ASSERT_TRUE(server.start(store));
    uint16_t port = server.read_port();
    ASSERT_NE(port, 0) << "the second server did not publish: " << server.out;
    {
      auto rt = agent_runtime::open(client_options(port));
      ASSERT_TRUE(rt.ok()) << rt.err().message;
      auto a = (*rt)->resume_agent(session, calculator_agent());
      ASSERT_TRUE(a.ok()) << a.err().message;
      turn_record r3 = ask(*a, kTurn3);
      EXPECT_EQ(r3.resume_path, "replayed");
      EXPECT_EQ(r3.resume_path, local3.resume_path);
      EXPECT_GT(r3.context, local2.context);
      EXPECT_EQ(r3.context, local3.context);
      EXPECT_EQ(r3.tool_calls, local3.tool_calls);
      EXPECT_EQ(r3.tool_results, local3.tool_results);
      EXPECT_EQ(r3.answer, local3.answer);
    }
    EXPECT_EQ(server.stop(), 0) << "the second server did not shut down cleanly";
  }

  // What the servers committed is in the SQLite file.
  auto st = sessions::store::open(store);
  ASSERT_TRUE(st.ok()) << st.err().message;
  auto list = (*st)->list_sessions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id, session);
  EXPECT_EQ((*list)[0].agent, "remote-calc");
  EXPECT_GE((*list)[0].n_turns, 3u);
}

TEST(Remote, NoServerIsAClearError) {
  uint16_t port = closed_port();
  ASSERT_NE(port, 0);
  auto rt = agent_runtime::open(client_options(port));
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.err().message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << rt.err().message;
}
