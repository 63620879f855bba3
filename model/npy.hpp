// npy — reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Owns: the .npy header (magic "\x93NUMPY", version, header length, the Python-dict header
// {'descr', 'fortran_order', 'shape'}), validation, and the raw bytes of the array.
// Supported: little-endian (or byte-order-free) f4, f8, i4, i8, u1, b1 ('<f4' '<f8' '<i4'
// '<i8' '|u1' '|b1'), C order only. Anything else is rejected with an error naming the file
// and the field. Used by the parity tests and by `cedar generate --tokens FILE`.
// Does not own: what the arrays mean.
#pragma once

#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::model {

struct npy_array {
  std::vector<int64_t> shape;
  std::string dtype;          // "f32", "f64", "i32", "i64", "u8", "bool"
  std::vector<uint8_t> bytes; // numel() * elem_size(), C order, little-endian

  int64_t numel() const;
  size_t elem_size() const;
  // Typed view of the bytes; T must match dtype (float: f32, double: f64, int32_t: i32,
  // int64_t: i64, uint8_t: u8 or bool). Asserts on a mismatch (a programmer error).
  template <class T>
  const T* as() const {
    assert(sizeof(T) == elem_size());
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <class T>
  T* as_mut() {
    assert(sizeof(T) == elem_size());
    return reinterpret_cast<T*>(bytes.data());
  }
  // Element i converted to double / int64 whatever the dtype (for small arrays and tests).
  double at_f64(int64_t i) const;
  int64_t at_i64(int64_t i) const;
};

result<npy_array> npy_load(const std::string& path);
// Parses an in-memory .npy image; `name` is used in error messages.
result<npy_array> npy_parse(const uint8_t* data, size_t size, const std::string& name);

status npy_save(const std::string& path, const npy_array& a);
// Convenience builders.
npy_array npy_from_f32(std::vector<int64_t> shape, const float* data);
npy_array npy_from_i64(std::vector<int64_t> shape, const int64_t* data);
npy_array npy_from_i32(std::vector<int64_t> shape, const int32_t* data);

}  // namespace cedar::model
