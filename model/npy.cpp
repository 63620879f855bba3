// npy — NumPy .npy reader/writer (see npy.hpp).
//
// Layout: "\x93NUMPY" | major u8 | minor u8 | header_len (u16 LE for v1, u32 LE for v2/v3) |
// header (ASCII/UTF-8 Python dict literal, padded with spaces, ending in '\n') | raw data.
// The header dict must hold exactly the keys 'descr', 'fortran_order' and 'shape'. The
// parser is a small recursive-descent reader of that literal subset (strings, True/False,
// tuples of non-negative integers); anything else is an error naming the file and the field.
// The data must be exactly numel * itemsize bytes (NumPy writes nothing after it).
#include "model/npy.hpp"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

namespace cedar::model {

namespace {

struct dtype_info {
  const char* name;     // ours
  size_t size;
  const char* descr;    // what we write
};
constexpr dtype_info k_dtypes[] = {
    {"f32", 4, "<f4"}, {"f64", 8, "<f8"}, {"i32", 4, "<i4"},
    {"i64", 8, "<i8"}, {"u8", 1, "|u1"},  {"bool", 1, "|b1"},
};

const dtype_info* find_dtype_by_name(const std::string& name) {
  for (const auto& d : k_dtypes)
    if (name == d.name) return &d;
  return nullptr;
}

// '<f4' / '=f4' / '|u1' ... -> our name, or "" when unsupported (big-endian, other kinds).
std::string dtype_from_descr(const std::string& descr) {
  if (descr.size() < 3) return "";
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  const bool one_byte = kind == "u1" || kind == "b1";
  if (one_byte) {
    if (order != '|' && order != '<' && order != '>' && order != '=') return "";
    return kind == "u1" ? "u8" : "bool";
  }
  if (order != '<' && order != '=') return "";  // big-endian or byte-order-free multibyte
  if (kind == "f4") return "f32";
  if (kind == "f8") return "f64";
  if (kind == "i4") return "i32";
  if (kind == "i8") return "i64";
  return "";
}

// Parser of the header's dict literal.
class header_parser {
 public:
  header_parser(std::string_view s, const std::string& file) : s_(s), file_(file) {}

  status parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return fail("header does not start with '{'");
    skip_ws();
    while (!peek('}')) {
      std::string key;
      CEDAR_TRY(parse_string(key));
      skip_ws();
      if (!eat(':')) return fail("expected ':' after key '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (have_descr) return fail("duplicate key 'descr'");
        CEDAR_TRY(parse_string(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) return fail("duplicate key 'fortran_order'");
        if (s_.substr(pos_, 4) == "True") {
          fortran = true;
          pos_ += 4;
        } else if (s_.substr(pos_, 5) == "False") {
          fortran = false;
          pos_ += 5;
        } else {
          return fail("field 'fortran_order' is not True or False");
        }
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) return fail("duplicate key 'shape'");
        CEDAR_TRY(parse_shape(shape));
        have_shape = true;
      } else {
        return fail("unexpected key '" + key + "'");
      }
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      if (!peek('}')) return fail("expected ',' or '}' in the header dict");
    }
    eat('}');
    skip_ws();
    if (pos_ != s_.size()) return fail("trailing characters after the header dict");
    if (!have_descr) return fail("missing key 'descr'");
    if (!have_fortran) return fail("missing key 'fortran_order'");
    if (!have_shape) return fail("missing key 'shape'");
    return {};
  }

 private:
  error fail(const std::string& what) const {
    return make_error(errc::invalid_format,
                      file_ + ": .npy header: " + what + " (at offset " + std::to_string(pos_) + ")");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  status parse_string(std::string& out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return fail("expected a string");
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return fail("unterminated string");
    out.assign(s_.substr(pos_, end - pos_));
    if (out.find('\\') != std::string::npos) return fail("escapes in strings are not supported");
    pos_ = end + 1;
    return {};
  }
  status parse_shape(std::vector<int64_t>& shape) {
    if (!eat('(')) return fail("field 'shape' is not a tuple");
    shape.clear();
    skip_ws();
    while (!peek(')')) {
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
        return fail("field 'shape' holds something other than a non-negative integer");
      int64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        const int d = s_[pos_++] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - d) / 10) return fail("shape dimension overflows");
        v = v * 10 + d;
      }
      if (peek('L')) ++pos_;  // Python 2 long suffix
      shape.push_back(v);
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      if (!peek(')')) return fail("expected ',' or ')' in field 'shape'");
    }
    eat(')');
    return {};
  }

  std::string_view s_;
  const std::string& file_;
  size_t pos_ = 0;
};

}  // namespace

int64_t npy_array::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

size_t npy_array::elem_size() const {
  const auto* d = find_dtype_by_name(dtype);
  return d ? d->size : 0;
}

double npy_array::at_f64(int64_t i) const {
  assert(i >= 0 && i < numel());
  if (dtype == "f32") return as<float>()[i];
  if (dtype == "f64") return as<double>()[i];
  return static_cast<double>(at_i64(i));
}

int64_t npy_array::at_i64(int64_t i) const {
  assert(i >= 0 && i < numel());
  if (dtype == "i64") return as<int64_t>()[i];
  if (dtype == "i32") return as<int32_t>()[i];
  if (dtype == "u8" || dtype == "bool") return bytes[static_cast<size_t>(i)];
  if (dtype == "f32") return static_cast<int64_t>(as<float>()[i]);
  if (dtype == "f64") return static_cast<int64_t>(as<double>()[i]);
  return 0;
}

result<npy_array> npy_parse(const uint8_t* data, size_t size, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return make_error(errc::invalid_format, name + ": " + what);
  };
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(data, magic, 6) != 0) return bad("not a .npy file (bad magic)");
  const int major = data[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return bad("truncated .npy preamble");
    header_len = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8) |
                 (static_cast<size_t>(data[10]) << 16) | (static_cast<size_t>(data[11]) << 24);
    header_start = 12;
  } else {
    return bad("unsupported .npy format version " + std::to_string(major) + "." +
               std::to_string(data[7]) + " (expected 1.x, 2.x or 3.x)");
  }
  if (header_len > size - header_start)
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(size) + " bytes)");
  std::string_view header(reinterpret_cast<const char*>(data + header_start), header_len);
  std::string descr;
  bool fortran = false;
  npy_array a;
  header_parser p(header, name);
  CEDAR_TRY(p.parse(descr, fortran, a.shape));
  a.dtype = dtype_from_descr(descr);
  if (a.dtype.empty())
    return bad("unsupported dtype '" + descr +
               "' (supported: little-endian <f4 <f8 <i4 <i8 |u1 |b1)");
  if (fortran) return bad("Fortran-order arrays are not supported (field 'fortran_order' is True)");
  const size_t elem = a.elem_size();
  uint64_t numel = 1;
  for (auto d : a.shape) {
    if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d) / elem)
      return bad("shape overflows");
    numel *= static_cast<uint64_t>(d);
  }
  const size_t data_start = header_start + header_len;
  const uint64_t want = numel * elem;
  const uint64_t have = size - data_start;
  if (have != want)
    return bad("data holds " + std::to_string(have) + " bytes, but shape and dtype '" + descr +
               "' need " + std::to_string(want));
  a.bytes.assign(data + data_start, data + size);
  return a;
}

result<npy_array> npy_load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::not_found, path + ": cannot open .npy file");
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return make_error(errc::io, path + ": read failed");
  return npy_parse(buf.data(), buf.size(), path);
}

status npy_save(const std::string& path, const npy_array& a) {
  const auto* d = find_dtype_by_name(a.dtype);
  if (!d)
    return make_error(errc::invalid_argument,
                      path + ": npy_save: unsupported dtype '" + a.dtype + "'");
  for (auto dim : a.shape)
    if (dim < 0) return make_error(errc::invalid_argument, path + ": npy_save: negative dimension");
  if (a.bytes.size() != static_cast<size_t>(a.numel()) * d->size)
    return make_error(errc::invalid_argument,
                      path + ": npy_save: " + std::to_string(a.bytes.size()) +
                          " bytes do not match shape x dtype (" +
                          std::to_string(static_cast<size_t>(a.numel()) * d->size) + ")");
  std::ostringstream h;
  h << "{'descr': '" << d->descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) h << (i ? ", " : "") << a.shape[i];
  if (a.shape.size() == 1) h << ",";  // a 1-tuple, as Python spells it: (201,)
  h << "), }";
  std::string header = h.str();
  // Pad with spaces so that preamble + header (ending in '\n') is a multiple of 64.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const size_t pre = v2 ? 12 : 10;
  const size_t total = (pre + header.size() + 1 + 63) / 64 * 64;
  header.append(total - pre - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const size_t hl = header.size();
  out.push_back(static_cast<char>(hl & 0xFF));
  out.push_back(static_cast<char>((hl >> 8) & 0xFF));
  if (v2) {
    out.push_back(static_cast<char>((hl >> 16) & 0xFF));
    out.push_back(static_cast<char>((hl >> 24) & 0xFF));
  }
  out += header;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(errc::io, path + ": cannot create .npy file");
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (!a.bytes.empty()) ok = ok && std::fwrite(a.bytes.data(), 1, a.bytes.size(), f) == a.bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return make_error(errc::io, path + ": write failed");
  return {};
}

namespace {
template <class T>
npy_array make_array(std::vector<int64_t> shape, const T* data, const char* dtype) {
  npy_array a;
  a.shape = std::move(shape);
  a.dtype = dtype;
  const size_t n = static_cast<size_t>(a.numel()) * sizeof(T);
  a.bytes.resize(n);
  if (n) std::memcpy(a.bytes.data(), data, n);
  return a;
}
}  // namespace

npy_array npy_from_f32(std::vector<int64_t> shape, const float* data) {
  return make_array(std::move(shape), data, "f32");
}
npy_array npy_from_i64(std::vector<int64_t> shape, const int64_t* data) {
  return make_array(std::move(shape), data, "i64");
}
npy_array npy_from_i32(std::vector<int64_t> shape, const int32_t* data) {
  return make_array(std::move(shape), data, "i32");
}

}  // namespace cedar::model
