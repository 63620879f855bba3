// A real child process for tests that drive the `cedar` binary (remote_test, signals_test):
// fork + exec with its stdout (and optionally stderr) on a pipe and optionally its stdin on
// another; read its output until a line containing a key; send it a signal and wait for the
// exit with a deadline (a hung child is killed, and the call reports it). Header-only, POSIX.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace cedar::test {

struct child_process {
  pid_t pid = -1;
  int from_child = -1;  // its stdout (+ stderr when merged)
  int to_child = -1;    // its stdin, when asked for
  std::string out;      // everything read so far

  child_process() = default;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  // argv[0] is the program's path. merge_stderr: stderr goes to the same pipe as stdout;
  // with_stdin: write to its stdin through write_input()/close_input().
  bool start(const std::vector<std::string>& args, bool merge_stderr = false, bool with_stdin = false) {
    int outp[2], inp[2] = {-1, -1};
    if (::pipe(outp) != 0) return false;
    if (with_stdin && ::pipe(inp) != 0) return false;
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid = ::fork();
    if (pid == 0) {  // the child: only async-signal-safe calls until exec
      ::dup2(outp[1], 1);
      if (merge_stderr) ::dup2(outp[1], 2);
      ::close(outp[0]);
      ::close(outp[1]);
      if (with_stdin) {
        ::dup2(inp[0], 0);
        ::close(inp[0]);
        ::close(inp[1]);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(outp[1]);
    from_child = outp[0];
    if (with_stdin) {
      ::close(inp[0]);
      to_child = inp[1];
    }
    return pid > 0;
  }

  // Reads until a complete line containing `key` has arrived; returns that line, or "" when the
  // child closes its output or nothing of the kind comes within `timeout_s`.
  std::string read_line_with(const std::string& key, int timeout_s = 120) {
    size_t line_start = out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{from_child, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(from_child, buf, sizeof buf);
      if (n <= 0) return "";
      out.append(buf, size_t(n));
      for (size_t nl; (nl = out.find('\n', line_start)) != std::string::npos; line_start = nl + 1) {
        std::string line = out.substr(line_start, nl - line_start);
        if (line.find(key) != std::string::npos) {
          line_start = nl + 1;
          return line;
        }
      }
    }
    return "";
  }

  // Reads whatever arrives for up to `timeout_s` or until the child closes its output.
  void read_to_end(int timeout_s = 60) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{from_child, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(from_child, buf, sizeof buf);
      if (n <= 0) return;
      out.append(buf, size_t(n));
    }
  }

  // Reads what is already there (waiting up to `wait_ms` for the first bytes).
  void drain(int wait_ms) {
    if (from_child < 0) return;
    for (int ms = wait_ms;; ms = 0) {
      pollfd p{from_child, POLLIN, 0};
      if (::poll(&p, 1, ms) <= 0) return;
      char buf[512];
      const ssize_t n = ::read(from_child, buf, sizeof buf);
      if (n <= 0) {
        if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));  // at EOF
        return;
      }
      out.append(buf, size_t(n));
    }
  }

  bool write_input(const std::string& s) { return ::write(to_child, s.data(), s.size()) == ssize_t(s.size()); }
  void close_input() {
    if (to_child >= 0) ::close(to_child);
    to_child = -1;
  }

  // Sends `sig` (unless 0), then waits: the exit status, or -1 when it did not exit within
  // `timeout_s` (it is then killed) or died of a signal. CEDAR_REMOTE_STACKS=1 writes a hung
  // child's stacks to remote_stacks.txt in the build dir before killing it.
  int stop(int sig = SIGTERM, int timeout_s = 60) {
    if (pid <= 0) return -1;
    if (sig != 0) ::kill(pid, sig);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0, rc = -1;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      drain(20);  // keeps reading, so a child blocked on a full pipe can finish
    }
    drain(0);
    if (!exited) {
      if (std::getenv("CEDAR_REMOTE_STACKS")) {  // diagnosing a hung shutdown
        std::string cmd = "gdb -p " + std::to_string(pid) + " -batch -ex 'thread apply all bt' > " +
                          std::string(CEDAR_BINARY_DIR) + "/remote_stacks.txt 2>&1";
        (void)std::system(cmd.c_str());
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
    pid = -1;
    close_input();
    ::close(from_child);
    from_child = -1;
    return rc;
  }

  ~child_process() {
    if (pid > 0) stop(SIGTERM, 5);
  }
};

}  // namespace cedar::test
