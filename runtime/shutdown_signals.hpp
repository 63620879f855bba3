// SIGINT/SIGTERM for the CLI commands that run until stopped or interrupted (`cedar serve`,
// `cedar serve-remote`, `cedar chat`): the self-pipe pattern.
//
// The kernel hands a process-directed signal to any thread that does not block it, and some
// threads are beyond our control (OpenBLAS starts its pool when the library loads, before main,
// so a signal mask set in main never reaches them). So nothing here depends on which thread
// receives the signal: the constructor installs, with sigaction, a handler that only writes the
// signal's number as one byte into a pipe (saving and restoring errno; write() is
// async-signal-safe), and the real work — stop the server, cancel a generation — runs in
// ordinary code that reads the pipe (wait(), or poll() on fd()). That code may allocate, lock
// and send actor messages; a handler may not.
//
//   kernel --SIGINT/SIGTERM--> handler (any thread) --1 byte--> pipe --> wait()/fd() reader
//
// Invariants:
//  1. The handler touches only the pipe's write end (non-blocking: a full pipe drops the byte,
//     the reader has plenty pending anyway) and errno, which it restores.
//  2. The pipe is created once per process and never closed, so a handler that runs while an
//     instance is being destroyed can never write into a reused descriptor. Both ends are
//     close-on-exec: child processes (MCP servers) get neither, and exec resets the handler, so
//     children start with the default actions and an unblocked mask.
//  3. At most one instance at a time (the CLI's command function owns it); the destructor
//     restores the actions it replaced. Bytes left from an earlier instance are drained by the
//     constructor.
//  4. One reader at a time: wait() and a poll() on fd() must not run in two threads at once
//     (`cedar chat` hands the pipe to a watcher thread during a turn and takes it back after).
//  5. The constructor also blocks both signals in the calling thread, so every thread started
//     afterwards (CAF's scheduler and middleman, the HTTP server's pool) inherits the block and
//     never has a blocking call interrupted (EINTR) by them. A signal then goes to a thread that
//     predates the constructor (OpenBLAS's pool: the handler writes the byte there) or to the
//     reader, which unblocks them only while it waits (ppoll with wait_mask()). The block stays
//     after the destructor: the command is about to return from main.
// Not for library code: signal dispositions belong to the CLI.
#pragma once

#include <csignal>

namespace cedar::runtime {

class shutdown_signals {
 public:
  shutdown_signals();
  ~shutdown_signals();
  shutdown_signals(const shutdown_signals&) = delete;
  shutdown_signals& operator=(const shutdown_signals&) = delete;

  // Blocks until SIGINT or SIGTERM arrives (returns it) or wake() is called (returns 0).
  int wait();
  // The pipe's read end, readable when wait() would not block (for poll() next to other fds).
  int fd() const;
  // Makes one wait() return 0: how a watcher thread blocked in wait() is told to stop. Ordinary
  // code only (any thread), never a signal handler.
  void wake();
  // The calling thread's signal mask with SIGINT and SIGTERM unblocked: pass it to ppoll() when
  // waiting on fd() next to other descriptors (invariant 5).
  static sigset_t wait_mask();
  // "SIGINT", "SIGTERM", or "signal N".
  static const char* name(int sig);

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace cedar::runtime
