// stdio transport: the MCP server is a child process; newline-delimited JSON on its stdin and
// stdout; its stderr is a log kept in a bounded ring buffer (never parsed as protocol).
//
// Lifecycle:
//   start():  pipes (O_CLOEXEC) -> posix_spawnp(command, args, environ + env) in a new
//             process group -> reader threads
//   running:  send() writes "<json>\n" under a mutex; the stdout reader splits lines and
//             delivers each; the stderr reader appends to the ring.
//   EOF on stdout / garbage / oversized line -> on_closed(error with exit status + stderr tail)
//   close():  close stdin, wait `grace`, SIGTERM, wait `grace`, SIGKILL (to the process group),
//             reap; SIGKILL the group's leftovers; join readers.
// Invariants: (1) the child is reaped exactly once (reap_() under mu_); (2) after close()
// returns, no reader thread runs and every pipe fd is closed; (3) callbacks never fire after
// close() returned.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tools_mcp/mcp_transport.hpp"

namespace cedar::tools::mcp {

// Bounded byte ring for a child's stderr: keeps the last `capacity` bytes.
class byte_ring {
 public:
  explicit byte_ring(size_t capacity) : cap_(capacity) {}
  void append(std::string_view s);
  std::string tail() const;  // the kept bytes, oldest first; starts at a line boundary if cut

 private:
  mutable std::mutex mu_;
  std::string buf_;
  size_t cap_;
  bool cut_ = false;
};

// Newline-delimited framing of the server's stdout (pure, for the reader thread and the fuzzer):
// splits bytes into lines, drops a trailing '\r', skips empty lines. feed() returns false once
// the unterminated tail exceeds `max_bytes` (checked after the chunk's complete lines were
// delivered); the caller then closes the transport and stops feeding.
class line_framer {
 public:
  explicit line_framer(size_t max_bytes) : max_(max_bytes) {}
  bool feed(std::string_view bytes, const std::function<void(std::string_view)>& on_line);
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
  size_t max_;
};

struct stdio_options {
  std::string command;                       // found on PATH like a shell would
  std::vector<std::string> args;
  std::map<std::string, std::string> env;    // added to (or overriding) this process's env
  size_t max_message_bytes = 64u << 20;      // a longer stdout line closes the transport
  size_t stderr_capacity = 64u << 10;
  std::chrono::milliseconds grace{2000};     // each of the two waits in close()
};

class stdio_transport final : public transport {
 public:
  explicit stdio_transport(stdio_options options);
  ~stdio_transport() override;

  status start(transport_events events) override;
  status send(const json& message) override;
  void close() override;
  std::string describe() const override;
  std::string stderr_tail() const override { return stderr_.tail(); }

  pid_t pid() const { return pid_; }
  // After close() or after the child exited: its wait status text ("exit 0", "signal 9").
  std::string exit_text() const;

 private:
  void read_stdout_();
  void read_stderr_();
  bool reap_(std::chrono::milliseconds wait);  // true once the child is reaped
  void fail_(error e);

  stdio_options opt_;
  transport_events ev_;
  byte_ring stderr_;
  pid_t pid_ = -1;
  int in_fd_ = -1, out_fd_ = -1, err_fd_ = -1;
  int wake_[2] = {-1, -1};  // close() writes here to wake the readers
  std::thread out_thread_, err_thread_;
  mutable std::mutex mu_;   // pid_/status_/reaped_/in_fd_
  std::timed_mutex write_mu_;  // one writer at a time on the child's stdin
  std::mutex close_mu_;
  bool closed_ = false;  // under close_mu_
  bool reaped_ = false;
  int wait_status_ = 0;
  std::atomic<bool> closing_{false};
  std::atomic<bool> failed_{false};
};

}  // namespace cedar::tools::mcp
