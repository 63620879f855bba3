// See shutdown_signals.hpp.
#include "runtime/shutdown_signals.hpp"

#include <pthread.h>

namespace cedar::runtime {

shutdown_signals::shutdown_signals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int shutdown_signals::wait() {
  int sig = 0;
  sigwait(&set_, &sig);  // fails only for an invalid set, which the constructor rules out
  return sig;
}

const char* shutdown_signals::name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace cedar::runtime
