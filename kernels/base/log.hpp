// Minimal leveled logging to stderr. One line per call, prefixed with the level; the level is
// set once at start-up (CLI --verbose / --quiet) and read with a relaxed atomic.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace cedar {

enum class log_level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

inline std::atomic<int>& log_threshold() {
  static std::atomic<int> t{static_cast<int>(log_level::info)};
  return t;
}
inline void log_set_level(log_level l) { log_threshold().store(static_cast<int>(l)); }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
inline void log_msg(log_level l, const char* fmt, ...) {
  if (static_cast<int>(l) < log_threshold().load(std::memory_order_relaxed)) return;
  static const char* names[] = {"debug", "info", "warn", "error"};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "cedar %s: %s\n", names[static_cast<int>(l)], buf);
}

}  // namespace cedar

#define CEDAR_LOG_DEBUG(...) ::cedar::log_msg(::cedar::log_level::debug, __VA_ARGS__)
#define CEDAR_LOG_INFO(...) ::cedar::log_msg(::cedar::log_level::info, __VA_ARGS__)
#define CEDAR_LOG_WARN(...) ::cedar::log_msg(::cedar::log_level::warn, __VA_ARGS__)
#define CEDAR_LOG_ERROR(...) ::cedar::log_msg(::cedar::log_level::error, __VA_ARGS__)
