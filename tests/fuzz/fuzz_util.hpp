// Helpers shared by the libFuzzer targets of tests/fuzz/ (header-only, no library).
//
// fuzz_bytes: takes parameters (chunk sizes, flags) from the front of a fuzz input and leaves
// the rest as the payload, so one input encodes both; deterministic for a given input.
// fuzz_require: an invariant of the code under test; on failure prints what broke and aborts,
// which libFuzzer reports as a crash and saves the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace cedar::fuzz {

class fuzz_bytes {
 public:
  fuzz_bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  // One byte of parameter (0 when the input is used up).
  uint8_t take_byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  // Up to `max` bytes of payload (fewer at the end of the input).
  std::string_view take(size_t max) {
    size_t k = max < n_ ? max : n_;
    std::string_view s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }
  std::string_view rest() { return take(n_); }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

inline void fuzz_require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

}  // namespace cedar::fuzz
