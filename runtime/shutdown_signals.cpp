// See shutdown_signals.hpp (self-pipe: the handler writes one byte, wait() reads it).
#include "runtime/shutdown_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace cedar::runtime {
namespace {

// The pipe of the process (invariant 2): [0] read end (blocking), [1] write end (non-blocking).
// The handler reads g_write_fd; it is set once, before the first handler is installed.
int g_pipe[2] = {-1, -1};
volatile sig_atomic_t g_write_fd = -1;

void open_pipe_once() {
  if (g_pipe[0] >= 0) return;
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) {
    std::perror("cedar: cannot create the signal pipe");
    std::abort();  // no descriptors left at start-up: nothing sensible to run
  }
  ::fcntl(g_pipe[1], F_SETFL, ::fcntl(g_pipe[1], F_GETFL) | O_NONBLOCK);
  g_write_fd = g_pipe[1];
}

extern "C" void on_shutdown_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  const int fd = g_write_fd;
  if (fd >= 0) {
    ssize_t n = ::write(fd, &b, 1);  // EAGAIN on a full pipe: the reader has bytes pending anyway
    (void)n;
  }
  errno = saved;
}

void install(int sig, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads elsewhere (stdin, sockets) resume, not fail with EINTR
  ::sigaction(sig, &sa, old);
}

}  // namespace

shutdown_signals::shutdown_signals() {
  open_pipe_once();
  // Drain what an earlier instance left (invariant 3); the read end is blocking, so peek first.
  const int flags = ::fcntl(g_pipe[0], F_GETFL);
  ::fcntl(g_pipe[0], F_SETFL, flags | O_NONBLOCK);
  unsigned char buf[64];
  while (::read(g_pipe[0], buf, sizeof buf) > 0) {
  }
  ::fcntl(g_pipe[0], F_SETFL, flags);
  install(SIGINT, &old_int_);
  install(SIGTERM, &old_term_);
  // Threads started from here on inherit a mask that blocks both signals, so their blocking
  // calls (epoll_wait, poll, accept in CAF and the HTTP server) never see EINTR; the signal goes
  // to a thread started earlier (OpenBLAS's: the handler runs there) or to a reader waiting in
  // wait()/wait_mask(), which unblocks it for the duration of the wait.
  sigset_t both;
  sigemptyset(&both);
  sigaddset(&both, SIGINT);
  sigaddset(&both, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &both, nullptr);
}

sigset_t shutdown_signals::wait_mask() {
  sigset_t m;
  pthread_sigmask(SIG_SETMASK, nullptr, &m);
  sigdelset(&m, SIGINT);
  sigdelset(&m, SIGTERM);
  return m;
}

shutdown_signals::~shutdown_signals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

int shutdown_signals::wait() {
  const sigset_t unblocked = wait_mask();
  for (;;) {
    pollfd p{g_pipe[0], POLLIN, 0};
    if (::ppoll(&p, 1, nullptr, &unblocked) < 0) continue;  // EINTR: the handler ran here
    unsigned char b = 0;
    const ssize_t n = ::read(g_pipe[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    // EOF or another error cannot happen while the write end stays open (invariant 2).
    std::perror("cedar: reading the signal pipe");
    return SIGTERM;
  }
}

int shutdown_signals::fd() const { return g_pipe[0]; }

void shutdown_signals::wake() {
  const unsigned char b = 0;
  ssize_t n = ::write(g_pipe[1], &b, 1);
  (void)n;
}

const char* shutdown_signals::name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: {
      static thread_local char buf[24];
      std::snprintf(buf, sizeof buf, "signal %d", sig);
      return buf;
    }
  }
}

}  // namespace cedar::runtime
