// SIGINT/SIGTERM for the commands that run until stopped (`cedar serve`, `cedar serve-remote`).
//
// Construct a shutdown_signals before the first thread starts: it blocks SIGINT and SIGTERM in
// the calling thread, so every thread created afterwards (CAF's scheduler and middleman, the
// HTTP server's pool) inherits the mask and neither signal can land in one of them. wait() then
// takes the first of the two with sigwait; the caller shuts down in order (server, then
// runtime) on the thread that owns them. Order: construct -> open/start -> wait -> close.
// Nothing runs in a signal handler, so the reaction may allocate, lock and send messages.
// The mask stays blocked afterwards: the process is about to exit. Not for library code: the
// signal mask belongs to the CLI's main thread. Limit: threads started before the constructor
// (OpenBLAS starts its pool when the library loads) keep the default action, so a signal the
// kernel hands to one of them ends the process without the orderly close.
#pragma once

#include <csignal>

namespace cedar::runtime {

class shutdown_signals {
 public:
  shutdown_signals();
  // Blocks until SIGINT or SIGTERM arrives and returns it.
  int wait();
  // "SIGINT" or "SIGTERM".
  static const char* name(int sig);

 private:
  sigset_t set_;
};

}  // namespace cedar::runtime
