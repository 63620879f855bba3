// Helpers shared by the MCP tests: where the npm servers live, a loopback child process for
// HTTP servers, free ports, and leak probes (threads, fds, child pids).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tools_mcp/mcp_config.hpp"

extern char** environ;

namespace cedar::tools::test {

inline std::string source_dir() { return CEDAR_SOURCE_DIR; }
inline std::string servers_dir() { return source_dir() + "/tests/tools_mcp/servers"; }
inline std::string fakes_dir() { return source_dir() + "/tests/tools_mcp/fakes"; }
inline std::string everything_js() {
  return servers_dir() + "/node_modules/@modelcontextprotocol/server-everything/dist/index.js";
}
inline std::string filesystem_js() {
  return servers_dir() + "/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";
}
inline bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

inline std::string node22() { return servers_dir() + "/node_modules/.bin/node"; }
inline std::string conformance_js() { return servers_dir() + "/node_modules/@modelcontextprotocol/conformance/dist/index.js"; }

// Fails the test (not skips) when the pinned npm packages are missing.
#define CEDAR_REQUIRE_NPM_SERVERS()                                                                  \
  ASSERT_TRUE(::cedar::tools::test::file_exists(::cedar::tools::test::everything_js()) &&            \
              ::cedar::tools::test::file_exists(::cedar::tools::test::filesystem_js()) &&            \
              ::cedar::tools::test::file_exists(::cedar::tools::test::node22()) &&                   \
              ::cedar::tools::test::file_exists(::cedar::tools::test::conformance_js()))             \
      << "the MCP test servers are not installed under tests/tools_mcp/servers/node_modules; run "   \
         "scripts/setup-npm.sh"

inline mcp::server_config stdio_config(std::string name, std::string command, std::vector<std::string> args) {
  mcp::server_config c;
  c.name = std::move(name);
  c.type = mcp::server_config::kind::stdio;
  c.command = std::move(command);
  c.args = std::move(args);
  return c;
}

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A server process on 127.0.0.1:port (PORT in its env), killed and reaped by stop()/destructor.
class loopback_server {
 public:
  loopback_server(std::vector<std::string> argv, int port) : port_(port) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::string(*e).rfind("PORT=", 0) != 0) env_s.push_back(*e);
    env_s.push_back("PORT=" + std::to_string(port));
    std::vector<char*> envp, av;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (auto& s : argv) av.push_back(s.data());
    av.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    if (posix_spawnp(&pid_, av[0], &fa, nullptr, av.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~loopback_server() { stop(); }
  // Waits until the port accepts connections (or the process died).
  bool wait_ready(std::chrono::milliseconds limit = std::chrono::milliseconds(15000)) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (pid_ < 0 || ::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (port_open(port_)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::kill(pid_, 0) == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/mcp"; }

 private:
  pid_t pid_ = -1;
  int port_;
};

inline int count_dir(const char* path) {
  DIR* d = ::opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}
inline int n_threads() { return count_dir("/proc/self/task"); }
inline int n_fds() { return count_dir("/proc/self/fd"); }
// True when `pid` was reaped (no zombie, no process): waitpid says it is not our child anymore.
inline bool reaped(pid_t pid) {
  int st;
  return ::waitpid(pid, &st, WNOHANG) < 0 && errno == ECHILD;
}

}  // namespace cedar::tools::test
