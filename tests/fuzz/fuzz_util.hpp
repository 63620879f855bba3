// Helpers shared by the libFuzzer targets of tests/fuzz/ (header-only, no library).
//
// fuzz_bytes: takes parameters (chunk sizes, flags) from the front of a fuzz input and leaves
// the rest as the payload, so one input encodes both; deterministic for a given input.
// fuzz_require: an invariant of the code under test; on failure prints what broke and aborts,
// which libFuzzer reports as a crash and saves the input.
// fuzz_data_path: a data file of the source tree a target reads once (the tokenizer), found in
// the source tree it was built from, else in the fuzz bundle next to the binary
// (<bundle>/bin/fuzz_x -> <bundle>/data/<rel>, scripts/fuzz-bundle.sh), for machines without the
// source tree.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
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

inline std::string fuzz_data_path(const std::string& rel) {
#ifdef CEDAR_SOURCE_DIR
  const std::string in_tree = std::string(CEDAR_SOURCE_DIR) + "/" + rel;
  if (access(in_tree.c_str(), R_OK) == 0) return in_tree;
#endif
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return rel;
  std::string dir(exe, size_t(n));
  dir.resize(dir.rfind('/'));                      // <bundle>/bin
  return dir.substr(0, dir.rfind('/')) + "/data/" + rel;  // <bundle>/data/<rel>
}

inline void fuzz_require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

}  // namespace cedar::fuzz
