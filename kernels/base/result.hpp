// cedar::result<T> — the error-carrying return type used across every module boundary.
//
// No exceptions cross a module or actor boundary (HOUSE_STYLE 9). A function that can fail on
// bad input returns result<T>: either a value or an `error` whose message names what was wrong
// (a path, a field, the expected value) so that a user can act on it. Asserts are reserved for
// programmer errors.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace cedar {

// Broad classes of failure; the message carries the specifics.
enum class errc {
  invalid_argument,  // a caller passed a bad value (CLI flag, API argument)
  invalid_format,    // malformed bytes: JSON, safetensors header, page header, DSML
  io,                // the OS refused: open/read/write/mmap
  not_found,         // a file, tensor, session or tool that does not exist
  mismatch,          // well-formed but incompatible: shape, dtype, model hash, version
  checksum,          // stored bytes fail their checksum
  timeout,           // a tool, server or request ran past its limit
  cancelled,         // the caller asked to stop
  unavailable,       // a peer (MCP server, device) is gone or not present
  internal,          // an invariant broke; a bug in cedar
};

const char* errc_name(errc c);

struct error {
  errc code = errc::internal;
  std::string message;
};

// Builds an error; `make_error(errc::invalid_format, "config.json: field 'hidden_size' ...")`.
inline error make_error(errc code, std::string message) { return error{code, std::move(message)}; }

template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : v_(std::move(value)) {}
  result(error err) : v_(std::move(err)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const error& err() const { assert(!ok()); return std::get<1>(v_); }
  error&& take_err() { assert(!ok()); return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, error> v_;
};

// result<void>: success or an error.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(error err) : err_(std::move(err)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const error& err() const { assert(!ok_); return err_; }
  error&& take_err() { assert(!ok_); return std::move(err_); }

 private:
  error err_;
  bool ok_ = true;
};

using status = result<void>;

inline const char* errc_name(errc c) {
  switch (c) {
    case errc::invalid_argument: return "invalid argument";
    case errc::invalid_format: return "invalid format";
    case errc::io: return "i/o error";
    case errc::not_found: return "not found";
    case errc::mismatch: return "mismatch";
    case errc::checksum: return "checksum mismatch";
    case errc::timeout: return "timeout";
    case errc::cancelled: return "cancelled";
    case errc::unavailable: return "unavailable";
    case errc::internal: return "internal error";
  }
  return "error";
}

}  // namespace cedar

// Propagates an error from an expression returning result<...>:  CEDAR_TRY(f(x));
#define CEDAR_TRY(expr)                               \
  do {                                                \
    auto cedar_try_r_ = (expr);                       \
    if (!cedar_try_r_.ok()) return cedar_try_r_.take_err(); \
  } while (0)
