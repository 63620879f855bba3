// stdio transport (see mcp_stdio.hpp for the lifecycle and invariants).
#include "tools_mcp/mcp_stdio.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/base/log.hpp"

extern char** environ;

namespace cedar::tools::mcp {

void byte_ring::append(std::string_view s) {
  std::lock_guard lock(mu_);
  buf_.append(s);
  if (buf_.size() > cap_) {
    buf_.erase(0, buf_.size() - cap_);
    cut_ = true;
  }
}

std::string byte_ring::tail() const {
  std::lock_guard lock(mu_);
  if (!cut_) return buf_;
  size_t nl = buf_.find('\n');
  return nl == std::string::npos ? buf_ : buf_.substr(nl + 1);
}

namespace {

std::string status_text(int st) {
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "signal " + std::to_string(WTERMSIG(st));
  return "status " + std::to_string(st);
}

std::string last_lines(const std::string& s, size_t max_bytes = 600) {
  std::string t = s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

}  // namespace

stdio_transport::stdio_transport(stdio_options options)
    : opt_(std::move(options)), stderr_(opt_.stderr_capacity) {}

stdio_transport::~stdio_transport() { close(); }

std::string stdio_transport::describe() const {
  std::string s = "stdio: " + opt_.command;
  for (const auto& a : opt_.args) s += " " + a;
  return s;
}

std::string stdio_transport::exit_text() const {
  std::lock_guard lock(mu_);
  return reaped_ ? status_text(wait_status_) : "running";
}

status stdio_transport::start(transport_events events) {
  if (opt_.command.empty()) return make_error(errc::invalid_argument, "stdio server: 'command' is empty");
  ev_ = std::move(events);
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return make_error(errc::io, std::string("pipe: ") + std::strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]); ::close(in[1]);
    return make_error(errc::io, std::string("pipe: ") + std::strerror(errno));
  }
  if (pipe2(err, O_CLOEXEC) != 0 || pipe2(wake_, O_CLOEXEC) != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return make_error(errc::io, std::string("pipe: ") + std::strerror(errno));
  }

  // Environment: ours, with the configured variables replacing or added.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos && opt_.env.count(kv.substr(0, eq))) continue;
    env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : opt_.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings{opt_.command};
  argv_strings.insert(argv_strings.end(), opt_.args.begin(), opt_.args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  // dup2 onto 0/1/2 clears O_CLOEXEC there; every other fd of ours stays close-on-exec.
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child gets default signal dispositions and an empty mask (our threads may block some).
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  // Its own process group: signals in close() reach wrappers' children too (npx, sh -c), and
  // a terminal's Ctrl-C reaches cedar, which then shuts the server down in order.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, opt_.command.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    for (int fd : {in[1], out[0], err[0], wake_[0], wake_[1]}) ::close(fd);
    wake_[0] = wake_[1] = -1;
    return make_error(errc::unavailable, "cannot start MCP server '" + opt_.command + "': " + std::strerror(rc));
  }
  // Writes to a dead child must fail with EPIPE, not kill us: MSG_NOSIGNAL does not apply to
  // pipes, so ignore SIGPIPE process-wide (harmless for a server process).
  signal(SIGPIPE, SIG_IGN);
  {
    std::lock_guard lock(mu_);
    pid_ = pid;
    in_fd_ = in[1];
  }
  out_fd_ = out[0];
  err_fd_ = err[0];
  out_thread_ = std::thread([this] { read_stdout_(); });
  err_thread_ = std::thread([this] { read_stderr_(); });
  CEDAR_LOG_DEBUG("mcp: started pid %d: %s", static_cast<int>(pid), describe().c_str());
  return {};
}

status stdio_transport::send(const json& message) {
  std::string line = json_dump(message);  // compact dump never contains a raw newline
  line += '\n';
  std::lock_guard wlock(write_mu_);
  int fd;
  {
    std::lock_guard lock(mu_);
    fd = in_fd_;
  }
  if (fd < 0 || failed_.load()) return make_error(errc::unavailable, "MCP server (" + describe() + ") is not running");
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::unavailable, "MCP server (" + describe() + ") closed its stdin: " + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

void stdio_transport::fail_(error e) {
  if (closing_.load() || failed_.exchange(true)) return;
  if (ev_.on_closed) ev_.on_closed(std::move(e));
}

bool line_framer::feed(std::string_view bytes, const std::function<void(std::string_view)>& on_line) {
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != '\n') continue;
    pending_.append(bytes.data() + start, i - start);
    start = i + 1;
    if (!pending_.empty() && pending_.back() == '\r') pending_.pop_back();
    if (!pending_.empty()) on_line(pending_);
    pending_.clear();
  }
  pending_.append(bytes.data() + start, bytes.size() - start);
  if (pending_.size() <= max_) return true;
  pending_.clear();
  pending_.shrink_to_fit();
  return false;
}

void stdio_transport::read_stdout_() {
  line_framer framer(opt_.max_message_bytes);
  char buf[65536];
  bool discard = false;
  for (;;) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int pr = ::poll(fds, 2, -1);
    if (pr < 0 && errno == EINTR) continue;
    if (fds[1].revents) return;  // close() in progress
    ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (discard) continue;
    const bool fits = framer.feed(std::string_view(buf, static_cast<size_t>(n)), [this](std::string_view line) {
      if (ev_.on_message && !closing_.load()) ev_.on_message(line);
    });
    if (!fits) {
      fail_(make_error(errc::invalid_format, "MCP server (" + describe() + ") sent a message longer than " +
                                                 std::to_string(opt_.max_message_bytes) + " bytes; connection closed"));
      discard = true;
    }
  }
  if (closing_.load()) return;
  // EOF: the server closed stdout, normally because it exited. Give it a moment to be reaped
  // so the error can say how it ended.
  reap_(std::chrono::milliseconds(500));
  std::string how = exit_text();
  std::string tail = last_lines(stderr_.tail());
  fail_(make_error(errc::unavailable, "MCP server (" + describe() + ") closed its stdout (" + how + ")" +
                                          (tail.empty() ? "" : "; stderr tail: " + tail)));
}

void stdio_transport::read_stderr_() {
  char buf[8192];
  for (;;) {
    pollfd fds[2] = {{err_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int pr = ::poll(fds, 2, -1);
    if (pr < 0 && errno == EINTR) continue;
    ssize_t n = 0;
    if (fds[0].revents) {
      n = ::read(err_fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        stderr_.append(std::string_view(buf, static_cast<size_t>(n)));
        continue;
      }
      return;  // EOF
    }
    if (fds[1].revents) return;
  }
}

bool stdio_transport::reap_(std::chrono::milliseconds wait) {
  auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (reaped_ || pid_ < 0) return true;
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        reaped_ = true;
        wait_status_ = st;
        return true;
      }
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void stdio_transport::close() {
  // close_mu_ serialises concurrent close() calls; write_mu_ is held only while stdin is
  // closed, never across the joins below (a reader may be inside send() answering a ping).
  std::lock_guard close_lock(close_mu_);
  if (closed_) return;
  closed_ = true;
  closing_.store(true);
  pid_t pid;
  {
    std::lock_guard lock(mu_);
    pid = pid_;
  }
  {
    // A writer blocked on a full pipe (the server stopped reading) holds write_mu_: kill the
    // server so that its write fails with EPIPE and releases the lock.
    std::unique_lock wlock(write_mu_, std::defer_lock);
    if (!wlock.try_lock_for(opt_.grace)) {
      if (pid > 0) ::kill(-pid, SIGKILL);
      wlock.lock();
    }
    std::lock_guard lock(mu_);
    if (in_fd_ >= 0) ::close(in_fd_);  // step 1: EOF on the server's stdin
    in_fd_ = -1;
  }
  if (pid > 0) {
    if (!reap_(opt_.grace)) {
      ::kill(-pid, SIGTERM);
      if (!reap_(opt_.grace)) {
        ::kill(-pid, SIGKILL);
        reap_(std::chrono::milliseconds(5000));
      }
    }
  }
  // Anything the server left in its group (grandchildren holding our pipes) goes too.
  if (pid > 0) ::kill(-pid, SIGKILL);
  if (wake_[1] >= 0) {
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
  }
  if (out_thread_.joinable()) out_thread_.join();
  if (err_thread_.joinable()) err_thread_.join();
  for (int* fd : {&out_fd_, &err_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

}  // namespace cedar::tools::mcp
